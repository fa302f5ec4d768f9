"""One colour, marker and rank per back-end, and one colour per kind of memory, shared by
every plot and table.

Known back-ends keep the same colour in every report; others (a user's ``module:callable``)
take the remaining colours in order of their names, so a report is stable across runs. A kind
of memory (a traced kind such as "optimizer temporaries", or a part of a step's peak such as
"loss region") has one colour wherever it is drawn (:func:`kind_colour`).
"""
from __future__ import annotations

from collections.abc import Iterable

from matplotlib import colormaps

from fusedce_profiler.instrument.tracing.attribution import KINDS

KNOWN_BACKENDS = ("torch", "torch-compile", "torch-native", "fusedce", "liger", "cce")

_COLOURS = {
    "torch": "#4d4d4d",          # dark grey: the baseline
    "torch-compile": "#ff7f0e",  # orange
    "torch-native": "#9467bd",   # purple
    "fusedce": "#1f77b4",        # blue: ours
    "liger": "#2ca02c",          # green
    "cce": "#d62728",            # red
}
_SPARE_COLOURS = ("#8c564b", "#e377c2", "#17becf", "#bcbd22", "#7f7f7f", "#aec7e8")
_MARKERS = {"torch": "o", "torch-compile": "s", "torch-native": "P", "fusedce": "D", "liger": "^", "cce": "v"}
_SPARE_MARKERS = ("X", "h", "*", "<", ">", "p")


def backend_rank(name: str) -> tuple[int, str]:
    """Sort key: the known back-ends in their fixed order, then the others by name."""
    if name in KNOWN_BACKENDS:
        return (KNOWN_BACKENDS.index(name), "")
    return (len(KNOWN_BACKENDS), name)


def ordered(backends: Iterable[str]) -> list[str]:
    """Distinct back-end names in report order."""
    return sorted(set(backends), key=backend_rank)


def backend_style(name: str, all_backends: Iterable[str] = ()) -> dict:
    """Matplotlib keyword arguments (colour, marker, line width, z-order) for one back-end.

    ``all_backends`` lists every back-end of the report, so that unknown names get
    distinct spare colours.
    """
    if name in _COLOURS:
        colour, marker = _COLOURS[name], _MARKERS[name]
    else:
        others = [b for b in ordered(all_backends) if b not in _COLOURS]
        index = others.index(name) if name in others else 0
        colour = _SPARE_COLOURS[index % len(_SPARE_COLOURS)]
        marker = _SPARE_MARKERS[index % len(_SPARE_MARKERS)]
    ours = name == "fusedce"
    return {"color": colour, "marker": marker, "linewidth": 2.4 if ours else 1.6, "zorder": 3 if ours else 2}


#: Parts of a step's peak (its composition) that are not traced kinds, after :data:`KINDS`.
COMPOSITION_PARTS = ("batch", "other at step start", "activations (forward)", "activations", "loss region",
                     "backward working set")


def kind_colour(name: str):
    """The one colour of a kind of memory in every plot: traced kinds and composition parts
    share one ``tab20`` sequence, so "optimizer temporaries" is the same colour in the
    breakdown and in the attribution; an unknown name gets grey."""
    names = KINDS + tuple(p for p in COMPOSITION_PARTS if p not in KINDS)
    if name not in names:
        return "#9e9e9e"
    return colormaps["tab20"](names.index(name) % 20)
