"""Reports of a run folder: tables, findings, plots, Markdown and HTML — every one a pure
function of the folder's stored JSON/CSV files (read through
:mod:`fusedce_profiler.instrument.store`).

The names below are imported on first use: a command that only formats a number or a line
(``units``, ``tables``) does not import matplotlib or pandas with them."""
__all__ = ["Report", "build_report", "Finding", "compute_findings", "results_frame"]

_LAZY = {"Report": "fusedce_reports.build", "build_report": "fusedce_reports.build",
         "Finding": "fusedce_reports.findings", "compute_findings": "fusedce_reports.findings",
         "results_frame": "fusedce_reports.frame"}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'fusedce_reports' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
