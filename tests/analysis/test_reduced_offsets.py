"""Instances of the pipeline rows' general tier checked at a reduced shape (issue 21):

* dynamic_slice / dynamic_update_slice at constant starts (a micro-batch's row of the loop's
  buffers, the start a concrete step's index): reduced as a slice is, each cut dim keeping
  its three parts (before, inside, after the window) shrunk, the start the shrunk `before`
  (`shapes.reduced_offset_types`); the general tier's update stated as slices and a
  concatenation (`abstraction.STATED_FORMS`) is reduced with that form;
* a zero multiple `0 * t` of a term not shown finite (a zero cotangent times a stage's
  activations): its leaf is unbounded (`terms.make_arg(finite=False)`), so the rule keeps the
  product on the leaf as it kept it on the term.

Each right instance is proved at the reduced shape; the nearest wrong one (another start,
another device's start, the update's pieces in another order, a factor 1 for 0) is refuted
there, and at the real shape where that is small enough to check."""

from __future__ import annotations

from dataclasses import replace

import pytest

from entangle_mlir.analysis.instance.abstraction import STATED, abstract_with_strategy
from entangle_mlir.analysis.instance.checker import InstanceChecker
from entangle_mlir.analysis.instance.reduce import reduced_info, reduced_instance
from entangle_mlir.analysis.instance.solve import run_check
from entangle_mlir.core import terms as T
from entangle_mlir.core.mesh import Mesh
from entangle_mlir.core.normal_form import slice_term, update_slice
from entangle_mlir.core.relations import GLOBAL, DeviceScalar, Rel, Value
from entangle_mlir.mlir.opinfo import OpInfo, TensorType
from entangle_mlir.rules import RULES
from entangle_mlir.rules.base import RuleContext
from entangle_mlir.rules.gather_scatter import make_dynamic_update_slice

DS, DUS = "stablehlo.dynamic_slice", "stablehlo.dynamic_update_slice"
ROWS, WIDTH = 8, 64
"""The buffer's rows (micro-batches) and width: 512 elements, reduced above 64."""
TP = Mesh((("tp", 2),))
GLOBAL_CTX = RuleContext()

_ids = iter(range(60_000, 10**6))


def arg(shape, dtype: str = "f32") -> T.Term:
    return T.make_arg(next(_ids), tuple(shape), dtype)


def whole(term: T.Term) -> Rel:
    """A value outside any manual computation (the general tier's instances)."""
    return Rel(term, ((),) * len(term.shape), scope=GLOBAL)


def start(value: int) -> Rel:
    return whole(T.make_splat(value, (), "i32"))


def types(*shapes) -> list[TensorType]:
    return [TensorType(tuple(s), "i32" if s == () else "f32") for s in shapes]


def slice_info(row: int, rows: int = ROWS) -> tuple[OpInfo, list[Value]]:
    x = whole(arg((rows, WIDTH)))
    info = OpInfo(DS, {"slice_sizes": (1, WIDTH)}, types((rows, WIDTH), (), ()),
                  types((1, WIDTH)))
    return info, [x, start(row), start(0)]


def update_info(row: int) -> tuple[OpInfo, list[Value]]:
    x, u = whole(arg((ROWS, WIDTH))), whole(arg((1, WIDTH)))
    info = OpInfo(DUS, {}, types((ROWS, WIDTH), (1, WIDTH), (), ()), types((ROWS, WIDTH)))
    return info, [x, u, start(row), start(0)]


def check(info: OpInfo, ins: list[Value], outs: list[Value], mesh: Mesh | None = None,
          ctx: RuleContext | None = None) -> tuple[str, str]:
    """(status, mode) of a fresh checker's check."""
    result = InstanceChecker().check(info, ins, outs, mesh, ctx)
    return result.status, result.details.get("mode", "")


def reduced(info: OpInfo, ins: list[Value], outs: list[Value], mesh: Mesh | None = None,
            ctx: RuleContext = GLOBAL_CTX):
    """The instance the checker checks: abstracted, then at the reduced shape."""
    abstract, strategy = abstract_with_strategy(info, ins, outs, mesh, ctx)
    assert abstract is not None
    found = reduced_instance(info, abstract[0], abstract[1], mesh, ctx, strategy)
    assert not isinstance(found, str), found
    return found


def refuted(info: OpInfo, ins: list[Value], outs: list[Value], mesh: Mesh | None = None,
            ctx: RuleContext = GLOBAL_CTX) -> bool:
    return run_check(info, ins, outs, mesh, ctx).status == "refuted"


@pytest.mark.parametrize("row, parts", [(0, (0, 1, 2)), (1, (1, 1, 2)), (5, (2, 1, 2)),
                                        (7, (2, 1, 0))])
def test_dynamic_slice_at_a_constant_start(row: int, parts: tuple[int, int, int]) -> None:
    """A row of the micro-batch buffer: the rows before and after it shrink to at most 2
    each, the start with them; a row one before or after is refuted there."""
    info, ins = slice_info(row)
    outs = RULES[DS](info, ins, GLOBAL_CTX)
    assert outs[0].term.op == "slice"
    assert check(info, ins, outs) == ("proved", "reduced")
    r_info, r_ins, r_outs = reduced(info, ins, outs)
    before, inside, after = parts
    assert r_info.operand_types[0].shape == (before + inside + after, 2)
    assert T.splat_value(r_ins[1].term) == before
    leaf = r_ins[0].term
    for other in (before - 1, before + 1):
        if 0 <= other < leaf.shape[0]:
            wrong = [replace(r_outs[0], term=slice_term(leaf, 0, other, other + 1))]
            assert refuted(r_info, r_ins, wrong)
    for other in (row - 1, row + 1):
        if 0 <= other < ROWS:
            wrong = [replace(outs[0], term=slice_term(ins[0].term, 0, other, other + 1))]
            assert check(info, ins, wrong)[0] == "refuted"


def test_a_start_the_op_clamps_is_not_reduced() -> None:
    """A start past the last row reads the last row (StableHLO clamps it): that instance is
    not the image of a reduced one, so it is checked at its real shape."""
    info, ins = slice_info(ROWS + 1)
    outs = RULES[DS](info, ins, GLOBAL_CTX)
    assert reduced_info(info, ins, None) is None
    status, mode = check(info, ins, outs)
    assert status == "proved" and mode != "reduced"


def test_dynamic_slice_at_one_start_on_every_device() -> None:
    """Inside a manual computation the start is a device table holding one row: reduced
    with the table; another row, or another row on one device, is refuted there."""
    x = Rel(arg((ROWS, WIDTH)), ((), ("tp",)))
    info = OpInfo(DS, {"slice_sizes": (1, WIDTH // 2)}, types((ROWS, WIDTH // 2), (), ()),
                  types((1, WIDTH // 2)))
    ins = [x, DeviceScalar((5, 5), ()), Rel(T.make_splat(0, (), "i32"), ())]
    ctx = RuleContext(mesh=TP, manual_axes=TP.names)
    outs = RULES[DS](info, ins, ctx)
    assert isinstance(outs[0], Rel) and outs[0].tiling == ((), ("tp",))
    assert check(info, ins, outs, TP, ctx) == ("proved", "reduced")
    r_info, r_ins, r_outs = reduced(info, ins, outs, TP, ctx)
    assert r_ins[1] == DeviceScalar((2, 2), ())
    for table in ((1, 1), (3, 3), (2, 3)):
        assert refuted(r_info, [r_ins[0], DeviceScalar(table, ()), r_ins[2]], r_outs, TP, ctx)


def test_dynamic_update_slice_at_a_constant_start() -> None:
    """The rule's update term, its constant starts read as the parts around the update:
    proved reduced; the update written one row off is refuted there."""
    info, ins = update_info(5)
    outs = RULES[DUS](info, ins, GLOBAL_CTX)
    assert outs[0].term.op == DUS
    assert check(info, ins, outs) == ("proved", "reduced")
    r_info, r_ins, r_outs = reduced(info, ins, outs)
    assert r_info.operand_types[0].shape == (5, 2) and T.splat_value(r_ins[2].term) == 2
    x, u = r_ins[0].term, r_ins[1].term
    for other in (1, 3):
        wrong = make_dynamic_update_slice(x, u, [T.make_splat(other, (), "i32"),
                                                 T.make_splat(0, (), "i32")])
        assert refuted(r_info, r_ins, [replace(r_outs[0], term=wrong)])


def test_the_general_tiers_update_is_checked_in_its_stated_form() -> None:
    """The general tier states an update at concrete starts as slices of the buffer around
    the update, concatenated (`update_slice(joined=False)`), not as the rule's term: checked
    with that form, reduced; the update one row off, or the rows around it swapped, are
    refuted."""
    info, ins = update_info(5)
    x, u = ins[0].term, ins[1].term
    outs = [whole(update_slice(x, u, [5, 0], joined=False))]
    assert outs[0].term.op == "concatenate"
    assert abstract_with_strategy(info, ins, outs, None, GLOBAL_CTX)[1] == STATED
    assert check(info, ins, outs) == ("proved", "reduced")
    assert check(info, ins, [whole(update_slice(x, u, [4, 0], joined=False))])[0] == "refuted"
    r_info, r_ins, r_outs = reduced(info, ins, outs)
    rx, ru = r_ins[0].term, r_ins[1].term
    for other in (1, 3):
        wrong = update_slice(rx, ru, [other, 0], joined=False)
        assert refuted(r_info, r_ins, [whole(wrong)])
    pieces = r_outs[0].term.args
    swapped = T.intern("concatenate", (pieces[2], pieces[1], pieces[0]), (0,), rx.shape, "f32")
    assert refuted(r_info, r_ins, [whole(swapped)])


def test_a_leaf_not_shown_finite_keeps_its_zero_multiple() -> None:
    """`0 * leaf` is 0 for a finite leaf and kept as a product for an unbounded one (it is
    NaN where the term the leaf stands for is infinite)."""
    zero = T.make_splat(0, (2, 2), "f32")
    finite = T.make_arg(next(_ids), (2, 2), "f32")
    unbounded = T.make_arg(next(_ids), (2, 2), "f32", finite=False)
    assert T.make_mul(zero, finite) is zero
    assert T.is_zero_multiple(T.make_mul(zero, unbounded))
    assert not T.term_finite(unbounded) and T.term_finite(finite)


def _not_finite(shape) -> T.Term:
    """A quotient whose divisor may be 0: not shown finite."""
    quotient = T.make_div(arg(shape), arg(shape))
    assert not T.term_finite(quotient)
    return quotient


def test_a_zero_multiple_is_checked_reduced() -> None:
    """`0 * t`, t not shown finite, too large to check at its real shape: proved at the
    reduced shape (before: not generic in t, so skipped); `1 * t` for it is refuted there."""
    shape = (128, 64)
    t = _not_finite(shape)
    ins = [whole(T.make_splat(0, shape, "f32")), whole(t)]
    info = OpInfo("stablehlo.multiply", {}, types(shape, shape), types(shape))
    outs = RULES[info.name](info, ins, GLOBAL_CTX)
    assert T.is_zero_multiple(outs[0].term)
    assert check(info, ins, outs) == ("proved", "reduced")
    r_info, r_ins, r_outs = reduced(info, ins, outs)
    assert not T.arg_finite(r_ins[1].term)
    assert refuted(r_info, r_ins, [replace(r_outs[0], term=r_ins[1].term)])


def test_a_contraction_with_zeros_is_checked_reduced() -> None:
    """A weight gradient `x^T . 0` with x not shown finite (kept: NaN where x is infinite):
    proved reduced; the contraction with ones in place of the zeros is refuted there."""
    x = _not_finite((1, 128, 96))
    zeros = T.make_splat(0, (1, 128, 80), "f32")
    dims = {"lhs_batch": (), "rhs_batch": (), "lhs_contract": (0, 1), "rhs_contract": (0, 1)}
    info = OpInfo("stablehlo.dot_general", dims, types((1, 128, 96), (1, 128, 80)),
                  types((96, 80)))
    ins = [whole(x), whole(zeros)]
    outs = RULES[info.name](info, ins, GLOBAL_CTX)
    assert outs[0].term.op == "stablehlo.dot_general"
    assert check(info, ins, outs) == ("proved", "reduced")
    r_info, r_ins, r_outs = reduced(info, ins, outs)
    lhs, rhs = r_outs[0].term.args
    ones = T.make_splat(1, rhs.shape, "f32")
    wrong = T.intern("stablehlo.dot_general", (lhs, ones), r_outs[0].term.attrs,
                     r_outs[0].term.shape, "f32")
    assert refuted(r_info, r_ins, [replace(r_outs[0], term=wrong)])
