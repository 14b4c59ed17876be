"""Lemmas for blocks in a device-dependent order (`Reordered`, `rules/kinds/reordered.py`),
TASO-style as in test_lemmas.py: each rule output on small symbolic tensors over a 4-device ring
is proved by Z3 per device; wrong claims (the other ring direction, a contraction or an
elementwise op of values in different orders) are refuted; and the rules refuse what they cannot
express."""

from __future__ import annotations

import pytest

from entangle_mlir.analysis.instance.checker import InstanceChecker
from entangle_mlir.core import terms as T
from entangle_mlir.core.mesh import Mesh
from entangle_mlir.core.relations import Opaque, Rel, Reordered, Shifted, Value
from entangle_mlir.mlir.opinfo import OpInfo, TensorType
from entangle_mlir.rules import RULES
from entangle_mlir.rules.base import RuleContext
from entangle_mlir.rules.kinds.reordered import with_orders

CP = Mesh((("cp", 4),))
N, B = 8, 2
_next_arg = iter(range(20_000, 1_000_000))


def arg(shape: tuple[int, ...]) -> T.Term:
    return T.make_arg(next(_next_arg), shape, "f32")


def tiled(term: T.Term, dim: int = 0) -> Rel:
    return Rel(term, tuple(("cp",) if d == dim else () for d in range(len(term.shape))))


def whole(term: T.Term, poly: frozenset[int] = frozenset()) -> Rel:
    return Rel(term, ((),) * len(term.shape), poly=poly)


def ring_orders(step: int) -> tuple[tuple[int, ...], ...]:
    """Blocks received around the ring: position k holds device (d - step * k)'s block."""
    return tuple(tuple((d - step * k) % 4 for k in range(4)) for d in range(4))


def local_shape(value: Value) -> tuple[int, ...]:
    if isinstance(value, Reordered):
        return local_shape(value.rel)
    if isinstance(value, Shifted):
        return tuple(value.rel.term.shape)
    return tuple(size if d in value.poly else size // CP.group_size(axes)
                 for d, (size, axes) in enumerate(zip(value.term.shape, value.tiling)))


def dtype(value: Value) -> str:
    return (value.rel if isinstance(value, Reordered | Shifted) else value).term.dtype


def info(op: str, ins: list[Value], result: tuple[int, ...], attrs: dict,
         result_dtype: str = "f32") -> OpInfo:
    return OpInfo(op, attrs, [TensorType(local_shape(v), dtype(v)) for v in ins],
                  [TensorType(result, result_dtype)])


def check(op_info: OpInfo, ins: list[Value], outs: list[Value]) -> str:
    ctx = RuleContext(mesh=CP, manual_axes=CP.names)
    checker = InstanceChecker(timeout_ms=20_000, reduce_above=10**9, max_elements=10**6)
    return checker.check(op_info, ins, outs, CP, ctx).status


def run(op_info: OpInfo, ins: list[Value]) -> list[Value]:
    return with_orders(RULES[op_info.name])(op_info, ins,
                                            RuleContext(mesh=CP, manual_axes=CP.names))


def ring_blocks(step: int = 1) -> tuple[T.Term, list[Value]]:
    """K (8 x 2) split over cp and the blocks a ring turning by `step` brings, as the
    collective_permute rule relates them: K rolled by `step` blocks per hop."""
    k = arg((N, 2))
    return k, [tiled(T.make_roll(k, 0, step * hop * B)) for hop in range(4)]


def concat_of(ins: list[Value]) -> OpInfo:
    return info("stablehlo.concatenate", ins, (N, 2), {"dimension": 0})


def reordered(term: T.Term, step: int = 1, dim: int = 0) -> Reordered:
    return Reordered(whole(term), dim, ring_orders(step))


def test_concatenated_ring_blocks_are_reordered() -> None:
    k, blocks = ring_blocks()
    (out,) = run(concat_of(blocks), blocks)
    assert out == reordered(k)
    assert check(concat_of(blocks), blocks, [out]) == "proved"


def test_concatenated_position_blocks_are_reordered() -> None:
    """k_pos = ((me - i) % n) * B + arange(B): step 0 is the split iota, the others offset
    iotas; concatenated they are iota(N) in the ring's order."""
    iota = T.make_iota((B,), 0, "i32")
    ins: list[Value] = [tiled(T.make_iota((N,), 0, "i32"))]
    ins += [Shifted(whole(iota), tuple(((d - hop) % 4) * B for d in range(4)))
            for hop in range(1, 4)]
    op_info = info("stablehlo.concatenate", ins, (N,), {"dimension": 0}, "i32")
    (out,) = run(op_info, ins)
    assert isinstance(out, Reordered) and out.orders == ring_orders(1)
    assert out.rel.term == T.make_iota((N,), 0, "i32")
    assert check(op_info, ins, [out]) == "proved"


def test_other_ring_direction_is_refuted() -> None:
    k, blocks = ring_blocks()
    assert check(concat_of(blocks), blocks, [reordered(k, step=-1)]) == "refuted"


def test_blocks_missing_a_device_are_an_error() -> None:
    _, blocks = ring_blocks()
    (out,) = run(concat_of(blocks[:3] + blocks[:1]), blocks[:3] + blocks[:1])
    assert isinstance(out, Opaque) and "not every block once" in out.reason


@pytest.mark.parametrize("reducer", ["add", "max"])
def test_reduction_over_the_reordered_dim_is_the_plain_reduction(reducer: str) -> None:
    x = arg((N, 2))
    ins = [reordered(x), whole(T.make_splat(0 if reducer == "add" else float("-inf"), (),
                                            "f32"))]
    op_info = info("stablehlo.reduce", ins, (2,), {"dimensions": (0,), "reducer": reducer})
    (out,) = run(op_info, ins)
    assert isinstance(out, Rel) and not out.tiled_axes
    assert check(op_info, ins, [out]) == "proved"


def test_contraction_of_the_same_order_is_the_plain_contraction() -> None:
    p, v = arg((3, N)), arg((N, 2))
    ins = [reordered(p, dim=1), reordered(v)]
    attrs = {"lhs_batch": (), "rhs_batch": (), "lhs_contract": (1,), "rhs_contract": (0,)}
    op_info = info("stablehlo.dot_general", ins, (3, 2), attrs)
    (out,) = run(op_info, ins)
    assert isinstance(out, Rel) and not out.tiled_axes
    assert check(op_info, ins, [out]) == "proved"
    wrong = [reordered(p, dim=1), reordered(v, step=-1)]
    (error,) = run(op_info, wrong)
    assert isinstance(error, Opaque) and error.category == "wrong_order"
    assert check(op_info, wrong, [out]) == "refuted"


def test_free_dim_of_a_dot_keeps_the_order() -> None:
    q, k = arg((3, 2)), arg((N, 2))
    ins = [whole(q), reordered(k)]
    attrs = {"lhs_batch": (), "rhs_batch": (), "lhs_contract": (1,), "rhs_contract": (1,)}
    op_info = info("stablehlo.dot_general", ins, (3, N), attrs)
    (out,) = run(op_info, ins)
    assert isinstance(out, Reordered) and out.dim == 1 and out.orders == ring_orders(1)
    assert check(op_info, ins, [out]) == "proved"


def test_elementwise_ops_keep_one_order_and_refuse_two() -> None:
    a, b = arg((N, 2)), arg((N, 2))
    ins = [reordered(a), reordered(b)]
    op_info = info("stablehlo.multiply", ins, (N, 2), {})
    (out,) = run(op_info, ins)
    assert isinstance(out, Reordered) and out.orders == ring_orders(1)
    assert check(op_info, ins, [out]) == "proved"
    mixed = [reordered(a), reordered(b, step=-1)]
    (error,) = run(op_info, mixed)
    assert isinstance(error, Opaque) and "different orders" in error.reason
    assert "[0, 3, 2, 1]" in error.reason and "[0, 1, 2, 3]" in error.reason
    assert check(op_info, mixed, [out]) == "refuted"
    constant = [reordered(a), whole(T.make_splat(2.0, (N, 2), "f32"), frozenset({0, 1}))]
    (scaled,) = run(op_info, constant)
    assert isinstance(scaled, Reordered) and check(op_info, constant, [scaled]) == "proved"
    natural = [reordered(a), whole(b)]
    (refused,) = run(op_info, natural)
    assert isinstance(refused, Opaque)


def test_broadcast_and_transpose_move_the_dim() -> None:
    x = arg((N, 2))
    ins = [reordered(x)]
    bcast = info("stablehlo.broadcast_in_dim", ins, (3, 2, N),
                 {"broadcast_dimensions": (2, 1)})
    (out,) = run(bcast, ins)
    assert isinstance(out, Reordered) and out.dim == 2
    assert check(bcast, ins, [out]) == "proved"
    transpose = info("stablehlo.transpose", ins, (2, N), {"permutation": (1, 0)})
    (moved,) = run(transpose, ins)
    assert isinstance(moved, Reordered) and moved.dim == 1
    assert check(transpose, ins, [moved]) == "proved"


def _rows(term: T.Term, start: int, stop: int) -> T.Term:
    return T.make_op("slice", (term,), ((start, 0), (stop, term.shape[1]), (1, 1)),
                     (stop - start, term.shape[1]), term.dtype, linear_in=0)


def test_consecutive_slices_rejoin_into_the_tensor() -> None:
    """Blockwise code concatenating the blocks it cut gets the tensor back (the rule's term);
    the blocks in another order are not the tensor (refuted)."""
    x = arg((N, 2))
    pieces: list[Value] = [whole(_rows(x, r, r + B)) for r in range(0, N, B)]
    op_info = concat_of(pieces)
    (out,) = run(op_info, pieces)
    assert out == whole(x)
    assert check(op_info, pieces, [out]) == "proved"
    swapped = pieces[1:] + pieces[:1]
    (rolled,) = run(op_info, swapped)
    assert rolled.term is not x
    assert check(op_info, swapped, [whole(x)]) == "refuted"
