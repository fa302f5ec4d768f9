"""What a step recorded inside the user's own training loop stores: plain, JSON-ready records.

One :class:`RecordedStep` per recorded step, appended to the run folder's
``recorded_steps.jsonl`` (:data:`fusedce_profiler.instrument.store.RECORDED_STEPS_FILE`) as the step ends; the
reports (``fusedce-profile report DIR``) are a pure function of those lines, the
``snapshots/*.timeline.json`` files and ``environment.json``.

Byte counts are absolute (what the allocator counts, not "over a baseline") unless a field
says otherwise; ``None`` means "not measurable here" (reserved bytes and device use on the CPU).

Public API: :class:`PhaseMemory`, :class:`EvalPass`, :class:`RecordedStep`,
:func:`append_recorded_step`, :func:`load_recorded_steps`.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

from fusedce_profiler.instrument import confined, store
from fusedce_profiler.instrument.models.head import HeadInfo
from fusedce_profiler.instrument.schema import build, checked_fields
from fusedce_profiler.instrument.tracing.attribution import Attribution

#: The phases a recorded step is split into, in order (any may be missing: see RecordedStep).
PHASES = ("forward", "loss", "backward", "optimizer")


@dataclass
class PhaseMemory:
    """One phase of a recorded step (bytes).

    ``start_allocated`` / ``end_allocated``: live tensor bytes when the phase began / ended;
    ``peak_allocated``: the most in between. ``peak_reserved``: the caching allocator's
    reserved high-water mark within the phase (CUDA); ``device_used_end``: bytes in use on the
    whole device when the phase ended (``cudaMemGetInfo``: what ``nvidia-smi`` shows for a lone
    process).
    """

    name: str
    start_allocated: int
    end_allocated: int
    peak_allocated: int
    peak_reserved: int | None = None
    device_used_end: int | None = None


@dataclass
class EvalPass:
    """An evaluation pass (Lightning's sanity check or validation, Hugging Face's evaluation)
    seen by a callback, with the allocator's reserved bytes around it (CUDA; ``None`` on the CPU).

    ``before_step``: the number of optimizer steps completed when it ran (a pass with
    ``before_step`` ≤ N ran before recorded step N). ``reserved_*``: ``memory_reserved()``
    (what the cache holds: it only grows unless ``empty_cache()`` is called);
    ``max_reserved_*``: ``max_memory_reserved()`` (the high-water mark).
    """

    kind: str
    before_step: int
    reserved_before: int | None = None
    reserved_after: int | None = None
    max_reserved_before: int | None = None
    max_reserved_after: int | None = None

    @property
    def raised_reserved(self) -> int | None:
        """Bytes the pass added to the allocator's reserved memory (``None`` on the CPU)."""
        if self.reserved_before is None or self.reserved_after is None:
            return None
        return self.reserved_after - self.reserved_before


@dataclass
class RecordedStep:
    """One training step recorded inside the user's loop (see :mod:`fusedce_profiler.instrument.recording`).

    - ``step``: the step's index (0-based: Lightning's and Hugging Face's ``global_step``
      when it began, or the recorder's own count); ``label``: the user's name for the run
      (e.g. ``"fused"``); ``fused``: what the user expects of the loss (``True``: a fused
      loss, ``False``: the naive one, ``None``: not said) — it only changes the wording of
      the logits verdict.
    - ``phases``: :class:`PhaseMemory` in the order they began. ``forward`` starts when the step
      starts, ``loss`` when the final norm's output or the LM head's input is reached (or the
      model's forward returns), ``backward`` when ``backward()`` is called, ``optimizer`` when
      an optimizer's ``step()`` begins; explicit marks override. A phase never reached is absent.
    - ``peak_allocated`` in ``peak_phase``; ``baseline_allocated``: live bytes when the step
      began; ``parameters``, ``gradients_at_start``, ``optimizer_state``: those tensors' bytes.
    - ``reserved_at_start``: ``memory_reserved()`` when the step began (the cache that earlier
      steps and evaluation passes left); ``max_reserved_before``: ``max_memory_reserved()``
      then; ``peak_reserved``: the reserved high-water mark within the step; ``device_used``:
      device bytes in use after the step; ``context`` = ``device_used`` − reserved then (CUDA
      context, kernels); ``smi_peak`` = ``context`` + ``peak_reserved`` (``nvidia-smi`` at the
      step's high-water mark).
    - ``batch``, ``seq``, ``tokens``: the shapes of the step's input ids (or as given);
      ``vocab``, ``hidden``: the LM head's; ``autocast``: the autocast dtype active when the loss
      phase began (``"bf16"``, ``"fp16"`` or ``None``); ``parameter_dtype``.
    - ``head``: the located head (:class:`~fusedce_profiler.instrument.models.head.HeadInfo` as a dict) or
      ``None``; ``head_called``: whether the head module's forward ran in this step.
    - ``attribution``: the traced peak by module and kind with the logits detector
      (:class:`fusedce_profiler.instrument.tracing.attribution.Attribution`), ``None`` when not traced; ``snapshot`` /
      ``timeline``: paths, relative to the run folder, of the allocator snapshot (pickle, for
      PyTorch's viewer) and of its timeline JSON (CUDA with ``snapshot=True``).
    - ``passes_before``: the evaluation passes that ran before this step; ``loss``: the step's
      loss when the integration saw it; ``notes``: sentences about anything unusual.
    """

    step: int
    label: str
    model: str
    device: str
    source: str
    phases: list[PhaseMemory]
    peak_allocated: int
    peak_phase: str
    baseline_allocated: int
    parameters: int
    gradients_at_start: int
    optimizer_state: int | None
    time_ms: float
    batch: int = 0
    seq: int = 0
    tokens: int = 0
    vocab: int | None = None
    hidden: int | None = None
    autocast: str | None = None
    parameter_dtype: str | None = None
    fused: bool | None = None
    reserved_at_start: int | None = None
    max_reserved_before: int | None = None
    peak_reserved: int | None = None
    device_used: int | None = None
    context: int | None = None
    smi_peak: int | None = None
    head: dict | None = None  # a :class:`~fusedce_profiler.instrument.models.head.HeadInfo`
    head_called: bool = False
    attribution: Attribution | None = None
    snapshot: str | None = None
    timeline: str | None = None
    passes_before: list[EvalPass] = field(default_factory=list)
    loss: float | None = None
    notes: list[str] = field(default_factory=list)

    def phase(self, name: str) -> PhaseMemory | None:
        return next((p for p in self.phases if p.name == name), None)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, raw: dict) -> "RecordedStep":
        """Validate a stored line (``ValueError`` naming what is wrong; every field checked
        against its type by :func:`fusedce_profiler.instrument.schema.build`; ``head`` as a
        :class:`~fusedce_profiler.instrument.models.head.HeadInfo`)."""
        if isinstance(raw, dict):
            unknown = sorted(set(raw) - {f.name for f in dataclasses.fields(cls)})
            if unknown:
                raise ValueError(f"unknown fields {unknown}")
        step = build(cls, raw)
        if step.step < 0:  # a 0-based index of the training loop
            raise ValueError(f"step must be at least 0, got {step.step}")
        if step.head is not None:
            step.head = checked_fields(HeadInfo, step.head, "head")
        return step


def append_recorded_step(folder: str | Path, record: RecordedStep, stored: int | None = None) -> Path:
    """Append ``record`` to the folder's ``recorded_steps.jsonl`` (flushed and fsync'ed).

    ``stored``: how many lines the file holds already (counted when ``None``). A file that holds
    :data:`~fusedce_profiler.instrument.capacity.MAX_RECORDED_STEPS` lines (across all the
    sessions that appended to it) or would pass its size limit takes no more:
    :class:`~fusedce_profiler.instrument.store.FileFull` naming the file. A folder that is a symbolic link
    is refused (:class:`~fusedce_profiler.instrument.confined.FolderRefused`) before anything is read or written."""
    from fusedce_profiler.instrument.capacity import MAX_RECORDED_STEPS

    path = Path(folder) / store.RECORDED_STEPS_FILE
    confined.check_folder(folder)  # replaced or moved since it was taken: never written through, nothing made
    store.cut_partial_line(path)
    stored = store.count_lines(path) if stored is None else stored
    if stored >= MAX_RECORDED_STEPS:
        raise store.FileFull(f"{path}: full: it holds {stored:,} recorded steps, the most a folder holds; "
                             "record into a new folder")
    store.append_jsonl(path, record.to_dict())
    return path


def load_recorded_steps(folder: str | Path) -> store.Loaded[RecordedStep]:
    """Every readable line of the folder's ``recorded_steps.jsonl`` (damaged lines reported)."""
    return store.read_jsonl(Path(folder) / store.RECORDED_STEPS_FILE, RecordedStep.from_dict)
