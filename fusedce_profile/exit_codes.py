"""Exit codes of ``fusedce-profile`` (also listed in ``fusedce-profile --help``)."""

OK = 0
"""Every cell ran or was recorded (OOM cells are results, not failures) and parity held."""

PARITY_FAILED = 1
"""A check failed: a cell's relative error exceeded its mode's tolerance (``fusedce_profiler.instrument.tolerances``;
a NaN loss or gradient is a failure), a doctor check failed, a named back-end failed in
every cell (or job) of the run, every job of a ``model`` run failed, torch's own ``parity`` curve did not train, or a
``--model`` factory failed (raised, exited, hung, or outgrew its memory guard)."""

CHECK_FAILED = PARITY_FAILED

BAD_INPUT = 2
"""Bad usage or input, said in one line before anything is measured: unknown option, a
back-end that is not installed or cannot be imported, a device this machine has not, bad
grid value, unreadable config file, a model too large for the device, an output folder that
is not empty without ``--force`` / ``--resume`` or that another run holds; and a run folder
that cannot be written (the path and the OS error are named; ``--resume`` continues)."""

RUN_FAILED = 3
"""The run could not go on: its worker process died at start-up (the message names what
died and its log), or the command itself could not import a library or ran out of memory (one line,
``fusedce_cli/entry.py``). No check was made; the cells finished before are kept and reported. It wins
over :data:`CHECK_FAILED`: a back-end that "failed in every cell" of a run that stopped was not
given them all."""

INTERRUPTED = 130
"""Ctrl-C (SIGINT) stopped the run; the finished cells are kept and reported (the shell's
convention, 128 + SIGINT)."""

TERMINATED = 143
"""SIGTERM stopped the run (128 + SIGTERM); handled like Ctrl-C: the finished cells are kept
and reported."""

HUNG_UP = 129
"""SIGHUP stopped the run (128 + SIGHUP: the terminal it ran in was closed); handled like SIGTERM."""
