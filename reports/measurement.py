"""The "how it was measured" text of a report, shared by the Markdown and HTML pages.

Each entry is (term, one sentence). The sentences describe the protocol the profiler
follows (:mod:`fusedce_profiler.instrument.protocol`) and which figure of memory the tables report.
"""
from __future__ import annotations

import pandas as pd

GPU_MEMORY = (
    ("allocated (reported)",
     "Bytes of live tensors per PyTorch's caching allocator (`torch.cuda.max_memory_allocated`); "
     "each cell's peak is taken over a baseline measured with its inputs alive after a warm-up "
     "step, so it is the loss's own extra memory, gradients included."),
    ("reserved",
     "What the caching allocator holds from the driver: allocated plus cached free blocks, kept "
     "at its high-water mark until `torch.cuda.empty_cache()`; it is in `results.csv`, not in "
     "the tables."),
    ("nvidia-smi",
     "Reserved plus the CUDA context and every other process on the GPU: the number users "
     "usually quote, and the least precise, so it is not used here."),
)

CPU_MEMORY = (
    ("CPU accounting",
     "On the CPU the peak is PyTorch's own accounting of CPU tensor allocations during the step "
     "(the profiler's memory events), over the same kind of baseline; it is not comparable with "
     "GPU figures."),
)

COLUMNS = (
    ("peak extra", "Peak over the baseline during one forward + backward of the loss."),
    ("× floor",
     "Peak extra divided by the floor: the bytes of the gradients that must exist at the end "
     "(grad hidden N·H in the hidden dtype + grad weight V·H, and grad bias V, in the weight dtype)."),
    ("predicted", "The analytic memory model's prediction of the peak for that back-end's design."),
    ("saving vs torch", "The `torch` back-end's peak minus this back-end's, and its share of torch's peak."),
    ("time", "Median of several forward + backward calls after the warm-up (CUDA events on a GPU)."),
    ("parity",
     "The largest relative error ‖x − x_ref‖ / ‖x_ref‖ of the loss and the gradients against an "
     "fp32 reference computed in chunks, ✓ within the mode's tolerance, ✗ beyond it."),
)


def memory_terms(frame: pd.DataFrame) -> tuple[tuple[str, str], ...]:
    """The memory sentences that apply to the run in ``frame`` (GPU, CPU or both)."""
    sources = set(frame["memory_source"]) if not frame.empty else set()
    terms: tuple[tuple[str, str], ...] = ()
    if sources - {"cpu-profiler"} or not sources:
        terms += GPU_MEMORY
    if "cpu-profiler" in sources:
        terms += CPU_MEMORY
    return terms
