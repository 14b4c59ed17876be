"""The vocab-parallel embedding and cross-entropy as Megatron-LM and most JAX code spell them
(issue 18), symbolic in the device:

    start = axis_index('tp') * n;  local = ids - start          # computed in int32: it wraps
    mask = (local >= 0) & (local < n)
    rows = take(w_local, clip(local, 0, n - 1))
    psum(where(mask, rows, 0))                                   # = take(w, ids) for valid ids

The semantic facts, each a rule Z3 proves here on several meshes and shapes, with must-fail
variants Z3 refutes:

1. `compare(ids - start, c)` with the difference computed in the dtype holds exactly for the
   ids whose exact difference lies in a union of ranges (`InBlock.ranges`,
   `device_blocks.compare_shifted(wrapped=True)`): `ids - start >= 0` alone also holds for ids
   near the dtype's minimum on a device with start > 0 (they wrap to large positive values),
   but `0 <= ids - start < n` is exactly the device's block whenever every block lies inside
   the dtype. Checked exhaustively on int8 below, and by Z3 on int32.
2. `clip(ids - start, 0, n - 1)` (max/min or clamp) is a `BlockIndex` with a clamp: `ids - start`
   inside the block, whatever outside; the gather there reads w[ids] for the ids of the block.
3. `where(mask, rows, 0)` summed over tp is `select(0 <= ids < V, w[ids], 0)`: the blocks
   partition the id range (`-inf` and a pmax: the same as a partial max).
4. A lookup valid inside the block goes through ops that keep its positions apart (MoE's
   `einsum(tokens, w[clip(local)])`) before the `where`.
5. take_along_axis of max-shifted logits is the gathered logit minus the max (the target logit
   of the cross-entropy).

The grounded part runs every spelling and the nearest wrong programs on simulated CPU
devices: the correct spellings compute the reference's numbers and are proven, the wrong ones
compute other numbers and are not.
"""

from __future__ import annotations

import os

if "--xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                               + " --xla_force_host_platform_device_count=8").strip()

import time
from dataclasses import replace
from fractions import Fraction

import pytest

from entangle_mlir.core import intervals
from entangle_mlir.core import terms as T
from entangle_mlir.core.mesh import Mesh
from entangle_mlir.core.ranges import wrap_integer
from entangle_mlir.core.relations import BlockIndex, InBlock, Masked, Opaque, Rel, Shifted
from entangle_mlir.rules.common import COMPARISONS
from tests.rules.test_device_blocks import (
    DP_TP,
    TP2,
    TP3,
    offsets,
    prove,
    refute,
    rel,
    run,
    zeros,
)
from tests.rules.test_lemmas import _EMBED, _TAKE_ALONG, arg

MESHES = [TP2, TP3, DP_TP]
IDS = ["tp2", "tp3", "dp2xtp2"]
TP4 = Mesh((("tp", 4),))


def _tokens(mesh: Mesh, n: int, dtype: str = "i32"):
    """Token ids (split over dp where the mesh has it) and their local shape."""
    t = arg((n,), dtype)
    if "dp" in mesh.names:
        return rel(t, "dp"), (n // mesh.group_size(("dp",)),)
    return rel(t), (n,)


def _local_ids(mesh: Mesh, length: int, n: int = 4, dtype: str = "i32"):
    """`ids - axis_index('tp') * length`, as the subtract rule relates it (proved)."""
    tokens, local = _tokens(mesh, n, dtype)
    start = Shifted(zeros(local, dtype), offsets(mesh, length))
    shifted = prove("stablehlo.subtract", [tokens, start], mesh, local, dtype=dtype)
    assert isinstance(shifted, Shifted)
    return tokens, shifted, local


def _compare(mesh, a, b, direction, local):
    return prove("stablehlo.compare", [a, b], mesh, local,
                 {"comparison_direction": direction}, "i1")


def _mask(mesh: Mesh, length: int, n: int = 4):
    """The Megatron mask, proved step by step: (local >= 0) & (local < n)."""
    tokens, shifted, local = _local_ids(mesh, length, n)
    lower = _compare(mesh, shifted, zeros(local, "i32"), "GE", local)
    upper = _compare(mesh, shifted, zeros(local, "i32", length), "LT", local)
    mask = prove("stablehlo.and", [lower, upper], mesh, local, dtype="i1")
    return tokens, shifted, mask, local


def _clip(mesh: Mesh, shifted: Shifted, length: int, local, how: str = "max_min"):
    """clip(local, 0, length - 1) in one of jax's spellings, proved step by step."""
    low, high = zeros(local, "i32"), zeros(local, "i32", length - 1)
    if how == "clamp":
        return prove("stablehlo.clamp", [low, shifted, high], mesh, local, dtype="i32")
    if how == "max_min":
        raised = prove("stablehlo.maximum", [low, shifted], mesh, local, dtype="i32")
        return prove("stablehlo.minimum", [high, raised], mesh, local, dtype="i32")
    lowered = prove("stablehlo.minimum", [shifted, high], mesh, local, dtype="i32")
    return prove("stablehlo.maximum", [lowered, low], mesh, local, dtype="i32")


# ----- 1. the range test of a wrapped difference ------------------------------------------------

@pytest.mark.parametrize("groups,length,k", [(2, 3, 0), (3, 16, 0), (4, 16, 0), (4, 48, 0),
                                             (3, 20, 2), (4, 40, -5)])
def test_wrapped_compare_is_exact_on_every_int8(groups: int, length: int, k: int) -> None:
    """Every direction, bound and operand order, on every int8 id and every device: the
    range test the rule states holds exactly where the device's wrapped compare does (blocks
    past 127 included: there the one-sided tests keep their wrapped ranges)."""
    mesh = Mesh((("tp", groups),))
    ids = rel(arg((2,), "i8"))
    device_offsets = tuple(wrap_integer(-(mesh.block_index(("tp",), d) * length + k), "i8")
                           for d in range(groups))
    shifted = Shifted(ids, device_offsets)
    for direction in COMPARISONS:
        for bound in (-128, -1, 0, 1, length - 1, length, length + 1, 127):
            constant = zeros((2,), "i8", bound)
            for first in (True, False):
                ins = [shifted, constant] if first else [constant, shifted]
                (test,), _, _ = run("stablehlo.compare", ins, mesh, (2,),
                                    {"comparison_direction": direction}, "i1")
                assert isinstance(test, InBlock), (direction, bound, test)
                for d in range(groups):
                    b = mesh.block_index(("tp",), d)
                    for x in range(-128, 128):
                        y = wrap_integer(x + device_offsets[d], "i8")
                        want = COMPARISONS[direction](y, bound) if first else \
                            COMPARISONS[direction](bound, y)
                        got = intervals.contains(test.ranges, x - b * test.length)
                        assert want == got, (direction, bound, first, d, x)


@pytest.mark.parametrize("mesh", MESHES, ids=IDS)
@pytest.mark.parametrize("spelling", ["ge_lt", "gt_le", "flipped", "not_or"])
def test_mask_spellings_are_the_block(mesh: Mesh, spelling: str) -> None:
    """(local >= 0) & (local < n), (local > -1) & (local <= n - 1), (0 <= local) & (n > local),
    ~((local < 0) | (local >= n)): each compare and the combination proved, the result
    exactly the block."""
    length = 3
    _, shifted, local = _local_ids(mesh, length)

    def c(value):
        return zeros(local, "i32", value)

    if spelling == "ge_lt":
        parts = [(shifted, c(0), "GE"), (shifted, c(length), "LT")]
    elif spelling == "gt_le":
        parts = [(shifted, c(-1), "GT"), (shifted, c(length - 1), "LE")]
    elif spelling == "flipped":
        parts = [(c(0), shifted, "LE"), (c(length), shifted, "GT")]
    else:
        parts = [(shifted, c(0), "LT"), (shifted, c(length), "GE")]
    tests = [_compare(mesh, a, b, d, local) for a, b, d in parts]
    if spelling == "not_or":
        outside = prove("stablehlo.or", tests, mesh, local, dtype="i1")
        assert isinstance(outside, InBlock) and outside.outside
        mask = prove("stablehlo.not", [outside], mesh, local, dtype="i1")
    else:
        mask = prove("stablehlo.and", tests, mesh, local, dtype="i1")
    assert isinstance(mask, InBlock) and mask.inside


@pytest.mark.parametrize("mesh", [TP3, DP_TP], ids=["tp3", "dp2xtp2"])
def test_unwrapped_readings_are_refuted(mesh: Mesh) -> None:
    """Must-fail: `local >= 0` read as `ids >= start` (no wrap-around) is refuted (ids near
    INT_MIN on a device with start > 0), and so is the block claimed for `local <= n`."""
    length = 3
    _, shifted, local = _local_ids(mesh, length)
    lower = _compare(mesh, shifted, zeros(local, "i32"), "GE", local)
    assert lower.ranges == ((None, -2**31), (0, None))
    refute("stablehlo.compare", [shifted, zeros(local, "i32")],
           replace(lower, ranges=((0, None),)), mesh, local, {"comparison_direction": "GE"},
           "i1")
    upper = _compare(mesh, shifted, zeros(local, "i32", length), "LE", local)
    both = prove("stablehlo.and", [lower, upper], mesh, local, dtype="i1")
    assert both.ranges == ((0, length + 1),) and not both.is_block
    refute("stablehlo.and", [lower, upper], replace(both, ranges=((0, length),)), mesh, local,
           dtype="i1")


# ----- 2. the clipped local index ----------------------------------------------------------------

@pytest.mark.parametrize("mesh", MESHES, ids=IDS)
@pytest.mark.parametrize("how", ["max_min", "min_max", "clamp"])
def test_clip_is_a_clamped_block_index(mesh: Mesh, how: str) -> None:
    length = 3
    _, shifted, local = _local_ids(mesh, length)
    index = _clip(mesh, shifted, length, local, how)
    assert isinstance(index, BlockIndex) and index.clamp == (0, length - 1)
    assert index.bounds() == (0, length - 1)


def test_clip_must_fail_variants() -> None:
    """Must-fail: the clip is not `where(outside, 0, local)` (ids above the block clip to
    n - 1), nor a clip to [0, n]; a clip cutting the block is refused."""
    mesh, length = TP3, 3
    _, shifted, local = _local_ids(mesh, length)
    low, high = zeros(local, "i32"), zeros(local, "i32", length - 1)
    index = _clip(mesh, shifted, length, local, "clamp")
    refute("stablehlo.clamp", [low, shifted, high], replace(index, clamp=None), mesh, local,
           dtype="i32")
    refute("stablehlo.clamp", [low, shifted, high], replace(index, clamp=(0, length)), mesh,
           local, dtype="i32")
    wide = prove("stablehlo.clamp", [low, shifted, zeros(local, "i32", length)], mesh, local,
                 dtype="i32")
    assert wide.clamp == (0, length)
    (cut,), _, _ = run("stablehlo.clamp", [low, shifted, zeros(local, "i32", length - 2)],
                       mesh, local, dtype="i32")
    assert isinstance(cut, Opaque) and "cuts the device's block" in cut.reason


# ----- 3. the masked lookup and its sum over tp --------------------------------------------------

def _lookup(mesh: Mesh, length: int, width: int, n: int = 4):
    tokens, shifted, mask, local = _mask(mesh, length, n)
    index = _clip(mesh, shifted, length, local)
    column = prove("stablehlo.broadcast_in_dim", [index], mesh, local + (1,),
                   {"broadcast_dimensions": (0,)}, "i32")
    vocab = length * mesh.group_size(("tp",))
    table = rel(arg((vocab, width)), "tp")
    rows = prove("stablehlo.gather", [table, column], mesh, local + (width,),
                 {**_EMBED, "slice_sizes": (1, width)})
    assert isinstance(rows, Masked) and not rows.zero
    wide = prove("stablehlo.broadcast_in_dim", [mask], mesh, local + (width,),
                 {"broadcast_dimensions": (0,)}, "i1")
    return tokens, rows, wide, local + (width,)


@pytest.mark.parametrize("mesh", MESHES, ids=IDS)
@pytest.mark.parametrize("width", [1, 3])
def test_masked_lookup_sums_to_the_lookup(mesh: Mesh, width: int) -> None:
    _, rows, wide, shape = _lookup(mesh, 2, width)
    summed = prove("stablehlo.select", [wide, rows, zeros(shape)], mesh, shape)
    assert isinstance(summed, Rel) and summed.partial == ("tp",) and summed.kind == "sum"
    top = prove("stablehlo.select", [wide, rows, zeros(shape, value=float("-inf"))], mesh,
                shape)
    assert isinstance(top, Rel) and top.partial == ("tp",) and top.kind == "max"


@pytest.mark.parametrize("mesh", [TP3, DP_TP], ids=["tp3", "dp2xtp2"])
def test_masked_lookup_must_fail_variants(mesh: Mesh) -> None:
    """Must-fail: the plain lookup (no range test) claimed as the sum, a sum claimed for the
    -inf fill, a partial max claimed for the zero fill; the mask on the wrong side and a
    mask off by one are refused."""
    _, rows, wide, shape = _lookup(mesh, 2, 2)
    summed = prove("stablehlo.select", [wide, rows, zeros(shape)], mesh, shape)
    lookup = summed.term.args[1]
    refute("stablehlo.select", [wide, rows, zeros(shape)], replace(summed, term=lookup), mesh,
           shape)
    refute("stablehlo.select", [wide, rows, zeros(shape)], replace(summed, kind="max"), mesh,
           shape)
    minus_inf = zeros(shape, value=float("-inf"))
    refute("stablehlo.select", [wide, rows, minus_inf], summed, mesh, shape)
    (flipped,), _, _ = run("stablehlo.select", [wide, zeros(shape), rows], mesh, shape)
    assert isinstance(flipped, Opaque)
    off = replace(wide, ranges=((0, 3),))
    (wrong,), _, _ = run("stablehlo.select", [off, rows, zeros(shape)], mesh, shape)
    assert isinstance(wrong, Opaque) and "not the device's block" in wrong.reason


def test_cross_entropy_target_at_the_clipped_label() -> None:
    """take_along_axis of vocab-split logits at the clipped local label, masked, summed."""
    mesh, length, rows_n = DP_TP, 2, 4
    _, shifted, mask, local = _mask(mesh, length, rows_n)
    index = _clip(mesh, shifted, length, local)
    column = prove("stablehlo.reshape", [index], mesh, local + (1, 1), dtype="i32")
    logits = rel(arg((rows_n, length * 2)), "dp", "tp")
    picked = prove("stablehlo.gather", [logits, column], mesh, local + (1,), dict(_TAKE_ALONG))
    flat = prove("stablehlo.reshape", [picked], mesh, local)
    target = prove("stablehlo.select", [mask, flat, zeros(local)], mesh, local)
    assert isinstance(target, Rel) and target.partial == ("tp",)


# ----- 4. carried through ops that keep positions apart ------------------------------------------

@pytest.mark.parametrize("mesh", [TP2, TP3], ids=["tp2", "tp3"])
def test_lookup_carried_through_a_batched_matmul(mesh: Mesh) -> None:
    """MoE: `einsum('sd,sdf->sf', x, w[clip(local)])` is valid inside the block, zeroed and
    summed after it. Must-fail: the product claimed valid on every device is refuted."""
    length, d, f, n = 2, 2, 3, 3
    _, shifted, mask, local = _mask(mesh, length, n)
    index = _clip(mesh, shifted, length, local)
    column = prove("stablehlo.broadcast_in_dim", [index], mesh, local + (1,),
                   {"broadcast_dimensions": (0,)}, "i32")
    experts = rel(arg((length * mesh.group_size(("tp",)), d, f)), "tp")
    picked = prove("stablehlo.gather", [experts, column], mesh, local + (d, f),
                   {**_EMBED, "offset_dims": (1, 2), "slice_sizes": (1, d, f)})
    x = rel(arg((n, d)))
    attrs = {"lhs_batch": (0,), "rhs_batch": (0,), "lhs_contract": (1,), "rhs_contract": (1,)}
    out = prove("stablehlo.dot_general", [x, picked], mesh, local + (f,), attrs)
    assert isinstance(out, Masked) and not out.zero
    refute("stablehlo.dot_general", [x, picked], out.rel, mesh, local + (f,), attrs)
    wide = prove("stablehlo.broadcast_in_dim", [mask], mesh, local + (f,),
                 {"broadcast_dimensions": (0,)}, "i1")
    scaled = prove("stablehlo.multiply", [out, zeros(local + (f,), value=2)], mesh,
                   local + (f,))
    assert isinstance(scaled, Masked)
    summed = prove("stablehlo.select", [wide, scaled, zeros(local + (f,))], mesh, local + (f,))
    assert isinstance(summed, Rel) and summed.partial == ("tp",)


# ----- 5. the target logit of max-shifted logits -------------------------------------------------

def _gather(operand: T.Term, indices: T.Term, dims: dict, shape) -> T.Term:
    from entangle_mlir.rules.gather_scatter import make_gather

    full = {"offset_dims": (), "collapsed_slice_dims": (), "operand_batching_dims": (),
            "start_indices_batching_dims": (), **dims}
    return make_gather(operand, indices, full, dims["slice_sizes"], shape, operand.dtype)


def _shifted(x: T.Term, m: T.Term, dims, sign: int = -1) -> T.Term:
    return T.make_lin([(Fraction(1), x), (Fraction(sign), T.make_broadcast(m, dims, x.shape))],
                      Fraction(0), x.shape, x.dtype)


@pytest.mark.parametrize("rows,vocab", [(2, 3), (3, 4), (4, 2)])
def test_gather_of_a_shifted_tensor(rows: int, vocab: int) -> None:
    """`normalize/idioms._gather_of_shift`: take_along_axis(x - broadcast(m), i) is
    take_along_axis(x, i) - m, and a row lookup of `w - broadcast(b)` (b along the row)
    is the lookup minus b; Z3 proves both for every x, m, i (indices out of range
    included: the gather clamps them alike). Must-fail: plus m, twice m, and a shift
    broadcast along the indexed dim taken out as if it were constant there."""
    from entangle_mlir.analysis.instance.term_equality import check_term_equality

    x, m, i = arg((rows, vocab)), arg((rows,)), arg((rows, 1, 1), "i32")
    take = dict(_TAKE_ALONG)
    left = _gather(_shifted(x, m, (0,)), i, take, (rows, 1))
    right = T.make_lin([(Fraction(1), _gather(x, i, take, (rows, 1))),
                        (Fraction(-1), T.make_broadcast(m, (0,), (rows, 1)))],
                       Fraction(0), (rows, 1), "f32")
    assert check_term_equality(left, right).status == "proved"
    plus = T.make_lin([(Fraction(1), _gather(x, i, take, (rows, 1))),
                       (Fraction(1), T.make_broadcast(m, (0,), (rows, 1)))], Fraction(0),
                      (rows, 1), "f32")
    assert check_term_equality(left, plus).status == "refuted"
    along = arg((vocab,))
    wrong = _gather(_shifted(x, along, (1,)), i, take, (rows, 1))
    assert check_term_equality(wrong, T.make_lin(
        [(Fraction(1), _gather(x, i, take, (rows, 1))),
         (Fraction(-1), T.make_broadcast(T.make_op("slice", (along,), ((0,), (1,), (1,)),
                                                   (1,), "f32"), (1,), (rows, 1)))],
        Fraction(0), (rows, 1), "f32")).status == "refuted"
    twice = T.make_lin([(Fraction(1), _gather(x, i, take, (rows, 1))),
                        (Fraction(-2), T.make_broadcast(m, (0,), (rows, 1)))],
                       Fraction(0), (rows, 1), "f32")
    assert check_term_equality(left, twice).status == "refuted"
    w, b, ids = arg((vocab, rows)), arg((rows,)), arg((3, 1), "i32")
    embed = {**_EMBED, "slice_sizes": (1, rows)}
    left = _gather(_shifted(w, b, (1,)), ids, embed, (3, rows))
    right = T.make_lin([(Fraction(1), _gather(w, ids, embed, (3, rows))),
                        (Fraction(-1), T.make_broadcast(b, (1,), (3, rows)))],
                       Fraction(0), (3, rows), "f32")
    assert check_term_equality(left, right).status == "proved"


# ----- symbolic in the device: 512 devices --------------------------------------------------------

def test_the_rules_scale_to_512_devices() -> None:
    """dp 64 x tp 8: the mask, the clip, the lookup and the sum are related without expanding
    any tensor per device (only the offsets are a table), and every rule instance is proved
    by Z3 on the 8 devices at dp coordinate 0: the device masks and local indices depend on
    the tp block only, so the instance is symmetric in dp (`instance.devices._symmetric_axes`).
    Must-fail: the lookup without its range test claimed as the sum is refuted there."""
    from entangle_mlir.analysis.instance import devices
    from entangle_mlir.analysis.instance.checker import InstanceChecker

    mesh = Mesh((("dp", 64), ("tp", 8)))
    length, width, n = 4, 2, 128
    checker = InstanceChecker()
    start_time = time.perf_counter()

    def step(op, ins, shape, attrs=None, dtype="f32"):
        (out,), info, ctx = run(op, ins, mesh, shape, attrs, dtype)
        verdict = checker.check(info, ins, [out], mesh, ctx)
        assert verdict.status == "proved", (op, verdict.describe())
        assert devices._symmetric_axes(ins, [out], mesh) == ("dp",), op
        return out

    t = arg((n,), "i32")
    tokens, local = rel(t, "dp"), (n // 64,)
    start = Shifted(zeros(local, "i32"), offsets(mesh, length))
    shifted = step("stablehlo.subtract", [tokens, start], local, dtype="i32")
    lower = step("stablehlo.compare", [shifted, zeros(local, "i32")], local,
                 {"comparison_direction": "GE"}, "i1")
    upper = step("stablehlo.compare", [shifted, zeros(local, "i32", length)], local,
                 {"comparison_direction": "LT"}, "i1")
    mask = step("stablehlo.and", [lower, upper], local, dtype="i1")
    index = step("stablehlo.clamp", [zeros(local, "i32"), shifted,
                                     zeros(local, "i32", length - 1)], local, dtype="i32")
    column = step("stablehlo.broadcast_in_dim", [index], local + (1,),
                  {"broadcast_dimensions": (0,)}, "i32")
    table = rel(arg((length * 8, width)), "tp")
    rows = step("stablehlo.gather", [table, column], local + (width,),
                {**_EMBED, "slice_sizes": (1, width)})
    wide = step("stablehlo.broadcast_in_dim", [mask], local + (width,),
                {"broadcast_dimensions": (0,)}, "i1")
    ins = [wide, rows, zeros(local + (width,))]
    summed = step("stablehlo.select", ins, local + (width,))
    assert time.perf_counter() - start_time < 60
    assert isinstance(mask, InBlock) and mask.inside and isinstance(index, BlockIndex)
    assert isinstance(summed, Rel) and summed.partial == ("tp",)
    assert summed.tiling[0] == ("dp",)
    _, info, ctx = run("stablehlo.select", ins, mesh, local + (width,))
    wrong = replace(summed, term=summed.term.args[1])
    assert checker.check(info, ins, [wrong], mesh, ctx).status == "refuted"


def test_offsets_varying_along_an_axis_break_its_symmetry() -> None:
    """Must-fail for the symmetry: offsets that differ along dp (a start that counts dp
    blocks too) make dp not symmetric, so every device's claim is checked."""
    from entangle_mlir.analysis.instance import devices

    mesh = Mesh((("dp", 2), ("tp", 2)))
    tokens, local = rel(arg((4,), "i32"), "dp"), (2,)
    start = Shifted(zeros(local, "i32"), tuple(-d for d in range(mesh.num_devices)))
    (shifted,), _, _ = run("stablehlo.subtract", [tokens, start], mesh, local, dtype="i32")
    assert devices._symmetric_axes([tokens, start], [shifted], mesh) == ()
    tp_only = Shifted(zeros(local, "i32"), offsets(mesh, 2))
    (shifted,), _, _ = run("stablehlo.subtract", [tokens, tp_only], mesh, local, dtype="i32")
    assert devices._symmetric_axes([tokens, tp_only], [shifted], mesh) == ("dp",)


def test_a_gather_pairing_split_indices_with_replicated_rows_is_not_symmetric() -> None:
    """Must-fail for the gather's symmetry: take_along_axis pairs operand row b with index row
    b, so indices split over tp with a replicated operand are not symmetric in tp (the
    device at tp coordinate 1 reads other rows than the renamed claim of coordinate 0);
    both split alike are."""
    from entangle_mlir.analysis.instance import devices

    mesh = TP2
    logits, ids = arg((4, 3)), arg((4, 1, 1), "i32")
    dims = {k: v for k, v in _TAKE_ALONG.items() if k != "slice_sizes"}
    term = T.intern("stablehlo.gather", (logits, ids), tuple(sorted(
        {**dims, "slice_sizes": (1, 1)}.items())), (4, 1), "f32")
    out = rel(term, "tp")
    assert devices._symmetric_axes([rel(logits), rel(ids, "tp")], [out], mesh) == ()
    assert devices._symmetric_axes([rel(logits, "tp"), rel(ids, "tp")], [out], mesh) == ("tp",)
