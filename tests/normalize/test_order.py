"""`order.at_most` and `order.slice_offsets` (entangle_mlir/normalize/order.py) on small
hand-written functions (returning the values compared); the orders the online softmax's backward relies
on are proven, their near misses are not (tests/normalize/test_exact_ring_overflow.py grounds
the rewrites that ask)."""

from __future__ import annotations

import pytest

from entangle_mlir.mlir.ir import context, parse_module
from entangle_mlir.normalize.order import at_most, slice_offsets

_NEG_INF = """
      %ninf = stablehlo.constant dense<0xFF800000> : tensor<f32>"""


def _reduce(name: str, value: str, shape: str, out: str) -> str:
    """`name` = the max of `value` over dim 1, from -inf."""
    return (f"      {name} = stablehlo.reduce({value} init: %ninf) applies stablehlo.maximum "
            f"across dimensions = [1] : (tensor<{shape}xf32>, tensor<f32>) -> tensor<{out}xf32>")


def _returned(body: str, args: str, results: str):
    """The module and the values its function returns."""
    module = parse_module(f"""
    func.func @main({args}) -> ({results}) {{{_NEG_INF}
{body}
    }}""")
    func = module.body.operations[0]
    return module, *func.regions[0].blocks[0].operations[-1].operands


def _prefix(x_blocks: int, y_blocks: int, swap: bool = False) -> str:
    """x and y the row maxes of `q @ concat(k_1..k_n)^T` over the first x_blocks and
    y_blocks key blocks (`swap`: y's first two blocks in the other order)."""
    def scores(name, n, order):
        keys = ", ".join(f"%k{i}" for i in order)
        ktype = ", ".join(["tensor<2x4xf32>"] * n)
        return (f"      %{name}c = stablehlo.concatenate {keys}, dim = 0 : ({ktype}) -> "
                f"tensor<{2 * n}x4xf32>\n"
                f"      %{name}t = stablehlo.transpose %{name}c, dims = [1, 0] : "
                f"(tensor<{2 * n}x4xf32>) -> tensor<4x{2 * n}xf32>\n"
                f"      %{name}s = stablehlo.dot_general %q, %{name}t, contracting_dims = [1] x "
                f"[0] : (tensor<2x4xf32>, tensor<4x{2 * n}xf32>) -> tensor<2x{2 * n}xf32>\n"
                + _reduce(f"%{name}", f"%{name}s", f"2x{2 * n}", "2"))
    y_order = list(range(y_blocks))
    if swap:
        y_order[:2] = [1, 0]
    return (scores("x", x_blocks, range(x_blocks)) + "\n" + scores("y", y_blocks, y_order)
            + "\n      return %x, %y : tensor<2xf32>, tensor<2xf32>")


_ARGS = "%q: tensor<2x4xf32>, %k0: tensor<2x4xf32>, %k1: tensor<2x4xf32>, %k2: tensor<2x4xf32>"


@pytest.mark.parametrize(("x_blocks", "y_blocks", "swap", "ordered"), [
    (1, 3, False, True), (2, 3, False, True), (3, 3, False, True), (1, 3, True, True),
    (2, 3, True, False), (3, 2, False, False)])
def test_running_max_over_sunk_concatenations(x_blocks, y_blocks, swap, ordered) -> None:
    """A row max over the first blocks of keys is at most the one over more blocks (the sunk
    form of a running max); not the other way. A block anywhere in y's row counts (swap: k0
    at offset 2); several blocks only as a run in y's order (k0, k1 against k1, k0, k2 is not
    sought: a ring's running maxes extend one another)."""
    with context():
        _, x, y = _returned(_prefix(x_blocks, y_blocks, swap), _ARGS,
                            "tensor<2xf32>, tensor<2xf32>")
        assert at_most(x, y) == ordered
        if not swap:
            assert at_most(y, x) == (y_blocks <= x_blocks)


def test_running_max_chain_and_row_of_scores() -> None:
    """m1 = max(-inf, rowmax(s0)), m2 = max(m1, rowmax(s1)): m1 <= m2, s0 <= m1 and s1 <= m2
    along the rows, s1 not <= m1."""
    body = (_reduce("%r0", "%s0", "2x4", "2") + "\n" + _reduce("%r1", "%s1", "2x4", "2") + """
      %init = stablehlo.broadcast_in_dim %ninf, dims = [] : (tensor<f32>) -> tensor<2xf32>
      %m1 = stablehlo.maximum %init, %r0 : tensor<2xf32>
      %m2 = stablehlo.maximum %m1, %r1 : tensor<2xf32>
      return %m1, %m2 : tensor<2xf32>, tensor<2xf32>""")
    with context():
        module, m1, m2 = _returned(body, "%s0: tensor<2x4xf32>, %s1: tensor<2x4xf32>",
                                   "tensor<2xf32>, tensor<2xf32>")
        s0, s1 = module.body.operations[0].regions[0].blocks[0].arguments
        assert at_most(m1, m2) and not at_most(m2, m1)
        assert at_most(s0, m1, (0,)) and at_most(s1, m2, (0,)) and at_most(s0, m2, (0,))
        assert not at_most(s1, m1, (0,))
        assert not at_most(s0, m1, (1,))  # the max placed along the wrong dim


def test_slices_read_off_concatenations_and_broadcasts() -> None:
    """x = concat(b, c) sits at offset 2 of y = concat(a, b, c); a row broadcast along the
    sliced dim is a slice of the same broadcast, a column broadcast is not."""
    body = """
      %x = stablehlo.concatenate %b, %c, dim = 0 : (tensor<2xf32>, tensor<2xf32>) -> tensor<4xf32>
      %y = stablehlo.concatenate %a, %b, %c, dim = 0 : (tensor<2xf32>, tensor<2xf32>, tensor<2xf32>) -> tensor<6xf32>
      %bx = stablehlo.broadcast_in_dim %a, dims = [0] : (tensor<2xf32>) -> tensor<2x4xf32>
      %by = stablehlo.broadcast_in_dim %a, dims = [0] : (tensor<2xf32>) -> tensor<2x6xf32>
      %cx = stablehlo.broadcast_in_dim %c, dims = [1] : (tensor<2xf32>) -> tensor<4x2xf32>
      %cy = stablehlo.broadcast_in_dim %y, dims = [1] : (tensor<6xf32>) -> tensor<4x6xf32>
      return %x, %y, %bx, %by, %cx, %cy : tensor<4xf32>, tensor<6xf32>, tensor<2x4xf32>, tensor<2x6xf32>, tensor<4x2xf32>, tensor<4x6xf32>"""
    with context():
        _, x, y, bx, by, cx, cy = _returned(
            body, "%a: tensor<2xf32>, %b: tensor<2xf32>, %c: tensor<2xf32>",
            "tensor<4xf32>, tensor<6xf32>, tensor<2x4xf32>, tensor<2x6xf32>, tensor<4x2xf32>, "
            "tensor<4x6xf32>")
        assert slice_offsets(x, y, 0) == {2}
        assert slice_offsets(bx, by, 1) == {0, 1, 2}
        assert slice_offsets(cx, cy, 1) == {4}
        assert slice_offsets(y, x, 0) == set()
        assert slice_offsets(bx, by, 0) == set()  # not along a dim the shapes share
