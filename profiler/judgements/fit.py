"""``--fit``: the largest batch (or sequence length) whose training step fits a memory limit.

:func:`largest_fitting` is the search, independent of how a probe is run: from a starting
guess it gallops (steps 1, 2, 4, ...) up while probes fit, or down while they do not, then
bisects between the last value that fitted and the first that did not. A good guess costs
two probes; a poor one O(log n). It assumes fitting is monotone (if ``n`` fits, every
smaller ``n`` fits), which holds for memory up to allocator fragmentation.
:func:`predicted_start` makes the guess from one measured step (memory grows about linearly
in B and T); :func:`fit_backend` runs each probe as a
:class:`~fusedce_profiler.instrument.step.jobs.ModelJob` through ``runner`` (in the CLI: a fresh worker
process per probe, :func:`~fusedce_profiler.instrument.step.jobs.run_job_in_worker`) with the limit applied;
:func:`fit_backends` does that for every back-end of a run and keeps the searches in the
run's folder.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path
from dataclasses import dataclass, field
from typing import Callable

from fusedce_profiler.instrument import store
from fusedce_profiler.instrument.schema import checked_fields
from fusedce_profiler.instrument.step.jobs import ModelJob, ModelResult

FIT_AXES = ("batch", "seq")


@dataclass
class FitSearch:
    """The answer and its evidence: every probe in order, as (value, fitted)."""

    largest: int  # 0 when not even the smallest value fits
    probes: list[tuple[int, bool]] = field(default_factory=list)
    hit_maximum: bool = False  # the search stopped at ``maximum`` while still fitting


def largest_fitting(fits: Callable[[int], bool], start: int = 1, maximum: int = 1 << 16) -> FitSearch:
    """The largest ``n`` in ``[1, maximum]`` with ``fits(n)``, in O(log |n − start|) probes."""
    if start < 1 or maximum < start:
        raise ValueError(f"need 1 ≤ start ≤ maximum, got start={start}, maximum={maximum}")
    search = FitSearch(largest=0)

    def probe(n: int) -> bool:
        ok = bool(fits(n))
        search.probes.append((n, ok))
        return ok

    step = 1
    if probe(start):
        good, bad = start, None
        while bad is None:
            if good == maximum:
                search.largest, search.hit_maximum = good, True
                return search
            n = min(good + step, maximum)
            if probe(n):
                good = n
            else:
                bad = n
            step *= 2
    else:
        good, bad = 0, start
        while good == 0 and bad > 1:
            n = max(bad - step, 1)
            if probe(n):
                good = n
            else:
                bad = n
            step *= 2
    # Invariant: good fits (or is 0: nothing does), bad does not; bisect the gap.
    while bad - good > 1:
        mid = (good + bad) // 2
        if probe(mid):
            good = mid
        else:
            bad = mid
    search.largest = good
    return search


def predicted_start(measured: ModelResult, axis: str, limit_bytes: int, maximum: int) -> int | None:
    """A first guess for the search: the size at which ``measured``'s step would reach
    ``limit_bytes``, taking its memory as fixed (static bytes + CUDA context) plus a part
    proportional to ``job.<axis>``. The step's allocated peak is used, not its reserved: under
    the cap the allocator frees its cache before it gives up, so a step needs about its
    allocated peak (+ context); fragmentation makes the guess err high, and the search walks
    down from it. ``None`` when ``measured`` has no memory to go by."""
    m = measured.memory
    if measured.status != "ok" or m is None:
        return None
    fixed = m.static + (m.context or 0)
    per_unit = (m.peak - m.static) / getattr(measured.job, axis)
    if per_unit <= 0:
        return None
    return max(1, min(maximum, int((limit_bytes - fixed) // per_unit)))


@dataclass
class FitResult:
    """One back-end's fit: the search and the result of the largest fitting probe."""

    backend: str
    axis: str
    limit_bytes: int
    search: FitSearch
    best: ModelResult | None


def fit_backend(job: ModelJob, axis: str, limit_bytes: int, maximum: int,
                runner: Callable[[ModelJob], ModelResult]) -> FitResult:
    """Search the largest ``job.<axis>`` that trains under ``limit_bytes``, starting the search
    at ``job.<axis>`` (see :func:`predicted_start` for a good value); each probe is a job.

    A probe fits when its status is ``ok``; ``error`` and ``skipped`` stop the search (the
    back-end cannot run at all), reported as ``largest = 0`` with the failing result.
    """
    if axis not in FIT_AXES:
        raise ValueError(f"fit axis must be one of {FIT_AXES}, got {axis!r}")
    results: dict[int, ModelResult] = {}

    def fits(n: int) -> bool:
        probe_job = dataclasses.replace(job, memory_limit_bytes=limit_bytes, trace=False, **{axis: n})
        result = runner(probe_job)
        results[n] = result
        if result.status in ("error", "skipped"):
            raise _Unfit(result)
        return result.status == "ok"

    try:
        search = largest_fitting(fits, start=min(getattr(job, axis), maximum), maximum=maximum)
    except _Unfit as stop:
        n = getattr(stop.result.job, axis)
        return FitResult(job.backend, axis, limit_bytes, FitSearch(0, [(n, False)]), stop.result)
    return FitResult(job.backend, axis, limit_bytes, search, results.get(search.largest))


def fit_backends(base: ModelJob, backends: list[str], measured: dict[str, ModelResult], axis: str,
                 limit_bytes: int, maximum: int, runner: Callable[[ModelJob], ModelResult], folder: Path,
                 progress: Callable[[FitResult], None] | None = None) -> list[FitResult]:
    """``--fit`` for every back-end: :func:`fit_backend` for each of ``backends`` (``base``
    with that back-end), starting where ``measured[backend]``'s step says the limit is reached
    (:func:`predicted_start`; ``base.<axis>`` when it cannot tell). The searches are written
    to ``folder``'s ``fit.json`` after each back-end, so a run cut short keeps those done;
    ``progress`` is called with each back-end's result as it is found."""
    fits: list[FitResult] = []
    for name in backends:
        # A close guess costs two or three probes (each a fresh process) instead of a search
        # from base.<axis>.
        start = predicted_start(measured[name], axis, limit_bytes, maximum) or getattr(base, axis)
        job = dataclasses.replace(base, backend=name, **{axis: start})
        found = fit_backend(job, axis, limit_bytes, maximum, runner=runner)
        fits.append(found)
        save_fits(folder, fits)
        if progress is not None:
            progress(found)
    return fits


class _Unfit(Exception):
    def __init__(self, result: ModelResult) -> None:
        super().__init__(result.message)
        self.result = result


def save_fits(folder: Path, fits: list[FitResult]) -> None:
    """Write the ``--fit`` searches to the folder's ``fit.json``."""
    store.write_json(Path(folder) / store.FIT_FILE, [dataclasses.asdict(f) for f in fits])


def _best(raw: object, where: str) -> ModelResult | None:
    """A search's best row, read as a row of ``model_results.jsonl`` (``ValueError`` naming ``where``)."""
    if raw is None:
        return None
    try:
        return ModelResult.from_dict(raw)
    except ValueError as exc:
        raise ValueError(f"{where}: {exc}") from None


def load_fits(folder: Path) -> list[FitResult]:
    """The ``--fit`` searches of a folder (``[]`` when it has none); ``ValueError`` naming the file."""
    path = Path(folder) / store.FIT_FILE
    if not store.present(path):
        return []
    raw = store.read_json(path)
    fits = []
    try:
        if not isinstance(raw, list):
            raise ValueError(f"expected a list, got {type(raw).__name__}")
        for index, stored in enumerate(raw):
            values = checked_fields(FitResult, stored, f"[{index}]", nested=("best",))
            values["best"] = _best(values.get("best"), f"[{index}].best")
            fits.append(FitResult(**values))
    except ValueError as exc:
        raise ValueError(f"{path}: not a list of fit searches ({exc})") from None
    return fits
