"""Arithmetic on booleans (i1) as XLA computes it: add is logical or, multiply logical and, a
reduce with an add reducer is `any` (StableHLO's definition, `terms.BOOLEAN_MEANING`).

Hand-written StableHLO (jax never emits add on i1) run by XLA on CPU and by the interpreter over
`OP_SEMANTICS`; the terms the builders make for these ops evaluate to the same booleans, and
the nearest wrong reading, the integer sum of the booleans, differs from XLA.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from entangle_mlir.core import terms as T
from entangle_mlir.semantics.evaluate import evaluate_term
from tests.semantics.test_semantics import check, run_text

BINARY = """
func.func public @main(%arg0: tensor<4xi1>, %arg1: tensor<4xi1>) -> tensor<4xi1> {
  %0 = stablehlo.OP %arg0, %arg1 : tensor<4xi1>
  return %0 : tensor<4xi1>
}"""

REDUCE = """
func.func public @main(%arg0: tensor<4x2xi1>) -> tensor<2xi1> {
  %c = stablehlo.constant dense<false> : tensor<i1>
  %0 = stablehlo.reduce(%arg0 init: %c) applies stablehlo.add across dimensions = [0] : (tensor<4x2xi1>, tensor<i1>) -> tensor<2xi1>
  return %0 : tensor<2xi1>
}"""

def _xla(text: str, *args: np.ndarray) -> np.ndarray:
    """The first result of `text` run by XLA on one CPU device."""
    import jax
    from jax._src import xla_bridge
    from jax._src.lib import xla_client

    backend = xla_bridge.get_backend("cpu")
    device = backend.devices()[0]
    exe = backend.compile_and_load(text, xla_client.DeviceList((device,)),
                                   xla_client.CompileOptions())
    out = exe.execute_sharded([jax.device_put(a, device) for a in args])
    return np.asarray(out.disassemble_into_single_device_arrays()[0][0])


P = np.array([False, False, True, True])
Q = np.array([False, True, False, True])


@pytest.mark.parametrize("op", sorted(T.BOOLEAN_MEANING))
def test_boolean_arithmetic_matches_xla(op: str) -> None:
    """XLA, the op semantics and the term the builders make agree on every pair of booleans;
    the integer reading of the op does not (for add: true + true is true, not 2)."""
    name = op.split(".")[-1]
    text = BINARY.replace("OP", name)
    check(text, P, Q, expect=op)
    (xla,), _, _ = run_text(text, P, Q)
    p, q = T.make_arg(0, (4,), "i1"), T.make_arg(1, (4,), "i1")
    term = T.make_elementwise(op, (p, q), dtype="i1")
    assert term.op == T.BOOLEAN_MEANING[op] and term.dtype == "i1"
    ours = evaluate_term(term, {0: P, 1: Q})
    assert [bool(v) for v in ours] == list(xla)
    numeric = {"add": P.astype(int) + Q, "multiply": P.astype(int) * Q,
               "maximum": np.maximum(P, Q).astype(int), "minimum": np.minimum(P, Q).astype(int)}
    if name == "add":
        assert list(numeric[name]) != list(xla.astype(int))


def test_boolean_reduce_add_is_any() -> None:
    """A reduce of booleans with an add reducer is `any` over the dims in XLA, and a sum term
    of booleans evaluates so (the op itself is read as no known reduction, `opinfo`, so no
    rule relates it)."""
    for bits in itertools.islice(itertools.product([False, True], repeat=8), 0, 256, 37):
        x = np.array(bits).reshape(4, 2)
        xla = _xla(REDUCE, x)
        assert list(xla) == list(x.any(axis=0))
        term = T.make_op("reduce_sum", (T.make_arg(0, (4, 2), "i1"),), ((0,),), (2,), "i1")
        assert [bool(v) for v in evaluate_term(term, {0: x})] == list(xla)


def test_an_i1_sum_term_has_no_numeric_meaning() -> None:
    """No term adds booleans as numbers: a `lin` of dtype i1 is refused by the evaluator."""
    m = T.make_arg(0, (4,), "i1")
    wrong = T.intern("lin", (m,), (0, (2,)), (4,), "i1")
    with pytest.raises(ValueError, match="booleans"):
        evaluate_term(wrong, {0: P})
