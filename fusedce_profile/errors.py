"""Errors the public API raises; the command line maps each to its exit code: :class:`UsageError`
(2), :class:`RunStopped` (3)."""


class UsageError(ValueError):
    """Bad input, said in one line naming the argument and what was expected (exit 2)."""



from fusedce_profiler.instrument.worker_errors import RunStopped  # noqa: E402,F401 - defined with the worker
