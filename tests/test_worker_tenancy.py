"""A user back-end runs in a worker of its own: once its code ran in a worker, no other back-end's
cell, curve or step runs there (its code may have altered the process and returned normally);
the tool's own code before it may share the worker.

The grid is checked end to end in ``test_cli_faults.py`` (a back-end that replaces the worker's
cell job); here the contract of :meth:`Worker.serves` and :meth:`Worker.kept_for`, and how
parity and explain keep it."""
from __future__ import annotations

import dataclasses
import os

import pytest

from fusedce_profiler.instrument import worker as worker_module
from fusedce_profiler.instrument.worker import Worker


def test_a_worker_that_ran_a_user_backend_serves_that_backend_alone(tmp_path):
    with Worker(tmp_path / "logs") as worker:
        assert worker.serves(None) and worker.serves("mine:loss")
        worker.call("environment", timeout_s=120)  # the tool's own code: the worker stays anyone's
        assert worker.serves("mine:loss") and worker.tenant is None
        worker.call("environment", timeout_s=120, tenant="mine:loss")
        assert worker.serves("mine:loss") and not worker.serves(None) and not worker.serves("other:loss")
        with pytest.raises(RuntimeError, match="mine:loss"):
            worker.call("environment", timeout_s=120)
        assert Worker.kept_for(worker, "mine:loss") is worker
        assert Worker.kept_for(worker, "other:loss") is None
        assert not _running(worker.pid)  # closed: it runs no job of anyone's
    assert Worker.kept_for(None, "mine:loss") is None


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


class _FakeWorker:
    """Records which back-ends ran in it; answers every job with ``answer(kind, payload)``."""

    made: list["_FakeWorker"] = []
    answer = staticmethod(lambda kind, payload: None)

    def __init__(self, *args, **kwargs) -> None:
        self.tenant, self.ran, self.closed = None, [], False
        _FakeWorker.made.append(self)

    serves = Worker.serves
    kept_for = staticmethod(Worker.kept_for)

    def call(self, kind, payload=None, timeout_s=None, max_rss_bytes=None, read=None, tenant=None):
        assert self.serves(tenant) and not self.closed
        self.tenant = tenant or self.tenant
        self.ran.append(tenant)
        raw = _FakeWorker.answer(kind, payload)
        return read(raw) if read else raw

    def close(self) -> None:
        self.closed = True


@pytest.fixture
def fake_workers(monkeypatch):
    _FakeWorker.made = []
    monkeypatch.setattr(worker_module, "Worker", _FakeWorker)
    return _FakeWorker


def test_parity_trains_a_user_backends_curve_in_a_worker_of_its_own(fake_workers, tmp_path):
    from fusedce_profile.parity import _CurveTrainer
    from fusedce_profiler.judgements.parity import ParityCurve

    fake_workers.answer = staticmethod(lambda kind, payload: dataclasses.asdict(ParityCurve(payload["backend"])))
    trainer = _CurveTrainer(settings=_Settings(), log_dir=tmp_path / "logs")
    for name in ("torch", "fusedce", "mine:loss", "mine:loss", "fusedce"):
        assert trainer(name, perturbed=False).backend == name
    trainer.close()
    assert [w.ran for w in fake_workers.made] == [[None, None, "mine:loss", "mine:loss"], [None]]


@dataclasses.dataclass
class _Settings:
    steps: int = 1


def test_explain_runs_a_user_backends_steps_in_a_worker_of_their_own(fake_workers, tmp_path):
    from fusedce_profile.explain import _Runner
    from fusedce_profiler.instrument.models.configs import get_preset
    from fusedce_profiler.instrument.step.jobs import ModelJob, ModelResult

    fake_workers.answer = staticmethod(lambda kind, payload: [
        ModelResult(job=ModelJob.from_dict(payload["jobs"][0]), status="error", message="-").to_dict()])

    class Steps(dict):
        put = dict.__setitem__

    runner = _Runner(Steps(), tmp_path / "logs")
    for backend, batch in (("torch", 1), ("mine:loss", 1), ("mine:loss", 2), ("torch", 2)):
        runner.run(ModelJob(get_preset("tiny"), backend, batch, 16, device="cpu", trace=False), "calibrate")
    runner.close()
    assert [w.ran for w in fake_workers.made] == [[None, "mine:loss", "mine:loss"], [None]]


def test_a_user_backends_import_cannot_fail_the_next_ones_check(tmp_path, monkeypatch):
    """Importing a back-end's module can alter the check worker (here it replaces the tool's check
    job to blame every other back-end): each user back-end is checked in a worker of its own."""
    import textwrap

    from fusedce_profiler.instrument.backends.check import user_backend_problems

    (tmp_path / "fx_blame.py").write_text(textwrap.dedent('''
        import torch.nn.functional as F
        import fusedce_profiler.instrument.backends.check as check
        real = check.check_job
        check.check_job = lambda payload: real(payload) if "fx_blame" in payload["name"] else {
            "problem": f"{payload['option']} {payload['name']}: blamed"}

        def loss(hidden, weight, target, bias=None):
            return F.cross_entropy(F.linear(hidden, weight, bias), target)
    '''))
    (tmp_path / "fx_plain.py").write_text("from fx_blame import loss\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert user_backend_problems(["fx_blame:loss", "fx_plain:loss"]) == {"fx_blame:loss": None, "fx_plain:loss": None}
