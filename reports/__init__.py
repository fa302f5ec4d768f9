"""Reports of a run folder: tables, findings, plots, Markdown and HTML — every one a pure
function of the folder's stored JSON/CSV files (read through
:mod:`fusedce_profiler.instrument.store`)."""
from fusedce_reports.build import Report, build_report
from fusedce_reports.findings import Finding, compute_findings
from fusedce_reports.frame import results_frame

__all__ = ["Report", "build_report", "Finding", "compute_findings", "results_frame"]
