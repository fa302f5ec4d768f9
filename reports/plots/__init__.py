"""PNG plots of a results frame, sized for GitHub's ~900 px column.

Every plot is a pair: ``draw_x(frame)`` returns the matplotlib ``Figure`` (``None`` when
the frame holds nothing to draw, e.g. no timed cells) and ``plot_x(frame, path)`` writes it
as a PNG and returns the path. Modules: :mod:`~fusedce_reports.plots.memory` (peak, saving,
heatmap), :mod:`~fusedce_reports.plots.time`, :mod:`~fusedce_reports.plots.frontier`,
:mod:`~fusedce_reports.plots.parity`; what they share is in :mod:`~fusedce_reports.plots.style`. The model
mode's bars, of a list of results rather than a frame, are :mod:`~fusedce_reports.plots.model`
(imported from there).
"""
from fusedce_reports.plots.frontier import draw_frontier, plot_frontier
from fusedce_reports.plots.memory import (draw_peak_memory, draw_saving, draw_saving_heatmap, plot_peak_memory, plot_saving,
                                  plot_saving_heatmap)
from fusedce_reports.plots.parity import draw_parity, plot_parity
from fusedce_reports.plots.time import draw_time, plot_time

__all__ = [
    "draw_frontier", "draw_parity", "draw_peak_memory", "draw_saving", "draw_saving_heatmap", "draw_time",
    "plot_frontier", "plot_parity", "plot_peak_memory", "plot_saving", "plot_saving_heatmap", "plot_time",
]
