"""Reports of a run folder: tables, findings, plots, Markdown and HTML — every one a pure
function of the folder's stored JSON/CSV files (read through :mod:`profiler.store`)."""
from reports.build import Report, build_report
from reports.findings import Finding, compute_findings
from reports.frame import results_frame

__all__ = ["Report", "build_report", "Finding", "compute_findings", "results_frame"]
