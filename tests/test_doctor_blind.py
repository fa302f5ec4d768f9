"""``doctor`` on blind cases (tests/blind_doctor/: models and wrappers written without its code),
each the regression test of a verdict it once got wrong:

- a Hugging Face GPT-2 in training mode (dropout 0.1) with a correct wrapper: the reference and
  the wrapper drew different dropout masks, and the gradients differed (a false alarm in fp32);
- a correct wrapper that ``torch.compile``s its loss call: the doctor's call recorder met AOT
  autograd's fake tensors and ended the run;
- ``ignore_index=0`` with padding labelled 0: real tokens 0 dropped, unseen while the batch held no
  labelled 0 (then blamed on the shift);
- label smoothing asked by the config and left out: invisible in the value at a uniform
  prediction, and a mean over padding on that model blamed on the options instead of the reduction.

Every other blind case runs too, in one of its modes. Each (but the compiled one: one observed
call, where the whole job recompiles for a minute) runs the doctor job in this process (the
worker's code path without the worker) on the CPU. Both modes of every case are tabulated by
``python -m tests.blind_doctor.run_table`` (benchmarks/results/doctor-blind-cpu-2026-12-03/).
"""
from __future__ import annotations

import pytest

from fusedce_profiler.judgements.doctor.job import run_doctor_job
from tests.blind_doctor.cases import CASES, case

REGRESSIONS = [
    ("hf_gpt2/correct_slice", "fp32"),
    ("plain_gpt/buggy_ignore_zero", "fp32"),
    ("hf_llama_smoothed/buggy_smoothing_forgotten", "amp-bf16"),
    ("hf_llama_smoothed/buggy_mean_with_padding", "fp32"),
    ("hf_llama_smoothed/correct_collator", "amp-bf16"),
]


#: Besides: every other case in one mode (alternating; the compiled wrapper by the test below); the
#: whole table, both modes, is benchmarks/results/doctor-blind-cpu-2026-12-03/.
SWEEP = [(c.name, c.modes[i % len(c.modes)]) for i, c in enumerate(CASES) if c.wrapper != "correct_compiled"]


@pytest.mark.parametrize(("name", "mode"), REGRESSIONS + [s for s in SWEEP if s not in REGRESSIONS])
def test_doctor_judges_blind_case(name, mode):
    pytest.importorskip("transformers")
    blind = case(name)
    reply = run_doctor_job({"loss": blind.loss_spec, "model": blind.model_spec, "device": "cpu", "mode": mode,
                            "compile_backend": None})
    assert reply["ok"] == "run", reply
    checks = reply["run"]["checks"]
    failed = [c["key"] for c in checks if c["verdict"] == "fail"]
    exit_code = 1 if failed else 0
    assert blind.judged_right(exit_code, failed), (blind.truth, [(c["key"], c["verdict"], c["evidence"][:200])
                                                                 for c in checks if c["verdict"] != "pass"])


def test_compiled_wrapper_is_observed_without_ending_the_run():
    """The loss call compiled with AOT autograd: the call recorder lets its fake tensors pass."""
    from fusedce_profiler.instrument.models.options import source_from_options
    from fusedce_profiler.judgements.doctor.doctor import make_batch
    from fusedce_profiler.judgements.doctor.observe import find_landmarks, observe
    from tests.blind_doctor.wrappers import correct_compiled, correct_slice

    blind = case("tied_gpt/correct_compiled")
    built = source_from_options(None, None, None, blind.model_spec, None, None, "tiny").build("cpu", seed=0)
    batch = make_batch(built.head.info.vocab)
    landmarks = find_landmarks(built, batch["input_ids"], "fp32")
    compiled = observe(built, landmarks, correct_compiled, batch, "fp32")
    eager = observe(built, landmarks, correct_slice, batch, "fp32")
    assert compiled.error is None and compiled.seen == []
    assert abs(compiled.loss - eager.loss) <= 1e-5 * abs(eager.loss)
