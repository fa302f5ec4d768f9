"""Checks every command makes before it measures anything: a mistake exits 2 at once, in one line.

- :func:`check_device`: ``--device`` names a device this machine has (``cuda`` without
  CUDA, ``cuda:7`` on a one-GPU machine and ``gpu`` are told what to write instead).
- :func:`check_backends`: every named back-end (``--backend``) resolves before any cell runs:
  an optional back-end that is not installed says which ``pip install`` adds it (read without
  importing it); a ``module:callable`` is imported in a worker of its own
  (:mod:`fusedce_profiler.instrument.backends.check`), never here: one that cannot be imported
  says where Python looked (the current folder is put on ``sys.path``, as ``python -m`` does),
  a typo in the callable lists the names the module has, and a module whose own code ends the
  check (``sys.exit``, a hang, runaway memory) is named in one line, exit 1. ``doctor --loss``
  is checked in doctor's own worker.
- :func:`check_model_fits`: a model's parameters, gradients and AdamW state (and a lower
  bound of its activations) fit the device's memory.
- :func:`check_grid_fits`: every grid cell's inputs and gradients fit what its device has.
- Numeric options are checked against their ranges in :mod:`fusedce_profile.ranges`.

Each raises :class:`~fusedce_profile.errors.UsageError` with the message (exit code 2 on the
command line). :func:`nothing_measured` is the after-the-fact check of a
``model`` run.
"""
from __future__ import annotations

import os
from collections.abc import Iterable, Sequence

from fusedce_profile import arguments
from fusedce_profile.errors import UsageError

INSTALL_HINTS = {
    "liger": 'pip install "fusedce[liger]"',
    "liger-patched": 'pip install "fusedce[liger]"',
    "cce": 'pip install "fusedce[cce]"',
    "torch-native": "it needs torch >= 2.13 (F.linear_cross_entropy): upgrade torch",
}
"""What adds a built-in back-end that is not installed (also shown by ``backends``)."""

SHORT_INSTALL_HINTS = {"liger": "fusedce[liger]", "cce": "fusedce[cce]", "torch-native": "torch>=2.13"}
"""The same, short enough for a table column."""


def install_hint(name: str) -> str:
    """The install command (or what else is needed) for built-in back-end ``name``; ``""`` if none."""
    return INSTALL_HINTS.get(name, "")


# --- devices -------------------------------------------------------------------------------

def check_device(device: str) -> str:
    """``device`` if this machine has it; ``UsageError`` saying what to use otherwise."""
    import torch

    kind, colon, index = device.partition(":")
    if kind not in ("cuda", "cpu") or (colon and (kind == "cpu" or not index.isdigit())):
        hint = "use cuda (or cuda:K) or cpu" if kind.lower() in ("gpu", "cuda", "nvidia") else \
            "use cuda, cuda:K or cpu"
        raise UsageError(f"--device {device}: not a device name; {hint}")
    if kind == "cpu":
        return device
    if not torch.cuda.is_available():
        build = f"torch {torch.__version__}" + ("" if torch.version.cuda else ", a CPU-only build")
        raise UsageError(f"--device {device}: no CUDA device is visible ({build}); use --device cpu")
    count = torch.cuda.device_count()
    if index and int(index) >= count:
        raise UsageError(f"--device {device}: this machine has {count} CUDA device(s), cuda:0 to "
                         f"cuda:{count - 1}; use one of them or --device cpu")
    return device


def resolve_device(device: str | None) -> str:
    """``device`` checked (:func:`check_device`), or the default: cuda when a GPU is visible, else cpu."""
    from fusedce_profiler.grid.spec import default_device

    return check_device(arguments.text(device, "--device") or default_device())


def device_memory_bytes(device: str) -> int:
    """The memory a run on ``device`` can have at most: a GPU's total memory, or the
    machine's physical memory for ``cpu``."""
    if device.startswith("cuda"):
        import torch

        return torch.cuda.get_device_properties(torch.device(device)).total_memory
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def available_memory_bytes(device: str) -> int:
    """The memory a grid cell on ``device`` can have now: a GPU's total memory (a cell runs alone
    on it), or for ``cpu`` what the machine has available (``MemAvailable`` of ``/proc/meminfo``:
    free memory and the caches it can drop; its free pages where that cannot be read)."""
    if device.startswith("cuda"):
        return device_memory_bytes(device)
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")


def check_grid_fits(spec, named: dict[str, str]) -> None:
    """``UsageError`` naming the first cell of ``spec`` (a :class:`~fusedce_profiler.grid.spec.GridSpec`)
    whose inputs and gradients alone (:func:`~fusedce_profiler.grid.memory_model.least_bytes`) exceed
    what its device has (:func:`available_memory_bytes`): it would fail with every back-end, and on
    the CPU take the machine's memory first. ``named``: ``hidden`` / ``vocab`` → where the value
    came from (``--hidden``, ``--config big.json: hidden_size``), for the message."""
    from fusedce_profiler.grid.memory_model import least_bytes
    from fusedce_reports.units import format_bytes

    cells = spec.cells()
    needs = [least_bytes(cell) for cell in cells]
    if not needs:
        return
    memory = available_memory_bytes(spec.device)
    too_large = next((i for i, need in enumerate(needs) if need > memory), None)
    if too_large is None:
        return
    cell, need = cells[too_large], needs[too_large]
    shape = _named_values((named["hidden"], cell.hidden), (named["vocab"], cell.vocab))
    where = "this machine's available memory" if spec.device == "cpu" else f"{spec.device}'s total memory"
    raise UsageError(
        f"{shape} at {cell.tokens} tokens ({cell.mode}{', bias' if cell.bias else ''}): the loss's inputs, weight "
        f"and gradients alone need {format_bytes(need)}, more than {where}, {format_bytes(memory)}; no back-end "
        "can run it: use a smaller head or fewer tokens")


def _named_values(*pairs: tuple[str, int]) -> str:
    """``--hidden 64, --vocab 256`` or ``--config big.json: hidden_size 10, vocab_size 20``: each value
    after its name, a shared ``source: `` prefix said once."""
    words, said = [], None
    for name, value in pairs:
        source, colon, entry = name.rpartition(": ")
        if colon and source == said:
            words.append(f"{entry} {value}")
        else:
            words.append(f"{name} {value}")
        said = source if colon else None
    return ", ".join(words)


# --- back-ends -----------------------------------------------------------------------------

def backend_problem(name: str, option: str = "--backend") -> str | None:
    """Why back-end ``name`` (built-in, model-mode or ``module:callable``) cannot be used here. A
    ``module:callable`` is imported in a worker (:mod:`fusedce_profiler.instrument.backends.check`):
    :class:`~fusedce_profiler.instrument.callables.CallableFailed` when its own code ends the check."""
    from fusedce_profiler.instrument.backends import BUILTIN_BACKENDS, MODEL_BACKENDS, get_model_backend

    if name not in BUILTIN_BACKENDS and name not in MODEL_BACKENDS:
        try:
            return _user_backend_problems([name], option)[name]
        except UsageError as exc:
            return str(exc)
    try:
        get_model_backend(name).version()
    except ImportError as exc:
        hint = install_hint(name)
        return f"{option} {name}: not installed ({exc})" + (f"; {hint}" if hint else "")
    return None


def _user_backend_problems(names: list[str], option: str) -> dict[str, str | None]:
    """:func:`~fusedce_profiler.instrument.backends.check.user_backend_problems`; a name not
    written ``package.module:callable`` is refused without starting a worker."""
    from fusedce_profiler.instrument.backends.check import user_backend_problems
    from fusedce_profiler.instrument.callables import split_target

    for name in names:
        try:
            split_target(name, option)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
    return user_backend_problems(names, option)


def check_backends(names: Iterable[str], option: str = "--backend") -> None:
    """``UsageError`` naming the first back-end of ``names`` that cannot be used, and the fix; the
    ``module:callable`` ones are checked one after another, each in a worker of its own."""
    from fusedce_profiler.instrument.backends import BUILTIN_BACKENDS, MODEL_BACKENDS

    names = list(names)
    user = [name for name in names if name not in BUILTIN_BACKENDS and name not in MODEL_BACKENDS]
    problems = _user_backend_problems(user, option) if user else {}
    for name in names:
        problem = problems[name] if name in problems else backend_problem(name, option)
        if problem:
            raise UsageError(problem)


# --- model memory --------------------------------------------------------------------------

TRAINING_BYTES_PER_PARAMETER = 16
"""fp32 weights (4) + fp32 gradients (4) + AdamW's two fp32 moments (8), in every training mode."""


def training_state_bytes(parameters: int) -> int:
    """Parameters, gradients and AdamW state of a model of ``parameters`` parameters."""
    return TRAINING_BYTES_PER_PARAMETER * parameters


def activation_floor_bytes(config, batch: int, seq: int) -> int:
    """A lower bound of the activations a training step keeps: each block's bf16 input,
    B·T·H·2 bytes per layer (a real step keeps several times more)."""
    return config.num_hidden_layers * batch * seq * config.hidden_size * 2


def check_model_fits(config, device: str, batch: int, seq: int, parameters: int | None = None) -> None:
    """``UsageError`` when the model cannot train on ``device`` at ``batch`` × ``seq``: its
    training state plus the activation floor exceed the device's memory. ``parameters``: the
    model's real parameter count (a source's :attr:`parameters`); ``config``'s count when not given."""
    from fusedce_reports.units import format_bytes

    count = config.num_parameters() if parameters is None else parameters
    state = training_state_bytes(count)
    activations = activation_floor_bytes(config, batch, seq)
    memory = device_memory_bytes(device)
    if state + activations <= memory:
        return
    where = "this machine's physical memory" if device == "cpu" else f"{device}'s total memory"
    raise UsageError(
        f"{config.name} ({count / 1e9:.2f} B parameters) needs at least "
        f"{format_bytes(state + activations)} to train on {device} (weights, gradients and AdamW state "
        f"{format_bytes(state)}, 16 bytes per parameter; activations at B={batch} T={seq} at least "
        f"{format_bytes(activations)}), more than {where}, {format_bytes(memory)}; use a smaller "
        "--config/--preset or a device with more memory")


def nothing_measured(statuses: Sequence[str]) -> bool:
    """Whether a ``model`` run measured nothing: every job errored, timed out or was skipped."""
    return bool(statuses) and not any(status in ("ok", "oom") for status in statuses)

