"""A differentiated running max: its cotangent is zero, so the paths to the max's argmax vanish.

An online softmax (ring or flash attention) shifts the scores by a running max
`m_i = max(m_{i-1}, max(s_i))` before exponentiating; the result does not depend on the shift.
When the model does not stop the max's gradient, jax's backward still computes the max's
cotangent (a sum of terms from every use of `m_i`) and sends it to the scores' argmax through
the transposes of `maximum` (tie shares `select(x == m, 1, 0) / select(y == m, 2, 1)`) and of
`reduce_max` (the argmax indicator over the count of ties). In real arithmetic that cotangent
is exactly zero: the terms cancel once the forward's recurrence is expanded
(`o_i = o_{i-1} c_i + p_i v_i`, `l_i = l_{i-1} c_i + sum(p_i)`; FAILURES.md section 7).

`zero_max_cotangents` finds those products, proves the cotangent zero by
`polynomial.is_zero` (pure algebra, every atom finite) and replaces them by zeros, which then
fold forward (`x * 0`, `0 / n`, moves and sums of zero, `y + 0`). The backward is then the one
of the max with its gradient stopped, which the online softmax rewrites take. Exact: a value
is replaced only by a proven-equal one; a floating-point run gives the max's cotangent as a
rounding residue (1e-7 in float32), which the verifier, like the reference's
`jax.nn.softmax`, does not model.

In floating point the cancellation needs the atoms finite (`polynomial.is_zero` asks
`finite.nonfinite_kinds`: inf - inf is NaN, not 0; a product of two unbounded values is
not, unless under `--assume-no-overflow`), and the zeros fold through a product only where
its other operands are finite (`_fold_zeros`: 0 * inf is NaN). Known gap: the cotangent's
own sums and products of finite atoms (cotangents times accumulators) are not checked for
overflow; where one overflows, the program's cotangent is inf or NaN, not a residue."""

from __future__ import annotations

import numpy as np
from jaxlib.mlir import ir
from jaxlib.mlir.dialects import stablehlo

from entangle_mlir.mlir.opinfo import compare_type, constant_value, reducer_kind
from entangle_mlir.normalize import polynomial
from entangle_mlir.normalize.finite import Kinds, judge, judging, nonfinite_kinds, overflow_words
from entangle_mlir.normalize.match import (
    MOVES_AND_TRANSPOSES,
    defining_op,
    editing,
    i64s,
    replace_uses,
    root_of,
    sum_reduce,
)


def _splat(value) -> float | None:
    root, _ = root_of(value)
    op = defining_op(root)
    if op is None or op.name != "stablehlo.constant":
        return None
    array, splat = constant_value(op.attributes["value"])
    return float(np.asarray(array).reshape(-1)[0]) if splat else None


def _shifts_exp(value) -> bool:
    """`value` (through moves) is subtracted inside an exponential: a softmax's shift. Only
    such maxes are tried (a relu's max has a cotangent that is not zero)."""
    pending, seen = [value], set()
    while pending:
        top = pending.pop()
        for use in top.uses:
            user = use.owner
            user = user.operation if hasattr(user, "operation") else user
            if user.name in MOVES_AND_TRANSPOSES and user.results[0] not in seen:
                seen.add(user.results[0])
                pending.append(user.results[0])
            elif user.name == "stablehlo.subtract" and any(
                    getattr(u.owner, "name", "") == "stablehlo.exponential"
                    for u in user.results[0].uses):
                return True
    return False


def _reads_max(compare) -> bool:
    """`compare` reads a max (elementwise or reduced) that shifts a softmax."""
    op = defining_op(compare)
    if op is None or op.name != "stablehlo.compare":
        return False
    for operand in op.operands:
        root, _ = root_of(operand)
        producer = defining_op(root)
        if producer is not None and (producer.name == "stablehlo.maximum" or (
                producer.name == "stablehlo.reduce" and reducer_kind(producer) == "max")) \
                and _shifts_exp(root):
            return True
    return False


def _constant_select(value, nonzero: bool) -> bool:
    op = defining_op(value)
    if op is None or op.name != "stablehlo.select" or not _reads_max(op.operands[0]):
        return False
    branches = [_splat(v) for v in op.operands[1:]]
    return all(b is not None and np.isfinite(b) and (b != 0 or not nonzero) for b in branches)


def _tie_share(value) -> bool:
    """`select(x == m, a, b) / select(y == m, c, d)` (constants, the divisor's nonzero), m a
    max: jax's split of a max's cotangent between tied operands."""
    op = defining_op(value)
    return (op is not None and op.name == "stablehlo.divide"
            and _constant_select(op.operands[0], False)
            and _constant_select(op.operands[1], True))


def _tie_count(value) -> bool:
    """`sum(convert(x == broadcast(max(x))))` over the max's dims: at least one, the max
    being one of the elements."""
    op = defining_op(value)
    if not sum_reduce(op):
        return False
    convert = defining_op(op.operands[0])
    if convert is None or convert.name != "stablehlo.convert":
        return False
    compare = defining_op(convert.operands[0])
    if compare is None or compare.name != "stablehlo.compare" or "EQ" not in str(
            compare.attributes["comparison_direction"]) or compare_type(compare) == "TOTALORDER":
        return False
    x, spread = compare.operands
    root, _ = root_of(spread)
    reduce = defining_op(root)
    return (reduce is not None and reduce.name == "stablehlo.reduce"
            and reducer_kind(reduce) == "max" and reduce.operands[0] == x and _shifts_exp(root)
            and i64s(reduce, "dimensions") == i64s(op, "dimensions"))


def _candidate(op: ir.Operation):
    """The max's cotangent this op sends to an argmax, or None."""
    if op.name == "stablehlo.multiply":
        for s, c in ((0, 1), (1, 0)):
            if _tie_share(op.operands[s]):
                return op.operands[c]
    if op.name == "stablehlo.divide" and _tie_count(op.operands[1]):
        return op.operands[0]
    return None


def _zero_like(value, at: ir.Operation):
    tensor = ir.RankedTensorType(value.type)
    with ir.InsertionPoint(at), at.location:
        attr = ir.DenseElementsAttr.get_splat(tensor, ir.FloatAttr.get(tensor.element_type, 0.0))
        return stablehlo.ConstantOp(attr).result


_ZERO_KEEPING = ("stablehlo.broadcast_in_dim", "stablehlo.reshape", "stablehlo.transpose",
                 "stablehlo.negate", "stablehlo.convert", "stablehlo.divide")


def _fold_zeros(zeros: list, kinds: dict) -> None:
    """Fold zeros into their users: ops that give zero for a zero operand (a product or
    contraction with finite operands, a sum, a move, a division of it) become zeros, `y + 0`
    and `y - 0` become y (their uses move; nothing is erased). `kinds`: `nonfinite_kinds`'s
    memo."""
    pending = list(zeros)
    while pending:
        zero = pending.pop()
        for use in list(zero.uses):
            user = use.owner
            user = user.operation if hasattr(user, "operation") else user
            if user.name.startswith(("func.", "sdy.")) or len(user.results) != 1 or not isinstance(
                    ir.RankedTensorType(user.results[0].type).element_type, ir.FloatType):
                continue
            other = [v for i, v in enumerate(user.operands) if i != use.operand_number]
            name = user.name
            if (name in _ZERO_KEEPING and use.operand_number == 0) or (
                    name in ("stablehlo.multiply", "stablehlo.dot_general")
                    and judge(lambda memo, other=other: all(
                        nonfinite_kinds(v, memo) == 0 for v in other), user,
                        memo=kinds)) or (
                    sum_reduce(user) and use.operand_number == 0):
                new = _zero_like(user.results[0], user)
                pending.append(new)
            elif name == "stablehlo.add" or (name == "stablehlo.subtract"
                                             and use.operand_number == 1):
                new = other[0]
            else:
                continue
            replace_uses(user.results[0], new)


_PURE_PREFIX = "stablehlo."
_EFFECTS = frozenset({"stablehlo.custom_call", "stablehlo.while", "stablehlo.if",
                      "stablehlo.case", "stablehlo.outfeed", "stablehlo.send", "stablehlo.recv",
                      "stablehlo.return"})


def _sweep(module: ir.Module) -> None:
    """Erase the stablehlo ops left without uses in the function and shard_map bodies (last
    first, so a chain goes in one pass; a reduce goes with its body)."""
    bodies = []

    def collect(op):
        if op.name in ("func.func", "sdy.manual_computation"):
            bodies.extend(block for region in op.regions for block in region.blocks)
        return ir.WalkResult.ADVANCE

    module.operation.walk(collect)
    for block in bodies:
        for op in reversed(list(block.operations)):
            op = op.operation if hasattr(op, "operation") else op
            if (op.name.startswith(_PURE_PREFIX) and op.name not in _EFFECTS
                    and not any(True for r in op.results for _ in r.uses)):
                op.erase()


def _cotangent_refusal(op: ir.Operation) -> str:
    return ("the running max's cotangent is zero only where the values it is computed from "
            f"are finite ({overflow_words(op.results[0])}): not exact there; pass "
            "--assume-no-overflow to assume no intermediate overflow")


def zero_max_cotangents(module: ir.Module, ops: list | None = None) -> int:
    """Replace every product sending a running max's cotangent to its argmax by zero when that
    cotangent is zero in real arithmetic; the number replaced. In program order: a later
    step's cotangent reads the earlier ones' products, zero by then. (Ops are only replaced
    during the scan, so the list stays valid; the dead ones go at the end.) `ops`: the
    module's ops as `ir.ops_in_order` lists them now."""
    names = ("stablehlo.multiply", "stablehlo.divide")
    if ops is None:
        found: list[ir.Operation] = []

        def collect(op):
            if op.name in names:
                found.append(op)
            return ir.WalkResult.ADVANCE

        module.operation.walk(collect)
    else:
        found = [op for name, op in ops if name in names]
    count = 0
    with judging() as finiteness, ir.Location.unknown(), editing() as edits:
        kinds = Kinds(finiteness.assume_no_overflow)
        keys = polynomial.Keys()
        for op in found:
            if not any(True for _ in op.results[0].uses):
                continue
            finiteness.attempt()
            cotangent = _candidate(op)
            if cotangent is None or not polynomial.is_zero(
                    cotangent, lambda atoms, op=op: judge(lambda memo: all(
                        nonfinite_kinds(v, memo) == 0 for v in atoms), op,
                        _cotangent_refusal(op), kinds), keys):
                continue
            zero = _zero_like(op.results[0], op)
            replace_uses(op.results[0], zero)
            _fold_zeros([zero], kinds)
            changed = list(edits.changed.values())
            finiteness.fired(changed)
            keys.forget_downstream(changed)
            edits.clear()
            count += 1
        if count:
            _sweep(module)
            finiteness.forget()
    return count
