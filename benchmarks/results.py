"""One benchmark run as a file: its environment, its settings, the GEMM rates and the cells.

The JSON file (``<gpu-slug>-<YYYY-MM-DD>[-variant].json``) is the record; the Markdown
table beside it is rendered from it (:mod:`benchmarks.render`) and can be rebuilt at any
time without a GPU. Cells are :class:`fusedce_profiler.instrument.records.CellResult` rows, the format the
profiler writes too.
"""
from __future__ import annotations

import dataclasses
import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path


from benchmarks.measure import GemmRate
from benchmarks.protocol import Row
from fusedce_profiler.instrument import store
from fusedce_profiler.instrument.records import CellResult

FORMAT_VERSION = 1
_REPO_ROOT = Path(__file__).resolve().parents[1]


@dataclass
class Environment:
    """Where and with what a run was measured (versions are "" where not installed)."""

    gpu: str
    driver: str
    cuda: str
    torch: str
    triton: str
    liger_kernel: str
    cut_cross_entropy: str
    fusedce: str
    fusedce_commit: str
    python: str
    date: str  # ISO 8601, UTC
    pytorch_cuda_alloc_conf: str
    gpu_memory_bytes: int | None = None


@dataclass
class BenchSettings:
    """What was asked for: rows (``NxHxV``), modes and impls (command-line names), options."""

    rows: list[str]
    modes: list[str]
    impls: list[str]
    device: str = "cuda"
    repeats: int = 5
    seed: int = 0
    ignore_frac: float = 0.0
    all_options: bool = False
    tag: str = ""

    def variant(self) -> str:
        """The file-name suffix: ``ignore30``, ``all-options``, the tag, joined by ``-``."""
        parts = []
        if self.ignore_frac:
            parts.append(f"ignore{round(self.ignore_frac * 100)}")
        if self.all_options:
            parts.append("all-options")
        if self.tag:
            parts.append(self.tag)
        return "-".join(parts)


@dataclass
class BenchRun:
    """Everything one run measured; ``rows`` keeps the labels of the rows."""

    environment: Environment
    settings: BenchSettings
    rows: list[Row] = field(default_factory=list)
    gemm: list[GemmRate] = field(default_factory=list)
    cells: list[CellResult] = field(default_factory=list)
    wall_s: float | None = None

    def gemm_rate(self, tokens: int, hidden: int, vocab: int) -> GemmRate | None:
        for rate in self.gemm:
            if (rate.tokens, rate.hidden, rate.vocab) == (tokens, hidden, vocab):
                return rate
        return None

    def to_dict(self) -> dict:
        return {
            "format": FORMAT_VERSION,
            "environment": dataclasses.asdict(self.environment),
            "settings": dataclasses.asdict(self.settings),
            "rows": [dataclasses.asdict(row) for row in self.rows],
            "gemm": [dataclasses.asdict(rate) for rate in self.gemm],
            "cells": [cell.to_dict() for cell in self.cells],
            "wall_s": self.wall_s,
        }

    @classmethod
    def from_dict(cls, raw: dict) -> "BenchRun":
        if raw.get("format") != FORMAT_VERSION:
            raise ValueError(f"results format {raw.get('format')!r} is not {FORMAT_VERSION}")
        return cls(
            environment=Environment(**raw["environment"]),
            settings=BenchSettings(**raw["settings"]),
            rows=[Row(**row) for row in raw["rows"]],
            gemm=[GemmRate(**rate) for rate in raw["gemm"]],
            cells=[CellResult.from_dict(cell) for cell in raw["cells"]],
            wall_s=raw.get("wall_s"),
        )


def save_run(run: BenchRun, path: Path) -> None:
    """Write ``run`` as indented JSON (atomically: a partial file never replaces a whole one)."""
    store.write_json(path, run.to_dict())


def load_run(path: str | Path) -> BenchRun:
    return BenchRun.from_dict(store.read_json(path))


def slug(text: str) -> str:
    """``"NVIDIA H200"`` -> ``"nvidia-h200"``."""
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "unknown"


def result_stem(environment: Environment, settings: BenchSettings) -> str:
    """``<gpu-slug>-<YYYY-MM-DD>[-variant]``."""
    parts = [slug(environment.gpu), environment.date[:10], settings.variant()]
    return "-".join(part for part in parts if part)


def _git_commit() -> str:
    """The measured checkout's commit; "" when the repository is not itself a git checkout (a
    copy inside another repository would otherwise report the enclosing one's HEAD)."""
    try:
        top = subprocess.run(["git", "rev-parse", "--show-toplevel"], capture_output=True, text=True, timeout=20,
                             cwd=_REPO_ROOT, check=True)
        if Path(top.stdout.strip()).resolve() != Path(_REPO_ROOT).resolve():
            return ""
        done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=20,
                              cwd=_REPO_ROOT, check=True)
    except (OSError, subprocess.SubprocessError):
        return ""
    return done.stdout.strip()


def collect_environment(device: str) -> Environment:
    """The benchmark's environment block: the profiler's (:mod:`fusedce_profiler.instrument.environment`) in
    this results format's fixed fields, plus the commit measured."""
    from fusedce_profiler.instrument.environment import collect_environment as profiler_environment

    env = profiler_environment()
    cuda = device == "cuda"
    backends = env["backends"]
    installed = lambda name: "" if backends.get(name) in (None, "not installed") else backends[name]  # noqa: E731
    return Environment(
        gpu=env["gpu"] if cuda else "cpu",
        driver=(env["driver"] or "") if cuda else "",
        cuda=env["cuda"] or "",
        torch=env["torch"],
        triton=env["triton"] or "",
        liger_kernel=installed("liger"),
        cut_cross_entropy=installed("cce"),
        fusedce=installed("fusedce"),
        fusedce_commit=_git_commit(),
        python=env["python"],
        date=env["date"],
        pytorch_cuda_alloc_conf=env["pytorch_cuda_alloc_conf"] or "",
        gpu_memory_bytes=env["gpu_memory_bytes"] if cuda else None,
    )
