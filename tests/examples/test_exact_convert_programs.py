"""Exact converts on whole programs, grounded on simulated CPU devices: a converted value
carries the convert's result dtype, so its arithmetic is that dtype's.

`mask.astype(f32)` adds as a number (`m + m` is `2m`), `mask.astype(i8)` wraps as an i8 (two
hundred ones are -56), `add` on booleans is `or`. The correct spellings are proven; the nearest
wrong programs compute other numbers and are not proven. Each pair: a reference and a
shard_map body over 4 devices, rows split (`tests.jax_runs.run_and_lower`).
"""

from __future__ import annotations

import os

if "--xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                               + " --xla_force_host_platform_device_count=8").strip()

import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from entangle_mlir.driver import check_texts
from entangle_mlir.evidence import compare_programs
from entangle_mlir.mlir.ir import parse_module
from entangle_mlir.mlir.program import from_two_modules
from tests.jax_runs import run_and_lower

f32, bf16, i8, u8, i32 = jnp.float32, jnp.bfloat16, jnp.int8, jnp.uint8, jnp.int32


def _floats(*shape, dtype=np.float32, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


def _ints(*shape, seed=1):
    return np.random.default_rng(seed).integers(-128, 128, shape).astype(np.int8)


def m(x, dtype=f32):
    """The mask `x > 0` as numbers of `dtype`."""
    return (x > 0).astype(dtype)


X = [_floats(8, 4)]
XY = [_floats(8, 4), _floats(8, 4, seed=2)]

CORRECT = {
    "mask_doubled": (lambda x: m(x) + m(x), lambda x: 2 * m(x), X),
    "mask_times_mask_is_and": (lambda a, b: m(a) * m(b), lambda a, b: m((a > 0) & (b > 0)), XY),
    "mask_max_is_or": (lambda a, b: jnp.maximum(m(a), m(b)), lambda a, b: m((a > 0) | (b > 0)),
                       XY),
    "i8_sum_in_range": (lambda a, b: 50 * m(a) + 50 * m(b),
                        lambda a, b: (50 * m(a, i8) + 50 * m(b, i8)).astype(f32), XY),
    "i8_hundred_ones": (lambda a: sum([m(a)] * 100), lambda a: sum([m(a, i8)] * 100).astype(f32),
                        X),
    "i32_via_f32": (lambda a: m(a, i32) * 3, lambda a: (m(a) * 3).astype(i32), X),
    "i32_sum_via_f32": (lambda a: sum([m(a)] * 3).astype(i32), lambda a: sum([m(a, i32)] * 3), X),
    "i8_inputs_in_f32": (lambda a, b: a.astype(f32) + b.astype(f32),
                         lambda a, b: b.astype(f32) + a.astype(f32), [_ints(8, 4), _ints(8, 4)]),
    "bf16_round_trip": (lambda a: a.astype(f32) * 3,
                        lambda a: a.astype(f32).astype(bf16).astype(f32) * 3,
                        [_floats(8, 4, dtype=bf16)]),
    "mask_multiplies": (lambda x: x * m(x), lambda x: jnp.where(x > 0, x, 0.0), X),
}

WRONG = {
    "mask_doubled_once": (lambda x: 2 * m(x), lambda x: m(x), X),
    "mask_sum_for_or": (lambda a, b: m(a) + m(b), lambda a, b: m((a > 0) | (b > 0)), XY),
    "i8_wraps": (lambda a, b: 100 * m(a) + 100 * m(b),
                 lambda a, b: (100 * m(a, i8) + 100 * m(b, i8)).astype(f32), XY),
    "u8_wraps": (lambda a, b: 200 * m(a) + 100 * m(b),
                 lambda a, b: (200 * m(a, u8) + 100 * m(b, u8)).astype(f32), XY),
    "i8_two_hundred_ones": (lambda a: sum([m(a)] * 200),
                            lambda a: sum([m(a, i8)] * 200).astype(f32), X),
    "u8_three_hundred_ones": (lambda a: sum([m(a)] * 300),
                              lambda a: sum([m(a, u8)] * 300).astype(f32), X),
    "i8_inputs_summed_in_i8": (lambda a, b: a.astype(f32) + b.astype(f32),
                               lambda a, b: (a + b).astype(f32), [_ints(8, 4), _ints(8, 4)]),
    "f32_round_trip_through_bf16": (lambda a: a * 3, lambda a: a.astype(bf16).astype(f32) * 3,
                                    X),
    "mask_tripled": (lambda x: 2 * m(x), lambda x: 3 * m(x), X),
}


def _run(reference, body, args):
    want, got, texts = run_and_lower(reference, body, args, [P("d")] * len(args), P("d"))
    same = np.array_equal(np.asarray(want, np.float64), np.asarray(got, np.float64))
    return same, check_texts(*texts)


@pytest.mark.parametrize("name", sorted(CORRECT))
def test_exact_convert_is_proven(name: str) -> None:
    reference, body, args = CORRECT[name]
    same, report = _run(reference, body, args)
    assert same
    assert report.proven, report.render_text()


@pytest.mark.parametrize("name", sorted(WRONG))
def test_the_nearest_wrong_program_is_not_proven(name: str) -> None:
    reference, body, args = WRONG[name]
    same, report = _run(reference, body, args)
    assert not same
    assert not report.proven, report.render_text()


# ----- add on booleans, hand-written (jax never emits it) -------------------------------------

def _ref(body: str) -> str:
    return f"""module @ref {{
  func.func public @main(%arg0: tensor<8x4xf32>) -> tensor<8x4xf32> {{
    %z = stablehlo.constant dense<0.0> : tensor<8x4xf32>
    %m = stablehlo.compare GT, %arg0, %z : (tensor<8x4xf32>, tensor<8x4xf32>) -> tensor<8x4xi1>
{body}
    return %r : tensor<8x4xf32>
  }}
}}
"""


def _sharded(op: str) -> str:
    return f"""module @sharded {{
  sdy.mesh @mesh = <["tp"=4]>
  func.func public @main(%arg0: tensor<8x4xf32>) -> tensor<8x4xf32> {{
    %0 = sdy.manual_computation(%arg0) in_shardings=[<@mesh, [{{"tp"}}, {{}}]>] out_shardings=[<@mesh, [{{"tp"}}, {{}}]>] manual_axes={{"tp"}} (%a: tensor<2x4xf32>) {{
      %z = stablehlo.constant dense<0.0> : tensor<2x4xf32>
      %m = stablehlo.compare GT, %a, %z : (tensor<2x4xf32>, tensor<2x4xf32>) -> tensor<2x4xi1>
      %s = stablehlo.{op} %m, %m : tensor<2x4xi1>
      %r = stablehlo.convert %s : (tensor<2x4xi1>) -> tensor<2x4xf32>
      sdy.return %r : tensor<2x4xf32>
    }} : (tensor<8x4xf32>) -> tensor<8x4xf32>
    return %0 : tensor<8x4xf32>
  }}
}}
"""


CONVERTED = "    %r = stablehlo.convert %m : (tensor<8x4xi1>) -> tensor<8x4xf32>"
DOUBLED = ("    %f = stablehlo.convert %m : (tensor<8x4xi1>) -> tensor<8x4xf32>\n"
           "    %r = stablehlo.add %f, %f : tensor<8x4xf32>")

BOOLEAN_PAIRS = {
    "or_of_itself": (CONVERTED, "add", True),
    "and_of_itself": (CONVERTED, "multiply", True),
    "or_read_as_a_sum": (DOUBLED, "add", False),
}


@pytest.mark.parametrize("name", sorted(BOOLEAN_PAIRS))
def test_add_on_booleans_is_or(name: str) -> None:
    """`convert(m + m)` with m boolean is `convert(m)` (add on i1 is or), not `2 * convert(m)`:
    both programs run on simulated CPU devices (`evidence.compare_programs`)."""
    ref_body, op, correct = BOOLEAN_PAIRS[name]
    ref_text, sharded_text = _ref(ref_body), _sharded(op)
    program = from_two_modules(parse_module(ref_text, "ref.mlir"),
                               parse_module(sharded_text, "sharded.mlir"), "ref.mlir",
                               "sharded.mlir")
    same = not any(c.differs for c in compare_programs(program))
    report = check_texts(ref_text, sharded_text)
    assert same == correct
    assert report.proven == correct, report.render_text()
