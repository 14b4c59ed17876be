"""The argmax / argmin comparator region is read whole (`opinfo.arg_reduction_kind`).

jax's region, in any op order and with commutative operands or compare sides swapped, is
argmax (argmin); every variant that computes another function -- the last index on ties, `>=`,
the values crossed, a TOTALORDER compare, the NaN check dropped -- is `other`, and each is
grounded: XLA gives other outputs on tied (or NaN) inputs.
"""

from __future__ import annotations

import numpy as np
import pytest

from entangle_mlir.mlir.ir import parse_module
from entangle_mlir.mlir.opinfo import describe, region_kind

CANONICAL = """
      %1 = stablehlo.compare GT, %v, %w, FLOAT : (tensor<f32>, tensor<f32>) -> tensor<i1>
      %2 = stablehlo.compare NE, %v, %v, FLOAT : (tensor<f32>, tensor<f32>) -> tensor<i1>
      %3 = stablehlo.or %1, %2 : tensor<i1>
      %4 = stablehlo.compare EQ, %v, %w, FLOAT : (tensor<f32>, tensor<f32>) -> tensor<i1>
      %5 = stablehlo.compare LT, %i, %j, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
      %6 = stablehlo.and %4, %5 : tensor<i1>
      %7 = stablehlo.or %3, %6 : tensor<i1>
      %8 = stablehlo.select %3, %v, %w : tensor<i1>, tensor<f32>
      %9 = stablehlo.select %7, %i, %j : tensor<i1>, tensor<i32>
      stablehlo.return %8, %9 : tensor<f32>, tensor<i32>"""

TEMPLATE = """
func.func public @main(%x: tensor<2x6xf32>, %iota: tensor<2x6xi32>) -> tensor<2xi32> {
  %init = stablehlo.constant dense<INIT> : tensor<f32>
  %c0 = stablehlo.constant dense<0> : tensor<i32>
  %0:2 = stablehlo.reduce(%x init: %init), (%iota init: %c0) across dimensions = [1] : (tensor<2x6xf32>, tensor<2x6xi32>, tensor<f32>, tensor<i32>) -> (tensor<2xf32>, tensor<2xi32>)
   reducer(%v: tensor<f32>, %w: tensor<f32>) (%i: tensor<i32>, %j: tensor<i32>)  {BODY
    }
  return %0#1 : tensor<2xi32>
}
"""
NEG_INF, POS_INF = "0xFF800000", "0x7F800000"


def _module(body: str, init: str = NEG_INF) -> str:
    return TEMPLATE.replace("BODY", body).replace("INIT", init)


def _kind(text: str) -> str:
    module = parse_module(text)
    func = module.body.operations[0]
    reduce = next(op.operation for op in func.regions[0].blocks[0].operations
                  if op.operation.name == "stablehlo.reduce")
    assert describe(reduce).attrs["reducer"] == region_kind(reduce)[0]
    return region_kind(reduce)[0]


INDICES = np.array([[5, 4, 3, 2, 1, 0]] * 2, np.int32)
"""Indices falling along the row: the comparator's tie-break (the smaller index) differs from
keeping the earlier element, which a sequential reduction's accumulator is."""


def _run(text: str, x: np.ndarray) -> np.ndarray:
    import jax  # lazy: jax takes a second to import; only the grounding needs it
    from jax._src import xla_bridge
    from jax._src.lib import xla_client

    backend = xla_bridge.get_backend("cpu")
    device = backend.devices()[0]
    exe = backend.compile_and_load(text, xla_client.DeviceList((device,)),
                                   xla_client.CompileOptions())
    out = exe.execute_sharded([jax.device_put(x, device), jax.device_put(INDICES, device)])
    return np.asarray(out.disassemble_into_single_device_arrays()[0][0])


TIES = np.array([[1, 3, 3, 0, 3, 2], [2, 2, 0, 2, 1, 0]], np.float32)
NANS = np.array([[1, np.nan, 3, 0, np.nan, 2], [2, 2, 0, 2, 1, 0]], np.float32)

SWAPPED = (CANONICAL.replace("compare GT, %v, %w", "compare LT, %w, %v")
           .replace("stablehlo.or %1, %2", "stablehlo.or %2, %1")
           .replace("stablehlo.and %4, %5", "stablehlo.and %5, %4")
           .replace("compare EQ, %v, %w", "compare EQ, %w, %v"))

VARIANTS = {
    "last index on ties": (CANONICAL.replace("compare LT, %i, %j", "compare GT, %i, %j"),
                           TIES),
    ">= instead of >": (CANONICAL.replace("compare GT, %v, %w", "compare GE, %v, %w"), TIES),
    "indices crossed": (CANONICAL.replace("select %7, %i, %j", "select %7, %j, %i"), TIES),
    "NaN check dropped": (CANONICAL.replace("stablehlo.or %1, %2", "stablehlo.or %1, %1"),
                          NANS),
    "tie test on the wrong predicate": (CANONICAL.replace("stablehlo.or %3, %6",
                                                          "stablehlo.or %1, %6"), NANS),
}


def test_jax_argmax_region_is_argmax_in_any_op_order() -> None:
    assert _kind(_module(CANONICAL)) == "argmax"
    assert _kind(_module(SWAPPED)) == "argmax"
    assert np.array_equal(_run(_module(SWAPPED), TIES), _run(_module(CANONICAL), TIES))


def test_jax_argmin_region_is_argmin() -> None:
    body = CANONICAL.replace("compare GT, %v, %w", "compare LT, %v, %w")
    assert _kind(_module(body, POS_INF)) == "argmin"
    assert list(_run(_module(body, POS_INF), TIES)) == [2, 0]  # the minima's smallest index


@pytest.mark.parametrize("name", list(VARIANTS))
def test_another_comparator_is_not_argmax_and_computes_other_numbers(name: str) -> None:
    body, inputs = VARIANTS[name]
    assert _kind(_module(body)) == "other"
    canonical = _run(_module(CANONICAL), inputs)
    assert list(canonical) == [_smallest_index_of_max(row) for row in inputs]
    assert not np.array_equal(_run(_module(body), inputs), canonical), name


def _smallest_index_of_max(row: np.ndarray) -> int:
    """argmax's answer with `INDICES`: the smallest index among the maxima; a NaN wins, and of
    two NaNs the accumulator (the first in XLA's sequential order)."""
    if np.isnan(row).any():
        return int(INDICES[0][np.argmax(np.isnan(row))])
    return int(INDICES[0][row == np.max(row)].min())


def test_totalorder_compare_is_not_argmax() -> None:
    """TOTALORDER orders -0 below +0: a different comparison (-0 and +0 tie under FLOAT)."""
    body = CANONICAL.replace("FLOAT", "TOTALORDER")
    assert _kind(_module(body)) == "other"
    zeros = np.array([[-3, -2, -1, 0.0, -0.0, -4], [1, 1, 1, 1, 1, 1]], np.float32)
    assert not np.array_equal(_run(_module(body), zeros), _run(_module(CANONICAL), zeros))
