"""Exit codes of ``fusedce-profile``: the public API's (:mod:`fusedce_profile.exit_codes`)."""
from fusedce_profile.exit_codes import (BAD_INPUT, CHECK_FAILED, HUNG_UP, INTERRUPTED, OK, PARITY_FAILED, RUN_FAILED,
                                        TERMINATED)

__all__ = ["BAD_INPUT", "CHECK_FAILED", "HUNG_UP", "INTERRUPTED", "OK", "PARITY_FAILED", "RUN_FAILED", "TERMINATED"]
