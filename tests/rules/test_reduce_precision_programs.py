"""reduce_precision on whole programs, grounded by execution on 4 simulated CPU devices.

At a format that holds every value of the dtype (jax's e8m23 on f32) it is the identity, on a
partial sum too; narrower, it rounds, and a program that rounds where the reference does not,
rounds partial sums before their psum, or rounds to another format computes other numbers and
is not proven. The correct twins (the same rounding applied to the same values) are proven.
"""

from __future__ import annotations

import numpy as np
from jax import lax
from jax.sharding import PartitionSpec as P

from tests.rules.grounding import ArgDef, assert_bug, assert_correct, pair

MESH = (("tp", 4),)
X = ArgDef("x", (8, 64), "float32", "data", P(None, "tp"))
W = ArgDef("w", (64, 16), "float32", "weight", P("tp", None), fan_in=64)


def _inputs(seeds=(0, 1)) -> list[list[np.ndarray]]:
    out = []
    for seed in seeds:
        rng = np.random.default_rng(seed)
        out.append([rng.standard_normal((8, 64)).astype(np.float32),
                    (rng.standard_normal((64, 16)) / 8).astype(np.float32)])
    return out


def ref_matmul(x, w):
    return x @ w


def psum_same_format(x, w):
    return lax.psum(lax.reduce_precision(x @ w, 8, 23), "tp")


def psum_rounded_partials(x, w):
    return lax.psum(lax.reduce_precision(x @ w, 8, 7), "tp")  # BUG


def ref_rounded_inputs(x, w):
    return lax.reduce_precision(x, 8, 7) @ w


def rounded_blocks(x, w):
    return lax.psum(lax.reduce_precision(x, 8, 7) @ w, "tp")


def rounded_blocks_other_format(x, w):
    return lax.psum(lax.reduce_precision(x, 5, 10) @ w, "tp")  # BUG


def rounded_where_the_reference_does_not(x, w):
    return lax.psum(lax.reduce_precision(x, 8, 7) @ w, "tp")  # BUG


def test_same_format_on_a_partial_sum_is_proven():
    assert_correct(pair("rp_same_format", MESH, ref_matmul, psum_same_format, (X, W), P()),
                   _inputs())


def test_rounding_partial_sums_before_the_psum_is_not_proven():
    assert_bug(pair("rp_rounded_partials", MESH, ref_matmul, psum_rounded_partials, (X, W),
                    P(), bug=True), _inputs(),
               contains="precision lost: reduce_precision to e8m7 (in f32) rounds each "
                        "device's partial sum over 'tp'")


def test_the_same_rounding_of_the_same_blocks_is_proven():
    assert_correct(pair("rp_rounded_blocks", MESH, ref_rounded_inputs, rounded_blocks, (X, W),
                        P()), _inputs())


def test_rounding_to_another_format_is_not_proven():
    assert_bug(pair("rp_other_format", MESH, ref_rounded_inputs, rounded_blocks_other_format,
                    (X, W), P(), bug=True), _inputs())


def test_rounding_the_reference_does_not_do_is_not_proven():
    assert_bug(pair("rp_rounds_alone", MESH, ref_matmul, rounded_where_the_reference_does_not,
                    (X, W), P(), bug=True), _inputs(),
               contains="precision lost: reduce_precision to e8m7 (in f32) rounds where the "
                        "reference does not")
