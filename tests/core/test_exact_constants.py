"""Constants compare exactly (issue 16, class 4): no tolerance anywhere in a proof.

Each attack is a shard_map program whose constant differs from its reference's by a little (an
int32 addend by 400 in 10^9, a float constant by one ulp of its dtype, a reciprocal rounded in
the wrong dtype or one ulp off). It is executed on simulated devices with inputs chosen so
that the difference shows, its numbers differ from the reference's, and it is not proven. Its
correct twins (XLA's / jax's `x * fl(1 / c)` for `x / c`, jax's mean as `sum * (1 / n)`) are
proven, and the report states the assumption they rest on, in text and in JSON."""

from __future__ import annotations

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

import json
from fractions import Fraction

import numpy as np
import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp
import ml_dtypes
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from entangle_mlir.core.rounding import round_to
from entangle_mlir.driver import check_texts
from examples.real.catalog import (
    custom,
    lower_pair,
    make_mesh,
    reference_fn,
    sharded_fn,
)
from examples.real.programs import ArgDef

if len(jax.devices()) < 4:
    pytest.skip("needs 4 (simulated) devices", allow_module_level=True)

ROUNDING = "XLA's exact constant rounding"
BF16 = ml_dtypes.bfloat16


def _judge(name: str, reference, body, x: np.ndarray, *, verify: bool = False):
    """(reference output, sharded output on 4 simulated devices, report) for `x` split over
    its first dim."""
    ex = custom(name, (("x", 4),), reference, body,
                (ArgDef("x", x.shape, str(x.dtype), "data", P("x")),), P("x"), name)
    want = np.asarray(reference_fn(ex)(x))
    got = np.asarray(sharded_fn(ex)(jax.device_put(x, NamedSharding(make_mesh(ex), P("x")))))
    return want, got, check_texts(*lower_pair(ex), verify_rules=verify)


def _ulp_up(value, dtype):
    """The next representable value of `dtype` above `value`."""
    return np.nextafter(dtype(value), dtype(np.inf)) if dtype is not BF16 else (
        np.frombuffer((np.frombuffer(BF16(value).tobytes(), np.uint16) + 1).tobytes(), BF16)[0])


def _assumed(report) -> list[str]:
    """What the report says the proof assumed about constants, in text and in JSON."""
    lines = report.render_text().splitlines()
    text = [line for line in lines if ROUNDING in line and not line.startswith("  - ")]
    listed = [line for line in lines if ROUNDING in line and line.startswith("  - ")]
    data = json.loads(report.dumps())
    assert [n for n in data["notes"] if ROUNDING in n] == [
        n for n in report.notes if ROUNDING in n]
    assert any(ROUNDING in a for a in data["assumptions"]) == bool(text) == bool(listed), data
    return text


# ----- exact rounding ---------------------------------------------------------------------------

@pytest.mark.parametrize("dtype, np_dtype", [("f32", np.float32), ("f16", np.float16),
                                             ("bf16", BF16), ("f64", np.float64)])
def test_round_to_is_correct_rounding(dtype: str, np_dtype) -> None:
    """`round_to` is IEEE's round-to-nearest-even of the exact rational: it agrees with the
    dtype's own correctly rounded division 1 / c, and ties go to the even neighbour."""
    for c in (3, 7, 10, 768, 1000, 3072, 4096 + 1):
        want = np_dtype(1) / np_dtype(c) if np_dtype is not BF16 else BF16(1 / c)
        assert round_to(Fraction(1, c), dtype) == Fraction(float(want)), c
    half_ulp_above_one = 1 + Fraction(1, 2 ** {"f32": 24, "f16": 11, "bf16": 8, "f64": 53}[dtype])
    assert round_to(half_ulp_above_one, dtype) == 1  # a tie: to even


def test_round_to_f32_does_not_round_twice() -> None:
    """A rational just above a float32 tie that float64 rounds onto the tie: going through
    float64 would round it to even (down), the exact rounding goes up."""
    tie = 1 + Fraction(1, 2 ** 24)
    above = tie + Fraction(1, 2 ** 80)
    assert np.float32(float(above)) == np.float32(1)  # the double rounding
    assert round_to(above, "f32") == 1 + Fraction(1, 2 ** 23)


def test_round_to_edges() -> None:
    """Subnormals round on their fixed grid (ties to even), overflow gives infinity; a rounding
    to infinity or to zero is never accepted as a constant's rounding; integers never round."""
    from entangle_mlir.core.rounding import is_rounding_of

    tiny = Fraction(1, 2 ** 149)  # the least float32 subnormal
    assert round_to(tiny * Fraction(3, 2), "f32") == 2 * tiny == Fraction(float(
        np.float32(float(tiny)) * np.float32(2)))
    assert round_to(tiny / 2, "f32") == 0 and round_to(Fraction(2) ** 128, "f32") == np.inf
    assert round_to(Fraction(65520), "f16") == np.inf and round_to(Fraction(65519), "f16") == 65504
    assert not is_rounding_of(np.inf, Fraction(2) ** 128, "f32")
    assert not is_rounding_of(Fraction(0), tiny / 4, "f32")
    assert not is_rounding_of(Fraction(1000000000), Fraction(1000000400), "i32")
    assert is_rounding_of(Fraction(float(np.float32(0.1))), Fraction(1, 10), "f32")
    assert not is_rounding_of(Fraction(float(np.float32(0.1))), Fraction(1, 10), "bf16")


# ----- attacks: numbers differ, not proven ---------------------------------------------------

def test_int32_addend_off_by_400_is_not_proven() -> None:
    """`x + 1000000400` for `x + 1000000000` in int32 (relative difference 4e-7): the old
    tolerance of 2^-21 took one for the other."""
    x = np.arange(8, dtype=np.int32)
    want, got, report = _judge("int_addend", lambda x: x + 1000000000,
                               lambda x: x + 1000000400, x)
    assert (got - want == 400).all()
    assert not report.proven, report.render_text()
    want, got, report = _judge("int_addend_twin", lambda x: x + 1000000000,
                               lambda x: x + 1000000000, x, verify=True)
    assert np.array_equal(got, want) and report.proven, report.render_text()


@pytest.mark.parametrize("np_dtype", [np.float32, np.float16, BF16],
                         ids=["f32", "f16", "bf16"])
def test_constant_one_ulp_off_is_not_proven(np_dtype) -> None:
    """A constant one ulp of its dtype away from the reference's: with x = 1 the product IS
    the constant, so the numbers differ."""
    c = np_dtype(3.0)
    off = _ulp_up(3.0, np_dtype)
    x = np.array([1, 2, -1, 0.5, 4, 8, 16, 1024], np.float32)

    def scaled(constant):
        return lambda x: (x.astype(np_dtype) * constant).astype(jnp.float32)

    want, got, report = _judge(f"ulp_{np.dtype(np_dtype).name}", scaled(c), scaled(off), x)
    assert got[0] == np.float32(off) != want[0] == np.float32(c)
    assert not report.proven, report.render_text()
    want, got, report = _judge(f"ulp_twin_{np.dtype(np_dtype).name}", scaled(c), scaled(c), x,
                               verify=True)
    assert np.array_equal(got, want) and report.proven, report.render_text()
    assert not _assumed(report)


def _reciprocals():
    exact = np.float32(1) / np.float32(768)  # IEEE division: the correctly rounded 1/768
    flipped = np.frombuffer((np.frombuffer(exact.tobytes(), np.uint32) ^ 1).tobytes(),
                            np.float32)[0]
    return exact, flipped


@pytest.mark.parametrize("wrong", ["last_bit", "bf16", "one_ulp_up"])
def test_wrong_reciprocal_is_not_proven(wrong: str) -> None:
    """`x * c` for the reference's `x / 768` (float32), with c float32(1/768) with its last
    bit flipped, or bfloat16(1/768), or float32(1/768) one ulp up: x = 768
    gives 1 in the reference and not 1 with each of these constants."""
    exact, flipped = _reciprocals()
    constant = {"last_bit": flipped, "bf16": np.float32(BF16(1 / 768)),
                "one_ulp_up": np.nextafter(exact, np.float32(1))}[wrong]
    assert constant != exact
    x = np.array([768, 1536, 3, 7, -768, 10, 1e6, 2304], np.float32)
    want, got, report = _judge(f"recip_{wrong}", lambda x: x / 768,
                               lambda x: x * constant, x)
    assert want[0] == 1 and got[0] != 1
    assert not report.proven, report.render_text()
    assert not _assumed(report)


def test_reciprocal_rounded_in_bf16_where_reference_divides_in_f32_is_not_proven() -> None:
    """The whole product in bfloat16 against a float32 division: the constant is bf16(1/768),
    exactly the rounding of 1/768 to bfloat16, but the value it scales is float32 in the
    reference; rounding is accepted only in the dtype the sharded value has."""
    x = np.array([768, 1536, 3, 7, -768, 10, 1e6, 2304], np.float32)
    want, got, report = _judge("recip_bf16_mul", lambda x: x / 768,
                               lambda x: x * jnp.asarray(BF16(1 / 768)).astype(jnp.float32), x)
    assert not np.array_equal(want, got)
    assert not report.proven, report.render_text()


# ----- correct twins: proven, with the assumption stated ----------------------------------------

def test_xla_reciprocal_is_proven_and_reported() -> None:
    """XLA's own spelling of `x / 768` in float32, `x * float32(1/768)`: proven, assuming
    exactly that rounding, which the report names (text and JSON)."""
    exact, _ = _reciprocals()
    x = np.array([768, 1536, 3, 7, -768, 10, 1e6, 2304], np.float32)
    want, got, report = _judge("recip_xla", lambda x: x / 768, lambda x: x * exact, x,
                               verify=True)
    assert np.array_equal(got, x * exact) and np.allclose(got, want, rtol=1e-7)
    assert report.proven, report.render_text()
    (line,) = _assumed(report)
    assert "`x / 768` vs sharded `x * 0.00130208337` (float32(1/768))" in line, line


def test_jax_mean_as_sum_times_reciprocal_is_proven() -> None:
    """jax's mean of a sharded row, spelled `psum(sum(x)) * (1 / n)` (a Python float: jax
    rounds it to float32), against the reference's `jnp.mean` (a division by n)."""
    x = np.random.default_rng(0).standard_normal((8, 12)).astype(np.float32)
    ex = custom("mean_sum_times", (("x", 4),), lambda x: jnp.mean(x, axis=0),
                lambda x: jax.lax.psum(jnp.sum(x, axis=0), "x") * (1 / 8),
                (ArgDef("x", x.shape, "float32", "data", P("x")),), P(), "mean")
    want = np.asarray(reference_fn(ex)(x))
    got = np.asarray(sharded_fn(ex)(jax.device_put(x, NamedSharding(make_mesh(ex), P("x")))))
    assert np.allclose(got, want, rtol=1e-6, atol=1e-6)
    report = check_texts(*lower_pair(ex), verify_rules=True)
    assert report.proven, report.render_text()
    assert not _assumed(report)  # 1/8 is exact in float32: nothing assumed
    ex = custom("mean_sum_times_12", (("x", 4),), lambda x: jnp.mean(x, axis=0),
                lambda x: jax.lax.psum(jnp.sum(x, axis=0), "x") * (1 / 12),
                (ArgDef("x", (12, 12), "float32", "data", P("x")),), P(), "mean")
    x = np.random.default_rng(0).standard_normal((12, 12)).astype(np.float32)
    want = np.asarray(reference_fn(ex)(x))
    got = np.asarray(sharded_fn(ex)(jax.device_put(x, NamedSharding(make_mesh(ex), P("x")))))
    assert np.allclose(got, want, rtol=1e-6, atol=1e-6)
    report = check_texts(*lower_pair(ex), verify_rules=True)
    assert report.proven, report.render_text()
    (line,) = _assumed(report)
    assert "float32(1/12)" in line, line


def test_pmean_of_local_means_is_exact() -> None:
    """`pmean(mean(x_local))` is `jnp.mean(x)` exactly (local n/4, then 1/4): no assumption."""
    x = np.random.default_rng(1).standard_normal((12, 6)).astype(np.float32)
    ex = custom("pmean_means", (("x", 4),), lambda x: jnp.mean(x, axis=0),
                lambda x: jax.lax.pmean(jnp.mean(x, axis=0), "x"),
                (ArgDef("x", x.shape, "float32", "data", P("x")),), P(), "pmean")
    want = np.asarray(reference_fn(ex)(x))
    got = np.asarray(sharded_fn(ex)(jax.device_put(x, NamedSharding(make_mesh(ex), P("x")))))
    assert np.allclose(got, want, rtol=1e-6, atol=1e-6)
    report = check_texts(*lower_pair(ex), verify_rules=True)
    assert report.proven, report.render_text()
    assert not _assumed(report)


# ----- XLA's per-device form: constants converted and rounded -----------------------------------

_REF_BF16 = """
func.func @main(%x: tensor<4xbf16>) -> tensor<4xbf16> {
  %c = stablehlo.constant dense<1.000980e-01> : tensor<4xbf16>
  %0 = stablehlo.multiply %x, %c : tensor<4xbf16>
  return %0 : tensor<4xbf16>
}"""

_SHARDED_BF16 = """
module attributes {mhlo.num_partitions = 4 : i32} {
  func.func @main(%x: tensor<1xbf16> {mhlo.sharding = "{devices=[4]<=[4]}"}) -> (tensor<1xbf16> {mhlo.sharding = "{devices=[4]<=[4]}"}) {
    CONSTANT
    %0 = stablehlo.multiply %x, %c : tensor<1xbf16>
    return %0 : tensor<1xbf16>
  }
}"""


@pytest.mark.parametrize("constant, same", [
    # float32 0.1 converted to bfloat16 IS bf16(0.1) = 0.10009765625: the same constant
    (("%w = stablehlo.constant dense<1.000000e-01> : tensor<1xf32>\n"
      "    %c = stablehlo.convert %w : (tensor<1xf32>) -> tensor<1xbf16>"), True),
    # one bfloat16 ulp above it
    ("%c = stablehlo.constant dense<1.005860e-01> : tensor<1xbf16>", False),
    # float32 0.1 + 2^-12 rounds to that next bfloat16 when converted
    (("%w = stablehlo.constant dense<0.100341797> : tensor<1xf32>\n"
     "    %c = stablehlo.convert %w : (tensor<1xf32>) -> tensor<1xbf16>"), False),
])
def test_converted_constant_is_its_rounding(constant: str, same: bool) -> None:
    """A constant converted to bfloat16 has the bfloat16 value (rounded exactly), not its
    float32 one: the same bf16 constant spelled through a convert is proven; a bf16 constant one
    ulp away, written or converted, computes other numbers (executed) and is not proven."""
    from entangle_mlir.jax import run_per_device

    sharded = _SHARDED_BF16.replace("CONSTANT", constant)
    x = np.array([1, 2, -3, 64], BF16)
    got = np.concatenate([out[0] for out in run_per_device(sharded, x)])
    want = x * BF16(0.1)
    assert np.array_equal(got, want) is same, (got, want)
    report = check_texts(_REF_BF16, sharded, verify_rules=same)
    assert report.proven is same, report.render_text()
    assert not _assumed(report)
