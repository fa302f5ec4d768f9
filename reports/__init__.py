"""Reports of a profiler run: tables, findings, plots, Markdown and HTML, all pure functions
of the run folder's ``results.jsonl`` (and snapshots)."""
from reports.build import Report, build_report, read_results
from reports.findings import Finding, compute_findings
from reports.frame import results_frame
from reports.tolerances import TOLERANCES, ParityVerdict, parity_verdict, tolerance_for

__all__ = [
    "Report", "build_report", "read_results", "Finding", "compute_findings", "results_frame",
    "TOLERANCES", "ParityVerdict", "parity_verdict", "tolerance_for",
]
