"""Instances with blocks in a device-dependent order (`Reordered`, `Returning`: ring
attention's keys and their cotangents) are checked at a reduced shape that keeps the number
of blocks and shrinks each block and every other dim (`reduce._blocks`,
`shapes.reduced_types(blocks=...)`): a slice of one whole block stays one, the pieces of a
partial sum stay one symbolic split. The right claims are proved there and the wrong ones
(another owner's block, a forward hop, a step counted twice) refuted, as at the real shape
(tests/rules/test_returning_lemmas.py)."""

from __future__ import annotations

from dataclasses import replace

from entangle_mlir.analysis.instance.checker import InstanceChecker
from entangle_mlir.core.relations import Rel, Returning, Value
from entangle_mlir.mlir.opinfo import OpInfo, TensorType
from entangle_mlir.rules.base import RuleContext
from tests.rules.test_reordered_lemmas import CP, arg, info, run
from tests.rules.test_returning_lemmas import FORWARD, REVERSE, _Value, partial_keys

ROWS, WIDTH = 4, 6
"""Each of the 4 devices' block of keys, and their width: both shrink to 2."""


def _check(op_info: OpInfo, ins: list[Value], outs: list[Value]) -> tuple[str, str]:
    """(status, mode) with every instance reduced where it can be."""
    checker = InstanceChecker(timeout_ms=20_000, reduce_above=1)
    result = checker.check(op_info, ins, outs, CP, RuleContext(mesh=CP, manual_axes=CP.names))
    return result.status, result.details.get("mode", "")


def _slice(y: Value, j: int) -> OpInfo:
    return info("stablehlo.slice", [y], (ROWS, WIDTH), {
        "start_indices": (ROWS * j, 0), "limit_indices": (ROWS * j + ROWS, WIDTH),
        "strides": (1, 1)})


def _local(op: str, ins: list[Value], attrs: dict) -> OpInfo:
    block = TensorType((ROWS, WIDTH), "f32")
    return OpInfo(op, attrs, [block] * len(ins), [block])


def _permute(x: Value, pairs) -> OpInfo:
    return _local("stablehlo.collective_permute", [x],
                  {"source_target_pairs": pairs, "channel_handle": 1})


def _step(y: Value, j: int) -> Value:
    (out,) = run(_slice(y, j), [y])
    return out


def test_a_slice_of_one_block_is_checked_reduced() -> None:
    y = partial_keys(arg((4 * ROWS, WIDTH)), _Value())
    out = _step(y, 2)
    assert isinstance(out, Returning)
    assert _check(_slice(y, 2), [y], [out]) == ("proved", "reduced")
    wrong = replace(out, blocks=tuple((d + 3) % 4 for d in range(4)))
    assert _check(_slice(y, 2), [y], [wrong])[0] == "refuted"


def test_the_ring_back_is_checked_reduced_and_its_wrong_claims_refuted() -> None:
    t = arg((4 * ROWS, WIDTH))
    y = partial_keys(t, _Value())
    last = _step(y, 3)
    (moved,) = run(_permute(last, REVERSE), [last])
    assert _check(_permute(last, REVERSE), [last], [moved]) == ("proved", "reduced")
    assert _check(_permute(last, FORWARD), [last], [moved])[0] == "refuted"
    acc = moved
    for i in (2, 1):
        add = _local("stablehlo.add", [acc, _step(y, i)], {})
        (summed,) = run(add, [acc, _step(y, i)])
        assert _check(add, [acc, _step(y, i)], [summed]) == ("proved", "reduced")
        (acc,) = run(_permute(summed, REVERSE), [summed])
    final = _local("stablehlo.add", [acc, _step(y, 0)], {})
    (done,) = run(final, [acc, _step(y, 0)])
    whole = Rel(t, (("cp",), ()))
    assert done == whole
    assert _check(final, [acc, _step(y, 0)], [whole]) == ("proved", "reduced")
    twice = _local("stablehlo.add", [acc, _step(y, 1)], {})
    assert _check(twice, [acc, _step(y, 1)], [whole])[0] == "refuted"
