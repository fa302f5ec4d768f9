"""``explain`` as a Python function: which configurations explain two ``nvidia-smi`` readings.

>>> from fusedce_profile.explain import explain
>>> e = explain(naive=22785, fused=22155, card=24, out="why")   # on the GPU the readings came from
>>> e.decided, e.conclusion, [h.label() for h in e.consistent]

Keyword arguments mirror ``fusedce-profile explain``'s options; ``out`` is the run folder,
written as the command writes it (``explain.json``, ``explain_steps.jsonl``, ``summary.md``,
``environment.json``, ``logs/``). Every calibration and confirmation step is appended to
``explain_steps.jsonl`` as it finishes; ``resume=True`` reuses the steps already there, and
``cache`` names a second steps file shared between explanations (same model, other readings).

**On a machine without CUDA** ``explain`` refuses (:class:`~fusedce_profile.errors.UsageError`)
unless ``device="cpu"`` is asked for explicitly; then it ranks the hypotheses by predicted
allocated peaks of the CPU steps, labelled as predictions, and never gives a "Decided" verdict:
the CPU has no allocator cache and no CUDA context, so nothing there is an ``nvidia-smi`` figure.

Ctrl-C (``KeyboardInterrupt``) stops it: what finished is kept, ``explain.json`` and
``summary.md`` are written marked *interrupted*, and the exception propagates (a worker dead at
start-up: :class:`~fusedce_profile.errors.RunStopped`, the finished steps kept).
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import stat
from collections.abc import Callable
from pathlib import Path

from fusedce_profile import arguments
from fusedce_profile.errors import UsageError
from fusedce_profile.folders import check_appendable, os_errors
from fusedce_profiler.instrument.confined import WRITE_SHARED_REFUSED, size_limit
from fusedce_profiler.instrument.store import EXPLAIN_STEPS_FILE as STEPS_FILE
from fusedce_profiler.instrument.text import count, one_line, same_command_resumed
SEQ_CANDIDATES = (512, 1024, 2048)


def _source(preset, config, hf, model, head, tied, device: str):
    """The model source of the arguments (``UsageError`` for a bad combination). A ``model``
    factory is called once, in a worker under a time limit and a memory guard
    (:func:`fusedce_profile.sources.model_source`): one that fails raises
    :class:`~fusedce_profiler.instrument.models.factory.FactoryFailed` in one line naming it."""
    from fusedce_profile.sources import model_source

    if sum(x is not None for x in (hf, model)) > 1 or (hf and (preset or config)) or (preset and config):
        raise UsageError("give one model: preset, config, hf or model (a model factory may take a preset/config)")
    return model_source(preset, config, hf, model, head, tied, "user-gpt" if device.startswith("cuda") else "tiny")


def _device(device: str | None) -> str:
    import torch

    if device is None:
        if not torch.cuda.is_available():
            raise UsageError("explain needs the GPU the readings came from (no CUDA device here); --device cpu "
                             "ranks predicted peaks of the CPU steps, with no verdict")
        return "cuda"
    if device != "cpu" and not (device.startswith("cuda") and torch.cuda.is_available()):
        raise UsageError(f"--device {device}: not a device this machine has; use cuda when a GPU is visible, or cpu")
    return device


def step_key(job) -> str:
    """The key a finished step is stored under: a hash of its job's fields."""
    return hashlib.sha1(job.key().encode()).hexdigest()


def _same_file(a: Path, b: Path) -> bool:
    """Whether ``a`` and ``b`` name one file (the same path, or two names of one file)."""
    try:
        return Path(a).resolve() == Path(b).resolve() or os.path.samefile(a, b)
    except OSError:
        return False


class StepStore:
    """Finished steps by job (``explain_steps.jsonl``: one ``{"key", "result"}`` line each, appended
    and fsync'ed as each step finishes; a cache file is read and appended the same way)."""

    def __init__(self, path: Path, cache: Path | None, resume: bool) -> None:
        from fusedce_profiler.instrument import store
        from fusedce_profiler.instrument.step.jobs import ModelResult

        if cache is not None and _same_file(cache, path):  # --cache naming the run's own steps file
            cache = None
        if resume:  # a file appended to later is refused now (a link, a hard link, a pipe), before any step runs
            check_appendable(path)
        self.path, self.cache, self._store = path, cache, store
        self.results: dict[str, ModelResult] = {}
        self.own: set[str] = set()
        def parse(row: dict) -> tuple[str, ModelResult]:
            if not isinstance(row.get("key"), str) or not isinstance(row.get("result"), dict):
                raise ValueError('expected {"key": "<step hash>", "result": {…}}')
            try:
                return row["key"], ModelResult.from_dict(row["result"])
            except (AttributeError, IndexError) as exc:  # read_jsonl names ValueError, TypeError, KeyError
                raise ValueError(str(exc)) from None

        for source, own in ((cache, False), (path if resume else None, True)):
            if source is not None and Path(source).is_file():
                loaded = store.read_jsonl(source, parse)
                if loaded.skipped:  # a step read wrong would be an explanation built on it
                    first = loaded.skipped[0]
                    what = "--resume" if own else "--cache"
                    raise UsageError(f"{what}: {source}:{first.line}: {first.reason}; not a steps file this command "
                                     "wrote (remove the line, or give another file)")
                for key, result in loaded.records:
                    self.results[key] = result
                    if own:
                        self.own.add(key)

    def get(self, key: str):
        """The stored result of ``key`` (a step that failed, an error or a time-out, is run again:
        its cause may be fixed); one taken from the cache is copied into the run's own file, so
        that its folder holds every step its explanation rests on."""
        from fusedce_profiler.instrument.records import FAILED_STATUSES

        result = self.results.get(key)
        if result is not None and result.status in FAILED_STATUSES:
            return None
        if result is not None and key not in self.own:
            self._store.append_jsonl(self.path, {"key": key, "result": result.to_dict()})
            self.own.add(key)
        return result

    def put(self, key: str, result) -> None:
        self.results[key] = result
        self.own.add(key)
        row = {"key": key, "result": result.to_dict()}
        self._store.append_jsonl(self.path, row)
        if self.cache is not None:
            self._store.append_jsonl(self.cache, row)


def _one_result(job, raw: object):
    """The ``training-steps`` job's reply to one ``job``: its :class:`ModelResult`."""
    from fusedce_profiler.instrument.step.jobs import ModelResult

    if not isinstance(raw, list) or len(raw) != 1:
        raise ValueError(f"expected a list of one result, got {type(raw).__name__}")
    return ModelResult.answering(job, raw[0])


class _Runner:
    """Jobs run one at a time in a long-lived worker (a dead worker is replaced and its job is an ``error``
    result; a user back-end's steps run in a worker of their own); stored results are reused instead of run."""

    def __init__(self, steps: StepStore, logs: Path) -> None:
        self.steps, self.logs, self.workers = steps, logs, {}

    def run(self, job, purpose: str):
        from fusedce_profiler.instrument.callables import user_backend
        from fusedce_profiler.instrument.step.jobs import ModelResult
        from fusedce_profiler.instrument.worker import JobFailed, Worker, WorkerDied, default_max_rss_bytes
        from fusedce_profiler.instrument.worker_errors import run_stopped_by

        key = step_key(job) + ("" if purpose != "repeat" else "-repeat")
        if (done := self.steps.get(key)) is not None:
            return done
        # Calibration and confirmation in separate workers: the card's cap set for a confirmation stays with
        # its process; the calibration's context and cache would count as "another process" in capped steps.
        pool = "confirm" if purpose == "confirm" else "calibrate"
        if pool == "confirm" and "calibrate" in self.workers:
            self.workers.pop("calibrate").close()
        tenant = user_backend(job.backend)  # a user back-end's steps run in a worker of their own
        self.workers[pool] = Worker.kept_for(self.workers.pop(pool, None), tenant) or Worker(self.logs)
        try:
            result = self.workers[pool].call("training-steps", {"jobs": [dataclasses.asdict(job)]}, 900,
                                             max_rss_bytes=default_max_rss_bytes(),
                                             read=lambda raw: _one_result(job, raw), tenant=tenant)
        except WorkerDied as died:
            if died.at_start:  # no later step could run either (the command line's one line, exit 3)
                raise run_stopped_by(died) from None
            self.workers.pop(pool).close()
            result = ModelResult(job=job, status="error", message=died.summary_in(self.logs.parent))
        except JobFailed as failed:  # the job raised before it could make its failure a result
            result = ModelResult(job=job, status="error", message=failed.summary_in(self.logs.parent))
        self.steps.put(key, result)
        return result

    def close(self) -> None:
        for worker in self.workers.values():
            worker.close()


@dataclasses.dataclass
class Plan:
    """What :func:`validate` settled: the observation, the model source, the first calibration
    job (the others are its variants), the families, the calibration batch sizes, the device."""

    obs: object
    source: object
    base: object
    families: list
    batches: tuple[int, ...] | None
    on_gpu: bool
    stand_in: bool
    confirm: int = 3
    cache: Path | None = None


def validate(*, naive: float, fused: float, card: float, preset: str | None = None, config: str | None = None,
             hf: str | None = None, model: str | None = None, head: str | None = None, tied: bool | None = None,
             batch: int | None = None, seq: int | None = None, seq_candidates: tuple[int, ...] = SEQ_CANDIDATES,
             attention: str | None = None, checkpointing: bool | None = None, eval_step: bool | None = None,
             fused_backend: str = "fusedce", calibration_batches: tuple[int, ...] | None = None, confirm: int = 3,
             device: str | None = None, mode: str | None = None, context_mib: float | None = None,
             fused_larger: bool = False, cache: str | Path | None = None) -> Plan:
    """Check the arguments of :func:`explain` and settle what it will measure; bad input raises
    :class:`~fusedce_profile.errors.UsageError` in one line (nothing is measured or written)."""
    from fusedce_profile.checks import check_backends
    from fusedce_profile.ranges import check_ranges
    from fusedce_profiler.instrument.step.jobs import ModelJob
    from fusedce_profiler.judgements.explain import calibration as cal
    from fusedce_profiler.judgements.explain.readings import check_observation, check_readings_are_mib, runnable_sequences
    from fusedce_profiler.judgements.explain.records import Observation

    check_ranges("explain", naive=naive, fused=fused, card=card, batch=batch, seq=seq, seq_candidates=seq_candidates,
                 calibration_batches=calibration_batches, confirm=confirm, context_mib=context_mib)
    check_backends([fused_backend], "--fused-backend")  # installed; a module:callable imported in a worker
    try:
        obs = Observation(naive, fused, card, batch=batch, seq=seq, attention=attention, tied=tied,
                          checkpointing=checkpointing, eval_step=eval_step, mode=mode or "amp-bf16",
                          fused_backend=fused_backend, context_mib=context_mib, fused_larger=fused_larger)
        check_observation(obs)
        run_device = _device(device)
        source = _source(preset, config, hf, model, head, tied, run_device)
        seqs = runnable_sequences(tuple(arguments.listed(seq_candidates, "--seq-candidates")), seq,
                                  source.config.max_position_embeddings)
        on_gpu = run_device.startswith("cuda")
        if on_gpu:
            check_readings_are_mib(obs)
        # default: 2 and 4 on the CPU (tests, small models); on a GPU 8192 and 16384 tokens per family
        batches = (tuple(arguments.listed(calibration_batches, "--calibration-batches")) if calibration_batches
                   else (None if on_gpu else (2, 4)))
        if batches is not None and len(set(batches)) < 2:
            raise ValueError("--calibration-batches needs at least two different positive batch sizes")
        if attention and attention not in source.attention_impls:
            raise ValueError(f"--attention must be one of {', '.join(source.attention_impls)}, got {attention!r}")
        base = ModelJob(source.config, "torch", 1, seqs[0], device=run_device, mode=obs.mode,
                        source=None if source.kind == "builtin" else source.to_dict(), trace=False)
    except UsageError:
        raise
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    ties = (source.config.tie_word_embeddings,) if source.kind == "user" else (False, True)
    families = cal.enumerate_families(obs, attention_impls=("eager", "sdpa"), tie_choices=ties, seq_candidates=seqs)
    return Plan(obs, source, base, families, batches, on_gpu, stand_in=source.kind == "builtin" and config is None,
                confirm=confirm, cache=_cache_file(cache))


def _cache_file(cache: str | Path | None) -> Path | None:
    """``--cache``: a steps file to read and append, or one to create in an existing folder. A link
    (symbolic or hard: the store appends only to a file with one name), a pipe or a device is refused
    before anything is measured (appending to it would fail, or block, after the calibration steps ran)."""
    if cache is None or cache == "":
        return None
    path = arguments.path(cache, "--cache")
    if os.path.islink(path):
        raise UsageError(f"--cache {path}: a symbolic link; give the steps file itself")
    if path.exists():
        info = path.stat()
        if not stat.S_ISREG(info.st_mode):
            raise UsageError(f"--cache {path}: not a regular file; give a steps file an earlier explanation wrote, "
                             "or a new file's name")
        if info.st_nlink != 1:
            raise UsageError(f"--cache {path}: {WRITE_SHARED_REFUSED}")
        if info.st_size > size_limit(path):  # what reading it would refuse, after the folder was made
            raise UsageError(f"--cache {path}: {info.st_size} bytes, over the limit of {size_limit(path)} bytes "
                             "for this kind of file")
    elif not path.parent.is_dir():
        raise UsageError(f"--cache {path}: its folder {path.parent} does not exist")
    return path


def explain(*, out: str | Path | None = None, force: bool = False, resume: bool = False,
            progress: Callable[[str], None] = lambda line: None, **options):
    """Explain the readings ``naive`` / ``fused`` (MiB) on a ``card`` GiB GPU (the arguments of
    :func:`validate`, mirroring the command's options) and return the stored
    :class:`~fusedce_profiler.judgements.explain.records.Explanation`. Bad input raises
    :class:`~fusedce_profile.errors.UsageError` before anything is measured.

    ``out`` is prepared as the command prepares ``--out`` (:func:`~fusedce_profile.folders.run_folder`:
    a new time-stamped folder when ``None``; a linked, nested, foreign or live run's folder refused;
    ``force`` replaces an earlier run's files, ``resume`` continues an explanation) and locked while
    the explanation runs."""
    from fusedce_profile.folders import run_folder

    out, (force, resume) = None if out is None else arguments.path(out, "--out"), arguments.folder_flags(force, resume)
    plan = validate(**options)  # before the folder is made
    with run_folder(out, force=force, resume=resume, kind="explain") as folder:
        return explain_plan(plan, out=folder, resume=resume, progress=progress)


def explain_plan(plan: Plan, *, out: str | Path = "fusedce-explain", resume: bool = False,
                 progress: Callable[[str], None] = lambda line: None):
    """:func:`explain` of what :func:`validate` settled (the command validates before it makes
    the folder, and a ``model`` factory is called once)."""
    from fusedce_profile.explain_run import ExplainRun

    out = arguments.path(out, "--out")
    out.mkdir(parents=True, exist_ok=True)
    run = ExplainRun(plan.obs, plan.source, plan.base, plan.families, plan.batches, out, on_gpu=plan.on_gpu,
                     confirm=plan.confirm, stand_in=plan.stand_in, progress=progress)
    with os_errors():  # a steps file that cannot be appended to; a step that cannot be stored (a full disk)
        steps = StepStore(out / STEPS_FILE, plan.cache, resume)
        if resume:
            _check_same_model(out, plan, steps)
        runner = _Runner(steps, out / "logs")
        try:
            return run.execute(runner.run)
        finally:
            runner.close()


def _measured_model(job) -> object:
    """What a calibration step measured but for what the families vary (tie, T, attention, …): the
    model's shapes and source, the device and the precision, as JSON values."""
    source = job.source
    if source is not None and source.get("kind") == "hf":
        source = {**source, "hf_config": {k: v for k, v in source["hf_config"].items() if k != "tie_word_embeddings"}}
    config = {k: v for k, v in job.config.to_dict().items() if k != "tie_word_embeddings"}
    return json.loads(json.dumps([config, source, job.device, job.mode]))


def _check_same_model(folder: Path, plan: Plan, steps: StepStore) -> None:
    """``UsageError`` when ``--resume`` would measure another model than the folder's run did (its
    model, device, precision or fused back-end): none of the folder's steps would be reused, and its
    explanation would be replaced by one of another question. Other readings and other statements
    about the run (batch, attention, …) are allowed: the steps are reused and judged anew. Told by
    the folder's explanation, or, where none was stored (a run killed before it), by its own steps."""
    from fusedce_profiler.instrument import store
    from fusedce_profiler.judgements.explain.records import load_explanation

    stored = None
    if store.present(folder / store.EXPLAIN_FILE):
        try:
            stored = load_explanation(folder)
        except ValueError:  # unreadable: replaced by this run's; its steps tell
            stored = None
    if stored is not None:
        before = (json.loads(json.dumps(stored.source)), stored.device, stored.observation.mode,
                  stored.observation.fused_backend)
        now = (json.loads(json.dumps(plan.source.to_dict())), plan.base.device, plan.obs.mode,
               plan.obs.fused_backend)
        changed = [name for name, a, b in zip(("model", "device", "--mode", "--fused-backend"), before, now)
                   if a != b]
    else:
        jobs, measuring = [steps.results[key].job for key in steps.own], _measured_model(plan.base)
        changed = [name for name, differs in (
            ("model, device or --mode", any(_measured_model(job) != measuring for job in jobs)),
            ("--fused-backend", any(job.backend not in ("torch", plan.obs.fused_backend) for job in jobs))) if differs]
    if changed:
        raise UsageError(f"--resume: the run in {one_line(folder)} was measured with another "
                         f"{' and '.join(changed)}; give the same model options (other readings are judged anew on "
                         "its steps), or --force to start again")


def explanation_stamp(folder: Path) -> tuple[int, int] | None:
    """Which ``explain.json`` the folder holds now (its inode and modification time; ``None``: none),
    so that a stopped run can tell its own explanation from one stored before it began."""
    from fusedce_profiler.instrument import store

    try:
        info = os.lstat(Path(folder) / store.EXPLAIN_FILE)
    except OSError:
        return None
    return info.st_ino, info.st_mtime_ns


def what_the_stop_left(folder: Path, stopped: KeyboardInterrupt, stamp_before: tuple[int, int] | None = None) -> str:
    """The line a stopped ``explain`` prints: its explanation whole (the signal came once it was
    stored), or the finished steps its folder keeps (none, before the first finished), the
    report only where one was written, and how to continue. ``stamp_before``: the folder's
    :func:`explanation_stamp` when the run began (an explanation still that one is not the run's:
    ``--resume`` with other readings judges them anew)."""
    from fusedce_profile.signals import signal_name
    from fusedce_profiler.instrument import store
    from fusedce_profiler.instrument.confined import FolderRefused
    from fusedce_profiler.judgements.explain.records import load_explanation

    folder = Path(folder)
    try:
        whole = not load_explanation(folder).interrupted
    except (OSError, ValueError, FolderRefused):
        whole = False
    whole = whole and (stamp_before is None or explanation_stamp(folder) != stamp_before)
    if whole:
        return f"stopped by {signal_name(stopped)} once the explanation was stored: report {one_line(folder)}/summary.md"
    try:
        steps = len(store.read_jsonl(folder / STEPS_FILE, lambda row: row).records)
    except (OSError, FolderRefused):
        steps = 0
    kept = f": {count(steps, 'finished step')} kept" if steps else " before any step had finished"
    page = f"; partial report {one_line(folder)}/summary.md" if steps and (folder / "summary.md").is_file() else ""
    return f"interrupted{kept}{page}; continue with {same_command_resumed(folder)}"

