"""Exact rewrites of numerical idioms that spell a computation another way.

Run by entangle-normalize on both programs, in place (`REWRITES`, applied by
`rewrites.rewrite_idioms`); each one is an identity of real arithmetic (the verifier's
semantics), so it is sound on any program, and it puts both programs in the same form:

* gathered sum: `reduce_add(all_gather(y, dim g), dims D)`, `y` of size 1 along g in D, is
  `reduce_add(all_reduce_add(y), D)` (psum spelled as an all_gather on a new axis and a sum);
* rescaled exp-sum: `reduce_add(exp(x - broadcast(m)), D) * exp(m)` is `reduce_add(exp(x), D)`
  for any `m` constant along D, also one that differs between devices (each shard stabilising
  its log-sum-exp with its own max);
* shifted log-sum-exp: `log(reduce_add(exp(x - broadcast(m)), D)) + m` is
  `log(reduce_add(exp(x), D))`, with an all_reduce sum between the reduce and the log when `m`
  is itself the result of an all_reduce over the same devices (the same on all of them: the
  pmax of vocab-parallel cross-entropy).

  These two hold in floating point only where `x` is bounded (`_unshifted_exact`): the
  shift keeps `exp` finite for large `x`, so a program without it overflows where one with
  it does not, and the rewrite is refused unless neither form can overflow. (Programs that
  keep the same shift on both sides need no rewrite: their terms meet as they are.)

* nested selects with one fill: `select(p, select(q, a, z), z)` is `select(and(p, q), a,
  z)` and `select(p, z, select(q, z, a))` is `select(or(p, q), z, a)` (nested `jnp.where`s
  masking a vocab-parallel lookup, `where(local >= 0, where(local < n, rows, 0), 0)`): exact
  for any values, since both pick `z` wherever either test does.

* a gather of a shifted tensor: `gather(x - broadcast(m), i)` is `gather(x, i) - broadcast'(m)`
  when the broadcast is constant along the indexed dims (the target logit of a max-shifted
  cross-entropy, `take_along_axis(logits - m, labels)`): a gather only copies elements, so it
  commutes with the elementwise subtraction, and the broadcast's gathered elements are m's.

* a product by a converted mask: `x * convert(m)` (m boolean, 0 or 1 after the convert) is
  `select(m, x, 0)` for integer x and for float x that holds no infinity or NaN (the
  vocab-parallel embedding masked as `rows * mask[:, None].astype(rows.dtype)`); the two
  differ at most in the sign of a zero, which the verifier's exact semantics does not hold.

* guards that hold on every value they see: `select(is_finite(m), m, c)` is `m` and
  `abs(v)` is `v` where the ranges (`bounds.py`) show m finite and v nonnegative (the max
  guard and the `log(abs(.))` of `jax.nn.logsumexp`).

* a shard's softmax accumulator moved to a common shift (flash-decoding's combine over a KV
  cache split between devices): `F(exp(y - m)) * exp(m - M)`, m the row max of y (F a sum or
  a contraction over one dim of y), is `F(exp(y - M))`, whatever M is (the pmax of every
  shard's m): then the shards' psums add up terms of one shift, as the softmax's.

* online softmax (flash and ring attention): a running max `max(m, reduce_max(s_i))` and
  accumulators rescaled by `exp(m_old - m_new)` as blocks of scores s_i arrive are the max,
  the exp-sum and the weighted sum over the blocks' concatenation (`concatenate(s_0, ...)`,
  values likewise), and the final division by the accumulated denominator is the softmax's
  (moved into the probabilities); the concatenations then move down through the ops that
  computed each block alike, to the blocks of keys, values and positions themselves.

"`broadcast(m)`" and "`m`" are recognised by the element each reads off a common root value
(through broadcast_in_dim and reshape): every element of the subtracted tensor must read the
same element of the root as the element it is reduced into.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
from jaxlib.mlir import ir
from jaxlib.mlir.dialects import stablehlo

from entangle_mlir.core.traits import ELEMENTWISE_OPS
from entangle_mlir.mlir.opinfo import compare_type, describe, reducer_kind
from entangle_mlir.normalize.bounds import (
    computed_alike,
    group_size,
    interval,
    log_largest,
    log_tiny,
)
from entangle_mlir.normalize.finite import (
    NAN,
    NEG,
    POS,
    finite_shift,
    judge,
    nonfinite_kinds,
    overflow_words,
    rows_finite,
)
from entangle_mlir.normalize.match import (
    MOVES_AND_TRANSPOSES,
    attr_names,
    defining_op,
    dot_operand_dims,
    erase_and_prune,
    finite_test,
    i64s,
    index_map,
    max_reduce,
    replace_uses,
    root_of,
    same_along,
    same_attribute,
    same_but,
    same_value,
    set_attribute,
    set_operand,
    shape_of,
    splat_of,
    sum_reduce,
)
from entangle_mlir.semantics.groups import has_channel
from entangle_mlir.semantics.ops import dimension_numbers


def drop_identity_converts(module: ir.Module, ops: list | None = None) -> int:
    """Replace every `stablehlo.convert` to its operand's own type by the operand (jax inserts
    them for weakly typed loop carries; they would hide an accumulator from the folds below).
    Exact. The number dropped. `ops`: the module's ops as `ir.ops_in_order` lists them now."""
    found: list[ir.Operation] = []

    def collect(op):
        if op.name == "stablehlo.convert" and op.operands[0].type == op.results[0].type:
            found.append(op)
        return ir.WalkResult.ADVANCE

    if ops is None:
        module.operation.walk(collect)
    else:
        for name, op in ops:
            if name == "stablehlo.convert":
                collect(op)
    for op in found:
        op.results[0].replace_all_uses_with(op.operands[0])
    for op in found:
        op.erase()
    return len(found)


REWRITES = {
    "stablehlo.reduce": lambda op: _gathered_sum(op) or _gathered_argmax(op),
    "stablehlo.multiply": lambda op: (_rescaled_exp_sum(op) or _masked_product(op)
                                      or _shift_moved(op)),
    "stablehlo.add": lambda op: _shifted_lse(op) or _online_sum(op),
    "stablehlo.maximum": lambda op: _online_max(op),
    "stablehlo.concatenate": lambda op: _sink_concat(op),
    "stablehlo.divide": lambda op: _normalized_after(op) or _division_under_sum(op),
    "stablehlo.select": lambda op: (_nested_select(op) or _finite_guard(op)
                                    or _decided_select(op)),
    "stablehlo.abs": lambda op: _nonnegative_abs(op),
    "stablehlo.gather": lambda op: _gather_of_shift(op),
}
"""The forward's rewrites by op name (`rewrites.rewrite_idioms` applies them)."""


def _nested_select(outer: ir.Operation) -> int:
    """`select(p, select(q, a, z), z)` is `select(and(p, q), a, z)`, and `select(p, z,
    select(q, z, a))` is `select(or(p, q), z, a)` (module docstring): the predicates of the
    same shape, the fills the same value (`same_value`). The inner select is left to its
    other uses."""
    pred, on_true, on_false = outer.operands
    for inner_at, fill, logic in ((1, on_false, stablehlo.AndOp), (2, on_true, stablehlo.OrOp)):
        inner = defining_op(outer.operands[inner_at])
        if inner is None or inner.name != "stablehlo.select":
            continue
        inner_pred, inner_true, inner_false = inner.operands
        inner_fill, kept = (inner_false, inner_true) if inner_at == 1 else (inner_true,
                                                                            inner_false)
        if pred.type != inner_pred.type or not same_value(inner_fill, fill):
            continue
        with ir.InsertionPoint(outer), outer.location:
            joined = logic(pred, inner_pred).result
            args = (joined, kept, fill) if inner_at == 1 else (joined, fill, kept)
            new = stablehlo.SelectOp(*args).result
        replace_uses(outer.results[0], new)
        erase_and_prune(outer)
        return 1
    return 0


def _finite_guard(select: ir.Operation) -> int:
    """`select(is_finite(m), m, c)` is `m` where m holds no infinity (jax's logsumexp
    guards its max so; the max of finite inputs is finite): the guard of `jax.nn.logsumexp`
    dropped, to meet a shift written without it. Judged like every finiteness check
    (`finite.judge`): the max of a product of inputs may overflow, and then only under
    `--assume-no-overflow`, which the report lists (strict: a guard refusal, which the
    driver reports only where the assumption proves the pair)."""
    pred, value, _ = select.operands
    if not finite_test(pred, value) or value.type != select.results[0].type:
        return 0
    if not judge(lambda memo: not nonfinite_kinds(value, memo) & (NEG | POS), select,
                 _guard_refusal(value), guard=True):
        return 0
    replace_uses(select.results[0], value)
    erase_and_prune(select)
    return 1


def _guard_refusal(value) -> str:
    """Why a pair that differs only in jax's `is_finite` guard of a max is not proven."""
    return ("a max guarded by `select(is_finite(m), m, 0)` (jax.nn.logsumexp) is met by a "
            "shift by the unguarded max only where the max is finite, and it may overflow "
            f"({overflow_words(value)}): where it does, the two shifted values differ "
            "(x - inf is -inf or NaN, x - 0 is not); the programs are equal assuming no "
            "intermediate overflow (--assume-no-overflow)")


_DECIDED: dict[str, Callable[[tuple[float, float], tuple[float, float]], bool | None]] = {
    "GE": lambda a, b: True if a[0] >= b[1] else False if a[1] < b[0] else None,
    "GT": lambda a, b: True if a[0] > b[1] else False if a[1] <= b[0] else None,
    "LE": lambda a, b: True if a[1] <= b[0] else False if a[0] > b[1] else None,
    "LT": lambda a, b: True if a[1] < b[0] else False if a[0] >= b[1] else None,
    "EQ": lambda a, b: False if a[1] < b[0] or b[1] < a[0] else None,
    "NE": lambda a, b: True if a[1] < b[0] or b[1] < a[0] else None,
}
"""A float compare's outcome for every pair of values within the operands' ranges (None:
not decided by them), by comparison direction."""


def _decided_select(select: ir.Operation) -> int:
    """`select(compare(a, b), x, y)` is x (or y) where the ranges of a and b decide the
    compare for every value they may hold (`bounds.interval`: the `sum(exp(...)) >= 0` of
    the jvp of `abs` in `jax.nn.logsumexp`'s gradient) and neither may be NaN (a NaN
    compares false in every direction but NE; judged by `finite.judge`, so under
    `--assume-no-overflow` where only an overflow could make one). FLOAT compares only
    (TOTALORDER orders -0 before +0)."""
    compare = defining_op(select.operands[0])
    if compare is None or compare.name != "stablehlo.compare" or compare_type(compare) != \
            "FLOAT" or select.operands[1].type != select.results[0].type:
        return 0
    direction = describe(compare).attrs["comparison_direction"]
    a, b = compare.operands
    outcome = _DECIDED[direction](interval(a), interval(b)) if direction in _DECIDED else None
    if outcome is None or not judge(lambda memo: not (nonfinite_kinds(a, memo)
                                                      | nonfinite_kinds(b, memo)) & NAN,
                                    select):
        return 0
    replace_uses(select.results[0], select.operands[1 if outcome else 2])
    erase_and_prune(select)
    return 1


def _nonnegative_abs(op: ir.Operation) -> int:
    """`abs(v)` is `v` where v's range holds no negative value (`bounds.interval`: the
    `log(abs(sum(exp(...))))` of `jax.nn.logsumexp`)."""
    value = op.operands[0]
    if value.type != op.results[0].type or not interval(value)[0] >= 0:
        return 0
    replace_uses(op.results[0], value)
    erase_and_prune(op)
    return 1


def _gather_of_shift(gather: ir.Operation) -> int:
    """`gather(x -+ broadcast(m), i)` is `gather(x, i) -+ broadcast'(m)` (module docstring):
    `broadcast(m)` (through a chain of broadcast_in_dims) varies only along operand batching
    dims and window dims the gather takes whole, so each gathered element of it is the m at
    the result's matching position; m's dims of size 1 are reshaped away first."""
    arith = defining_op(gather.operands[0])
    if arith is None or arith.name not in ("stablehlo.subtract", "stablehlo.add"):
        return 0
    info = describe(gather)
    dims = dimension_numbers(info.attrs, "dimension_numbers")
    sizes = tuple(info.attrs.get("slice_sizes", ()))
    result_shape = shape_of(gather.results[0])
    for side in ((1,) if arith.name == "stablehlo.subtract" else (1, 0)):
        found = _row_constant(arith.operands[side], dims, sizes, shape_of(gather.operands[1]),
                              result_shape)
        if found is None:
            continue
        core, out_dims = found
        result_type = gather.results[0].type
        with ir.InsertionPoint(gather), gather.location:
            if any(n == 1 for n in shape_of(core)):
                kept = tuple(n for n in shape_of(core) if n != 1)
                element = ir.RankedTensorType(core.type).element_type
                core = stablehlo.ReshapeOp(ir.RankedTensorType.get(kept, element),
                                           core).result
            shift = stablehlo.BroadcastInDimOp(result_type, core, out_dims).result
            picked = gather.clone(ir.InsertionPoint(gather))
            set_operand(picked, 0, arith.operands[1 - side])
            op = stablehlo.SubtractOp if arith.name == "stablehlo.subtract" else \
                stablehlo.AddOp
            new = op(picked.results[0], shift).result
        replace_uses(gather.results[0], new)
        erase_and_prune(gather)
        return 1
    return 0


def _row_constant(value, dims: dict, sizes: tuple, indices_shape: tuple, result_shape: tuple):
    """(m, result dims of m's dims of size > 1) when `value` is m broadcast (through
    broadcast_in_dims) so that it varies only along operand dims the gather reads at a
    position the result names: a batching dim (the paired indices batch dim's result dim)
    or a window dim it takes whole (its offset dim); else None."""
    to_operand = None
    core = value
    while (op := defining_op(core)) is not None and op.name == "stablehlo.broadcast_in_dim":
        step = i64s(op, "broadcast_dimensions")
        to_operand = step if to_operand is None else [to_operand[d] for d in step]
        core = op.operands[0]
    if to_operand is None:
        return None
    operand_shape = shape_of(value)
    ivd = dims.get("index_vector_dim", 0)
    offset_dims = list(dims.get("offset_dims", ()))
    result_batch = [d for d in range(len(result_shape)) if d not in offset_dims]
    indices_batch = [d for d in range(len(indices_shape)) if d != ivd]
    operand_batching = list(dims.get("operand_batching_dims", ()))
    indices_batching = list(dims.get("start_indices_batching_dims", ()))
    window = [d for d in range(len(operand_shape)) if d not in dims.get("collapsed_slice_dims", ())
              and d not in operand_batching]
    out_dims = []
    for axis, size in enumerate(shape_of(core)):
        if size == 1:
            continue
        d = to_operand[axis]
        if d in operand_batching:
            paired = indices_batching[operand_batching.index(d)]
            out = result_batch[indices_batch.index(paired)]
        elif d in window and d not in dims.get("start_index_map", ()) and \
                sizes[d] == operand_shape[d]:
            out = offset_dims[window.index(d)]
        else:
            return None
        if result_shape[out] != size:
            return None
        out_dims.append(out)
    if out_dims != sorted(out_dims):
        return None
    return core, out_dims


def _copy_attr(src: ir.Operation, dst: ir.Operation, name: str) -> None:
    if name in src.attributes:
        set_attribute(dst, name, src.attributes[name])


def _gathered_sum(reduce: ir.Operation) -> int:
    if len(reduce.operands) != 2:
        return 0
    gather = defining_op(reduce.operands[0])  # the cheap test first: most reduces sum no all_gather
    if gather is None or gather.name != "stablehlo.all_gather" or len(gather.operands) != 1:
        return 0
    if not sum_reduce(reduce):
        return 0
    g = gather.attributes["all_gather_dim"].value
    y = gather.operands[0]
    if shape_of(y)[g] != 1 or g not in i64s(reduce, "dimensions"):
        return 0
    element = ir.RankedTensorType(y.type).element_type
    with ir.InsertionPoint(reduce), reduce.location:
        summed = stablehlo.AllReduceOp([y.type], [y], gather.attributes["replica_groups"])
        for name in ("channel_handle", "use_global_device_ids"):
            _copy_attr(gather, summed.operation, name)
        scalar = ir.RankedTensorType.get([], element)
        body = summed.regions[0].blocks.append(scalar, scalar)
        with ir.InsertionPoint(body):
            stablehlo.ReturnOp([stablehlo.AddOp(*body.arguments).result])
        squeezed = [n for d, n in enumerate(shape_of(y)) if d != g]
        flat = stablehlo.ReshapeOp(ir.RankedTensorType.get(squeezed, element),
                                   summed.results[0]).result
    dims = [d - (d > g) for d in i64s(reduce, "dimensions") if d != g]
    if dims:
        set_operand(reduce, 0, flat)
        set_attribute(reduce, "dimensions", ir.DenseI64ArrayAttr.get(dims))
        erase_and_prune(gather)
    else:
        replace_uses(reduce.results[0], flat)
        erase_and_prune(reduce)
    return 1


def _gathered_argmax(reduce: ir.Operation) -> int:
    """argmax (argmin) of the devices' argmax answers, gathered (XLA's partitioning of
    `jnp.argmax` over a split dim): `R2(all_gather(v1), all_gather(i1))` over the gathered unit
    dim, where (v1, i1) = `R1(X, I)` with the same comparator and init, is `R1` over the
    gathered `X` and `I`: each device's answer is the pair largest in (value, -index) among its
    candidates and the init, so the answer over the answers is the one over every device's
    candidates (the comparator only selects: exact on numbers, in any order). The gathered
    indices are the global ones exactly when each device's `I` numbered its block globally."""
    if len(reduce.operands) != 4 or len(reduce.results) != 2:
        return 0
    gathers = [defining_op(v) for v in reduce.operands[:2]]
    if any(g is None or g.name != "stablehlo.all_gather" or len(g.operands) != 1
           for g in gathers):
        return 0
    g_v, g_i = gathers
    g = g_v.attributes["all_gather_dim"].value
    if g_i.attributes["all_gather_dim"].value != g or i64s(reduce, "dimensions") != [g] or any(
            str(g_v.attributes.get(name)) != str(g_i.attributes.get(name))
            for name in ("replica_groups", "use_global_device_ids")) or any(
            ("channel_handle" in x.attributes) != ("channel_handle" in g_v.attributes)
            for x in gathers):
        return 0
    pieces = [defining_op(x.operands[0]) for x in gathers]
    if any(p is None or not _adds_unit_dim(p, g) for p in pieces):
        return 0
    first = defining_op(pieces[0].operands[0])
    if first is None or first.name != "stablehlo.reduce" or len(first.operands) != 4 or [
            defining_op(p.operands[0]) for p in pieces] != [first, first] or [
            p.operands[0] for p in pieces] != list(first.results):
        return 0
    for piece, result in zip(pieces, first.results):
        unit = list(shape_of(piece.results[0]))
        if len(unit) <= g or unit[g] != 1 or unit[:g] + unit[g + 1:] != list(shape_of(result)):
            return 0
    kind = reducer_kind(reduce)
    if kind not in ("argmax", "argmin") or reducer_kind(first) != kind or not all(
            _same_constant(a, b) for a, b in zip(reduce.operands[2:], first.operands[2:])):
        return 0
    d = i64s(first, "dimensions")[0]
    with ir.InsertionPoint(reduce), reduce.location:
        whole = []
        for x in first.operands[:2]:
            shape = list(shape_of(x))
            shape[d] *= shape_of(g_v.results[0])[g]
            element = ir.RankedTensorType(x.type).element_type
            gathered = stablehlo.AllGatherOp([ir.RankedTensorType.get(shape, element)], [x],
                                             ir.IntegerAttr.get(ir.IntegerType.get_signless(64),
                                                                d),
                                             g_v.attributes["replica_groups"])
            for name in ("channel_handle", "use_global_device_ids"):
                _copy_attr(g_v, gathered.operation, name)
            whole.append(gathered.results[0])
    for k, value in enumerate(whole):
        set_operand(reduce, k, value)
    set_attribute(reduce, "dimensions", first.attributes["dimensions"])
    for x in gathers:
        erase_and_prune(x)
    return 1


def _adds_unit_dim(op: ir.Operation, g: int) -> bool:
    """`op` only inserts a dim of size 1 at `g` (a reshape, or jax's `v[:, None]`: a
    broadcast_in_dim onto every other dim, in order)."""
    shape = list(shape_of(op.results[0]))
    if len(shape) <= g or shape[g] != 1:
        return False
    if op.name == "stablehlo.reshape":
        return True
    if op.name != "stablehlo.broadcast_in_dim":
        return False
    return i64s(op, "broadcast_dimensions") == [d for d in range(len(shape)) if d != g]


def _same_constant(a, b) -> bool:
    """Two values are the same constant (a splat init of a reduce)."""
    x, y = defining_op(a), defining_op(b)
    return (x is not None and y is not None and x.name == y.name == "stablehlo.constant"
            and a.type == b.type and x.attributes["value"] == y.attributes["value"])


def _shifted_exp_sum(value):
    """(reduce, x, root of m, root's index map in the reduced shape's terms) when `value` is
    `reduce_add(exp(x - broadcast(m)), D)`; else None. The subtracted tensor's index map is
    checked against `m_value` by the caller."""
    reduce = defining_op(value)
    if reduce is None or reduce.name != "stablehlo.reduce" or len(reduce.operands) != 2:
        return None
    exp = defining_op(reduce.operands[0])
    if exp is None or exp.name != "stablehlo.exponential":
        return None
    sub = defining_op(exp.operands[0])
    if sub is None or sub.name != "stablehlo.subtract":
        return None
    if not sum_reduce(reduce):  # its reducer and init last: they cost the most to read
        return None
    return reduce, exp, sub


def _shift_matches(sub: ir.Operation, reduce: ir.Operation, m_value) -> bool:
    """The tensor `sub` subtracts is `m_value` broadcast along the reduced dims."""
    root, chain = root_of(sub.operands[1])
    m_root, m_chain = root_of(m_value)
    if root != m_root:
        return False
    sub_index = index_map(root, chain, i64s(reduce, "dimensions"))
    m_index = index_map(root, m_chain)
    if sub_index is None or m_index is None:
        return False
    return same_along(sub_index, i64s(reduce, "dimensions"), m_index)


def _unshifted_exact(reduce: ir.Operation, sub: ir.Operation, devices: int, scale) -> bool:
    """The unshifted `sum(exp(x))` equals the shifted form `sum(exp(x - m))` (times
    `exp(m)`, or with `m` added to its log) in the dtype too, from the ranges of x, x - m
    and m alone (`bounds.py`), whatever computes m:

    * no sum of exponentials overflows: `x` and `x - m` stay below log(largest / count);
    * no term of either sum underflows: `x` and `x - m` stay above log(smallest normal), so
      neither sum vanishes (`log(0) + m` is -inf or NaN where the reference's is finite:
      a shift m = |a| * |b| of large inputs, or a bounded m = 110 + tanh(a), flushes every
      term of the shifted sum to zero) nor loses precision to subnormals;
    * `exp(m)`, if the sum is rescaled by it, does not overflow.

    Bounding `x - m` on both sides with `x` bounds `m` on both sides, so `m` is finite and
    `exp(x - m) * exp(m) = exp(x)`, `log(sum(exp(x - m))) + m = log(sum(exp(x)))` hold up
    to rounding. No fact about m's finiteness is taken from `finite.nonfinite_kinds`
    (which reads a sum or product of two unbounded values as finite).

    A max shift exists to keep `exp` finite where `x` is large: rewriting it away is exact
    only where `x` is bounded (inputs are not), so a program that drops the shift is not
    taken for one that keeps it (`log(psum(sum(exp(x))))` overflows at x = 100 in float32
    where the reference's `m + log(sum(exp(x - m)))` does not). `scale`: the `m` of
    `exp(m)` the shifted sum is multiplied by, if any; `devices`: the terms an all_reduce
    adds up."""
    ranges: dict = {}
    x = sub.operands[0]
    count = devices * math.prod(shape_of(x)[d] for d in i64s(reduce, "dimensions"))
    room = log_largest(x) - math.log(max(count, 1))
    tiny = log_tiny(x)
    x_lo, x_hi = interval(x, ranges)
    shifted_lo, shifted_hi = interval(sub.results[0], ranges)
    if not (tiny < x_lo and x_hi < room and tiny < shifted_lo and shifted_hi < room):
        return False
    return scale is None or interval(scale, ranges)[1] < log_largest(x)


def _group(collective: ir.Operation | None) -> int:
    return 1 if collective is None else group_size(collective)


def _unshifted(reduce: ir.Operation, sub: ir.Operation, at: ir.Operation):
    """`reduce_add(exp(x), D)`, built before `at`."""
    with ir.InsertionPoint(at), at.location:
        exp = stablehlo.ExpOp(sub.operands[0]).result
        clone = reduce.clone(ir.InsertionPoint(at))
    set_operand(clone, 0, exp)
    return clone.results[0]


def _rescaled_exp_sum(mul: ir.Operation) -> int:
    """`reduce_add(exp(x - broadcast(m)), D) * exp(m)` is `reduce_add(exp(x), D)` (module
    docstring). Needs m finite (else inf * 0), no exponential of either form overflowing,
    and the shifted terms normal (else the product is 0 where exp(x) is not): all from the
    ranges of x, x - m and m (`_unshifted_exact`); `finite_shift` is implied by them."""
    for s, e in ((0, 1), (1, 0)):
        scale = defining_op(mul.operands[e])
        if scale is None or scale.name != "stablehlo.exponential":
            continue
        found = _shifted_exp_sum(mul.operands[s])
        if found is None:
            continue
        reduce, _, sub = found
        if not _shift_matches(sub, reduce, scale.operands[0]) or not finite_shift(
                scale.operands[0]) or not _unshifted_exact(reduce, sub, 1, scale.operands[0]):
            continue
        new = _unshifted(reduce, sub, mul)
        replace_uses(mul.results[0], new)
        erase_and_prune(mul)
        return 1
    return 0


def _converted_mask(value) -> tuple[object, list[ir.Operation]] | None:
    """(m, views) when `value` is a boolean m converted to a number (0 or 1) and then only
    broadcast or reshaped (`views`, innermost first); None otherwise."""
    views = []
    op = defining_op(value)
    while op is not None and op.name in ("stablehlo.broadcast_in_dim", "stablehlo.reshape"):
        views.append(op)
        op = defining_op(op.operands[0])
    if op is None or op.name != "stablehlo.convert":
        return None
    mask = op.operands[0]
    element = ir.RankedTensorType(mask.type).element_type
    if not isinstance(element, ir.IntegerType) or ir.IntegerType(element).width != 1:
        return None
    return mask, views[::-1]


def _masked_product(mul: ir.Operation) -> int:
    """`x * convert(m)` (m boolean, the converted 0/1 broadcast or reshaped on the way) is
    `select(m', x, 0)`, m' the same broadcasts of m (the vocab-parallel embedding spelled
    `rows * mask[:, None].astype(rows.dtype)`): exact for integers and for finite floats
    (1 * x = x, 0 * x = 0 up to the sign of a zero, which the verifier's exact semantics does
    not tell apart, like the comparisons of floats). A float x that may be infinite or NaN
    (inf * 0 is NaN, where the select gives 0) is left alone."""
    result_type = ir.RankedTensorType(mul.results[0].type)
    element = result_type.element_type
    if not isinstance(element, ir.IntegerType | ir.FloatType):
        return 0
    for m_at, x_at in ((1, 0), (0, 1)):
        found = _converted_mask(mul.operands[m_at])
        if found is None:
            continue
        x = mul.operands[x_at]
        is_int = isinstance(element, ir.IntegerType)
        if not is_int and not judge(lambda memo, x=x: not nonfinite_kinds(x, memo), mul):
            continue
        mask, views = found
        i1 = ir.RankedTensorType(mask.type).element_type
        with ir.InsertionPoint(mul), mul.location:
            pred = mask
            for view in views:
                shape = ir.RankedTensorType.get(shape_of(view.results[0]), i1)
                if view.name == "stablehlo.reshape":
                    pred = stablehlo.ReshapeOp(shape, pred).result
                else:
                    pred = stablehlo.BroadcastInDimOp(shape, pred,
                                                      i64s(view, "broadcast_dimensions")).result
            zero = ir.IntegerAttr.get(element, 0) if is_int else ir.FloatAttr.get(element, 0.0)
            zeros = stablehlo.ConstantOp(ir.DenseElementsAttr.get_splat(result_type, zero)
                                         ).result
            new = stablehlo.SelectOp(pred, x, zeros).result
        mul.results[0].replace_all_uses_with(new)
        erase_and_prune(mul)
        return 1
    return 0


def _shifted_lse(add: ir.Operation) -> int:
    """`log(reduce_add(exp(x - broadcast(m)), D)) + m` is `log(reduce_add(exp(x), D))`
    (module docstring). Needs m finite (else -inf + inf), no sum of exponentials
    overflowing, and the shifted terms normal (a large m flushes them all to 0 and gives
    log(0) + m = -inf): all from the ranges of x and x - m (`_unshifted_exact`), whatever
    computes m (a product of two inputs overflows to +inf, and `finite_shift`, implied by
    those ranges, reads it as finite)."""
    for s, m in ((0, 1), (1, 0)):
        log = defining_op(add.operands[s])
        if log is None or log.name != "stablehlo.log":
            continue
        summed = log.operands[0]
        collective = defining_op(summed)
        if collective is not None and collective.name == "stablehlo.all_reduce":
            if len(collective.operands) != 1 or reducer_kind(collective) != "add":
                continue
            summed = collective.operands[0]
        else:
            collective = None
        found = _shifted_exp_sum(summed)
        if found is None:
            continue
        reduce, _, sub = found
        if not _shift_matches(sub, reduce, add.operands[m]) or not finite_shift(
                add.operands[m]):
            continue
        if collective is not None and not _same_on_group(add.operands[m], collective):
            continue
        if not _unshifted_exact(reduce, sub, _group(collective), None):
            continue
        new = _unshifted(reduce, sub, add)
        if collective is not None:
            gathered = collective.clone(ir.InsertionPoint(add))
            set_operand(gathered, 0, new)
            new = gathered.results[0]
        with ir.InsertionPoint(add), add.location:
            new = stablehlo.LogOp(new).result
        replace_uses(add.results[0], new)
        erase_and_prune(add)
        return 1
    return 0


def _same_on_group(m_value, collective: ir.Operation) -> bool:
    """`m` is read off the result of an all_reduce over the same replica groups as
    `collective`: every device that `collective` sums over holds the same `m`."""
    root, _ = root_of(m_value)
    producer = defining_op(root)
    if producer is None or producer.name != "stablehlo.all_reduce":
        return False
    return all(_attr_text(producer, name) == _attr_text(collective, name)
               for name in ("replica_groups", "use_global_device_ids")) and has_channel(
        {"channel_handle": _attr_text(producer, "channel_handle")}) == has_channel(
        {"channel_handle": _attr_text(collective, "channel_handle")})


def _attr_text(op: ir.Operation, name: str) -> str | None:
    return str(op.attributes[name]) if name in op.attributes else None


# ---------------------------------------------------------------------------------------------
# Online softmax (flash / ring attention): a running max, and accumulators rescaled by
# exp(m_old - m_new) each time a block of scores arrives, are the softmax's pieces over the
# blocks' concatenation.
# ---------------------------------------------------------------------------------------------

_VIEWS = ("stablehlo.transpose", "stablehlo.reshape")
"""Ops an accumulator may go through after its reduction (jax's einsum output transpose)."""


def concat_blocks(values: list, dim: int, at: ir.Operation):
    """`concatenate(values, dim)` built before `at`, flattening operands that are themselves
    concatenations along `dim` (blocks arrive one step at a time), marked with `BLOCKS_ATTR`
    so that it sinks (`_sink_concat`)."""
    flat = []
    for value in values:
        op = defining_op(value)
        if op is not None and op.name == "stablehlo.concatenate" and (
                ir.IntegerAttr(op.attributes["dimension"]).value == dim):
            flat += list(op.operands)
        else:
            flat.append(value)
    with ir.InsertionPoint(at), at.location:
        joined = stablehlo.ConcatenateOp(flat, dim)
    set_attribute(joined.operation, BLOCKS_ATTR, ir.UnitAttr.get())
    return joined.result


def _online_max(maximum: ir.Operation) -> int:
    """`max(m, reduce_max(s, d))` with `m = reduce_max(x, d)` (or `max(-inf, reduce_max(x,
    d))`, the first step) is `reduce_max(concatenate(x, s, d), d)`: max is associative and
    idempotent, so the init values may repeat."""
    for p, c in ((0, 1), (1, 0)):
        cur = defining_op(maximum.operands[c])
        dims = max_reduce(cur)
        if dims is None or len(dims) != 1:
            continue
        prev = _running_max(maximum.operands[p])
        if prev is None or max_reduce(prev) != dims or not _same_init(prev, cur):
            continue
        x, s = prev.operands[0], cur.operands[0]
        if not same_but(shape_of(x), shape_of(s), dims[0]):
            continue
        joined = concat_blocks([x, s], dims[0], maximum)
        clone = cur.clone(ir.InsertionPoint(maximum))
        set_operand(clone, 0, joined)
        replace_uses(maximum.results[0], clone.results[0])
        erase_and_prune(maximum)
        return 1
    return 0


def _running_max(value) -> ir.Operation | None:
    """The max reduction `value` is, also through `max(-inf, .)` (a running max's first
    step); None otherwise."""
    op = defining_op(value)
    if op is not None and op.name == "stablehlo.maximum":
        for p, c in ((0, 1), (1, 0)):
            if splat_of(op.operands[p], -math.inf) and max_reduce(
                    defining_op(op.operands[c])) is not None:
                return defining_op(op.operands[c])
        return None
    return op if max_reduce(op) is not None else None


def _same_init(a: ir.Operation, b: ir.Operation) -> bool:
    first, second = defining_op(a.operands[1]), defining_op(b.operands[1])
    return (first is not None and second is not None and first.name == second.name
            == "stablehlo.constant" and same_attribute(first.attributes["value"],
                                                       second.attributes["value"]))


class Accumulated:
    """A value `views(F(exp(y - broadcast(m))))` where F sums over one dim `d` of `y`: a
    `reduce_add` over d, or a dot_general contracting d with a value `v` (along `dv`). `index`
    gives, for every element of the value, the flat index of the element of `m` its terms are
    shifted by (the same for all of them: m is constant along d)."""

    def __init__(self, value) -> None:
        self.ok = False
        self.views: list[ir.Operation] = []
        op = defining_op(value)
        while op is not None and op.name in _VIEWS:
            self.views.append(op)
            op = defining_op(op.operands[0])
        self.core = op
        if op is None:
            return
        if sum_reduce(op):
            dims = i64s(op, "dimensions")
            if len(dims) != 1:
                return
            self.side, self.d, self.v, self.dv = 0, dims[0], None, None
        elif op.name == "stablehlo.dot_general" and len(op.operands) == 2:
            numbers = stablehlo.DotDimensionNumbers(op.attributes["dot_dimension_numbers"])
            batch = (list(numbers.lhs_batching_dimensions), list(numbers.rhs_batching_dimensions))
            contract = (list(numbers.lhs_contracting_dimensions),
                        list(numbers.rhs_contracting_dimensions))
            sides = [s for s in (0, 1) if is_exp_of_sub(op.operands[s])]
            if len(sides) != 1 or len(contract[0]) != 1:
                return
            self.side = sides[0]
            self.d, self.dv = contract[self.side][0], contract[1 - self.side][0]
            self.v = op.operands[1 - self.side]
            self.batch = batch
        else:
            return
        exp = defining_op(op.operands[self.side])
        if not is_exp_of_sub(op.operands[self.side]):
            return
        self.exp = exp
        self.sub = defining_op(exp.operands[0])
        self.y = self.sub.operands[0]
        self.m, chain = root_of(self.sub.operands[1])
        sub_index = index_map(self.m, chain)
        if sub_index is None:
            return
        first = np.take(sub_index, [0], axis=self.d)
        if not (sub_index == first).all():
            return
        self.sub_index = sub_index
        index = np.take(sub_index, 0, axis=self.d)
        if op.name == "stablehlo.dot_general":
            index = self._dot_index(index, op)
        for view in reversed(self.views):
            if view.name == "stablehlo.transpose":
                index = index.transpose(i64s(view, "permutation"))
            else:
                index = index.reshape(shape_of(view.results[0]))
        self.index = index
        self.ok = True

    def _dot_index(self, index: np.ndarray, op: ir.Operation) -> np.ndarray:
        """The shift's index map (over the exp operand's dims but d) laid out as the dot's
        result: batch dims, then the lhs's free dims, then the rhs's."""
        rank = len(shape_of(op.operands[self.side]))
        kept = [k for k in range(rank) if k != self.d]
        batch = self.batch[self.side]
        free = [k for k in kept if k not in batch]
        index = index.transpose([kept.index(k) for k in batch + free])
        other_rank = len(shape_of(self.v))
        other_free = other_rank - len(self.batch[1 - self.side]) - 1
        shape = list(index.shape)
        at = len(batch) + (0 if self.side == 1 else len(free))
        index = index.reshape(shape[:at] + [1] * other_free + shape[at:])
        return np.broadcast_to(index, shape_of(op.results[0]))

    def like(self, other: Accumulated) -> bool:
        """The same reduction and views, over blocks that differ only along d (and dv)."""
        if self.core.name != other.core.name or self.side != other.side or self.d != other.d:
            return False
        names = attr_names(self.core)
        if names != attr_names(other.core) or any(
                not same_attribute(self.core.attributes[n], other.core.attributes[n])
                for n in names):
            return False
        if len(self.views) != len(other.views) or any(
                a.name != b.name or a.results[0].type != b.results[0].type
                or (a.name == "stablehlo.transpose"
                    and i64s(a, "permutation") != i64s(b, "permutation"))
                for a, b in zip(self.views, other.views)):
            return False
        if self.core.results[0].type != other.core.results[0].type:
            return False
        if not same_but(shape_of(self.y), shape_of(other.y), self.d):
            return False
        return self.v is None or same_but(shape_of(self.v), shape_of(other.v), self.dv)


def is_exp_of_sub(value) -> bool:
    """`value` is `exp(a - b)` (the shifted exponential an online softmax accumulates)."""
    exp = defining_op(value)
    if exp is None or exp.name != "stablehlo.exponential":
        return False
    sub = defining_op(exp.operands[0])
    return sub is not None and sub.name == "stablehlo.subtract"


def _online_sum(add: ir.Operation) -> int:
    """One step of an online softmax's accumulation, `acc * exp(m_old - m) + F(exp(s - m))`
    with `acc = F(exp(x - m_old))` (F a sum over d, possibly against values v), is
    `F(exp(concatenate(x, s) - m))` (over concatenate(v_x, v_s)); with `acc` = 0 (the first
    step) it is `F(exp(s - m))`. Exact in real arithmetic for any m_old and m (rescaling by
    exp(m_old - m) moves the shift of every term from m_old to m), provided every element is
    rescaled by the difference of the very shifts its terms carry: the index maps must say so.

    In floating point, `F(exp(x - m_old)) * exp(m_old - m)` is `F(exp(x - m))` (up to
    rounding; F is linear, and products may be regrouped) only where no factor over- or
    underflows alone. Two facts make it so:

    * m_old is the row max of x itself (`_row_max_of`): every `exp(x - m_old)` is in [0, 1]
      and each row holds a term 1, so `exp(m_old - m)` is the largest of the rewritten terms
      `exp(x - m)`: where it underflows to 0 they all do, where it overflows (a shift m far
      below m_old, which no running max is) the rewritten sum is inf too. A shift other than
      the max is not taken: `exp(x - (max(x) - 100))` overflows where `exp(x - max(x))` does
      not, and the rewrite would erase that.
    * m_old > -inf: a row of the earlier blocks that is -inf throughout (a causal mask hiding
      a whole row of the first block) has m_old = -inf, exp(-inf - -inf) = NaN, and the
      program computes NaN there, where the softmax over the concatenation is finite. So
      every row of the earlier blocks must hold an element above -inf on every device
      (`rows_finite`), also where the scores overflow: scores `q @ k.T` of unbounded
      inputs may be -inf throughout a row, so the fold of any ring attention over such
      scores is refused (the last check, recorded as the reason the program is not
      proven: `running_max_refusal`) unless under `--assume-no-overflow`
      (tests/normalize/test_exact_ring_overflow.py: the corpus's ring attention outputs NaN
      there where the reference is finite).

    The unnormalised accumulators `F(exp(s - m))` against values v may overflow where the
    softmax's normalised sum does not (values near the dtype's largest): that is the
    regrouping of a product over a sum every proof assumes (`online_backward.py`'s module
    docstring), not checked here.

    A ring whose running max is guarded (clamped to the dtype's lowest finite value, so a
    row of -inf scores gives zeros, not NaN) is not taken: the fold would need the guard
    recognised in the running max and a score of +inf (which makes both forms NaN only
    when the new shift is the running max over the old one) handled; a new rewrite."""
    for a, c in ((0, 1), (1, 0)):
        mul = defining_op(add.operands[a])
        if mul is None or mul.name != "stablehlo.multiply":
            continue
        cur = Accumulated(add.operands[c])
        if not cur.ok:
            continue
        for x, r in ((0, 1), (1, 0)):
            if _accumulate(add, mul.operands[x], mul.operands[r], add.operands[c], cur):
                return 1
    return 0


def _accumulate(add: ir.Operation, acc_value, rescale, cur_value, cur: Accumulated) -> int:
    root, chain = root_of(rescale, MOVES_AND_TRANSPOSES)
    exp = defining_op(root)
    if exp is None or not is_exp_of_sub(root):
        return 0
    sub = defining_op(exp.operands[0])
    old, new = sub.operands
    if new != cur.m or shape_of(root) != shape_of(cur.m):
        return 0
    index = index_map(root, chain)
    if index is None or index.shape != cur.index.shape or not (index == cur.index).all():
        return 0
    if splat_of(acc_value, 0.0):
        replace_uses(add.results[0], cur_value)
        erase_and_prune(add)
        return 1
    prev = Accumulated(acc_value)
    if not prev.ok or prev.m != old or not prev.like(cur) or not (
            prev.index == cur.index).all():
        return 0
    if not _row_max_of(prev):
        return 0
    kept = [k for k in range(len(shape_of(cur.y))) if k != cur.d]
    if len(shape_of(cur.m)) != len(kept):
        return 0
    plain = np.broadcast_to(
        np.arange(math.prod(shape_of(cur.m))).reshape(shape_of(cur.m)).reshape(
            [n if k != cur.d else 1 for k, n in enumerate(shape_of(cur.y))]), shape_of(cur.y))
    if not (plain == cur.sub_index).all():
        return 0
    running = defining_op(prev.m)
    if not rows_finite(prev.y, prev.d, add if running is None else running,
                       running_max_refusal(prev.y)):
        return 0
    joined = concat_blocks([prev.y, cur.y], cur.d, add)
    element = ir.RankedTensorType(cur.y.type).element_type
    with ir.InsertionPoint(add), add.location:
        shift = stablehlo.BroadcastInDimOp(
            ir.RankedTensorType.get(shape_of(joined), element), cur.m, kept).result
        exp_new = stablehlo.ExpOp(stablehlo.SubtractOp(joined, shift).result).result
    core = cur.core.clone(ir.InsertionPoint(add))
    set_operand(core, cur.side, exp_new)
    if cur.v is not None:
        set_operand(core, 1 - cur.side, concat_blocks([prev.v, cur.v], cur.dv, core))
    _replace_through_views(add, core.results[0], cur.views)
    return 1


def _shift_moved(mul: ir.Operation) -> int:
    """`F(exp(y - m)) * views(exp(m - M))` is `F(exp(y - M))` (F a sum over d, possibly
    against values v: an `Accumulated`), M any value of m's shape: the rescale moves the
    shift of every term from m to M. Flash-decoding spells its combine so, each device's
    accumulators over its block of the KV cache rescaled to the pmax of the devices' maxima
    before the psum. The index maps must say that every element is rescaled by the difference
    of the very shift its terms carry.

    Exact in real arithmetic (`exp(a - m) exp(m - M) = exp(a - M)`, F linear). In floating
    point, under the conditions `_online_sum` states for its first step (the same product):
    m is the row max of y itself (`_row_max_of`: every term exp(y - m) is in [0, 1] and
    each row holds a 1, so exp(m - M) is the largest rewritten term, and over- or underflows
    only where they all do) and every row of y holds an element above -inf (`rows_finite`:
    else m = -inf and the program is NaN where the softmax is finite; scores of unbounded
    inputs may overflow to -inf, so this is refused unless under --assume-no-overflow).

    A rescaled accumulator added to the next block's (an online softmax's step) is left to
    `_online_sum`, which folds the step whole."""
    if any(use.owner.name == "stablehlo.add" for use in mul.results[0].uses):
        return 0
    for x, r in ((0, 1), (1, 0)):
        root, chain = root_of(mul.operands[r], MOVES_AND_TRANSPOSES)
        if not is_exp_of_sub(root):
            continue
        old, new = defining_op(defining_op(root).operands[0]).operands
        acc = Accumulated(mul.operands[x])
        if not acc.ok or acc.m != old or shape_of(root) != shape_of(acc.m):
            continue
        index = index_map(root, chain)
        if index is None or index.shape != acc.index.shape or not (index == acc.index).all():
            continue
        kept = [k for k in range(len(shape_of(acc.y))) if k != acc.d]
        if len(shape_of(acc.m)) != len(kept) or not _row_max_of(acc):
            continue
        running = defining_op(acc.m)
        if not rows_finite(acc.y, acc.d, mul if running is None else running,
                           running_max_refusal(acc.y)):
            continue
        element = ir.RankedTensorType(acc.y.type).element_type
        with ir.InsertionPoint(mul), mul.location:
            shift = stablehlo.BroadcastInDimOp(
                ir.RankedTensorType.get(shape_of(acc.y), element), new, kept).result
            exp_new = stablehlo.ExpOp(stablehlo.SubtractOp(acc.y, shift).result).result
        core = acc.core.clone(ir.InsertionPoint(mul))
        set_operand(core, acc.side, exp_new)
        _replace_through_views(mul, core.results[0], acc.views)
        return 1
    return 0


def running_max_refusal(scores) -> str:
    """Why the fold of an online softmax is refused when its scores may overflow (the last
    check `_accumulate` makes, so the fold would fire under `--assume-no-overflow`)."""
    return ("the online softmax's running max may be -inf where a whole block of scores "
            f"overflows ({overflow_words(scores)}): the program is NaN there while the "
            "softmax over all the blocks is finite; pass --assume-no-overflow to assume no "
            "intermediate overflow")


def _row_max_of(acc: Accumulated) -> bool:
    """The shift of `acc`'s terms is the row max of the very scores it shifts:
    `m = reduce_max(y, d)` (init -inf, possibly as a running max's first step
    `max(-inf, .)`), broadcast along d to the rows it was taken over. Then every term
    `exp(y - m)` lies in [0, 1] and each row holds a term exp(0) = 1 (`rows_finite`
    excludes rows of -inf)."""
    reduce = _running_max(acc.m)
    if reduce is None or list(max_reduce(reduce)) != [acc.d] or not splat_of(
            reduce.operands[1], -math.inf) or shape_of(acc.m) != shape_of(reduce.results[0]):
        return False
    if not computed_alike(reduce.operands[0], acc.y):
        return False
    rows = [n if k != acc.d else 1 for k, n in enumerate(shape_of(acc.y))]
    plain = np.broadcast_to(np.arange(math.prod(shape_of(acc.m))).reshape(rows),
                            shape_of(acc.y))
    return bool((plain == acc.sub_index).all())


def _replace_through_views(old: ir.Operation, value, views: list[ir.Operation]) -> None:
    """Replace `old`'s result by `value` carried through copies of `views` (innermost last,
    as an accumulator's einsum transposes/reshapes were applied), then erase what is dead."""
    for view in reversed(views):
        clone = view.clone(ir.InsertionPoint(old))
        set_operand(clone, 0, value)
        value = clone.results[0]
    replace_uses(old.results[0], value)
    erase_and_prune(old)


# ---------------------------------------------------------------------------------------------
# The blocks an online softmax concatenates are computed block by block by the same ops: the
# concatenation moves down through them, to the blocks of keys, values and positions.
# ---------------------------------------------------------------------------------------------

BLOCKS_ATTR = "entangle.blocks"
"""Marks the concatenations the online-softmax rewrite builds (only they are moved down)."""

_SINK_ELEMENTWISE = frozenset(op for op, traits in ELEMENTWISE_OPS.items() if traits.concat)
"""Elementwise ops a concatenation of blocks moves down through (`Traits.concat`)."""


def _integer(value) -> bool:
    return isinstance(ir.RankedTensorType(value.type).element_type, ir.IntegerType) and (
        ir.IntegerType(ir.RankedTensorType(value.type).element_type).width > 1)


def _sink_concat(concat: ir.Operation) -> int:
    """`concatenate(f(x_1, ...), ..., f(x_n, ...), c)` for one op f (same attributes) is
    `f(concatenate(x_1, ..., x_n, c'), ...)` where c' is the operand dim f maps to c; an
    operand that is the same value in every block and a broadcast along c is broadcast to the
    larger shape instead. Exact: f computes each block's rows from the same operands' rows.
    Only through elementwise ops (not integer arithmetic, which stays per block for the device
    tables), broadcast_in_dim, reshape and transpose that keep c, and dot_general along a free
    or batch dim."""
    if BLOCKS_ATTR not in attr_names(concat):
        return 0
    dim = ir.IntegerAttr(concat.attributes["dimension"]).value
    producers = [defining_op(v) for v in concat.operands]
    first = producers[0]
    if first is None or any(p is None or p.name != first.name for p in producers):
        return 0
    names = attr_names(first)
    if any(attr_names(p) != names or any(not same_attribute(p.attributes[n],
                                                            first.attributes[n])
                                         for n in names) for p in producers):
        return 0
    operand_dims = _operand_dims(first, dim)
    if any(_operand_dims(p, dim) != operand_dims for p in producers[1:]):
        return 0
    if operand_dims is None or (first.name in _SINK_ELEMENTWISE and _integer(first.results[0])):
        return 0
    result_type = concat.results[0].type
    joins = [_join([p.operands[j] for p in producers], d, concat)
             for j, d in enumerate(operand_dims)]
    if any(join is None for join in joins):
        return 0
    new_operands = [join() for join in joins]
    with ir.InsertionPoint(concat), concat.location:
        new = ir.Operation.create(first.name, results=[result_type], operands=new_operands,
                                  attributes={n: first.attributes[n] for n in names},
                                  loc=first.location)
    replace_uses(concat.results[0], new.results[0])
    erase_and_prune(concat)
    return 1


def _operand_dims(op: ir.Operation, dim: int) -> list[int | None] | None:
    """For each operand of `op`, the dim that becomes result dim `dim` (None: the operand has
    no such dim, it must be the same in every block); None if `op` mixes rows along `dim`."""
    out = shape_of(op.results[0])
    if op.name in _SINK_ELEMENTWISE:
        return [dim if shape_of(v) == out else None for v in op.operands]
    if op.name == "stablehlo.transpose":
        return [i64s(op, "permutation")[dim]]
    if op.name == "stablehlo.broadcast_in_dim":
        dims = i64s(op, "broadcast_dimensions")
        if dim in dims and shape_of(op.operands[0])[dims.index(dim)] == out[dim]:
            return [dims.index(dim)]
        return [None]
    if op.name == "stablehlo.reshape":
        source = shape_of(op.operands[0])
        before = math.prod(out[:dim])
        for d in range(len(source)):
            if math.prod(source[:d]) == before and source[d] == out[dim]:
                return [d]
        return None
    if op.name == "stablehlo.dot_general":
        return dot_operand_dims(op, dim)
    return None


def _join(values: list, dim: int | None, concat: ir.Operation) -> Callable[[], object] | None:
    """How the blocks' operands join along `dim`, as a function that builds the joined value
    (before `concat`): one value every block shares when `dim` is None (the op does not map
    it to the concatenated dim); else the value re-broadcast to the larger shape when every
    block shares one broadcast along `dim`, or their concatenation. None if they do not join.
    (`_sink_concat` builds only once every operand joins: an attempt that does not fire
    leaves the module as it was, which the rewrite driver relies on.)"""
    shared = all(same_value(v, values[0]) for v in values)
    if dim is None:
        return (lambda: values[0]) if shared else None
    if shared:
        broadcast = _broadcast_along(values[0], dim, concat)
        if broadcast is not None:
            return broadcast
    return lambda: concat_blocks(values, dim, concat)


def _broadcast_along(value, dim: int, concat: ir.Operation) -> Callable[[], object] | None:
    """A function building `value` (a broadcast that is constant along `dim`) re-broadcast to
    the size the concatenation gives `dim`; None for anything else."""
    op = defining_op(value)
    total = shape_of(concat.results[0])[ir.IntegerAttr(concat.attributes["dimension"]).value]
    if op is None or op.name != "stablehlo.broadcast_in_dim":
        return None
    dims = i64s(op, "broadcast_dimensions")
    if dim in dims and shape_of(op.operands[0])[dims.index(dim)] != 1:
        return None
    shape = list(shape_of(value))
    shape[dim] = total
    element = ir.RankedTensorType(value.type).element_type

    def build():
        with ir.InsertionPoint(concat), concat.location:
            return stablehlo.BroadcastInDimOp(ir.RankedTensorType.get(shape, element),
                                              op.operands[0], dims).result

    return build


def _normalized_after(divide: ir.Operation) -> int:
    """`views(F(exp(y - m))) / den` with `den = reduce_add(exp(y - m), d)` (F contracting d
    with values v, the accumulated online softmax divided by its accumulated denominator at
    the end) is `views(F(exp(y - m) / den))`, the softmax's probabilities against v, as a
    plain attention computes it. Exact: den is constant along d, the contracted dim. The
    denominator may be summed over devices (`all_reduce` add: flash-decoding's combine,
    after `_division_under_sum`): still constant along d."""
    acc = Accumulated(divide.operands[0])
    if not acc.ok or acc.v is None:
        return 0
    root, chain = root_of(divide.operands[1], MOVES_AND_TRANSPOSES)
    den = Accumulated(_summed_over_devices(root))
    if not den.ok or den.v is not None or den.m != acc.m or den.d != acc.d:
        return 0
    if not same_value(den.y, acc.y, 12) or shape_of(root) != shape_of(acc.m):
        return 0
    identity = np.arange(math.prod(shape_of(root))).reshape(shape_of(root))
    if not (den.index == identity).all():
        return 0
    index = index_map(root, chain)
    if index is None or index.shape != acc.index.shape or not (index == acc.index).all():
        return 0
    kept = [k for k in range(len(shape_of(acc.y))) if k != acc.d]
    plain = np.broadcast_to(identity.reshape(
        [n if k != acc.d else 1 for k, n in enumerate(shape_of(acc.y))]), shape_of(acc.y))
    if len(shape_of(root)) != len(kept) or not (plain == acc.sub_index).all():
        return 0
    exp_value = acc.exp.results[0]
    element = ir.RankedTensorType(exp_value.type).element_type
    with ir.InsertionPoint(divide), divide.location:
        spread = stablehlo.BroadcastInDimOp(
            ir.RankedTensorType.get(shape_of(exp_value), element), root, kept).result
        probs = stablehlo.DivOp(exp_value, spread).result
    core = acc.core.clone(ir.InsertionPoint(divide))
    set_operand(core, acc.side, probs)
    _replace_through_views(divide, core.results[0], acc.views)
    return 1


def _summed_over_devices(value):
    """The operand of `value`'s producer when that is a one-operand all_reduce sum; else
    `value`."""
    op = defining_op(value)
    if op is not None and op.name == "stablehlo.all_reduce" and len(op.operands) == 1 and (
            reducer_kind(op) == "add"):
        return op.operands[0]
    return value


def _division_under_sum(divide: ir.Operation) -> int:
    """`all_reduce_add(x) / d` is `all_reduce_add(x / d)` where d holds the same value on
    every device the all_reduce sums over (`_same_on_group`: read off an all_reduce over the
    same replica groups, as flash-decoding divides its psum'd output by its psum'd
    denominator). Exact in real arithmetic (a sum of quotients by one divisor); in floating
    point the regrouping of a product over a sum every proof assumes, at a division the
    verifier takes where it is defined (d nonzero)."""
    collective = defining_op(divide.operands[0])
    if collective is None or collective.name != "stablehlo.all_reduce" or len(
            collective.operands) != 1 or reducer_kind(collective) != "add":
        return 0
    if len(list(collective.results[0].uses)) != 1:
        return 0
    if not _same_on_group(divide.operands[1], collective):
        return 0
    with ir.InsertionPoint(divide), divide.location:
        local = stablehlo.DivOp(collective.operands[0], divide.operands[1]).result
    summed = collective.clone(ir.InsertionPoint(divide))
    set_operand(summed, 0, local)
    replace_uses(divide.results[0], summed.results[0])
    erase_and_prune(divide)
    return 1
