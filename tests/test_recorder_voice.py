"""The recorder in the user's own training output: one line per recorded step saying where it
went, one line per requested step never reached, and no third-party chatter (the profiler
back-end's ``USDT … profiler_start`` lines, the CPU allocator's warning)."""
from __future__ import annotations

import subprocess
import sys
import textwrap

import torch

from processes import REPO
from test_recording import _lightning_fit, _Trainer, lightning_callback  # noqa: F401 - the fixture
from tests.doctor_models import WrappedHeadLM

LOOP = textwrap.dedent("""
    import sys
    import torch
    import torch.nn.functional as F
    from examples.user_model import UserGPT
    from fusedce_profile import StepRecorder

    torch.manual_seed(0)
    model = UserGPT(vocab=256, hidden=32, layers=1, heads=2, max_len=16)
    optimizer = torch.optim.AdamW(model.parameters())
    recorder = StepRecorder(model, sys.argv[1], steps=(2, 50), label="naive")
    for i in range(5):
        ids = torch.randint(0, 256, (2, 16))
        with recorder.step():
            loss = F.cross_entropy(model(ids).flatten(0, 1), ids.flatten())
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
        print(f"user: step {i}")
    recorder.close()
    recorder.close()
""")


def test_a_plain_loop_prints_where_each_step_went_and_which_steps_never_came_and_nothing_else(tmp_path):
    out = tmp_path / "run"
    done = subprocess.run([sys.executable, "-c", LOOP, str(out)], cwd=REPO, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [f"user: step {i}" for i in range(5)]
    assert done.stderr.splitlines() == [
        f"fusedce-profile: step 2 recorded in {out / 'summary.md'}",
        "fusedce-profile: step 50 was never reached (the run ended after step 4); nothing was recorded for it",
    ]


def test_the_lightning_callback_says_where_it_wrote_and_at_the_end_of_fit_which_steps_never_came(
        tmp_path, lightning_callback, capsys):  # noqa: F811 - the fixture
    torch.manual_seed(0)
    callback = lightning_callback(steps=(1, 7), trace=False)
    _lightning_fit(callback, WrappedHeadLM(), _Trainer(tmp_path / "logs"), steps=3, validate_after=set())
    folder = tmp_path / "logs" / "fusedce-profile"
    assert capsys.readouterr().err.splitlines() == [
        f"fusedce-profile: step 1 recorded in {folder / 'summary.md'}",
        "fusedce-profile: step 7 was never reached (the run ended after step 2); nothing was recorded for it",
    ]


def test_a_stale_step_ended_by_a_later_forward_still_says_which_steps_never_came(tmp_path, capfd):
    """A Hugging Face ``train()`` raised inside its recorded step and the model was used again (an evaluation):
    the forward ended the stale step and closed the recorder, but the line naming the requested steps never reached
    was never printed, not even at exit."""
    import time
    import warnings

    from fusedce_profile import StepRecorder
    from fusedce_profiler.instrument.recording.phases import WATCH_S

    model = WrappedHeadLM()
    ids = torch.randint(0, 64, (2, 8))
    recorder = StepRecorder(model, tmp_path / "r", steps=(0, 5), trace=False, snapshot=False, report=False)
    alive = [True]
    recorder.loop_alive = lambda: alive[0]
    recorder.start(0)
    model(ids).float().mean().backward()
    alive[0] = False  # the loop that began the step ended (an exception left it)
    time.sleep(3 * WATCH_S)  # the step's watch sees its loop ended
    with warnings.catch_warnings(record=True) as caught, torch.no_grad():
        warnings.simplefilter("always")
        model(ids)
    assert not recorder.recording and recorder.closed
    assert [str(w.message).split(":")[1] for w in caught] == [" step 0 is not recorded"]
    assert capfd.readouterr().err.splitlines() == [
        "fusedce-profile: step 5 was never reached (the run ended after step 0); nothing was recorded for it"]
    recorder.close()  # said once
    assert capfd.readouterr().err == ""
