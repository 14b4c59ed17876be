"""Float precision (issue 16, class 5): every value carries the dtype it was computed in.

A convert that rounds (f32 -> bf16/f16, i32 -> f32) is a real op, never the identity: a
Megatron row-parallel matmul whose f32 partial sums are rounded and all-reduced in bf16 (or
f16) against an f32 reference, or int32 ids pushed through f32 above 2^24, computes other
numbers and is "not proven: precision lost" at the convert. The correct twins stay proven: a
bf16 model whose reference computes the same dot in bf16 (the partial bf16 sums are that sum
regrouped, and the report says so), an f32 psum of f32 partials, bf16 inputs upcast to f32
before the matmul in both programs.

Every case is executed on 4 simulated CPU devices with chosen inputs: bugs differ clearly,
twins match (exactly where bf16 sums are exact by the choice of inputs).
"""

from __future__ import annotations

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

import inspect
from fractions import Fraction

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from jax import lax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from entangle_mlir.core import precision
from entangle_mlir.driver import check_texts
from entangle_mlir.semantics.element import convert
from examples.real.catalog import (
    custom,
    lower_pair,
    make_mesh,
    reference_fn,
    sharded_fn,
)
from examples.real.programs import ArgDef

bf16, f16, f32 = jnp.bfloat16, jnp.float16, jnp.float32
MESH = (("tp", 4),)
X = ArgDef("x", (8, 64), "float32", "data", P(None, "tp"))
W = ArgDef("w", (64, 16), "float32", "weight", P("tp", None), fan_in=64)
IDS = ArgDef("ids", (8, 16), "int32", "tokens", P(None, "tp"), high=1000)
OFF = 2**24 + 1


def _run(ex, inputs: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Reference and sharded outputs on `inputs` (4 simulated devices)."""
    mesh = make_mesh(ex)
    placed = [jax.device_put(x, NamedSharding(mesh, a.spec)) for x, a in zip(inputs, ex.args)]
    ref = np.asarray(reference_fn(ex)(*inputs), np.float64)
    shd = np.asarray(sharded_fn(ex)(*placed), np.float64)
    return ref, shd


def _line(fn, marker: str = "# BUG") -> str:
    """`file:line:` of the line of `fn` ending with `marker`."""
    lines, start = inspect.getsourcelines(fn)
    hits = [start + i for i, text in enumerate(lines) if text.rstrip().endswith(marker)]
    assert len(hits) == 1
    return f"{inspect.getsourcefile(fn)}:{hits[0]}:"


def _matmul_inputs(seed: int = 0) -> list[np.ndarray]:
    """Values whose partial sums are far from bf16/f16 grid points: rounding shows."""
    rng = np.random.default_rng(seed)
    x = (1 + rng.random((8, 64))).astype(np.float32)
    w = (1 + rng.random((64, 16))).astype(np.float32) / np.float32(3)
    return [x, w]


def _small_integers(seed: int = 0) -> list[np.ndarray]:
    """Entries in {-1, 0, 1}: every partial and full dot is an integer of magnitude <= 64,
    exact in bf16, so a correct bf16 program matches its reference exactly."""
    rng = np.random.default_rng(seed)
    return [rng.integers(-1, 2, (8, 64)).astype(np.float32),
            rng.integers(-1, 2, (64, 16)).astype(np.float32)]


def ref_f32(x, w):
    return x @ w


def row_parallel_bf16_psum(x, w):
    return lax.psum((x @ w).astype(bf16), "tp").astype(f32)  # BUG


def row_parallel_f16_psum(x, w):
    return lax.psum((x @ w).astype(f16), "tp").astype(f32)  # BUG


def row_parallel_f32(x, w):
    return lax.psum(x @ w, "tp")


def ref_bf16_model(x, w):
    return (x.astype(bf16) @ w.astype(bf16)).astype(f32)


def row_parallel_bf16_model(x, w):
    return lax.psum(x.astype(bf16) @ w.astype(bf16), "tp").astype(f32)


def ref_upcast(x, w):
    return x.astype(bf16).astype(f32) @ w.astype(bf16).astype(f32)


def row_parallel_upcast(x, w):
    return lax.psum(x.astype(bf16).astype(f32) @ w.astype(bf16).astype(f32), "tp")


def ref_ids(ids):
    return jnp.sum(ids + OFF, axis=1)


def ids_through_f32(ids):
    return lax.psum(jnp.sum((ids + OFF).astype(f32), axis=1), "tp").astype(jnp.int32)  # BUG


@pytest.mark.parametrize("body,narrow", [(row_parallel_bf16_psum, "bf16"),
                                         (row_parallel_f16_psum, "f16")])
def test_psum_of_rounded_partials_is_precision_lost(body, narrow):
    ex = custom(f"row_parallel_{narrow}_psum", MESH, ref_f32, body, (X, W), P(), "bug")
    ref, shd = _run(ex, _matmul_inputs())
    assert np.abs(ref - shd).max() > 1e-3, "the rounded psum should differ"
    report = check_texts(*lower_pair(ex), verify_rules=False)
    text = report.render_text()
    assert not report.proven, text
    assert f"precision lost: convert f32 -> {narrow} rounds each device's partial sum" in text
    assert "where the reference computes it in f32" in text
    assert _line(body) in text, text


def test_int32_through_f32_above_2_24_is_precision_lost():
    ex = custom("ids_through_f32", MESH, ref_ids, ids_through_f32, (IDS,), P(), "bug")
    ids = np.random.default_rng(0).integers(0, 1000, (8, 16)).astype(np.int32)
    ref, shd = _run(ex, [ids])
    assert np.abs(ref - shd).max() >= 1, "values above 2^24 lose their low bits in f32"
    report = check_texts(*lower_pair(ex), verify_rules=False)
    text = report.render_text()
    assert not report.proven, text
    assert "precision lost: convert i32 -> f32 rounds to f32" in text
    assert _line(ids_through_f32) in text, text


@pytest.mark.parametrize("name,ref,body,inputs,tol", [
    ("f32_psum", ref_f32, row_parallel_f32, _matmul_inputs, 1e-4),
    ("bf16_model", ref_bf16_model, row_parallel_bf16_model, _small_integers, 0.0),
    ("bf16_upcast", ref_upcast, row_parallel_upcast, _matmul_inputs, 1e-4),
])
def test_correct_twins_stay_proven(name, ref, body, inputs, tol):
    ex = custom(name, MESH, ref, body, (X, W), P(), "correct")
    got_ref, got_shd = _run(ex, inputs())
    assert np.abs(got_ref - got_shd).max() <= tol
    report = check_texts(*lower_pair(ex), verify_rules=True)
    assert report.proven, report.render_text()
    assert " 0 refuted, 0 inconclusive" in report.mode, report.mode
    regrouped = any("float sums regrouped in bf16" in n for n in report.notes)
    assert regrouped == (name == "bf16_model"), report.notes


def test_bf16_model_against_f32_reference_is_not_proven():
    """The bf16 model's program against the f32 reference: its sums are in bf16."""
    ex = custom("bf16_model_vs_f32", MESH, ref_f32, row_parallel_bf16_model, (X, W), P(), "bug")
    ref, shd = _run(ex, _matmul_inputs())
    assert np.abs(ref - shd).max() > 1e-3
    report = check_texts(*lower_pair(ex), verify_rules=False)
    assert not report.proven, report.render_text()


def ref_sum_squares(x, w):
    xb = x.astype(bf16).astype(f32)
    return jnp.sum(xb * xb, axis=1) + 0 * w[0, 0]


def sum_squares_in_bf16(x, w):
    xb = x.astype(bf16)
    return lax.psum(jnp.sum(xb * xb, axis=1), "tp").astype(f32) + 0 * w[0, 0]  # BUG


def test_statistic_summed_in_bf16_is_not_proven():
    """A norm's sum of squares computed and all-reduced in bf16 where the reference computes
    it in f32 from the same bf16 inputs: no narrowing convert, the sum's own dtype differs."""
    ex = custom("sum_squares_bf16", MESH, ref_sum_squares, sum_squares_in_bf16, (X, W), P(),
                "bug")
    ref, shd = _run(ex, _matmul_inputs())
    assert np.abs(ref - shd).max() > 1e-2
    report = check_texts(*lower_pair(ex), verify_rules=False)
    text = report.render_text()
    assert not report.proven, text
    assert "precision lost" in text and _line(sum_squares_in_bf16) in text, text


@pytest.mark.parametrize("dtype", ["bf16", "f16", "f8E5M2", "f8E4M3FN", "f32"])
def test_round_to_matches_ml_dtypes(dtype):
    """`precision.round_to` (exact, ties to even, no double rounding) against ml_dtypes."""
    np_type = {"bf16": ml_dtypes.bfloat16, "f16": np.float16, "f8E5M2": ml_dtypes.float8_e5m2,
               "f8E4M3FN": ml_dtypes.float8_e4m3fn, "f32": np.float32}[dtype]
    rng = np.random.default_rng(1)
    values = np.concatenate([rng.standard_normal(2000) * 10.0 ** rng.integers(-8, 6, 2000),
                             [0.0, 1.0, -1.0, 1 + 2.0**-8, 1 + 3 * 2.0**-9, 2.0**-20]])
    for v in values:
        with np.errstate(over="ignore"):
            want = float(np.float64(v).astype(np_type))
        if not np.isfinite(want):
            continue
        assert float(precision.round_to(Fraction(float(v)), dtype)) == want, (dtype, v)


def test_narrowing_convert_is_not_the_identity_in_z3():
    """The Z3 encoding of a rounding convert is `round_<dtype>`, so a proof cannot take it for
    the identity; an exact one is the identity."""
    import z3

    x = z3.Real("x")
    narrowed = convert(x, "f32", "bf16")
    solver = z3.Solver()
    solver.add(narrowed != x)
    assert solver.check() == z3.sat
    assert convert(x, "bf16", "f32") is x
    assert convert(Fraction(OFF), "i32", "f32") == Fraction(2**24)
    assert convert(Fraction(OFF), "i32", "f64") == Fraction(OFF)  # exact: no rounding


@pytest.mark.parametrize("source,target,exact", [
    ("bf16", "f32", True), ("f16", "f32", True), ("f32", "f64", True), ("i1", "bf16", True),
    ("i8", "bf16", True), ("i16", "f32", True), ("i32", "f64", True), ("ui16", "f32", True),
    ("f32", "bf16", False), ("f32", "f16", False), ("f64", "f32", False),
    ("bf16", "f16", False), ("f16", "bf16", False), ("i32", "f32", False),
    ("i16", "bf16", False), ("i64", "f64", False), ("ui32", "f32", False),
])
def test_exact_convert_table(source, target, exact):
    assert precision.exact_convert(source, target) == exact
    assert precision.rounds(source, target) == (not exact)


_FORMATS = [(5, 10), (8, 7), (8, 23), (4, 3), (5, 2), (8, 22), (6, 23), (7, 10)]


def _edge_values() -> np.ndarray:
    """f32 values across the range: random magnitudes from 1e-40 to 1e38, f16's and f32's
    subnormal and overflow edges, ties of the rounding."""
    rng = np.random.default_rng(0)
    wide = rng.standard_normal(1500) * 10.0 ** rng.integers(-40, 39, 1500)
    edges = [1.00390625, 1.01171875, 65504, 65520, 65519.99, 2**-14, 2**-15, 2**-14 * 0.99,
             2**-14 * 1.5, 2**-24, 2**-149, 2**-127, 3.4e38, -3.4e38, 1.0000001, 0.0]
    return np.concatenate([wide, rng.standard_normal(300) * 2.0**-14,
                           rng.standard_normal(300) * 65504, edges]).astype(np.float32)


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_reduce_precision_matches_xla_bit_for_bit(dtype):
    """`precision.reduce_precision` (exact) against XLA's reduce_precision on CPU, format by
    format: the rounding, the flush of values below the format's least normal to zero and the
    overflow to infinity."""
    values = _edge_values()
    if dtype == "bf16":
        values = values.astype(ml_dtypes.bfloat16)
    formats = _FORMATS if dtype == "f32" else [(5, 10), (8, 5), (5, 7), (4, 3), (8, 7)]
    for e, m in formats:
        got = np.asarray(jax.jit(lambda v, e=e, m=m: lax.reduce_precision(v, e, m))(values))
        for x, xla in zip(values.astype(np.float64), got.astype(np.float64)):
            want = float(precision.reduce_precision(float(x), dtype, e, m))
            assert want == xla or (np.isinf(want) and np.isinf(xla)
                                   and np.sign(want) == np.sign(xla)), (dtype, e, m, x, xla,
                                                                        want)
        if precision.reduce_precision_is_identity(dtype, e, m):
            assert np.array_equal(got.astype(np.float64), values.astype(np.float64))


def test_reduce_precision_identity_table():
    """The identity exactly when the format has the dtype's exponent and mantissa bits."""
    assert precision.reduce_precision_is_identity("f32", 8, 23)
    assert precision.reduce_precision_is_identity("bf16", 8, 23)
    assert precision.reduce_precision_is_identity("f16", 8, 23)
    assert precision.reduce_precision_is_identity("bf16", 8, 7)
    assert not precision.reduce_precision_is_identity("f32", 8, 22)
    assert not precision.reduce_precision_is_identity("f32", 7, 23)
    assert not precision.reduce_precision_is_identity("f16", 8, 7)
    assert not precision.reduce_precision_is_identity("f8E5M2", 8, 23)  # not in the table


def test_narrowing_reduce_precision_is_not_the_identity_in_z3():
    import z3

    from entangle_mlir.semantics.element import reduce_precision

    x = z3.Real("x")
    solver = z3.Solver()
    solver.add(reduce_precision(x, "f32", 8, 7) != x)
    assert solver.check() == z3.sat
    assert reduce_precision(x, "f32", 8, 23) is x
