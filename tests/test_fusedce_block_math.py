"""The two BlockMath implementations keep the contract of ``fusedce.block_math``, and what in
the Triton kernels no CPU run can check stays in their source."""
import ast
import importlib.util
import inspect
import textwrap

import pytest

from fusedce import block_math_torch
from fusedce.block_math import BlockMath

METHODS = ("chunk_stats", "logit_grad")

needs_triton = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed")


def _protocol_signature(name: str) -> inspect.Signature:
    signature = inspect.signature(getattr(BlockMath, name))
    return signature.replace(parameters=list(signature.parameters.values())[1:])  # drop self


def _assert_implements_block_math(module) -> None:
    for name in METHODS:
        assert inspect.signature(getattr(module, name)) == _protocol_signature(name), (module.__name__, name)


def test_the_torch_block_math_has_the_protocols_signatures():
    _assert_implements_block_math(block_math_torch)


@needs_triton
def test_the_triton_launchers_have_the_protocols_signatures():
    from fusedce import kernels

    _assert_implements_block_math(kernels)


def _loop_of(kernel_source: str) -> ast.For:
    (function,) = ast.parse(textwrap.dedent(kernel_source)).body
    loops = [node for node in ast.walk(function) if isinstance(node, ast.For)]
    assert len(loops) == 1, "logit_grad_kernel is expected to walk the row in one loop over BLOCK_V columns"
    return loops[0]


def _calls(node: ast.AST, attribute: str) -> list[ast.Call]:
    return [n for n in ast.walk(node) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
            and n.func.attr == attribute]


def _is_in_place_narrow_branch(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "IN_PLACE_NARROW"


def _barrier_between_loads_and_stores(kernel_source: str) -> bool:
    """Whether the loop over BLOCK_V columns calls ``tl.debug_barrier()`` inside an
    ``if IN_PLACE_NARROW:`` after every statement that loads the logits row (``z_row``) and
    before the first statement that stores."""
    body = _loop_of(kernel_source).body

    def loads_z(statement: ast.AST) -> bool:
        return any("z_row" in ast.unparse(call.args[0]) for call in _calls(statement, "load") if call.args)

    last_load = max((i for i, statement in enumerate(body) if loads_z(statement)), default=None)
    first_store = min((i for i, statement in enumerate(body) if _calls(statement, "store")), default=None)
    barriers = [i for i, statement in enumerate(body)
                if _is_in_place_narrow_branch(statement) and _calls(statement, "debug_barrier")]
    if last_load is None or first_store is None:
        return False
    return any(last_load < i < first_store for i in barriers)


@needs_triton
def test_logit_grad_kernel_keeps_its_barrier_between_the_loads_and_the_in_place_stores():
    """With a bf16/fp16 output, ``logit_grad`` writes the gradients over the fp32 logits they
    are computed from (a narrower view of the same bytes). Each iteration's stores overwrite
    logits that this or an earlier iteration loads, so without a barrier after the loads a
    warp that runs ahead overwrites logits other warps of the same program have not read yet.

    The race is invisible to every CPU test: Triton's interpreter runs a program as one
    sequential thread, so deleting the barrier changes no value there. This checks the source
    instead: the barrier must stay inside the ``IN_PLACE_NARROW`` branch, between the loads of
    the logits row and the stores. (``tests/test_fusedce_gpu.py`` runs the race-prone shape on
    a GPU.)
    """
    from fusedce.kernels.logit_grad import logit_grad_kernel

    assert _barrier_between_loads_and_stores(inspect.getsource(logit_grad_kernel.fn))


_WITH_BARRIER = '''
def kernel(z_row, d_row, n_cols, IN_PLACE_NARROW, BLOCK_V):
    for start in range(0, n_cols, BLOCK_V):
        x = tl.load(z_row + start)
        if IN_PLACE_NARROW:
            tl.debug_barrier()
        tl.store(d_row + start, x)
'''


@pytest.mark.parametrize("edit,expected", [
    (lambda src: src, True),
    (lambda src: src.replace("            tl.debug_barrier()\n", "            pass\n"), False),
    (lambda src: src.replace("        if IN_PLACE_NARROW:\n            tl.debug_barrier()\n", ""), False),
    (lambda src: src.replace("if IN_PLACE_NARROW:", "if HAS_BIAS:"), False),
    (lambda src: src.replace("""        x = tl.load(z_row + start)
        if IN_PLACE_NARROW:
            tl.debug_barrier()
""", """        if IN_PLACE_NARROW:
            tl.debug_barrier()
        x = tl.load(z_row + start)
"""), False),
], ids=["kept", "barrier-deleted", "branch-deleted", "other-branch", "before-the-loads"])
def test_the_barrier_check_rejects_a_missing_or_misplaced_barrier(edit, expected):
    assert _barrier_between_loads_and_stores(edit(_WITH_BARRIER)) is expected
