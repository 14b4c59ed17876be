"""Completeness gaps the territory fuzzer found (benchmarks/GENERAL_TIER_RESULTS.md), each
closed generally and grounded: both programs run on simulated CPU devices; a correct one is
proven, its nearest wrong twin (numbers differ) is not.

* a constant added after block sums joined from contractions (`mine + ppermute(other) + 0.5`
  against `a0 @ a1 + 0.5`): the normal form dropped the constant while joining the sums, which
  also proved the twin without the constant in the reference (a false proof);
* a per-device factor `x * (axis_index + 1).astype(f32)` against the same factors as a
  constant table: a product by a constant spelled as a `lin` (`2 * x`) overflows where the
  reference's `x * [.., 2, ..]` does, so the overflow claim counts both;
* the vocab-parallel embedding masked by a product, `rows * mask[:, None].astype(rows.dtype)`:
  the same as `where(mask, rows, 0)` for integer or finite rows (`idioms._masked_product`);
  rows looked up by `jnp.take` at a clipped index are finite (its NaN fill is never picked:
  `normalize/int_ranges.py`, sound under wrap-around);
* `jnp.flip` (`stablehlo.reverse`) in the reference against blocks read in reverse order, and
  on both sides along a dim that is not split;
* the factor folded into a later scale (`x * (axis_index + 7) * 0.1` is `0.7 * x` on device
  7, the reference's `0.1 * (x * table)` keeps the product): the overflow claim counts a chain
  of constant factors at its folded product on both sides (`constant_product_part`);
* int32 products that wrap on 8 devices: 64 independent elements Z3 decides one by one
  (`solver.prove_all`) and not as one query.
"""

from __future__ import annotations

import os

if "--xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
    ).strip()

from dataclasses import dataclass
from fractions import Fraction

import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.sharding import PartitionSpec as P

from entangle_mlir.analysis.instance.term_equality import check_term_equality
from entangle_mlir.core.terms import intern, make_arg, make_dense, make_elementwise, make_lin
from entangle_mlir.driver import check_texts
from entangle_mlir.mlir.ir import parse_module
from entangle_mlir.normalize.int_ranges import decided
from tests.jax_runs import run_and_lower

RNG = np.random.default_rng(0)
IDS = np.array([0, 3, 8, 15, 7, 9, 1, 12], dtype=np.int32)  # block edges on both devices


@dataclass(frozen=True)
class Program:
    name: str
    reference: object
    body: object
    args: tuple
    specs: tuple
    out_specs: object
    tier: str = "general"
    mesh: tuple = (("i", 2),)
    general: bool = True
    """Run the general tier (a twin whose point is the layout tier's refusal skips its Z3
    search on an exp, which costs seconds)."""


def _blocks_plus(constant: float):
    def body(a0, a1):
        i = lax.axis_index("i")
        part = a0 @ a1
        mine = lax.dynamic_slice_in_dim(part, i * 2, 2, 0)
        other = lax.dynamic_slice_in_dim(part, (1 - i) * 2, 2, 0)
        return mine + lax.ppermute(other, "i", [(0, 1), (1, 0)]) + jnp.float32(constant)
    return body


def _factor(c: int):
    return lambda a0: a0 * (lax.axis_index("i") + c).astype(a0.dtype)


def _factor_reference(a0):
    return a0 * jnp.repeat(jnp.arange(2) + 1, 2).astype(a0.dtype).reshape((4, 1))


def _int_factor(c: int):
    return lambda a0: (a0 * (lax.axis_index(("a", "b")) + c).astype(a0.dtype)) * 5


def _int_factor_reference(a0):
    return a0 * jnp.repeat(jnp.arange(8) + 2, 2).astype(a0.dtype).reshape((1, 16)) * 5


AB = (("a", 4), ("b", 2))


def _scaled_factor(c: int):
    return lambda a0: a0 * (lax.axis_index("i") + c).astype(a0.dtype) * jnp.float32(0.1) + 1


def _scaled_factor_reference(c: int):
    def reference(a0):
        table = jnp.repeat(jnp.arange(2) + c, 2).astype(a0.dtype).reshape((4, 1))
        return a0 * table * jnp.float32(0.1) + 1
    return reference


def _embedding(bound: int = 8, mask_first: bool = False):
    def body(w, ids):
        local = ids - lax.axis_index("i") * 8
        mask = (local >= 0) & (local < bound)
        rows = w[jnp.clip(local, 0, 7)]
        scale = mask[:, None].astype(rows.dtype)
        return lax.psum(scale * rows if mask_first else rows * scale, "i")
    return body


def _take_embedding(clip: bool = True):
    def body(w, ids):
        local = ids - lax.axis_index("i") * 8
        mask = (local >= 0) & (local < 8)
        rows = jnp.take(w, jnp.clip(local, 0, 7) if clip else local, axis=0)
        return lax.psum(rows * mask[:, None].astype(rows.dtype), "i")
    return body


def _exp_embedding(w, ids):
    local = ids - lax.axis_index("i") * 8
    mask = (local >= 0) & (local < 8)
    rows = jnp.exp(w[jnp.clip(local, 0, 7)])
    return lax.psum(rows * mask[:, None].astype(rows.dtype), "i")


def _flipped_blocks(a0):
    return jnp.flip(a0.reshape((2, 2)), axis=0).reshape((4,))


def _blocks_read(reverse: bool):
    def body(a0):
        i = lax.axis_index("i")
        return lax.dynamic_slice_in_dim(a0, ((1 - i) if reverse else i) * 2, 2, 0)
    return body


def _flip_times_two(axis: int):
    return lambda a0: jnp.flip(a0, axis=axis) * 2.0


def _take(w, ids):
    return jnp.take(w, ids, axis=0)


def _ints(*shape):
    return RNG.integers(-50, 50, shape).astype(np.float32)


MM_ARGS, MM_SPECS = (_ints(4, 2), _ints(2, 2)), (P(None, "i"), P("i", None))
TABLE = RNG.standard_normal((16, 4)).astype(np.float32)
INT_TABLE = RNG.integers(-2**31, 2**31 - 1, (16, 4)).astype(np.int32)
INT_FACTOR_ARGS = (RNG.integers(-2**31, 2**31 - 1, (4, 16)).astype(np.int32),)

CORRECT = [
    Program("flipped_blocks", _flipped_blocks, _blocks_read(reverse=True), (_ints(4),),
            (P(),), P("i")),
    Program("flip_of_an_unsplit_dim", _flip_times_two(1), _flip_times_two(1), (_ints(4, 4),),
            (P("i", None),), P("i", None), tier="layout"),
    Program("blocks_plus_constant", lambda a0, a1: a0 @ a1 + jnp.float32(0.5),
            _blocks_plus(0.5), MM_ARGS, MM_SPECS, P("i", None)),
    Program("per_device_factor", _factor_reference, _factor(1), (_ints(4, 2),),
            (P("i", None),), P("i", None)),
    # the factor folded into the scale on one side (`0.7 * x`), kept as a product under it
    # on the other (`0.1 * (x * [7, 8])`): counted at the folded product on both; from 0,
    # device 0's product is an exact zero
    Program("per_device_factor_then_scaled", _scaled_factor_reference(7), _scaled_factor(7),
            (_ints(4, 2),), (P("i", None),), P("i", None)),
    Program("per_device_factor_from_zero_then_scaled", _scaled_factor_reference(0),
            _scaled_factor(0), (_ints(4, 2),), (P("i", None),), P("i", None)),
    # int32 products that wrap, on 8 devices: 64 independent elements, asked one by one
    # (`solver.prove_all`; as one query Z3 ran out of time)
    Program("per_device_int32_factor_wrapping", _int_factor_reference, _int_factor(2),
            INT_FACTOR_ARGS, (P(None, ("a", "b")),), P(None, ("a", "b")), mesh=AB),
    Program("embedding_times_mask", _take, _embedding(), (TABLE, IDS), (P("i", None), P()),
            P(), tier="layout"),
    Program("take_embedding_times_mask", _take, _take_embedding(), (TABLE, IDS),
            (P("i", None), P()), P(), tier="layout"),
    Program("embedding_mask_times_rows_int32", _take, _embedding(mask_first=True),
            (INT_TABLE, IDS), (P("i", None), P()), P(), tier="layout"),
]
TWINS = [
    Program("flipped_blocks_read_in_order", _flipped_blocks, _blocks_read(reverse=False),
            (_ints(4),), (P(),), P("i")),
    # each device flips its own block of the split dim: not the global flip
    Program("flip_of_the_split_dim", _flip_times_two(0), _flip_times_two(0), (_ints(4, 4),),
            (P("i", None),), P("i", None)),
    # the reference without the constant: proven before the normal form kept it
    Program("blocks_plus_constant_not_in_the_reference", lambda a0, a1: a0 @ a1,
            _blocks_plus(0.5), MM_ARGS, MM_SPECS, P("i", None)),
    Program("per_device_factor_off_by_one", _factor_reference, _factor(2), (_ints(4, 2),),
            (P("i", None),), P("i", None)),
    Program("per_device_int32_factor_off_by_one", _int_factor_reference, _int_factor(3),
            INT_FACTOR_ARGS, (P(None, ("a", "b")),), P(None, ("a", "b")), mesh=AB),
    Program("per_device_factor_then_scaled_off_by_one", _scaled_factor_reference(7),
            _scaled_factor(8), (_ints(4, 2),), (P("i", None),), P("i", None)),
    Program("embedding_times_mask_off_by_one", _take, _embedding(bound=9), (TABLE, IDS),
            (P("i", None), P()), P()),
    # an unclipped take fills NaN outside the device's rows: NaN * 0 is NaN
    Program("take_embedding_times_mask_unclipped", _take, _take_embedding(clip=False),
            (TABLE, IDS), (P("i", None), P()), P()),
    # rows that may be inf: inf * 0 is NaN where the select would give 0 (not rewritten)
    Program("embedding_times_mask_of_overflowing_rows", lambda w, ids: jnp.exp(_take(w, ids)),
            _exp_embedding, (np.full((16, 4), 100.0, dtype=np.float32), IDS),
            (P("i", None), P()), P(), general=False),
    Program("embedding_mask_times_rows_int32_off_by_one", _take,
            _embedding(bound=9, mask_first=True), (INT_TABLE, IDS), (P("i", None), P()), P()),
]


def _run(program: Program):
    want, got, texts = run_and_lower(program.reference, program.body, program.args,
                                     program.specs, program.out_specs, program.mesh)
    return np.asarray(want), np.asarray(got), texts


@pytest.mark.parametrize("program", CORRECT, ids=lambda p: p.name)
def test_correct_programs_are_proven(program: Program) -> None:
    want, got, (ref_text, sharded_text) = _run(program)
    np.testing.assert_allclose(got, want, rtol=1e-6)  # grounded: same numbers
    report = check_texts(ref_text, sharded_text)
    assert report.proven, report.render_text()
    assert report.stats["tier"] == program.tier


@pytest.mark.parametrize("program", TWINS, ids=lambda p: p.name)
def test_wrong_twins_are_not_proven(program: Program) -> None:
    want, got, (ref_text, sharded_text) = _run(program)
    assert not np.array_equal(got, want, equal_nan=True)  # grounded: other numbers
    report = check_texts(ref_text, sharded_text, general_tier=program.general)
    assert not report.proven, report.render_text()


def test_a_product_by_a_constant_overflows_alike_in_both_spellings() -> None:
    """`x * [2, 2]` and `2 * x` overflow at the same inputs: equal, with the overflow claim;
    `(2 * x) / 2` (its inner product written out) against `x` is equal in reals only: the
    inner `2 * x` overflows where `x` does not (must fail)."""
    x = make_arg(0, (2,), "f32")
    twos = make_dense(b"test_general_gaps.twos", (2,), "f32", values=np.array([2, 2]))
    product = make_elementwise("stablehlo.multiply", (x, twos), (), "f32")
    scaled = make_lin([(Fraction(2), x)], Fraction(0), (2,), "f32")
    assert product is not scaled
    assert check_term_equality(product, scaled, "gaps.alike", typed=True, known_dense=True,
                               finite_alike=True).proved
    inner = intern("lin", (x,), (Fraction(0), (Fraction(2),)), (2,), "f32")
    halved = intern("lin", (inner,), (Fraction(0), (Fraction(1, 2),)), (2,), "f32")
    found = check_term_equality(halved, x, "gaps.overflow", typed=True, finite_alike=True)
    assert not found.proved and "overflow" in found.reason


def test_a_chain_of_constant_factors_counts_at_its_folded_product() -> None:
    """`0.1 * (x * [7, 7])` (the factor a constant tensor, kept as a product) against
    `0.7 * x` (a scalar factor, folded by the normal form): the chain is counted at its
    folded product on both sides (liberty 1, as the normal form folds scalar factors). A
    product of two inputs is still counted where it is computed: `0.1 * (x * y)` against
    `(0.1 * x) * y` is equal in reals only (must fail)."""
    x = make_arg(0, (2,), "f32")
    y = make_arg(1, (2,), "f32")
    sevens = make_dense(b"test_general_gaps.sevens", (2,), "f32", values=np.array([7, 7]))
    product = intern("mul", (x, sevens), (), (2,), "f32")
    scaled = intern("lin", (product,), (Fraction(1), (Fraction(1, 10),)), (2,), "f32")
    folded = make_lin([(Fraction(7, 10), x)], Fraction(1), (2,), "f32")
    assert check_term_equality(scaled, folded, "gaps.folded", typed=True, known_dense=True,
                               finite_alike=True).proved
    inputs = intern("lin", (intern("mul", (x, y), (), (2,), "f32"),),
                    (Fraction(0), (Fraction(1, 10),)), (2,), "f32")
    regrouped = intern("mul", (intern("lin", (x,), (Fraction(0), (Fraction(1, 10),)), (2,),
                                      "f32"), y), (), (2,), "f32")
    found = check_term_equality(inputs, regrouped, "gaps.inputs", typed=True,
                                finite_alike=True)
    assert not found.proved and "overflow" in found.reason


WRAP = """
func.func @f(%arg0: tensor<4xi32>) -> (tensor<4xi1>, tensor<4xi1>, tensor<4xi1>) {
  %lo = stablehlo.constant dense<0> : tensor<4xi32>
  %hi = stablehlo.constant dense<10> : tensor<4xi32>
  %big = stablehlo.constant dense<2147483647> : tensor<4xi32>
  %x = stablehlo.clamp %lo, %arg0, %hi : tensor<4xi32>
  %in = stablehlo.compare LE, %x, %hi, SIGNED : (tensor<4xi32>, tensor<4xi32>) -> tensor<4xi1>
  %y = stablehlo.add %x, %big : tensor<4xi32>
  %wrapped = stablehlo.compare GE, %y, %lo, SIGNED : (tensor<4xi32>, tensor<4xi32>) -> tensor<4xi1>
  %m = stablehlo.maximum %y, %lo : tensor<4xi32>
  %kept = stablehlo.compare GE, %m, %lo, SIGNED : (tensor<4xi32>, tensor<4xi32>) -> tensor<4xi1>
  return %in, %wrapped, %kept : tensor<4xi1>, tensor<4xi1>, tensor<4xi1>
}
"""


def test_integer_ranges_decide_tests_only_where_no_value_wraps() -> None:
    """`clamp(0, x, 10) <= 10` always holds, and so does `max(y, 0) >= 0`; but `clamp(0, x,
    10) + (2^31 - 1) >= 0` does not (it wraps to negative for x >= 1): must not be decided."""
    module = parse_module(WRAP)
    with module.context:
        func = module.body.operations[0]
        ret = func.regions[0].blocks[0].operations[-1]
        in_range, wrapped, kept = ret.operands
        assert decided(in_range) is True
        assert decided(wrapped) is None
        assert decided(kept) is True
