"""How a recording says that it cannot record: a warning that never ends the training it watches.

Profiling never stops training, and a recording's trouble (a folder held or unwritable, a disk that
fills, a step that raised) is said as a ``RuntimeWarning``. Under a filter that turns warnings into
exceptions (``-W error``, pytest's ``filterwarnings = ["error"]``) ``warnings.warn`` raises, inside the
training loop's hooks; there the line goes to standard error instead.
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
        print(message, file=sys.stderr, flush=True)
