"""Exit codes of ``fusedce-profile`` (also listed in ``fusedce-profile --help``)."""

OK = 0
"""Every cell ran or was recorded (OOM cells are results, not failures) and parity held."""

PARITY_FAILED = 1
"""At least one cell's relative error exceeded its mode's tolerance (``profiler.tolerances``)."""

BAD_INPUT = 2
"""Bad usage or input: unknown option or back-end, bad grid value, unreadable config file,
an output folder that is not empty without ``--force`` / ``--resume``."""

INTERRUPTED = 130
"""Ctrl-C (SIGINT) stopped the run; the finished cells are kept and reported (the shell's
convention, 128 + SIGINT)."""

TERMINATED = 143
"""SIGTERM stopped the run (128 + SIGTERM); handled like Ctrl-C: the finished cells are kept
and reported."""
