"""How a recording says that it cannot record: a warning that never ends the training it watches.

Profiling never stops training, and a recording's trouble (a folder held or unwritable, a disk that
fills, a step that raised) is said as a ``RuntimeWarning``. Under a filter that turns warnings into
exceptions (``-W error``, pytest's ``filterwarnings = ["error"]``) ``warnings.warn`` raises, inside the
training loop's hooks; there the line goes to standard error instead. A standard error that cannot be
written (a full disk, the closed pipe of a ``| tee`` that ended) drops the line, as Python's own
warnings do.
"""
from __future__ import annotations

import sys
import warnings


def notice(message: str, stacklevel: int = 2) -> None:
    """``warnings.warn(message, RuntimeWarning)`` as seen from the caller's caller (``stacklevel`` as
    for ``warnings.warn`` called where this is); printed to standard error when the warning is made
    an exception."""
    try:
        warnings.warn(message, RuntimeWarning, stacklevel=stacklevel + 1)
    except Warning:
        to_stderr(message)


def to_stderr(line: str) -> None:
    """``line`` on standard error, or nowhere when it cannot be written (no stream, a full disk, a
    closed pipe): the training goes on either way."""
    try:
        print(line, file=sys.stderr, flush=True)
    except (OSError, ValueError, AttributeError):  # ValueError: a closed stream; AttributeError: sys.stderr None
        pass
