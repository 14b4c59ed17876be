"""Integers in the arithmetic of their width (issue 16, class 2): two's-complement wrap-around,
truncating division, narrowing converts that wrap, integers in floats only where exact.

Each attack is a small shard_map program whose reference and sharded side are executed on
simulated CPU devices with chosen inputs (near 2^31, negative, odd, above 127 / 255 / 2^15,
iota positions above 256 in bf16): the numbers differ and the program is not proven. Its
correct twin computes the same numbers and is proven, every rule instance by Z3. The lemma
tests check the changed rules on small symbolic shapes (Z3 with integer wrap-around), and
must-fail lemmas show Z3 refuting the old, rational reading.

False proofs these replace (all were "verified" before):
* `ValidIndices` took `ids * 2^29 >= 0` as always true for ids in [0, 16) (it wraps for ids
  >= 4) and `iota + 2147483000 < 2147483647` as the prefix i < 647 (it wraps from 648 on);
* an integer `divide` by a constant became the scale 1/c: `trunc(x / 2) * 2` was `x`;
* narrowing converts (i32 -> i8 / ui8 / i16, i32 -> ui32) were dropped as exact;
* an iota in bf16 (or an int32 iota converted to bf16) was read as exact integers.
"""

from __future__ import annotations

import os

if "--xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                               + " --xla_force_host_platform_device_count=8").strip()

from collections.abc import Callable
from dataclasses import dataclass, replace
from fractions import Fraction

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from entangle_mlir.core import intrange, ranges
from entangle_mlir.core import terms as T
from entangle_mlir.core.relations import InBlock, Opaque, Shifted
from entangle_mlir.driver import check_texts
from entangle_mlir.rules import RULES
from entangle_mlir.rules.base import RuleContext
from entangle_mlir.semantics.element import div, remainder, wrap_int
from examples.real.catalog import custom, lower_pair, make_mesh, reference_fn, sharded_fn
from examples.real.programs import ArgDef
from tests.rules.test_lemmas import M1, M2, M3, Lemma, arg, prove_lemma, refute, rel, splat

I32 = jnp.int32
V = 16  # vocabulary of the lookups
N = 1024  # iota length of the interval masks


@dataclass(frozen=True)
class Case:
    name: str
    reference: Callable
    body: Callable
    args: tuple[ArgDef, ...]
    out_specs: object
    inputs: Callable[[], list[np.ndarray]]
    correct: bool


def _ints(name: str, shape: tuple[int, ...]) -> ArgDef:
    return ArgDef(name, shape, "int32", "tokens", P("dp"), high=V)


def _floats(name: str, shape: tuple[int, ...]) -> ArgDef:
    return ArgDef(name, shape, "float32", "data", P())


def _table() -> np.ndarray:
    return np.arange(V * 4, dtype=np.float32).reshape(V, 4) + 1


# ----- the programs ---------------------------------------------------------------------------

def _lookup(w, ids):
    return jnp.take(w, ids, axis=0)


def _masked_lookup(factor: int):
    def reference(w, ids):
        keep = (ids * factor >= 0)[..., None]  # valid ids are >= 0, but the product wraps
        return jnp.where(keep, jnp.take(w, ids, axis=0), 0.0)
    return reference


def _prefix_mask(offset: int, bound: int):
    def body(x):
        return jnp.where(lax.iota(I32, N) + offset < bound, x, 0.0)
    return body


def _prefix_reference(x):
    return jnp.where(lax.iota(I32, N) < 647, x, 0.0)


def _identity(x):
    return x


def _halved_doubled(x):
    return lax.div(x, I32(2)) * 2


def _round_trip(dtype):
    def body(x):
        return x.astype(dtype).astype(I32)
    return body


def _via_unsigned_to_float(x):
    return x.astype(jnp.uint32).astype(jnp.float32)


def _to_float(x):
    return x.astype(jnp.float32)


def _plus_float_iota(size: int):
    def reference(x):
        return x + jnp.arange(size, dtype=jnp.float32)
    return reference


def _plus_iota_in(dtype, size: int, through_int: bool):
    def body(x):
        iota = lax.iota(I32, size).astype(dtype) if through_int else lax.iota(dtype, size)
        return x + iota.astype(jnp.float32)
    return body


def _onehot_reference(w, ids):
    return jax.nn.one_hot(ids, V, dtype=w.dtype) @ w


def _onehot_vocab_parallel(offset_blocks: int):
    """Each device's one-hot hit `ids - start == j` over its vocab block (`offset_blocks`
    blocks further on: 0 is correct), summed over 'dp'."""
    def body(w, ids):
        vl = w.shape[0]
        start = (lax.axis_index("dp") + offset_blocks) * vl
        hit = (ids[:, None] - start) == jnp.arange(vl)[None, :]
        return lax.psum(hit.astype(w.dtype) @ w, "dp")
    return body


def _extreme_ids() -> list[np.ndarray]:
    """Valid ids and ids near INT_MIN / INT_MAX, where `ids - start` wraps."""
    return [_table(), np.array([0, 5, 9, 15, -2147483648, -2147483641, 2147483647, 3],
                               np.int32)]


def _odd_and_negative() -> list[np.ndarray]:
    return [np.array([3, -3, 7, -7, 2147483647, -2147483648, 1, 0], np.int32)]


def _wide() -> list[np.ndarray]:
    return [np.array([300, -129, 127, 40000, -40000, 255, 2147483647, -1], np.int32)]

CASES = [
    # the valid-index simplifier: ids * 2^29 wraps for ids >= 4; ids * 2 never does
    Case("valid_index_product_wraps", _masked_lookup(1 << 29), _lookup,
         (_floats("w", (V, 4)), _ints("ids", (8,))), P("dp"),
         lambda: [_table(), np.arange(8, dtype=np.int32) + 2], False),
    Case("valid_index_product_fits", _masked_lookup(2), _lookup,
         (_floats("w", (V, 4)), _ints("ids", (8,))), P("dp"),
         lambda: [_table(), np.arange(8, dtype=np.int32) + 2], True),
    # iota intervals: iota + 2147483000 wraps from i = 648 on; iota + 1000 does not
    Case("iota_interval_wraps", _prefix_reference, _prefix_mask(2147483000, 2147483647),
         (_floats("x", (N,)),), P(), lambda: [np.ones(N, np.float32)], False),
    Case("iota_interval_exact", _prefix_reference, _prefix_mask(1000, 1647),
         (_floats("x", (N,)),), P(), lambda: [np.ones(N, np.float32)], True),
    # an equality compare of `ids - start` is wrap-invariant (adding start is a bijection
    # mod 2^32), so it is proven even where the subtraction wraps; a wrong offset is not
    Case("onehot_eq_compare_wraps_exactly", _onehot_reference, _onehot_vocab_parallel(0),
         (ArgDef("w", (V, 4), "float32", "data", P("dp")),
          ArgDef("ids", (8,), "int32", "tokens", P(), high=V)), P(), _extreme_ids, True),
    Case("onehot_eq_compare_wrong_offset", _onehot_reference, _onehot_vocab_parallel(1),
         (ArgDef("w", (V, 4), "float32", "data", P("dp")),
          ArgDef("ids", (8,), "int32", "tokens", P(), high=V)), P(), _extreme_ids, False),
    # integer division truncates toward zero
    Case("int_divide_is_not_a_scale", _identity, _halved_doubled, (_ints("x", (8,)),),
         P("dp"), _odd_and_negative, False),
    Case("int_divide_same_on_both_sides", _halved_doubled, _halved_doubled,
         (_ints("x", (8,)),), P("dp"), _odd_and_negative, True),
    # narrowing converts wrap
    Case("convert_i32_i8_wraps", _identity, _round_trip(jnp.int8), (_ints("x", (8,)),),
         P("dp"), _wide, False),
    Case("convert_i32_ui8_wraps", _identity, _round_trip(jnp.uint8), (_ints("x", (8,)),),
         P("dp"), _wide, False),
    Case("convert_i32_i16_wraps", _identity, _round_trip(jnp.int16), (_ints("x", (8,)),),
         P("dp"), _wide, False),
    Case("convert_i32_ui32_to_float", _to_float, _via_unsigned_to_float, (_ints("x", (8,)),),
         P("dp"), _wide, False),
    Case("convert_i32_i8_on_both_sides", _round_trip(jnp.int8), _round_trip(jnp.int8),
         (_ints("x", (8,)),), P("dp"), _wide, True),
    # an iota in bf16 is exact only up to 256
    Case("int_iota_to_bf16_rounds", _plus_float_iota(512),
         _plus_iota_in(jnp.bfloat16, 512, True), (_floats("x", (512,)),), P(),
         lambda: [np.zeros(512, np.float32)], False),
    Case("int_iota_to_f16_rounds", _plus_float_iota(4096),
         _plus_iota_in(jnp.float16, 4096, True), (_floats("x", (4096,)),), P(),
         lambda: [np.zeros(4096, np.float32)], False),
    Case("bf16_iota_exact", _plus_float_iota(256), _plus_iota_in(jnp.bfloat16, 256, False),
         (_floats("x", (256,)),), P(), lambda: [np.zeros(256, np.float32)], True),
    Case("int_iota_to_bf16_exact", _plus_float_iota(256),
         _plus_iota_in(jnp.bfloat16, 256, True), (_floats("x", (256,)),), P(),
         lambda: [np.zeros(256, np.float32)], True),
]


def _example(case: Case):
    return custom(case.name, (("dp", 2),), case.reference, case.body, case.args,
                  case.out_specs, case.name)


def _run(case: Case) -> tuple[np.ndarray, np.ndarray]:
    ex = _example(case)
    inputs = case.inputs()
    mesh = make_mesh(ex)
    want = np.asarray(reference_fn(ex)(*inputs))
    placed = [jax.device_put(x, NamedSharding(mesh, a.spec)) for x, a in zip(inputs, ex.args)]
    got = np.asarray(sharded_fn(ex)(*placed))
    return want, got


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_verdict_matches_execution(case: Case) -> None:
    """A program that computes other numbers is not proven; its correct twin is proven with
    every rule instance proved by Z3."""
    want, got = _run(case)
    same = bool(np.array_equal(want, got))
    assert same == case.correct, f"{case.name}: grounded {'equal' if same else 'different'}"
    report = check_texts(*lower_pair(_example(case)), verify_rules=True)
    assert report.proven == case.correct, report.render_text()
    if case.correct:
        assert " 0 refuted, 0 inconclusive" in report.mode, report.mode


# ----- the value ranges ------------------------------------------------------------------------

def test_value_ranges_are_those_of_the_dtype() -> None:
    """A product that may wrap has its dtype's whole range; an argument its dtype's range; an
    iota of 512 positions is not a bf16 range."""
    ids = T.make_arg(0, (8,), "i32")
    wide = ranges.int_limits("i32")
    assert intrange.value_range(ids) == wide
    assert intrange.value_range(T.scale(ids, 1 << 29), {ids.serial: (0, 15)}) == wide
    assert intrange.value_range(T.scale(ids, 2), {ids.serial: (0, 15)}) == (0, 30)
    assert intrange.value_range(T.make_iota((512,), 0, "bf16")) is None
    assert intrange.value_range(T.make_iota((256,), 0, "bf16")) == (0, 255)
    assert ranges.exact_convert("i8", "bf16") and not ranges.exact_convert("i16", "bf16")
    assert ranges.exact_convert("ui16", "i32") and not ranges.exact_convert("i32", "ui32")
    assert [ranges.wrap_integer(v, "i8") for v in (300, -129, 128)] == [44, 127, -128]


def test_bf16_iota_is_not_the_float_iota() -> None:
    """An iota of 512 positions in bf16 converted to f32 is not the f32 iota (257 is not a
    bf16 value; XLA's CPU backend happens to fold the convert into an f32 iota, so this one
    is not grounded by execution); 256 positions are."""
    for size, exact in ((512, False), (256, True)):
        ex = custom(f"bf16_iota_{size}", (("dp", 2),), _plus_float_iota(size),
                    _plus_iota_in(jnp.bfloat16, size, False), (_floats("x", (size,)),), P(),
                    "bf16 iota")
        assert check_texts(*lower_pair(ex)).proven == exact


def test_integer_division_keeps_its_term() -> None:
    x = T.make_arg(0, (4,), "i32")
    two = T.make_splat(2, (4,), "i32")
    halved = T.make_div(x, two)
    assert halved.op == "div"
    assert T.make_mul(halved, two) is not x
    assert T.make_div(x, T.make_splat(1, (4,), "i32")) is x
    real = T.make_arg(1, (4,), "f32")
    assert T.make_mul(T.make_div(real, T.make_splat(2, (4,), "f32")),
                      T.make_splat(2, (4,), "f32")) is real


def test_semantics_wrap() -> None:
    """The exact semantics the Z3 checks use computes integers in their width."""
    import z3

    x, y = z3.Int("x"), z3.Int("y")
    solver = z3.Solver()
    solver.add(x >= -128, x <= 127, y >= -128, y <= 127,
               wrap_int(x + y, "i8", 1) != (x + y + 128) % 256 - 128)
    assert solver.check() == z3.unsat
    assert wrap_int(2**31, "i32") == -(2**31)
    assert div(-7, 2, integer=True) == -3 and remainder(-7, 2, integer=True) == -1


def _exact_wrap(value, lo: int, hi: int):
    return (value - lo) % (hi - lo + 1) + lo


def test_wraps_at_different_steps_meet_in_one_term() -> None:
    """Reduction modulo 2^N is a ring homomorphism: `5 * wrap(9 * x)` and `45 * x` wrap to the
    same int32, and `wrap_int` builds one term for both (no two modulos for z3 to relate);
    likewise through sums, differences and negation, and whichever encoding came first."""
    import z3

    x, y = z3.Int("x"), z3.Int("y")
    late = wrap_int(5 * wrap_int(9 * x, "i32"), "i32")
    assert late.eq(wrap_int(45 * x, "i32"))
    mixed = wrap_int(wrap_int(x + y, "i32", 1) - wrap_int(-(3 * y), "i32"), "i32", 1)
    assert mixed.eq(wrap_int(x + 4 * y, "i32"))
    solver = z3.Solver()
    solver.add(x >= -2**31, x <= 2**31 - 1, late != _exact_wrap(45 * x, -2**31, 2**31 - 1))
    assert solver.check() == z3.unsat


def test_wraps_meet_only_where_the_homomorphism_holds() -> None:
    """Must fail: a wrap to another width, an integer division and a reduction with the wrong
    factor are not looked through; z3 finds the values where they differ."""
    import z3

    x = z3.Int("x")
    lo, hi = -2**31, 2**31 - 1
    narrow = wrap_int(5 * wrap_int(9 * x, "i8"), "i32")
    halved = wrap_int(z3.If(x >= 0, wrap_int(9 * x, "i32") / 3, -((-wrap_int(9 * x, "i32")) / 3)),
                      "i32")
    for wrong, right in ((narrow, 45 * x), (halved, 3 * x),
                         (wrap_int(5 * wrap_int(9 * x, "i32"), "i32"), 46 * x)):
        assert not wrong.eq(wrap_int(right, "i32"))
        solver = z3.Solver()
        solver.add(x >= lo, x <= hi, wrong != _exact_wrap(right, lo, hi))
        assert solver.check() == z3.sat


def test_a_known_wrap_is_reused_only_where_it_is_exact() -> None:
    """A wrap built by few If-corrections (exact for a value within `periods` ranges) is not
    handed out for a value that may lie further out; the modulo is, for any."""
    import z3

    x = z3.Int("x")
    near = wrap_int(x, "i8", 1)
    far = wrap_int(x, "i8", 3)
    assert not far.eq(near)
    solver = z3.Solver()
    solver.add(x >= -128 * 4, x <= 127 * 4, far != _exact_wrap(x, -128, 127))
    assert solver.check() == z3.unsat
    anywhere = wrap_int(x, "i8")
    assert wrap_int(x, "i8", 2).eq(anywhere)


# ----- lemmas: the changed rules, proved on small shapes ----------------------------------------

def _layouts():
    return [(M1, lambda t: rel(t, "tp")), (M2, lambda t: rel(t, ("dp", "tp"))),
            (M3, lambda t: rel(t, "tp"))]


def _convert(source: str, target: str, shape=(6,)) -> list[Lemma]:
    out = []
    for mesh, layout in _layouts():
        x = arg(shape, source)
        local = (shape[0] // mesh.num_devices,)
        out.append(Lemma(f"convert-{source}-{target}-{mesh.names}", "stablehlo.convert",
                         [layout(x)], results=[(local, target)], mesh=mesh))
    return out


LEMMAS = [
    *_convert("i32", "i8", (12,)), *_convert("i32", "ui8", (12,)),
    *_convert("i32", "i16", (12,)), *_convert("i8", "i32", (12,)),
    *_convert("ui32", "i32", (12,)), *_convert("i8", "bf16", (12,)),
    Lemma("int-divide-by-two", "stablehlo.divide",
          [rel(arg((4,), "i32"), "tp"), splat(2, (2,), "i32")],
          results=[((2,), "i32")]),
    Lemma("int-add-wraps", "stablehlo.add",
          [rel(arg((4,), "i8"), "tp"), rel(arg((4,), "i8"), "tp")]),
]


@pytest.mark.parametrize("lemma", LEMMAS, ids=[lemma.name for lemma in LEMMAS])
def test_integer_lemma(lemma: Lemma) -> None:
    prove_lemma(lemma)


def test_narrowing_convert_of_partial_sum_is_refused() -> None:
    x = arg((2, 3), "i32")
    lemma = Lemma("narrow", "stablehlo.convert", [rel(x, partial=("tp",))],
                  results=[((2, 3), "i8")])
    outs = RULES["stablehlo.convert"](lemma.info(), lemma.ins, lemma.context())
    assert isinstance(outs[0], Opaque)


def test_widening_convert_of_partial_sum_is_not_kept() -> None:
    """i8 pieces summed in i8 wrap before a widening convert: not a partial i32 sum (the rule
    refuses, and Z3 refutes the claim)."""
    x = arg((2, 3), "i8")
    lemma = Lemma("widen", "stablehlo.convert", [rel(x, partial=("tp",))],
                  results=[((2, 3), "i32")])
    outs = RULES["stablehlo.convert"](lemma.info(), lemma.ins, lemma.context())
    assert isinstance(outs[0], Opaque)
    widened = T.make_elementwise("stablehlo.convert", (x,), dtype="i32")
    refute("stablehlo.convert", lemma.ins, [rel(widened, partial=("tp",))], [((2, 3), "i32")])


def test_int_divide_of_partial_sum_is_not_kept() -> None:
    x = arg((4,), "i32")
    two = splat(2, (4,), "i32")
    lemma = Lemma("div", "stablehlo.divide", [rel(x, partial=("tp",)), two],
                  results=[((4,), "i32")])
    outs = RULES["stablehlo.divide"](lemma.info(), lemma.ins, lemma.context())
    assert isinstance(outs[0], Opaque)
    halved = T.make_div(x, T.make_splat(2, (4,), "i32"))
    refute("stablehlo.divide", lemma.ins, [rel(halved, partial=("tp",))], [((4,), "i32")])


# ----- must-fail: the old rational readings are refuted ------------------------------------------

def test_refutes_narrowing_convert_as_identity() -> None:
    x = arg((4,), "i32")
    refute("stablehlo.convert", [rel(x, "tp")], [rel(x, "tp")], [((2,), "i8")])


def test_refutes_integer_divide_as_scale() -> None:
    x = arg((4,), "i32")
    scaled = T.make_lin([(Fraction(1, 2), x)], Fraction(0), (4,), "i32")
    refute("stablehlo.divide", [rel(x, "tp"), splat(2, (2,), "i32")], [rel(scaled, "tp")],
           [((2,), "i32")])


def test_refutes_unwrapped_sum() -> None:
    """An i8 add claimed to be the unwrapped sum (an exact lin read as a wider integer)."""
    x, y = arg((4,), "i8"), arg((4,), "i8")
    wide = T.make_lin([(Fraction(1), T.make_elementwise("stablehlo.convert", (x,), dtype="i32")),
                       (Fraction(1), T.make_elementwise("stablehlo.convert", (y,), dtype="i32"))],
                      Fraction(0), (4,), "i32")
    refute("stablehlo.add", [rel(x, "tp"), rel(y, "tp")], [rel(wide, "tp")], [((2,), "i8")])


def test_shifted_compare_that_may_wrap_is_stated_exactly() -> None:
    """`(ids - start) < c` on arbitrary int32 ids: ids near INT_MIN wrap, so the compare is
    not the one-sided range test it reads as. The rule states the exact ids it accepts (device
    1's wrapped ids near INT_MIN too) and Z3 proves that; the naive reading is refuted."""
    mesh = M1
    ids = rel(arg((4,), "i32"))
    shifted = Shifted(ids, (0, -2))
    bound = rel(T.make_splat(2, (4,), "i32"))
    lemma = Lemma("cmp", "stablehlo.compare", [shifted, bound], results=[((4,), "i1")],
                  attrs={"comparison_direction": "LT"}, mesh=mesh)
    ctx = RuleContext(mesh=mesh, manual_axes=mesh.names)
    (test,) = RULES["stablehlo.compare"](lemma.info(), lemma.ins, ctx)
    assert isinstance(test, InBlock) and test.ranges == ((-2**31, 2),)
    prove_lemma(lemma)
    naive = replace(test, ranges=((None, 2),))
    refute("stablehlo.compare", [shifted, bound], [naive], [((4,), "i1")],
           {"comparison_direction": "LT"}, mesh)


@pytest.mark.parametrize("dtype,limits", [("i32", (-2**31, 2**31 - 1)), ("ui8", (0, 255)),
                                          ("i8", (-128, 127))])
def test_wrap_periods_of_sums_are_exact(dtype, limits) -> None:
    """`sum_periods` / `range_periods` (the If-chains the instance checks use for sums of
    values of a dtype, and for a partial sum's last piece) give the modular reduction on
    every value in the stated range."""
    import z3

    from entangle_mlir.semantics.element import range_periods, wrap_int

    lo, hi = limits
    for count in (2, 3, 4, 5, 8):
        for low, high in ((count * lo, count * hi), (lo - (count - 1) * hi,
                                                     hi - (count - 1) * lo)):
            periods = range_periods(dtype, low, high)
            if periods is None:
                continue
            x = z3.Int("x")
            solver = z3.Solver()
            solver.add(x >= low, x <= high,
                       wrap_int(x, dtype, periods) != (x - lo) % (hi - lo + 1) + lo)
            assert solver.check() == z3.unsat, (dtype, count, low, high, periods)
