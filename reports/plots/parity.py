"""The parity plot of a grid report: every cell's relative errors against the fp32 reference.

:func:`draw_parity` returns the figure: one panel per precision mode, a scatter per
(back-end, quantity) with the ``gid`` ``<back-end>:<column>`` (``fusedce:err_loss``), the
mode's tolerance as a dashed line (``gid`` ``tolerance``). :func:`plot_parity` writes it.
"""
from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from fusedce_reports.escape import plot_text
from fusedce_reports.palette import backend_style, ordered
from fusedce_reports.plots.style import legend, panels, saved, styled
from fusedce_reports.units import format_error

QUANTITIES = (("err_loss", "loss", "o"), ("err_grad_hidden", "grad hidden", "s"),
              ("err_grad_weight", "grad weight", "^"), ("err_grad_bias", "grad bias", "D"))
"""(frame column, legend label, marker) of each relative error drawn."""


@styled
def draw_parity(frame: pd.DataFrame) -> Figure | None:
    """Relative error vs the fp32 reference of every cell, per back-end and quantity, one
    panel per precision mode, with that mode's tolerance as a dashed line. Exact zeros are
    drawn at a quarter of the smallest non-zero error (the axis is logarithmic)."""
    checked = frame[frame["status"] == "ok"]
    present = [(col, label, marker) for col, label, marker in QUANTITIES if checked[col].notna().any()]
    if checked.empty or not present:
        return None
    backends = ordered(checked["backend"])
    modes = list(dict.fromkeys(checked["mode"]))
    fig, axes = panels(len(modes), "Parity: relative error vs the fp32 reference (every cell)")
    errors = checked[[col for col, _, _ in present]].to_numpy(float)
    positive = errors[errors > 0]
    floor = positive.min() / 4 if positive.size else 1e-8
    for ax, mode in zip(axes, modes):
        rows = checked[checked["mode"] == mode]
        width = 0.8 / len(present)
        for i, backend in enumerate(backends):
            own = rows[rows["backend"] == backend]
            style = backend_style(backend, backends)
            for k, (col, _, marker) in enumerate(present):
                values = own[col].dropna().clip(lower=floor)
                centre = i - 0.4 + width * (k + 0.5)
                x = centre + np.linspace(-width / 4, width / 4, len(values)) if len(values) > 1 \
                    else np.full(len(values), centre)
                ax.scatter(x, values, color=style["color"], marker=marker, s=22, zorder=3, edgecolors="none",
                           gid=f"{backend}:{col}")
        tolerance = rows["tolerance"].iloc[0]
        ax.axhline(tolerance, color="#d62728", linestyle="--", linewidth=1.2, gid="tolerance")
        ax.annotate(f"tolerance {format_error(tolerance)}", (1.0, tolerance), xycoords=("axes fraction", "data"),
                    xytext=(-4, 3), textcoords="offset points", ha="right", fontsize=8, color="#d62728")
        ax.set_yscale("log")
        ax.set_xticks(range(len(backends)), [plot_text(b) for b in backends],
                      rotation=20 if len(backends) > 4 else 0)
        ax.set_xlim(-0.6, len(backends) - 0.4)
        ax.set_ylabel("relative error")
        ax.set_title(mode)
        ax.grid(axis="x", visible=False)
    handles = [Line2D([], [], color="#555555", marker=marker, linestyle="none", label=label)
               for _, label, marker in present]
    if (errors == 0).any():
        handles.append(Line2D([], [], color="none", label=f"exact 0 drawn at {format_error(floor)}"))
    legend(fig, handles)
    return fig


plot_parity = saved(draw_parity)
