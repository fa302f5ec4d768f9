"""The frontier run as one figure: a panel per case, every implementation at (peak extra, median time).

Reads a run's ``frontier.jsonl`` (:mod:`benchmarks.frontier`; several: a run split over processes) and
draws it with the report's frontier plot (:func:`fusedce_reports.plots.frontier.draw_frontier`, a panel
for every case and token count): the Pareto set ringed and joined, points that failed parity hollow, the
gradient floor dashed. A pure function of the stored cells, so the committed figure is rebuilt without a GPU::

    python3 benchmarks/frontier_plot.py benchmarks/results/<run>/frontier/frontier.jsonl [more.jsonl] -o frontier.png

Exit status 0; 2 when a file is missing, is not a frontier run's records, or none holds a measured cell.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.frontier_goals import read_cases
from fusedce_reports.figures import save_figure
from fusedce_reports.frame import results_frame
from fusedce_reports.plots.frontier import draw_frontier
from fusedce_reports.plots.style import DPI, styled


def plot_run(jsonl: list[Path], png: Path) -> Path | None:
    """Draw every case of the ``jsonl`` files into ``png``; ``None`` (nothing written) when no cell was measured
    (cells that failed, ran out of memory or were skipped are kept: the plot says which)."""
    cells = [cell for one in jsonl for case in read_cases(one).values() for cell in case]
    figure = styled(draw_frontier)(results_frame(cells), every_size=True) if cells else None
    return None if figure is None else save_figure(figure, png, dpi=DPI)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Draw a frontier run's cells as one time–memory figure.")
    parser.add_argument("jsonl", type=Path, nargs="+", help="the run's frontier.jsonl (benchmarks/frontier.py)")
    parser.add_argument("-o", "--output", type=Path, required=True, help="the PNG to write")
    args = parser.parse_args(argv)
    missing = [str(path) for path in args.jsonl if not path.is_file()]
    if missing:
        print(f"frontier_plot.py: jsonl: {', '.join(missing)} is not a file (expected a run's frontier.jsonl)",
              file=sys.stderr)
        return 2
    try:
        written = plot_run(args.jsonl, args.output)
    except (ValueError, KeyError, TypeError) as exc:  # a line that is not a frontier record
        print(f"frontier_plot.py: jsonl: not a frontier run's records ({type(exc).__name__}: {exc})", file=sys.stderr)
        return 2
    if written is None:
        print(f"frontier_plot.py: jsonl: {', '.join(map(str, args.jsonl))} holds no measured cell", file=sys.stderr)
        return 2
    print(f"wrote {written}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
