"""The command line's terminal output: the public API's (:mod:`fusedce_profile.console`)."""
from fusedce_profile.console import CellProgress, error, make_console, summary_tables

__all__ = ["CellProgress", "error", "make_console", "summary_tables"]
