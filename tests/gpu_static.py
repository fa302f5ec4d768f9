"""A CPU check of the tests that only run on a GPU: every name they use must exist.

CI has no GPU, so a test marked ``gpu`` is skipped there and an attribute it reads that no
longer exists (a renamed field of a result record) goes unnoticed until someone has a device.
This pass reads each such test's source and, without running it, resolves:

- ``module.attr`` for every imported module (at the top of the file or inside the test);
- ``value.attr`` where ``value``'s type is known — a local assigned from a call of a class, or of a
  function whose return annotation names a class; a call itself; or an attribute of a known type whose
  annotation (a field's, a property's return) names a class, so ``cell.parity.grad_hidden`` is checked
  at each step — against the class's attributes, dataclass fields and annotations;
- the arguments of every call to a resolvable class or function, against its signature: keywords
  it does not take, too many positional arguments, a required one missing (not where the call
  unpacks ``*args`` or ``**kwargs``).

Public API: :func:`check_gpu_tests` → one sentence per problem (``path:line: ...``).
"""
from __future__ import annotations

import ast
import dataclasses
import importlib
import importlib.util
import inspect
import sys
import types
import typing
from pathlib import Path
from types import ModuleType


OWN_PACKAGES = ("fusedce", "fusedce_profile", "fusedce_profiler", "fusedce_reports", "fusedce_cli", "benchmarks")


def _is_gpu_mark(node: ast.expr) -> bool:
    text = ast.unparse(node)
    return text in ("pytest.mark.gpu", "mark.gpu") or text.startswith(("pytest.mark.gpu(",))


def _module_is_gpu(tree: ast.Module) -> bool:
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "pytestmark" for t in node.targets):
            marks = node.value.elts if isinstance(node.value, (ast.List, ast.Tuple)) else [node.value]
            if any(_is_gpu_mark(m) for m in marks):
                return True
    return False


def _gpu_tests(tree: ast.Module) -> list[ast.FunctionDef]:
    whole = _module_is_gpu(tree)
    return [node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name.startswith("test")
            and (whole or any(_is_gpu_mark(d) for d in node.decorator_list))]


def _load(path: Path, tree: ast.Module) -> ModuleType:
    """The test module, imported; or, when importing it skips or fails on this machine (a
    module-level ``pytest.skip`` without a GPU), a module holding only its top-level imports."""
    name = f"_gpu_static_{path.stem}_{abs(hash(str(path)))}"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException as exc:  # noqa: BLE001 - pytest's Skipped is not an Exception
        if isinstance(exc, KeyboardInterrupt):
            raise
        module = ModuleType(name)
        imports = ast.Module([node for node in tree.body if isinstance(node, (ast.Import, ast.ImportFrom))], [])
        exec(compile(imports, str(path), "exec"), vars(module))  # noqa: S102 - the file's own imports
    return module


def _local_imports(function: ast.FunctionDef) -> dict[str, object]:
    names: dict[str, object] = {}
    for node in ast.walk(function):
        if isinstance(node, ast.Import):
            for alias in node.names:
                module = importlib.import_module(alias.name)
                names[alias.asname or alias.name.split(".")[0]] = module if alias.asname else \
                    importlib.import_module(alias.name.split(".")[0])
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            module = importlib.import_module(node.module)
            for alias in node.names:
                value = getattr(module, alias.name, None)
                if value is None:
                    value = importlib.import_module(f"{node.module}.{alias.name}")
                names[alias.asname or alias.name] = value
    return names


def _resolve(node: ast.expr, scope: dict[str, object]):
    """The object a dotted name refers to, or ``None`` when it is not a plain import path."""
    if isinstance(node, ast.Name):
        return scope.get(node.id)
    if isinstance(node, ast.Attribute):
        base = _resolve(node.value, scope)
        if isinstance(base, (ModuleType, type)):
            return getattr(base, node.attr, None)
    return None


def _returned_class(target) -> type | None:
    if isinstance(target, type):
        return target
    if callable(target):
        try:
            hint = typing.get_type_hints(target).get("return")
        except Exception:  # noqa: BLE001 - an annotation that does not resolve tells us nothing
            return None
        return hint if isinstance(hint, type) else None
    return None


def _has(cls: type, attr: str) -> bool:
    if hasattr(cls, attr):
        return True
    if dataclasses.is_dataclass(cls) and attr in {f.name for f in dataclasses.fields(cls)}:
        return True
    return any(attr in getattr(klass, "__annotations__", {}) for klass in cls.__mro__)


def _annotated_class(cls: type, attr: str) -> type | None:
    """The class that ``cls``'s annotation of ``attr`` names (a field's, or a property's return), ``X``
    of ``X | None``; None when there is none or it is no single class."""
    member = inspect.getattr_static(cls, attr, None)
    try:
        hint = typing.get_type_hints(member.fget).get("return") if isinstance(member, property) \
            else typing.get_type_hints(cls).get(attr)
    except Exception:  # noqa: BLE001 - an annotation that does not resolve tells us nothing
        return None
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        classes = [arg for arg in typing.get_args(hint) if arg is not type(None)]
        hint = classes[0] if len(classes) == 1 else None
    return hint if isinstance(hint, type) and typing.get_origin(hint) is None else None


def _type_of(node: ast.expr, typed: dict[str, type], scope: dict[str, object]) -> type | None:
    """The class of the value ``node`` evaluates to, where the test's source tells it (module docstring):
    a class of this project's only, through a call or an annotation (another library's classes differ
    between the versions here and on a device: the CPU build's ``_CudaDeviceProperties`` lacks fields)."""
    if isinstance(node, ast.Name):
        return typed.get(node.id)
    if isinstance(node, ast.Call):
        found = _returned_class(_resolve(node.func, scope))
    elif isinstance(node, ast.Attribute):
        base = _type_of(node.value, typed, scope)
        found = _annotated_class(base, node.attr) if base is not None else None
    else:
        return None
    return found if found is not None and found.__module__.split(".")[0] in OWN_PACKAGES else None


def _check_arguments(call: ast.Call, target, where: str) -> list[str]:
    """The call's arguments bound to ``target``'s signature, as Python would bind them."""
    try:
        signature = inspect.signature(target)
    except (TypeError, ValueError):
        return []
    name, parameters = getattr(target, "__qualname__", target), signature.parameters.values()
    unknown = [] if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters) else [
        f"{where}: {name}() takes no keyword {kw.arg!r}" for kw in call.keywords if kw.arg is not None
        and kw.arg not in {p.name for p in parameters if p.kind is not inspect.Parameter.POSITIONAL_ONLY}]
    if unknown or any(isinstance(arg, ast.Starred) for arg in call.args) or any(kw.arg is None for kw in call.keywords):
        return unknown  # unpacked arguments: only the keywords written out can be checked
    try:
        signature.bind(*call.args, **{kw.arg: kw.value for kw in call.keywords})
    except TypeError as exc:
        return [f"{where}: {name}(): {exc}"]
    return []


def check_test(path: Path, module: ModuleType, function: ast.FunctionDef) -> list[str]:
    """The problems of one GPU test (see the module docstring)."""
    scope = {**vars(module), **_local_imports(function)}
    typed: dict[str, type] = {}
    problems = []
    for node in ast.walk(function):  # walk order is breadth-first: assignments are seen before deeper uses
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call) and len(node.targets) == 1 \
                and isinstance(node.targets[0], ast.Name):
            cls = _returned_class(_resolve(node.value.func, scope))
            if cls is not None:
                typed[node.targets[0].id] = cls
    for node in ast.walk(function):
        where = f"{path}:{getattr(node, 'lineno', function.lineno)}"
        if isinstance(node, ast.Call):
            target = _resolve(node.func, scope)
            if target is not None and callable(target):
                problems += _check_arguments(node, target, where)
        if isinstance(node, ast.Attribute):
            owner, owner_type = ast.unparse(node.value), _type_of(node.value, typed, scope)
            if owner_type is not None and not _has(owner_type, node.attr):
                problems.append(f"{where}: {owner} is a {owner_type.__name__}, which has no attribute {node.attr!r}")
            elif isinstance(node.value, ast.Name) and isinstance(scope.get(owner), ModuleType) \
                    and owner not in typed and not hasattr(scope[owner], node.attr):
                problems.append(f"{where}: module {scope[owner].__name__} has no attribute {node.attr!r}")
    return problems


def check_gpu_tests(paths) -> list[str]:
    """Every problem found in the GPU-only tests of the files ``paths``."""
    problems = []
    for path in map(Path, paths):
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        tests = _gpu_tests(tree)
        if not tests:
            continue
        module = _load(path, tree)
        for function in tests:
            problems += check_test(path, module, function)
    return problems
