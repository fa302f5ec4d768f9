"""A user back-end (``package.module:callable``) checked before a run, in a worker, never in the
process that runs the command.

Checking that a back-end can be used means importing its module (which runs the module's own
top-level code: it may call ``sys.exit``, ``os._exit``, ``argparse``, hang or allocate without end)
and reading the callable's signature (a class is instantiated to read its ``__call__``). Both
happen in a throw-away worker (:class:`~fusedce_profiler.instrument.worker.Worker`) under a time
limit and the worker's memory guard, so a module that ends its process ends that worker only and
is named:

- the module is not found, has no such attribute, is not callable, raises an exception while it is
  imported, or the callable cannot be called ``fn(hidden, weight, target, bias)``: a problem
  message (the caller's usage error, exit 2);
- the module or the class's constructor calls ``sys.exit`` (any code), ends the worker
  (``os._exit``, a signal), does not finish within the time limit or grows past the memory guard:
  :class:`~fusedce_profiler.instrument.callables.CallableFailed` (exit 1).

Public API: :func:`user_backend_problems` (the caller's side: one worker for all the names, the
first that ends the check named), :func:`check_job` (the worker's ``check-backend`` job).
"""
from __future__ import annotations

from pathlib import Path

from fusedce_profiler.instrument.callables import CallableFailed, what_it_raised
from fusedce_profiler.instrument.scratch import scratch_folder

CHECK_TIMEOUT_S = 120.0
"""How long importing a back-end's module and reading its signature may take."""


def _ended_with(exc: BaseException) -> str:
    told = what_it_raised(exc)
    return told if isinstance(exc, SystemExit) else f"raised {told}"


def check_job(payload: dict) -> dict:
    """The worker's ``check-backend`` job. ``payload``: ``name`` (``package.module:callable``) and
    ``option`` (how the command line spells it). Reply: ``{"problem": message or None}``, or
    ``{"failed": message}`` when the user's code ended the check (see the module docstring)."""
    import inspect

    from fusedce_profiler.instrument.backends.user import UserBackend
    from fusedce_profiler.instrument.callables import callable_problem, load_callable

    name, option = payload["name"], payload["option"]
    stage = "importing it"
    try:
        problem = callable_problem(name, option) or UserBackend(name).signature_problem(option)
        if problem is None:
            obj = load_callable(name, option)
            if inspect.isclass(obj):  # its constructor is user code every cell will run
                stage = f"making it ({obj.__name__}())"
                obj()
    except BaseException as exc:  # noqa: BLE001 - sys.exit or KeyboardInterrupt at import; a constructor's error
        return {"failed": f"{option} {name}: {stage} {_ended_with(exc)}"}
    return {"problem": problem}


def _checked(raw: object) -> str | None | CallableFailed:
    """The ``check-backend`` job's reply (:func:`check_job`): the problem (``None``: none), or the
    failure to raise; ``ValueError`` for a reply of another shape."""
    if isinstance(raw, dict) and isinstance(raw.get("failed"), str):
        return CallableFailed(raw["failed"])
    if isinstance(raw, dict) and "problem" in raw and (raw["problem"] is None or isinstance(raw["problem"], str)):
        return raw["problem"]
    raise ValueError("neither a problem nor a failure")


def user_backend_problems(names: list[str], option: str = "--backend", *, timeout_s: float | None = None,
                          memory_bytes: int | None = None) -> dict[str, str | None]:
    """Why each user back-end of ``names`` cannot be used (``None`` where it can), checked one
    after another, each in a worker of its own (its import may alter the process: the next
    back-end's check must not run there) within ``timeout_s`` (default :data:`CHECK_TIMEOUT_S`);
    :class:`CallableFailed` (one line naming it) for the first whose own code ends the check."""
    from fusedce_profiler.instrument.worker import JobFailed, Worker, WorkerDied, default_max_rss_bytes, run_stopped_by

    memory = default_max_rss_bytes() if memory_bytes is None else memory_bytes
    timeout_s = CHECK_TIMEOUT_S if timeout_s is None else timeout_s
    problems: dict[str, str | None] = {}
    with scratch_folder("check") as scratch:  # a kill -9 leaves it to the next one
        worker = None
        try:
            for name in names:
                worker = Worker.kept_for(worker, name)  # a user back-end's worker is its own
                if worker is None:
                    worker = Worker(Path(scratch) / "logs", preload=("check-backend",))
                try:
                    reply = worker.call("check-backend", {"name": name, "option": option}, timeout_s,
                                        max_rss_bytes=memory, read=_checked, tenant=name)
                except WorkerDied as died:
                    if died.at_start:  # before the back-end was imported: no fault of it (exit 3)
                        raise run_stopped_by(died, log_kept=False) from None
                    raise CallableFailed(_died_message(f"{option} {name}", died, timeout_s, memory)) from None
                except JobFailed as failed:
                    raise CallableFailed(f"{option} {name}: the check failed in its worker: {failed.cause}") from None
                if isinstance(reply, CallableFailed):
                    raise CallableFailed(_naming(str(reply), option, name))
                problems[name] = None if reply is None else _naming(reply, option, name)
        finally:
            if worker is not None:
                worker.close()
    return problems


def _naming(message: str, option: str, name: str) -> str:
    """``message`` beginning with the option and the back-end it is about (as the check job writes
    it; a reply the back-end's own code wrote may not)."""
    return message if message.startswith(f"{option} {name}: ") else f"{option} {name}: {message}"


def _died_message(what: str, died, timeout_s: float, memory: int) -> str:
    if died.timed_out:
        return f"{what}: importing it did not finish within {timeout_s:g} s"
    if died.over_memory:
        return f"{what}: importing it grew past the memory limit of {memory / 2**30:.3g} GiB; the worker was stopped"
    return f"{what}: importing it ended the worker that checked it ({died.reason})"
