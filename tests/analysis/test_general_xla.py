"""The general tier on XLA's per-device (SPMD-partitioned) programs: one module every device
runs, parameters the blocks their shardings give (device lists and iota tile assignments),
partition_id evaluated per device, collectives combining the devices their replica groups and
source_target_pairs name, results assembled by their shardings.

Every label is grounded by execution on simulated CPU devices (`jax.run_per_device`): each
correct program computes the reference's blocks on every device, and is proven by the general
tier where the layout tier alone does not prove it; each edit (a wrong partition_id offset, a
dropped all_reduce, wrong replica_groups, wrong source_target_pairs) computes other numbers
and is not proven, after the general tier expanded it on every device.
"""

from __future__ import annotations

import os

if "--xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
    ).strip()

import re
from collections.abc import Callable
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

from entangle_mlir.driver import check_texts
from entangle_mlir.jax import expected_per_device, lower_partitioned, run_per_device
from entangle_mlir.mlir.ir import context, parse_module

TIER_NOTE = "proven by per-device expansion on 4 devices (general tier)"


def _computes(program: str, args: list[np.ndarray], reference: list[np.ndarray]) -> bool:
    """Whether every device of the per-device program returns its block of the reference's
    outputs (exactly: these programs move values and add at most four floats in one order
    the float rounding of small integers cannot tell apart)."""
    got = run_per_device(program, *args)
    want = expected_per_device(program, reference)
    return all(np.array_equal(g, w) for gd, wd in zip(got, want) for g, w in zip(gd, wd))


def _edit(text: str, old: str, new: str) -> str:
    assert text.count(old) == 1, (old, text)
    return text.replace(old, new)


def _assert_proven_by_the_general_tier(ref: str, program: str) -> None:
    layout = check_texts(ref, program, general_tier=False)
    assert not layout.proven, "the layout tier proves it: no longer a general-tier case"
    report = check_texts(ref, program)
    assert report.proven, report.render_text()
    assert TIER_NOTE in report.notes
    general = report.stats["general_tier"]
    assert report.stats["tier"] == "general" and general["devices"] == 4
    assert general["rule_instances"]["refuted"] == general["rule_instances"]["unknown"] == 0


def _assert_not_proven_after_expansion(ref: str, program: str) -> None:
    report = check_texts(ref, program)
    assert not report.proven, report.render_text()
    general = report.stats["general_tier"]
    assert not general["proven"] and general["devices"] == 4, general
    assert general["ops"] > 0, general  # expanded, not refused up front


# ----- XLA's own partitioner output (jax.jit with shardings) ----------------------------------

@dataclass(frozen=True)
class Jitted:
    name: str
    fn: Callable
    out: P


JITTED = [
    Jitted("transpose", lambda x: x.T + 1.0, P("x", "y")),
    Jitted("reshape_resharded", lambda x: x.reshape(4, 16) * 3.0, P("y", "x")),
    Jitted("axes_swapped", lambda x: x * 2.0, P("y", "x")),
]


def _lowered(case: Jitted) -> tuple[str, str, np.ndarray, np.ndarray]:
    """(reference, per-device program as text, an input, the reference's output)."""
    mesh = jax.make_mesh((2, 2), ("x", "y"), axis_types=(AxisType.Auto,) * 2)
    aval = jax.ShapeDtypeStruct((8, 8), jnp.float32, sharding=NamedSharding(mesh, P("x", "y")))
    fn = jax.jit(case.fn, out_shardings=NamedSharding(mesh, case.out))
    ref, program = lower_partitioned(fn, aval)
    with context():
        text = str(parse_module(program))
    x = np.arange(64, dtype=np.float32).reshape(8, 8)
    return ref, text, x, np.asarray(jax.jit(case.fn)(x))


@pytest.mark.parametrize("case", JITTED, ids=lambda c: c.name)
def test_xla_partitioned_programs_are_proven_by_the_general_tier(case: Jitted) -> None:
    ref, program, x, want = _lowered(case)
    assert _computes(program, [x], [want])
    _assert_proven_by_the_general_tier(ref, program)


_RESHAPE_EDITS = {
    "wrong partition_id offset": ("dense<[0, 8, 0, 8]> : tensor<4xi32>",
                                  "dense<[8, 0, 8, 0]> : tensor<4xi32>"),
    "wrong replica_groups": ("replica_groups = dense<[[0, 1], [2, 3]]>",
                             "replica_groups = dense<[[0, 2], [1, 3]]>"),
    "wrong source_target_pairs": ("dense<[[0, 0], [1, 2], [2, 1], [3, 3]]>",
                                  "dense<[[0, 0], [1, 1], [2, 2], [3, 3]]>"),
}


@pytest.mark.parametrize("edit", sorted(_RESHAPE_EDITS))
def test_edited_xla_programs_are_not_proven(edit: str) -> None:
    ref, program, x, want = _lowered(JITTED[1])
    wrong = _edit(program, *_RESHAPE_EDITS[edit])
    assert not _computes(wrong, [x], [want])
    _assert_not_proven_after_expansion(ref, wrong)


# ----- written per device by hand: device lists, partition_id arithmetic, all_reduce, rings ------

_ALL_REDUCE = """\
    %r = "stablehlo.all_reduce"(%a) <{channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, replica_groups = dense<[[0, 1, 2, 3]]> : tensor<1x4xi64>, use_global_device_ids}> ({
    ^bb0(%u: tensor<f32>, %v: tensor<f32>):
      %w = stablehlo.add %u, %v : tensor<f32>
      stablehlo.return %w : tensor<f32>
    }) : (tensor<4xf32>) -> tensor<4xf32>
"""

REF_BLOCKS = """
func.func @main(%x: tensor<8x4xf32>) -> (tensor<8x4xf32>, tensor<4xf32>) {
  %0 = stablehlo.add %x, %x : tensor<8x4xf32>
  %z = stablehlo.constant dense<0.0> : tensor<f32>
  %1 = stablehlo.reduce(%x init: %z) applies stablehlo.add across dimensions = [0] : (tensor<8x4xf32>, tensor<f32>) -> tensor<4xf32>
  return %0, %1 : tensor<8x4xf32>, tensor<4xf32>
}"""

BLOCKS = """
module attributes {mhlo.num_partitions = 4 : i32} {
  func.func @main(%x: tensor<8x4xf32> {mhlo.sharding = "{replicated}"}) -> (tensor<2x4xf32> {mhlo.sharding = "{devices=[4,1]3,2,1,0}"}, tensor<4xf32> {mhlo.sharding = "{replicated}"}) {
    %pid = stablehlo.partition_id : tensor<ui32>
    %i = stablehlo.convert %pid : (tensor<ui32>) -> tensor<i32>
    %three = stablehlo.constant dense<3> : tensor<i32>
    %k = stablehlo.subtract %three, %i : tensor<i32>
    %two = stablehlo.constant dense<2> : tensor<i32>
    %off = stablehlo.multiply %k, %two : tensor<i32>
    %c0 = stablehlo.constant dense<0> : tensor<i32>
    %s = stablehlo.dynamic_slice %x, %off, %c0, sizes = [2, 4] : (tensor<8x4xf32>, tensor<i32>, tensor<i32>) -> tensor<2x4xf32>
    %y = stablehlo.add %s, %s : tensor<2x4xf32>
    %z = stablehlo.constant dense<0.0> : tensor<f32>
    %a = stablehlo.reduce(%s init: %z) applies stablehlo.add across dimensions = [0] : (tensor<2x4xf32>, tensor<f32>) -> tensor<4xf32>
""" + _ALL_REDUCE + """\
    return %y, %r : tensor<2x4xf32>, tensor<4xf32>
  }
}"""
"""Device d holds rows 2 (3 - d) .. of x (the output's device list is 3, 2, 1, 0), and the
column sums all-reduced over every device."""

REF_SUM = """
func.func @main(%x: tensor<8x4xf32>) -> tensor<4xf32> {
  %z = stablehlo.constant dense<0.0> : tensor<f32>
  %0 = stablehlo.reduce(%x init: %z) applies stablehlo.add across dimensions = [0] : (tensor<8x4xf32>, tensor<f32>) -> tensor<4xf32>
  return %0 : tensor<4xf32>
}"""

_PERMUTE = ('"stablehlo.collective_permute"({x}) <{{channel_handle = #stablehlo.channel_handle'
            '<handle = {h}, type = 1>, source_target_pairs = dense<{pairs}> : tensor<4x2xi64>}}> '
            ': (tensor<4xf32>) -> tensor<4xf32>')

RING = """
module attributes {mhlo.num_partitions = 4 : i32} {
  func.func @main(%x: tensor<2x4xf32> {mhlo.sharding = "{devices=[4,1]<=[4]}"}) -> (tensor<4xf32> {mhlo.sharding = "{replicated}"}) {
    %z = stablehlo.constant dense<0.0> : tensor<f32>
    %a = stablehlo.reduce(%x init: %z) applies stablehlo.add across dimensions = [0] : (tensor<2x4xf32>, tensor<f32>) -> tensor<4xf32>
    %p = """ + _PERMUTE.format(x="%a", h=1, pairs="[[0, 1], [1, 2], [2, 3], [3, 0]]") + """
    %b = stablehlo.add %a, %p : tensor<4xf32>
    %q = """ + _PERMUTE.format(x="%b", h=2, pairs="[[0, 2], [1, 3], [2, 0], [3, 1]]") + """
    %c = stablehlo.add %b, %q : tensor<4xf32>
    return %c : tensor<4xf32>
  }
}"""
"""An all-reduce written as a ring of collective_permutes: shift by one, then by two."""

REF_DOUBLE = """
func.func @main(%x: tensor<8x4xf32>) -> tensor<8x4xf32> {
  %0 = stablehlo.add %x, %x : tensor<8x4xf32>
  return %0 : tensor<8x4xf32>
}"""

GATHERED = """
module attributes {mhlo.num_partitions = 4 : i32} {
  func.func @main(%x: tensor<4x4xf32> {mhlo.sharding = "{devices=[2,1,2]<=[4] last_tile_dim_replicate}"}) -> (tensor<2x4xf32> {mhlo.sharding = "{devices=[4,1]3,1,2,0}"}) {
    %g = "stablehlo.all_gather"(%x) <{all_gather_dim = 0 : i64, channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, replica_groups = dense<[[0, 2], [1, 3]]> : tensor<2x2xi64>, use_global_device_ids}> : (tensor<4x4xf32>) -> tensor<8x4xf32>
    %table = stablehlo.constant dense<[6, 2, 4, 0]> : tensor<4xi32>
    %pid = stablehlo.partition_id : tensor<ui32>
    %t = stablehlo.dynamic_slice %table, %pid, sizes = [1] : (tensor<4xi32>, tensor<ui32>) -> tensor<1xi32>
    %off = stablehlo.reshape %t : (tensor<1xi32>) -> tensor<i32>
    %c0 = stablehlo.constant dense<0> : tensor<i32>
    %s = stablehlo.dynamic_slice %g, %off, %c0, sizes = [2, 4] : (tensor<8x4xf32>, tensor<i32>, tensor<i32>) -> tensor<2x4xf32>
    %y = stablehlo.add %s, %s : tensor<2x4xf32>
    return %y : tensor<2x4xf32>
  }
}"""
"""Halves of x, each on two devices (`last_tile_dim_replicate`: devices 0, 1 hold rows 0..3),
gathered across the halves, and each device's rows picked by an offset table in the order
of the result's device list (3, 1, 2, 0)."""


def _x() -> np.ndarray:
    return np.arange(32, dtype=np.float32).reshape(8, 4) - 7


def test_partition_id_offsets_device_lists_and_all_reduce_are_proven() -> None:
    x = _x()
    assert _computes(BLOCKS, [x], [x + x, x.sum(0)])
    _assert_proven_by_the_general_tier(REF_BLOCKS, BLOCKS)


def test_replicated_tiles_gathered_in_a_listed_device_order_are_proven() -> None:
    x = _x()
    assert _computes(GATHERED, [x], [x + x])
    _assert_proven_by_the_general_tier(REF_DOUBLE, GATHERED)


def test_a_ring_of_collective_permutes_is_proven() -> None:
    x = _x()
    assert _computes(RING, [x], [x.sum(0)])
    _assert_proven_by_the_general_tier(REF_SUM, RING)


_HAND_EDITS = {
    "wrong partition_id offset": (REF_BLOCKS, BLOCKS, "dense<3> : tensor<i32>",
                                  "dense<2> : tensor<i32>"),
    "dropped all_reduce": (REF_BLOCKS, BLOCKS, "return %y, %r :", "return %y, %a :"),
    "wrong replica_groups": (REF_BLOCKS, BLOCKS, "dense<[[0, 1, 2, 3]]> : tensor<1x4xi64>",
                             "dense<[[0, 1], [2, 3]]> : tensor<2x2xi64>"),
    "wrong device list": (REF_BLOCKS, BLOCKS, "{devices=[4,1]3,2,1,0}",
                          "{devices=[4,1]0,1,2,3}"),
    "all_gather of one half twice": (REF_DOUBLE, GATHERED, "dense<[[0, 2], [1, 3]]>",
                                     "dense<[[0, 1], [2, 3]]>"),
    "offset table off by one": (REF_DOUBLE, GATHERED, "dense<[6, 2, 4, 0]>",
                                "dense<[6, 2, 4, 1]>"),
    "wrong source_target_pairs": (REF_SUM, RING, "[[0, 2], [1, 3], [2, 0], [3, 1]]",
                                  "[[0, 1], [1, 2], [2, 3], [3, 0]]"),
}


@pytest.mark.parametrize("edit", sorted(_HAND_EDITS))
def test_edited_hand_written_programs_are_not_proven(edit: str) -> None:
    ref, program, old, new = _HAND_EDITS[edit]
    wrong = _edit(program, old, new)
    x = _x()
    outputs = {REF_BLOCKS: [x + x, x.sum(0)], REF_SUM: [x.sum(0)], REF_DOUBLE: [x + x]}[ref]
    assert not _computes(wrong, [x], outputs)
    _assert_not_proven_after_expansion(ref, wrong)


def test_replicated_results_must_agree_on_every_device() -> None:
    """A result declared replicated whose devices hold different values (each its own column
    sums, no all_reduce) is not proven: device 1's value is not device 0's."""
    wrong = _edit(BLOCKS, "return %y, %r :", "return %y, %a :")
    report = check_texts(REF_BLOCKS, wrong)
    assert not report.proven
    reason = report.stats["general_tier"]["reason"]
    assert re.search(r"device \d's result #1 .*differs from device 0's", reason), reason
