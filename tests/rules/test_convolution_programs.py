"""convolution on whole programs, grounded by execution on simulated CPU devices.

A CNN layer split over its batch (data parallel) and its output features (the kernel's output
channels), or over its input features with a psum after, is proven; the same layer with the psum
missing, or with the image height split without a halo exchange (each device's windows stop at
its block edge), computes other numbers and is not proven.
"""

from __future__ import annotations

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from entangle_mlir.jax import check_partitioned
from tests.rules.grounding import ArgDef, assert_bug, assert_correct, pair

DN = ("NHWC", "HWIO", "NHWC")
DPTP = (("dp", 2), ("tp", 2))
TP = (("tp", 4),)


def _inputs(seed: int = 0) -> list[list[np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [[rng.standard_normal((4, 6, 6, 8)).astype(np.float32),
             (rng.standard_normal((3, 3, 8, 8)) / 8).astype(np.float32)]]


def conv(x, w):
    return lax.conv_general_dilated(x, w, (1, 1), "SAME", dimension_numbers=DN)


def conv_psum(x, w):
    return lax.psum(conv(x, w), "tp")


def conv_no_psum(x, w):
    return conv(x, w)  # BUG: a partial sum over the input features


def test_batch_and_output_features_split_is_proven():
    args = (ArgDef("x", (4, 6, 6, 8), "float32", "data", P("dp")),
            ArgDef("w", (3, 3, 8, 8), "float32", "weight", P(None, None, None, "tp")))
    assert_correct(pair("conv_dp_tp", DPTP, conv, conv, args, P("dp", None, None, "tp")),
                   _inputs())


def test_input_features_split_then_psum_is_proven():
    args = (ArgDef("x", (4, 6, 6, 8), "float32", "data", P(None, None, None, "tp")),
            ArgDef("w", (3, 3, 8, 8), "float32", "weight", P(None, None, "tp", None)))
    assert_correct(pair("conv_features_psum", TP, conv, conv_psum, args, P()), _inputs())


def test_input_features_split_without_psum_is_not_proven():
    args = (ArgDef("x", (4, 6, 6, 8), "float32", "data", P(None, None, None, "tp")),
            ArgDef("w", (3, 3, 8, 8), "float32", "weight", P(None, None, "tp", None)))
    assert_bug(pair("conv_features_no_psum", TP, conv, conv_no_psum, args, P(), bug=True),
               _inputs(), contains="partial sum")


def test_height_split_without_a_halo_is_not_proven():
    args = (ArgDef("x", (4, 6, 6, 8), "float32", "data", P(None, ("dp",))),
            ArgDef("w", (3, 3, 8, 8), "float32", "weight", P()))
    assert_bug(pair("conv_height_split", (("dp", 2),), conv, conv, args, P(None, "dp"),
                    bug=True), _inputs(), contains="windows stop at its block edge")


def test_xla_partitions_a_batch_split_convolution():
    mesh = jax.make_mesh((4,), ("dp",), axis_types=(jax.sharding.AxisType.Auto,))
    x = jax.ShapeDtypeStruct((4, 6, 6, 8), jnp.float32, sharding=NamedSharding(mesh, P("dp")))
    w = jax.ShapeDtypeStruct((3, 3, 8, 8), jnp.float32, sharding=NamedSharding(mesh, P()))
    report = check_partitioned(jax.jit(conv, out_shardings=NamedSharding(mesh, P("dp"))), x, w)
    assert report.proven, report.render_text()
