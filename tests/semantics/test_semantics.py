"""Ground `semantics/ops.py` in real XLA execution.

Every op of `OP_SEMANTICS` is run on random float inputs in two ways: by jax/XLA on CPU, and by
a small interpreter that walks the StableHLO jax lowers (OpInfos from `opinfo.describe`, so the
attribute normalisation is checked too) with `OP_SEMANTICS`. Collectives are grounded the same
way through `shard_map` on 4 simulated devices. The z3 encodings of the exact (non-transcendental)
ops are checked against the numeric semantics by substituting concrete values.
"""

from __future__ import annotations

import os

if "--xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
    ).strip()

import functools
import math
from collections.abc import Callable
from fractions import Fraction

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import z3
from jax import lax
from jax.sharding import AxisType
from jax.sharding import PartitionSpec as P

from entangle_mlir.core import terms as T
from entangle_mlir.core.mesh import Mesh
from entangle_mlir.mlir.ir import parse_module
from entangle_mlir.mlir.opinfo import OpInfo, TensorType, describe
from entangle_mlir.semantics.collectives import COLLECTIVE_SEMANTICS
from entangle_mlir.semantics.element import (
    SemanticsError,
    equal,
    is_int_dtype,
    is_z3,
    maximum,
    minimum,
    random_functions,
    to_z3,
    transcendental,
)
from entangle_mlir.semantics.evaluate import TERM_OPS, evaluate_term
from entangle_mlir.semantics.ops import ELEMENTWISE, OP_SEMANTICS
from entangle_mlir.semantics.tensor import (
    dynamic_slice,
    dynamic_update_slice,
    full,
    gather,
    obj_array,
    reduce_dims,
    scatter,
    top_k,
)

# ----- a tiny interpreter over lowered StableHLO ----------------------------------------------


def _lower(fn: Callable, args: list[np.ndarray]):
    text = jax.jit(fn).lower(*args).as_text()
    return parse_module(text)


def _functions(module) -> dict:
    out = {}
    for op in module.body.operations:
        if op.operation.name == "func.func":
            out[op.operation.attributes["sym_name"].value] = op.operation
    return out


def _interpret(func, inputs: list, funcs: dict, seen: set[str]) -> list:
    """Run a func.func with OP_SEMANTICS; `seen` collects the op names executed."""
    block = func.regions[0].blocks[0]
    values = {arg: value for arg, value in zip(block.arguments, inputs)}
    for op in block.operations:
        name = op.operation.name
        operands = [values[v] for v in op.operands]
        if name == "func.return":
            return operands
        if name == "func.call":
            callee = funcs[op.operation.attributes["callee"].value]
            results = _interpret(callee, operands, funcs, seen)
        elif name == "stablehlo.case":
            results = _interpret_case(op.operation, operands, values, funcs, seen)
        else:
            info = describe(op.operation)
            seen.add(info.name)
            results = OP_SEMANTICS[info.name](info, operands)
        for r, value in zip(op.results, results):
            assert tuple(value.shape) == tuple(r.type.shape), (name, value.shape, r.type)
            values[r] = value
    raise AssertionError("no func.return")


def _interpret_case(op, operands: list, values: dict, funcs: dict, seen: set[str]) -> list:
    """A case as the walker reads it: every branch run (its ops may read the enclosing
    values), then OP_SEMANTICS["stablehlo.case"] on the index and the branches' results."""
    branch_results, types = [], [describe(op).operand_types[0]]
    for region in op.regions:
        block = region.blocks[0]
        inner = dict(values)
        for nested in block.operations:
            if nested.operation.name == "stablehlo.return":
                branch_results.extend(inner[v] for v in nested.operands)
                types.extend(TensorType(tuple(v.type.shape), str(v.type.element_type))
                             for v in nested.operands)
                break
            info = describe(nested.operation)
            seen.add(info.name)
            for r, value in zip(nested.results, OP_SEMANTICS[info.name](
                    info, [inner[v] for v in nested.operands])):
                inner[r] = value
    info = describe(op)
    seen.add("stablehlo.case")
    info = OpInfo("stablehlo.case", {"branches": len(op.regions)}, types, info.result_types)
    return OP_SEMANTICS["stablehlo.case"](info, operands + branch_results)


def run_both(fn: Callable, *args: np.ndarray) -> tuple[list[np.ndarray], list, set[str]]:
    """(XLA results, interpreted results as float arrays, op names executed)."""
    module = _lower(fn, list(args))
    funcs = _functions(module)
    seen: set[str] = set()
    inputs = [obj_array(np.asarray(a)) for a in args]
    ours = _interpret(funcs["main"], inputs, funcs, seen)
    theirs = jax.jit(fn)(*args)
    theirs = list(theirs) if isinstance(theirs, (tuple, list)) else [theirs]
    return [np.asarray(t) for t in theirs], ours, seen


def run_text(text: str, *args: np.ndarray) -> tuple[list[np.ndarray], list, set[str]]:
    """Like `run_both` for hand-written StableHLO (ops jax never emits as such)."""
    from jax._src import xla_bridge
    from jax._src.lib import xla_client

    backend = xla_bridge.get_backend("cpu")
    device = backend.devices()[0]
    exe = backend.compile_and_load(text, xla_client.DeviceList((device,)),
                                   xla_client.CompileOptions())
    out = exe.execute_sharded([jax.device_put(a, device) for a in args])
    theirs = [np.asarray(x[0]) for x in out.disassemble_into_single_device_arrays()]
    module = parse_module(text)
    funcs = _functions(module)
    seen: set[str] = set()
    ours = _interpret(funcs["main"], [obj_array(np.asarray(a)) for a in args], funcs, seen)
    return theirs, ours, seen


def _to_float(array: np.ndarray) -> np.ndarray:
    out = np.empty(array.shape, dtype=np.float64)
    for idx in np.ndindex(array.shape):
        out[idx] = float(array[idx])
    return out


def check(fn: Callable | str, *args: np.ndarray, expect: str | tuple[str, ...] = (),
          rtol: float = 2e-5, atol: float = 2e-5) -> None:
    theirs, ours, seen = run_text(fn, *args) if isinstance(fn, str) else run_both(fn, *args)
    for name in (expect,) if isinstance(expect, str) else expect:
        assert name in seen, f"{name} not in lowered ops {sorted(seen)}"
    assert len(theirs) == len(ours)
    for t, o in zip(theirs, ours):
        assert t.shape == o.shape
        np.testing.assert_allclose(_to_float(o), t.astype(np.float64), rtol=rtol, atol=atol)


RNG = np.random.default_rng(0)


def rand(*shape: int, low: float = -2.0, high: float = 2.0) -> np.ndarray:
    return RNG.uniform(low, high, size=shape).astype(np.float32)


def ints(*shape: int, low: int = -5, high: int = 6) -> np.ndarray:
    return RNG.integers(low, high, size=shape).astype(np.int32)


# ----- elementwise ----------------------------------------------------------------------------

X, Y = rand(2, 3), rand(2, 3)
POS = rand(2, 3, low=0.1, high=3.0)

ELEMENTWISE_CASES: list[tuple[str, Callable | str, tuple]] = [
    ("stablehlo.add", lambda a, b: a + b, (X, Y)),
    ("stablehlo.subtract", lambda a, b: a - b, (X, Y)),
    ("stablehlo.multiply", lambda a, b: a * b, (X, Y)),
    ("stablehlo.divide", lambda a, b: a / b, (X, POS)),
    ("stablehlo.negate", lambda a: -a, (X,)),
    ("stablehlo.maximum", jnp.maximum, (X, Y)),
    ("stablehlo.minimum", jnp.minimum, (X, Y)),
    ("stablehlo.abs", jnp.abs, (X,)),
    ("stablehlo.exponential", jnp.exp, (X,)),
    ("stablehlo.exponential_minus_one", jnp.expm1, (X,)),
    ("stablehlo.log", jnp.log, (POS,)),
    ("stablehlo.log_plus_one", jnp.log1p, (POS,)),
    ("stablehlo.tanh", jnp.tanh, (X,)),
    ("stablehlo.logistic", """
func.func public @main(%arg0: tensor<2x3xf32>) -> tensor<2x3xf32> {
  %0 = stablehlo.logistic %arg0 : tensor<2x3xf32>
  return %0 : tensor<2x3xf32>
}""", (X,)),
    ("stablehlo.rsqrt", lax.rsqrt, (POS,)),
    ("stablehlo.sqrt", jnp.sqrt, (POS,)),
    ("stablehlo.cbrt", jnp.cbrt, (X,)),
    ("stablehlo.power", lax.pow, (POS, X)),
    ("stablehlo.sine", jnp.sin, (X,)),
    ("stablehlo.cosine", jnp.cos, (X,)),
    ("stablehlo.tan", jnp.tan, (X / 2,)),
    ("stablehlo.atan2", jnp.arctan2, (X, Y)),
    ("stablehlo.sign", jnp.sign, (np.array([-1.5, 0.0, 2.0], np.float32),)),
    ("stablehlo.floor", jnp.floor, (X * 3,)),
    ("stablehlo.ceil", jnp.ceil, (X * 3,)),
    ("stablehlo.round_nearest_even", lambda a: lax.round(a, lax.RoundingMethod.TO_NEAREST_EVEN),
     (np.array([-2.5, -1.5, -0.5, 0.5, 1.5, 2.5, 0.3, -0.7], np.float32),)),
    ("stablehlo.round_nearest_afz", lambda a: lax.round(a, lax.RoundingMethod.AWAY_FROM_ZERO),
     (np.array([-2.5, -1.5, -0.5, 0.5, 1.5, 2.5, 0.3, -0.7], np.float32),)),
    ("stablehlo.remainder", lax.rem, (X * 3, POS)),
    ("stablehlo.is_finite", lambda a: jnp.isfinite(a).astype(jnp.float32),
     (np.array([1.0, np.inf, -np.inf], np.float32),)),
    ("chlo.square", jnp.square, (X,)),
    ("chlo.erf", jax.scipy.special.erf, (X,)),
    ("stablehlo.compare", lambda a, b: jnp.where(a < b, a, b), (X, Y)),
    ("stablehlo.select", lambda a, b: lax.select(a > 0, a, b), (X, Y)),
    ("stablehlo.clamp", lambda a: lax.clamp(np.float32(-0.5), a, np.float32(0.7)), (X,)),
    ("stablehlo.convert", lambda a: a.astype(jnp.int32).astype(jnp.float32), (X * 3,)),
    ("stablehlo.reduce_precision", lambda a: lax.reduce_precision(a, 5, 10), (X * 1e4,)),
    ("stablehlo.reduce_precision", lambda a: lax.reduce_precision(a, 8, 7), (X,)),
    ("stablehlo.reduce_precision", lambda a: lax.reduce_precision(a, 8, 23), (X,)),
    ("stablehlo.and", lambda a, b: ((a > 0) & (b > 0)).astype(jnp.float32), (X, Y)),
    ("stablehlo.or", lambda a, b: ((a > 0) | (b > 0)).astype(jnp.float32), (X, Y)),
    ("stablehlo.xor", lambda a, b: ((a > 0) ^ (b > 0)).astype(jnp.float32), (X, Y)),
    ("stablehlo.not", lambda a: (~(a > 0)).astype(jnp.float32), (X,)),
]


@pytest.mark.parametrize("name,fn,args", ELEMENTWISE_CASES, ids=[c[0] for c in ELEMENTWISE_CASES])
def test_elementwise_matches_xla(name: str, fn: Callable, args: tuple) -> None:
    check(fn, *args, expect=name)


@pytest.mark.parametrize("direction", ["EQ", "NE", "LT", "LE", "GT", "GE"])
def test_compare_directions(direction: str) -> None:
    a = np.array([1.0, 2.0, 3.0, -1.0], np.float32)
    b = np.array([1.0, 3.0, 2.0, -1.0], np.float32)
    ops = {"EQ": lambda x, y: x == y, "NE": lambda x, y: x != y, "LT": lambda x, y: x < y,
           "LE": lambda x, y: x <= y, "GT": lambda x, y: x > y, "GE": lambda x, y: x >= y}
    check(lambda x, y: ops[direction](x, y).astype(jnp.float32), a, b, expect="stablehlo.compare")


def test_integer_division_and_remainder_truncate() -> None:
    a = np.array([7, -7, 7, -7, 0], np.int32)
    b = np.array([2, 2, -2, -2, 3], np.int32)
    check(lambda x, y: (lax.div(x, y), lax.rem(x, y)), a, b,
          expect=("stablehlo.divide", "stablehlo.remainder"))


def test_int_float_converts() -> None:
    check(lambda i: i.astype(jnp.float32) * 0.5, ints(2, 3), expect="stablehlo.convert")
    check(lambda a: (a > 0).astype(jnp.int32) + 1, X, expect="stablehlo.convert")


def test_bitwise_not_of_integers() -> None:
    """~x is least + greatest - x: -1 - x signed, MAX - x unsigned."""
    for dtype in (np.int32, np.int8, np.uint8, np.uint32):
        info = np.iinfo(dtype)
        values = np.array([0, 1, 5, info.max, info.min], dtype)
        check(lambda a: ~a, values, expect="stablehlo.not", rtol=0, atol=0)


def test_integer_power() -> None:
    check(lambda a: lax.pow(a, np.int32(3)), X, expect="stablehlo.power")


# ----- data movement, contraction, reduction --------------------------------------------------

MOVEMENT_CASES: list[tuple[str, Callable, tuple]] = [
    ("stablehlo.broadcast_in_dim", lambda a: lax.broadcast_in_dim(a, (3, 2, 4), (1, 0)),
     (rand(2, 1),)),
    ("stablehlo.broadcast_in_dim", lambda a: lax.broadcast_in_dim(a, (2, 4, 3), (0, 2)),
     (rand(2, 3),)),
    ("stablehlo.reshape", lambda a: a.reshape(3, 2, 4), (rand(4, 6),)),
    ("stablehlo.transpose", lambda a: jnp.transpose(a, (2, 0, 1)), (rand(2, 3, 4),)),
    ("stablehlo.reverse", lambda a: jnp.flip(a, (0, 2)), (rand(2, 3, 4),)),
    ("stablehlo.slice", lambda a: a[1:4:2, ::3], (rand(5, 7),)),
    ("stablehlo.concatenate", lambda a, b: jnp.concatenate([a, b, a], axis=1),
     (rand(2, 3), rand(2, 1))),
    ("stablehlo.pad", lambda a: lax.pad(a, np.float32(0.5), ((1, -1, 1), (0, 2, 0))),
     (rand(3, 4),)),
    ("stablehlo.iota", lambda a: a + lax.broadcasted_iota(jnp.float32, (3, 4), 1), (rand(3, 4),)),
    ("stablehlo.constant", lambda a: a * jnp.array([[1.0, -2.0, 0.25]], jnp.float32),
     (rand(2, 3),)),
    ("stablehlo.dot_general", lambda a, b: a @ b, (rand(3, 4), rand(4, 5))),
    ("stablehlo.dot_general",
     lambda a, b: lax.dot_general(a, b, (((2,), (1,)), ((0,), (2,)))),
     (rand(2, 3, 4), rand(5, 4, 2))),
    ("stablehlo.dot_general", lambda a, b: jnp.einsum("bij,bkj->bki", a, b),
     (rand(2, 3, 4), rand(2, 5, 4))),
    ("stablehlo.reduce", lambda a: jnp.sum(a, axis=1), (rand(2, 3, 4),)),
    ("stablehlo.reduce", lambda a: jnp.max(a, axis=(0, 2)), (rand(2, 3, 4),)),
    ("stablehlo.reduce", lambda a: jnp.min(a, axis=0), (rand(2, 3, 4),)),
    ("stablehlo.reduce", lambda a: lax.reduce(a, np.float32(1.5), lax.add, (1,)), (rand(2, 3),)),
    ("stablehlo.reduce_window", lambda a: jnp.cumsum(a, axis=1), (rand(2, 5),)),
    ("stablehlo.reduce_window", lambda a: lax.cummax(a, axis=0), (rand(4, 3),)),
    ("stablehlo.reduce_window", lambda a: jnp.cumprod(a, axis=1), (rand(2, 5),)),
    ("stablehlo.reduce_window", lambda a: lax.cumprod(a, axis=0, reverse=True), (rand(4, 3),)),
    ("stablehlo.reduce_window", lambda a: jnp.cumprod(a, axis=1),  # wraps modulo 2^32
     (np.array([[65536, 65536, 3, -7], [46341, 46341, 2, 2], [-1, 2**31 - 1, 2, 3]],
               np.int32),)),
    ("stablehlo.reduce", lambda a: jnp.prod(a, axis=1), (rand(3, 4),)),
    ("stablehlo.reduce", lambda a: lax.reduce(a, np.int32(3), lax.mul, (0,)),
     (np.array([[65536, 7], [65536, -46341], [5, 46341]], np.int32),)),
    ("stablehlo.reduce_window",
     lambda a: lax.reduce_window(a, np.float32(0.5), lax.add, (2, 2), (2, 1), ((1, 0), (0, 1)),
                                 (1, 2), (2, 1)), (rand(4, 3),)),
    ("stablehlo.reduce", lambda a: jnp.argmax(a, axis=1), (rand(3, 5),)),
    ("stablehlo.reduce", lambda a: jnp.argmax(a, axis=1),  # ties: the first index
     (np.array([[1, 2, 2, 0, 2], [3, 3, 3, 3, 3], [-1, 0, -1, 0, 0]], np.float32),)),
    ("stablehlo.reduce", lambda a: jnp.argmin(a, axis=0),
     (np.array([[1, 2, 2], [1, 0, 2], [0, 0, 5]], np.float32),)),
    ("stablehlo.reduce", lambda a: jnp.argmax(a),
     (np.array([[2, 7, 7], [7, 0, 1]], np.int32),)),
    ("stablehlo.convolution",
     lambda x, w: lax.conv_general_dilated(x, w, (2, 1), [(1, 1), (0, 2)], lhs_dilation=(1, 2),
                                           rhs_dilation=(2, 1)), (rand(2, 3, 6, 5), rand(4, 3, 3, 2))),
    ("stablehlo.convolution",
     lambda x, w: lax.conv_general_dilated(x, w, (1, 1), "SAME",
                                           dimension_numbers=("NHWC", "HWIO", "NHWC")),
     (rand(2, 5, 5, 3), rand(3, 3, 3, 4))),
    ("stablehlo.convolution", lambda x, w: lax.conv_general_dilated(x, w, (1,), [(-1, 2)]),
     (rand(1, 2, 7), rand(3, 2, 3))),
    ("stablehlo.convolution",
     lambda x, w: lax.conv_general_dilated(x, w, (), [], dimension_numbers=("NC", "IO", "NC")),
     (rand(4, 6), rand(6, 3))),
    ("stablehlo.case", lambda n, a: lax.switch(n, [lambda x: x, jnp.sin, lambda x: x * 2], a),
     (np.int32(1), rand(2, 3))),
    ("stablehlo.case", lambda n, a: lax.switch(n, [lambda x: x, jnp.sin, lambda x: x * 2], a),
     (np.int32(7), rand(2, 3))),  # out of range: clamped by jax to the last branch
    ("stablehlo.case", lambda a: lax.cond(jnp.any(a > 0), lambda x: x + 1, lambda x: x - 1, a),
     (rand(2, 3),)),
    ("stablehlo.sort", lambda a: jnp.sort(a, axis=1), (rand(3, 5),)),
    ("stablehlo.sort", lambda a: jnp.argsort(a, axis=0),  # ties: stable
     (np.array([[1, 2, 2], [0, 2, 1], [1, 2, 0], [0, 1, 1]], np.float32),)),
    ("stablehlo.sort", lambda a: jnp.sort(a, axis=-1),
     (np.array([[3, -1, 2, -1], [7, 7, 0, 2]], np.int32),)),
    ("stablehlo.sort", lambda a, b: lax.sort((a, b), dimension=1, num_keys=1),
     (np.array([[1, 0, 1, 0]], np.float32), rand(1, 4))),
    ("chlo.top_k", lambda a: lax.top_k(a, 3), (rand(2, 3, 5),)),
    ("chlo.top_k", lambda a: lax.top_k(a, 4),  # ties: the lower index first
     (np.array([[1, 2, 2, 0, 2, 1], [3, 3, 3, 3, 3, 3]], np.float32),)),
]


@pytest.mark.parametrize("name,fn,args", MOVEMENT_CASES,
                         ids=[f"{c[0]}-{i}" for i, c in enumerate(MOVEMENT_CASES)])
def test_movement_matches_xla(name: str, fn: Callable, args: tuple) -> None:
    check(fn, *args, expect=name, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("offset", [-3, 0, 2, 9])
def test_dynamic_slice_clamps(offset: int) -> None:
    x = rand(6, 4)
    check(lambda a, i: lax.dynamic_slice(a, (i, np.int32(1)), (3, 2)), x, np.int32(offset),
          expect="stablehlo.dynamic_slice")


def test_identity_ops() -> None:
    check("""
func.func public @main(%arg0: tensor<2x3xf32>) -> tensor<2x3xf32> {
  %0 = mhlo.copy %arg0 : tensor<2x3xf32>
  return %0 : tensor<2x3xf32>
}""", rand(2, 3), expect="mhlo.copy")
    check(lambda a, b: lax.optimization_barrier((a, b)), rand(2, 3), rand(3),
          expect="stablehlo.optimization_barrier")


def test_dynamic_update_slice() -> None:
    check(lambda a, u, i: lax.dynamic_update_slice(a, u, (i, np.int32(0))), rand(5, 3), rand(2, 3),
          np.int32(4), expect="stablehlo.dynamic_update_slice")


# ----- gather / scatter -------------------------------------------------------------------------

GATHER_MODE = lax.GatherScatterMode.PROMISE_IN_BOUNDS


def test_gather_embedding_lookup_clamps() -> None:
    ids = np.array([[0, 4], [9, -2], [2, 2]], np.int32)  # out of range ids are clamped
    dnums = lax.GatherDimensionNumbers(offset_dims=(2,), collapsed_slice_dims=(0,),
                                       start_index_map=(0,))
    check(lambda t, i: lax.gather(t, i[..., None], dnums, (1, 3), mode=GATHER_MODE),
          rand(5, 3), ids, expect="stablehlo.gather")


def test_gather_windows_and_index_vector() -> None:
    dnums = lax.GatherDimensionNumbers(offset_dims=(1, 2), collapsed_slice_dims=(),
                                       start_index_map=(1, 0))
    starts = np.array([[0, 0], [2, 1], [1, 3]], np.int32)
    check(lambda t, i: lax.gather(t, i, dnums, (2, 2), mode=GATHER_MODE), rand(4, 5), starts,
          expect="stablehlo.gather")


def test_gather_batching_dims() -> None:
    dnums = lax.GatherDimensionNumbers(offset_dims=(2,), collapsed_slice_dims=(1,),
                                       start_index_map=(1,), operand_batching_dims=(0,),
                                       start_indices_batching_dims=(0,))
    ids = np.array([[[1], [0]], [[2], [2]]], np.int32)
    check(lambda t, i: lax.gather(t, i, dnums, (1, 1, 4), mode=GATHER_MODE), rand(2, 3, 4), ids,
          expect="stablehlo.gather")


@pytest.mark.parametrize("update", ["add", "set", "max"])
def test_scatter(update: str) -> None:
    ids = np.array([0, 3, 0, 7], np.int32)  # a duplicate (add/max) and an out-of-range id
    if update == "set":
        ids = np.array([0, 3, 1, 7], np.int32)
    fn = {"add": lambda t, i, u: t.at[i].add(u, mode="drop"),
          "set": lambda t, i, u: t.at[i].set(u, mode="drop"),
          "max": lambda t, i, u: t.at[i].max(u, mode="drop")}[update]
    check(fn, rand(5, 3), ids, rand(4, 3), expect="stablehlo.scatter")


def test_symbolic_indices_agree_with_concrete() -> None:
    table = obj_array(np.arange(15).reshape(5, 3) * 2 - 7)
    dims = {"offset_dims": (1,), "collapsed_slice_dims": (0,), "start_index_map": (0,),
            "index_vector_dim": 1}
    i, j = z3.Int("i"), z3.Int("j")
    symbolic = gather(table, obj_array(np.array([[i], [j]], object)), dims, (1, 3), (2, 3))
    window = dynamic_slice(table, [i, 1], (2, 2))
    updates = obj_array(np.array([[1, 2, 3], [4, 5, 6]]))
    scattered = scatter(table, obj_array(np.array([[i], [j]], object)), updates,
                        {"update_window_dims": (1,), "inserted_window_dims": (0,),
                         "scatter_dims_to_operand_dims": (0,), "index_vector_dim": 1}, "add")
    for vi, vj in ((0, 4), (-3, 2), (9, 1), (2, 2)):
        subst = [(i, z3.IntVal(vi)), (j, z3.IntVal(vj))]
        concrete = gather(table, obj_array(np.array([[vi], [vj]])), dims, (1, 3), (2, 3))
        assert (_concretize(symbolic, subst) == concrete).all()
        assert (_concretize(window, subst) == dynamic_slice(table, [vi, 1], (2, 2))).all()
        expect = scatter(table, obj_array(np.array([[vi], [vj]])), updates,
                         {"update_window_dims": (1,), "inserted_window_dims": (0,),
                          "scatter_dims_to_operand_dims": (0,), "index_vector_dim": 1}, "add")
        assert (_concretize(scattered, subst) == expect).all()
        placed = dynamic_update_slice(table, updates, [i, j])
        assert (_concretize(placed, subst) ==
                dynamic_update_slice(table, updates, [vi, vj])).all()


# ----- collectives on 4 simulated devices -----------------------------------------------------

MESH = Mesh((("x", 2), ("y", 2)))


@functools.cache
def _jax_mesh():
    return jax.make_mesh((2, 2), ("x", "y"), axis_types=(AxisType.Auto,) * 2)


def _collective_case(body: Callable, local: np.ndarray, name: str):
    """Run `body` per device through shard_map and through COLLECTIVE_SEMANTICS.

    Device d holds `local[d]`; the outputs are stacked by device id (row-major over x, y).
    """
    mesh = _jax_mesh()
    spec = P(("x", "y"))
    fn = jax.jit(jax.shard_map(lambda a: body(a[0])[None], mesh=mesh, in_specs=spec,
                               out_specs=spec, check_vma=False))
    theirs = np.asarray(fn(local))
    module = parse_module(fn.lower(local).as_text())
    infos = []

    def visit(op):
        if op.name == name:
            infos.append(describe(op))
        return __import__("jaxlib.mlir.ir", fromlist=["WalkResult"]).WalkResult.ADVANCE

    module.operation.walk(visit)
    assert len(infos) == 1, f"expected one {name}, found {len(infos)}"
    info = infos[0]
    operands = [[obj_array(local[d])] for d in range(MESH.num_devices)]
    ours = COLLECTIVE_SEMANTICS[name](info, MESH, operands)
    for d in range(MESH.num_devices):
        np.testing.assert_allclose(_to_float(ours[d][0]), theirs[d].astype(np.float64),
                                   rtol=1e-5, atol=1e-5)
    return info


COLLECTIVE_CASES: list[tuple[str, str, Callable, tuple[int, ...]]] = [
    ("psum_y", "stablehlo.all_reduce", lambda a: lax.psum(a, "y"), (2, 3)),
    ("psum_xy", "stablehlo.all_reduce", lambda a: lax.psum(a, ("x", "y")), (2, 3)),
    ("pmax_x", "stablehlo.all_reduce", lambda a: lax.pmax(a, "x"), (2, 3)),
    ("pmin_y", "stablehlo.all_reduce", lambda a: lax.pmin(a, "y"), (2, 3)),
    ("all_gather_x_dim1", "stablehlo.all_gather",
     lambda a: lax.all_gather(a, "x", axis=1, tiled=True), (2, 3)),
    ("all_gather_yx_dim0", "stablehlo.all_gather",
     lambda a: lax.all_gather(a, ("y", "x"), axis=0, tiled=True), (2, 3)),
    ("psum_scatter_y", "stablehlo.reduce_scatter",
     lambda a: lax.psum_scatter(a, "y", scatter_dimension=1, tiled=True), (2, 4)),
    ("all_to_all_x", "stablehlo.all_to_all",
     lambda a: lax.all_to_all(a, "x", split_axis=0, concat_axis=1, tiled=True), (4, 3)),
    ("all_to_all_xy", "stablehlo.all_to_all",
     lambda a: lax.all_to_all(a, ("x", "y"), split_axis=1, concat_axis=0, tiled=True), (2, 4)),
    ("ppermute_y", "stablehlo.collective_permute",
     lambda a: lax.ppermute(a, "y", perm=[(0, 1), (1, 0)]), (2, 3)),
    ("ppermute_partial", "stablehlo.collective_permute",
     lambda a: lax.ppermute(a, "x", perm=[(0, 1)]), (2, 3)),
]


@pytest.mark.parametrize("case,name,body,shape", COLLECTIVE_CASES,
                         ids=[c[0] for c in COLLECTIVE_CASES])
def test_collectives_match_xla(case: str, name: str, body: Callable,
                               shape: tuple[int, ...]) -> None:
    local = RNG.standard_normal((MESH.num_devices,) + shape).astype(np.float32)
    _collective_case(body, local, name)


def test_partition_id_is_the_flattened_device_id() -> None:
    local = np.zeros((4, 1), np.float32)
    mesh = _jax_mesh()
    spec = P(("x", "y"))
    fn = jax.jit(jax.shard_map(
        lambda a: a + (lax.axis_index("x") * 2 + lax.axis_index("y")).astype(jnp.float32),
        mesh=mesh, in_specs=spec, out_specs=spec))
    theirs = np.asarray(fn(local)).reshape(-1)
    info = OpInfo("stablehlo.partition_id", {}, [], [TensorType((), "ui32")])
    ours = COLLECTIVE_SEMANTICS["stablehlo.partition_id"](info, MESH, [[] for _ in range(4)])
    assert [int(o[0][()]) for o in ours] == [int(t) for t in theirs]


# ----- symbolic encodings agree with the numeric semantics ------------------------------------

def _symbolic(shape: tuple[int, ...], prefix: str, dtype: str = "f32") -> np.ndarray:
    out = np.empty(shape, dtype=object)
    for idx in np.ndindex(shape):
        name = f"{prefix}{'_'.join(map(str, idx))}"
        out[idx] = z3.Int(name) if is_int_dtype(dtype) else z3.Real(name)
    return out


def _concretize(symbolic: np.ndarray, subst: list[tuple]) -> np.ndarray:
    out = np.empty(symbolic.shape, dtype=object)
    for idx in np.ndindex(symbolic.shape):
        v = symbolic[idx]
        if is_z3(v):
            v = z3.simplify(z3.substitute(v, *subst))
            if z3.is_true(v) or z3.is_false(v):
                v = z3.is_true(v)
            elif z3.is_int_value(v):
                v = v.as_long()
            else:
                v = Fraction(v.as_fraction())
        out[idx] = v
    return out


EXACT_OPS = ["stablehlo.add", "stablehlo.subtract", "stablehlo.multiply", "stablehlo.divide",
             "stablehlo.maximum", "stablehlo.minimum", "stablehlo.abs", "stablehlo.negate",
             "stablehlo.sign", "stablehlo.floor", "stablehlo.ceil", "stablehlo.remainder",
             "stablehlo.round_nearest_even", "stablehlo.round_nearest_afz", "chlo.square",
             "stablehlo.compare", "stablehlo.select", "stablehlo.clamp", "stablehlo.convert",
             "stablehlo.power"]


@pytest.mark.parametrize("name", EXACT_OPS)
def test_z3_encoding_agrees(name: str) -> None:
    rng = np.random.default_rng(1)
    shape = (6,)
    values = [np.array([Fraction(int(v), 2) for v in rng.integers(-7, 8, size=shape)], object)
              for _ in range(3)]
    values[1] = np.array([v if v != 0 else Fraction(3, 2) for v in values[1]], object)
    syms = [_symbolic(shape, f"v{k}_") for k in range(3)]
    subst = [(s, to_z3(v)) for sym, val in zip(syms, values)
             for s, v in zip(sym.reshape(-1), val.reshape(-1))]
    attrs: dict = {}
    arity = 2
    rtype = "f32"
    if name == "stablehlo.compare":
        attrs = {"comparison_direction": "LT"}
        rtype = "i1"
    if name in ("stablehlo.abs", "stablehlo.negate", "stablehlo.sign", "stablehlo.floor",
                "stablehlo.ceil", "stablehlo.round_nearest_even", "stablehlo.round_nearest_afz",
                "chlo.square"):
        arity = 1
    if name in ("stablehlo.select", "stablehlo.clamp"):
        arity = 3
    if name == "stablehlo.convert":
        arity, rtype = 1, "i32"
    if name == "stablehlo.power":
        values[1] = np.array([Fraction(k % 4 - 1) for k in range(6)], object)
        values[0] = np.array([v if v != 0 else Fraction(1, 3) for v in values[0]], object)
        subst = [(s, to_z3(v)) for sym, val in zip(syms, values)
                 for s, v in zip(sym.reshape(-1), val.reshape(-1))]
    operand_types = [TensorType(shape, "f32")] * arity
    numeric_args = list(values[:arity])
    symbolic_args = list(syms[:arity])
    if name == "stablehlo.select":
        numeric_args[0] = np.array([v > 0 for v in values[0]], object)
        symbolic_args[0] = np.array([s > 0 for s in syms[0]], object)
        operand_types[0] = TensorType(shape, "i1")
    if name == "stablehlo.clamp":
        numeric_args = [values[0], values[1], values[0] + 2]
        symbolic_args = [syms[0], syms[1], np.array([s + 2 for s in syms[0]], object)]
    if name == "stablehlo.power":
        # Integer exponents are expanded; a symbolic exponent would be uninterpreted.
        symbolic_args[1] = values[1]
    info = OpInfo(name, attrs, operand_types, [TensorType(shape, rtype)])
    numeric = OP_SEMANTICS[name](info, numeric_args)[0]
    symbolic = OP_SEMANTICS[name](info, symbolic_args)[0]
    got = _concretize(symbolic, subst)
    for a, b in zip(got.reshape(-1), numeric.reshape(-1)):
        assert equal(a, b), (name, got, numeric)


def test_transcendentals_are_uninterpreted_functions() -> None:
    x = _symbolic((2,), "t")
    info = OpInfo("stablehlo.tanh", {}, [TensorType((2,), "f32")], [TensorType((2,), "f32")])
    out = OP_SEMANTICS["stablehlo.tanh"](info, [x])[0]
    assert all(z3.is_app(v) and v.decl().name() == "tanh" for v in out)
    with random_functions(3):
        a = transcendental("tanh", Fraction(1, 3))
        b = transcendental("tanh", Fraction(1, 3))
        c = transcendental("tanh", Fraction(2, 3))
    assert a == b and isinstance(a, Fraction) and isinstance(c, Fraction)
    assert math.isclose(transcendental("tanh", 0.5), math.tanh(0.5))


def test_infinities_in_max_and_reduce() -> None:
    x = _symbolic((3,), "m")
    reduced = reduce_dims(x, (0,), "max", -math.inf)
    assert z3.eq(reduced[()], maximum(maximum(x[0], x[1]), x[2]))
    assert maximum(-math.inf, x[0]) is x[0]
    assert minimum(x[1], math.inf) is x[1]


# ----- terms ----------------------------------------------------------------------------------

def test_evaluate_term_covers_canonical_forms() -> None:
    a = T.make_arg(0, (2, 3), "f32")
    b = T.make_arg(1, (3, 4), "f32")
    env = {0: obj_array(rand(2, 3)), 1: obj_array(rand(3, 4))}
    fa, fb = _to_float(env[0]), _to_float(env[1])
    cases = [
        (T.make_add(T.scale(a, Fraction(1, 4)), T.make_splat(2, (2, 3), "f32")), fa / 4 + 2),
        (T.make_mul(a, a), fa * fa),
        (T.make_div(a, T.make_lin([(Fraction(1), a)], 3, (2, 3), "f32")), fa / (fa + 3)),
        (T.make_transpose(a, (1, 0)), fa.T),
        (T.make_reshape(a, (3, 2)), fa.reshape(3, 2)),
        (T.make_broadcast(a, (0, 2), (2, 5, 3)), np.broadcast_to(fa[:, None, :], (2, 5, 3))),
        (T.make_dot(a, b, ((), (), (1,), (0,)), (2, 4), "f32"), fa @ fb),
        (T.make_op("reduce_sum", (a,), ((1,),), (2,), "f32", linear_in=0), fa.sum(1)),
        (T.intern("reduce_max", (a,), ((0,),), (3,), "f32"), fa.max(0)),
        (T.intern("reduce_min", (a,), ((0, 1),), (), "f32"), np.array(fa.min())),
        (T.make_op("slice", (a,), ((0, 1), (2, 3), (1, 2)), (2, 1), "f32", linear_in=0),
         fa[0:2, 1:3:2]),
        (T.intern("concatenate", (a, a), (0,), (4, 3), "f32"), np.concatenate([fa, fa])),
        (T.intern("pad", (a, T.make_splat(0, (), "f32")), ((1, 0), (0, 1), (0, 0)), (3, 4),
                  "f32"), np.pad(fa, ((1, 0), (0, 1)))),
        (T.make_elementwise("stablehlo.maximum", (a, T.make_splat(0, (2, 3), "f32"))),
         np.maximum(fa, 0)),
        (T.make_elementwise("stablehlo.tanh", (a,)), np.tanh(fa)),
        (T.make_elementwise("stablehlo.select", (
            T.make_elementwise("stablehlo.compare", (a, T.make_splat(0, (2, 3), "f32")), ("GT",),
                               dtype="i1"), a, T.make_splat(-1, (2, 3), "f32"))),
         np.where(fa > 0, fa, -1)),
        (T.make_iota((2, 3), 1, "f32"), np.broadcast_to(np.arange(3.0), (2, 3))),
        (T.intern("reduce_mul", (a,), ((1,),), (2,), "f32"), fa.prod(1)),
        (T.intern("reduce_window_mul", (a,), ((1, 3), (1, 1), (1, 1), (1, 1), (0, 2), (0, 0)),
                  (2, 3), "f32"), np.cumprod(fa, axis=1)),
        (T.intern("reduce_window_mul", (a,), ((2, 1), (1, 1), (1, 1), (1, 1), (0, 0), (1, 0)),
                  (2, 3), "f32"), np.cumprod(fa[::-1], axis=0)[::-1]),
    ]
    for term, expect in cases:
        got = evaluate_term(term, env)
        np.testing.assert_allclose(_to_float(got), expect, rtol=1e-6, err_msg=repr(term))


def test_evaluate_term_loops_and_computed_slices() -> None:
    x = T.make_arg(0, (4, 2), "f32")
    i = T.make_arg(1, (), "i32")
    window = T.intern("dynamic_slice", (x, i, T.make_splat(0, (), "i32")), ((2, 2),), (2, 2),
                      "f32")
    values = obj_array(np.arange(8).reshape(4, 2))
    for offset, rows in ((1, [1, 2]), (3, [2, 3]), (-1, [0, 1])):
        got = evaluate_term(window, {0: values, 1: obj_array(offset)})
        assert (got == values[rows]).all()
    loop = T.make_loopvar(1, 0, (2,), "f32")
    result = T.intern("while_result", (x,), (0, 1, ()), (2,), "f32")
    env = {("loopvar", 1, 0): obj_array(np.array([1, 2]))}
    assert list(evaluate_term(T.make_add(loop, loop), env)) == [2, 4]
    with pytest.raises(SemanticsError, match="while_result"):
        evaluate_term(result, {0: values})
    opaque = {"opaque": lambda term: full(term.shape, 7), 0: values}
    assert list(evaluate_term(result, opaque)) == [7, 7]


def test_evaluate_term_dense_and_errors() -> None:
    d = T.make_dense(b"k", (2,), "f32")
    assert list(evaluate_term(d, {("dense", b"k"): np.array([1.0, 2.0])})) == [1.0, 2.0]
    with pytest.raises(SemanticsError, match="dense"):
        evaluate_term(d, {})
    weird = T.intern("mystery_op", (), (), (2,), "f32")
    with pytest.raises(SemanticsError, match="mystery_op"):
        evaluate_term(weird, {})
    with pytest.raises(SemanticsError, match="arg7"):
        evaluate_term(T.make_arg(7, (1,), "f32"), {})


def test_every_rule_op_has_semantics() -> None:
    """Each op with a rule can be run locally or across devices."""
    from entangle_mlir.rules import RULES

    missing = [name for name in RULES
               if name not in OP_SEMANTICS and name not in COLLECTIVE_SEMANTICS]
    assert not missing, missing


def test_every_term_op_the_rules_build_can_be_evaluated() -> None:
    """Term op strings interned by terms.py or the rules (read off their source) and every
    elementwise rule's op are known to `evaluate_term`."""
    import re
    from pathlib import Path

    import entangle_mlir
    from entangle_mlir.rules.elementwise import ELEMENTWISE_RULES

    root = Path(entangle_mlir.__file__).parent
    found: set[str] = set()
    for path in sorted(root.rglob("*.py")):
        text = path.read_text()
        found |= set(re.findall(r'(?:intern|make_op)\(\s*"([^"]+)"', text))
        for prefix in re.findall(r'(?:intern|make_op)\(\s*f"([a-z_.]+)\{', text):
            found |= {op for op in TERM_OPS if op.startswith(prefix)} or {prefix + "?"}
    assert found, "no term constructors found"
    missing = sorted(found - set(TERM_OPS)) + sorted(set(ELEMENTWISE_RULES) - set(ELEMENTWISE))
    assert not missing, missing


def test_rebuild_knows_every_elementwise_op() -> None:
    """`terms.rebuild` sends exactly the elementwise ops (`semantics.ops.ELEMENTWISE`) through
    `make_elementwise`: its own ops and the arithmetic ones that become `lin`, `mul`, `div`."""
    assert set(ELEMENTWISE) == T.ELEMENTWISE_STABLEHLO | T.ARITHMETIC_STABLEHLO


GROUNDED_ELSEWHERE = {"stablehlo.dynamic_slice", "stablehlo.dynamic_update_slice",
                      "stablehlo.gather", "stablehlo.scatter", "mhlo.copy",
                      "stablehlo.optimization_barrier",
                      "mhlo.topk"}  # test_mhlo_topk_is_chlo_top_k


def test_every_op_in_the_tables_is_grounded() -> None:
    """Each key of OP_SEMANTICS / COLLECTIVE_SEMANTICS has an XLA-grounded test case here."""
    covered = ({c[0] for c in ELEMENTWISE_CASES} | {c[0] for c in MOVEMENT_CASES}
               | {c[1] for c in COLLECTIVE_CASES} | GROUNDED_ELSEWHERE
               | {"stablehlo.partition_id", "stablehlo.replica_id"})
    missing = sorted((set(OP_SEMANTICS) | set(COLLECTIVE_SEMANTICS)) - covered)
    assert not missing, missing


TOPK_TEXT = """
func.func public @main(%x: tensor<3x6xf32>) -> (tensor<3x4xf32>, tensor<3x4xi32>) {
  %values, %indices = mhlo.topk(%x, k = 4) : tensor<3x6xf32> -> (tensor<3x4xf32>, tensor<3x4xi32>)
  return %values, %indices : tensor<3x4xf32>, tensor<3x4xi32>
}"""


def test_mhlo_topk_is_chlo_top_k() -> None:
    """XLA's mhlo.topk (the per-device programs' spelling): the k largest, ties to the lower
    index, as chlo.top_k."""
    ties = np.array([[1, 3, 3, 0, 3, 2], [2, 2, 0, 2, 1, 0], [5, 4, 3, 2, 1, 0]], np.float32)
    theirs, ours, seen = run_text(TOPK_TEXT, ties)
    assert "mhlo.topk" in seen
    assert len(theirs) == len(ours) == 2
    for t, o in zip(theirs, ours):
        assert np.array_equal(_to_float(o), t.astype(np.float64)), (t, o)
    assert [int(v) for v in ours[1][0]] == [1, 2, 4, 5]


REVERSED_CONV = """
func.func public @main(%x: tensor<1x2x6xf32>, %w: tensor<3x2x3xf32>) -> tensor<1x3x3xf32> {
  %0 = stablehlo.convolution(%x, %w) dim_numbers = [b, f, 0]x[o, i, 0]->[b, f, 0], window = {stride = [2], pad = [[1, 0]], lhs_dilate = [1], rhs_dilate = [1], reverse = [true]} {batch_group_count = 1 : i64, feature_group_count = 1 : i64} : (tensor<1x2x6xf32>, tensor<3x2x3xf32>) -> tensor<1x3x3xf32>
  return %0 : tensor<1x3x3xf32>
}"""


def test_convolution_window_reversal() -> None:
    """A reversed window (jax never emits one): the kernel read back to front."""
    check(REVERSED_CONV, rand(1, 2, 6), rand(3, 2, 3), expect="stablehlo.convolution")


CASE_TEXT = """
func.func public @main(%n: tensor<i32>, %x: tensor<3xf32>) -> tensor<3xf32> {
  %0 = "stablehlo.case"(%n) ({
    stablehlo.return %x : tensor<3xf32>
  }, {
    %1 = stablehlo.negate %x : tensor<3xf32>
    stablehlo.return %1 : tensor<3xf32>
  }, {
    %1 = stablehlo.add %x, %x : tensor<3xf32>
    stablehlo.return %1 : tensor<3xf32>
  }) : (tensor<i32>) -> tensor<3xf32>
  return %0 : tensor<3xf32>
}"""


@pytest.mark.parametrize("index", [0, 1, 2, 3, 100, -1])
def test_case_runs_the_last_branch_for_an_index_out_of_range(index: int) -> None:
    """StableHLO's case (not jax's clamped switch): an index out of range runs the last
    branch, on XLA and in OP_SEMANTICS."""
    check(CASE_TEXT, np.int32(index), np.array([1.0, -2.0, 0.5], np.float32),
          expect="stablehlo.case", rtol=0, atol=0)


def test_sort_on_symbolic_keys_matches_the_concrete_sort() -> None:
    """The stable bubble network on z3 keys agrees with the direct stable sort (ties keep
    their order), for the keys and an operand moved with them."""
    from entangle_mlir.semantics.tensor import sort_ascending

    rows = [[1, 2, 2, 0, 2], [3, 3, 1, 3, 0], [4, 3, 2, 1, 0], [1, 1, 1, 1, 1]]
    xs = [z3.Real(f"x{j}") for j in range(5)]
    tags = np.array([list(range(5))], dtype=object)
    keys, moved = sort_ascending([np.array([xs], dtype=object), tags], 1, "f32")
    for row in rows:
        want_k, want_m = sort_ascending([np.array([row], dtype=object), tags], 1, "f32")
        subst = [(x, z3.RealVal(v)) for x, v in zip(xs, row)]
        got_k = [z3.simplify(z3.substitute(to_z3(v), *subst)).as_fraction() for v in keys[0]]
        got_m = [z3.simplify(z3.substitute(to_z3(v), *subst)).as_long() for v in moved[0]]
        assert got_k == list(want_k[0]) == sorted(row)
        assert got_m == list(want_m[0]) == sorted(range(5), key=lambda j: row[j])


def test_argmax_on_symbolic_elements_matches_the_concrete_fold() -> None:
    """The comparator's select chain on z3 reals agrees with the concrete fold, ties
    included (the first index), and argmin's too."""
    from entangle_mlir.semantics.tensor import arg_reduce

    rows = [[1, 2, 2, 0, 2], [3, 3, 1, 3, 0], [0, 1, 2, 3, 4], [5, 5, 5, 5, 5]]
    xs = [z3.Real(f"x{j}") for j in range(5)]
    idx = np.array([list(range(5))], dtype=object)
    for kind, init in (("argmax", -math.inf), ("argmin", math.inf)):
        values, indices = arg_reduce(np.array([xs], dtype=object), idx, init, 0, (1,), kind,
                                     "f32")
        for row in rows:
            want_v, want_i = arg_reduce(np.array([row], dtype=object), idx, init, 0, (1,),
                                        kind, "f32")
            subst = [(x, z3.RealVal(v)) for x, v in zip(xs, row)]
            got_v = z3.simplify(z3.substitute(to_z3(values[0]), *subst))
            got_i = z3.simplify(z3.substitute(to_z3(indices[0]), *subst))
            assert got_v.as_fraction() == want_v[0] and got_i.as_long() == want_i[0], (kind, row)
            first = (max if kind == "argmax" else min)(row)
            assert want_i[0] == row.index(first)


def test_top_k_on_symbolic_elements_matches_the_concrete_sort() -> None:
    """The stable bubble network used on z3 elements agrees with the direct sort, ties
    included (lower index first)."""
    rows = [[1, 2, 2, 0, 2], [3, 3, 1, 3, 0], [0, 1, 2, 3, 4]]
    xs = [z3.Real(f"x{j}") for j in range(5)]
    values, indices = top_k(np.array([xs], dtype=object), 3, "f32")
    for row in rows:
        want_v, want_i = top_k(np.array([row], dtype=object), 3, "f32")
        subst = [(x, z3.RealVal(v)) for x, v in zip(xs, row)]
        got_v = [z3.simplify(z3.substitute(to_z3(v), *subst)) for v in values[0]]
        got_i = [z3.simplify(z3.substitute(to_z3(i), *subst)) for i in indices[0]]
        assert [g.as_fraction() for g in got_v] == list(want_v[0])
        assert [g.as_long() for g in got_i] == list(want_i[0])


@pytest.mark.parametrize("kind", ["add", "replace"])
def test_symbolic_scatter_with_batching_dims_agrees_with_concrete(kind: str) -> None:
    """A top-k gradient's scatter: one row a batch element (a batching dim, known), the
    column symbolic. Only the row's positions are visited; each substitution of the columns
    gives the concrete scatter's elements (also a column off the row's end: dropped)."""
    table = obj_array(np.arange(12).reshape(3, 4) * 3 - 5)
    dims = {"update_window_dims": (), "inserted_window_dims": (1,),
            "input_batching_dims": (0,), "scatter_indices_batching_dims": (0,),
            "scatter_dims_to_operand_dims": (1,), "index_vector_dim": 2}
    names = [[z3.Int(f"c{r}{k}") for k in range(2)] for r in range(3)]
    updates = obj_array(np.arange(6).reshape(3, 2) + 100)
    ids = obj_array(np.array([[[c] for c in row] for row in names], object))
    scattered = scatter(table, ids, updates, dims, kind)
    for values in ([[0, 3], [1, 1], [2, 0]], [[3, 2], [0, 4], [1, 2]]):
        subst = [(names[r][k], z3.IntVal(values[r][k])) for r in range(3) for k in range(2)]
        expect = scatter(table, obj_array(np.array(values).reshape(3, 2, 1)), updates, dims,
                         kind)
        assert (_concretize(scattered, subst) == expect).all()
