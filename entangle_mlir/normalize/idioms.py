"""Exact rewrites of numerical idioms that spell a computation another way.

Run by entangle-normalize on both programs, in place; each one is an identity of real arithmetic
(the verifier's semantics), so it is sound on any program, and it puts both programs in the
same form:

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

import numpy as np
from jaxlib.mlir import ir

from entangle_mlir.core import precision
from entangle_mlir.core.traits import ELEMENTWISE_OPS
from entangle_mlir.mlir.ir import erase_dead
from entangle_mlir.mlir.opinfo import compare_type, constant_value, reducer_kind

_MOVES = ("stablehlo.broadcast_in_dim", "stablehlo.reshape")
_MOVES_AND_TRANSPOSES = (*_MOVES, "stablehlo.transpose")
_MAX_INDEX = 1 << 22
"""Largest tensor whose element-to-root index map is computed (to compare two views)."""


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


def rewrite_idioms(module: ir.Module, ops: list | None = None) -> int:
    """Apply the rewrites in place until none applies; the number applied. (One rewrite per
    walk: a rewrite erases ops that a list collected before it would still hold.) `ops`: the
    module's ops as `ir.ops_in_order` lists them now (stands for the first walk). The online
    softmax's backward rewrites (`online_backward.py`) join in once the forward's are done,
    in a module that passes blocks around a ring (a collective_permute)."""
    from entangle_mlir.normalize.online_backward import REWRITES as backward

    count = 0
    states: set[int] = set()
    with ir.Location.unknown():
        while _rewrite_one(module, _REWRITES, ops):
            ops = None
            count += 1
            if count % _CYCLE_CHECK == 0 and _cycled(module, states):
                return count
        if not _has_ring(module, ops):
            return count
        both = {name: _either(_REWRITES.get(name), backward.get(name))
                for name in {*_REWRITES, *backward}}
        while _rewrite_one(module, both, ops):
            ops = None
            count += 1
            if count % _CYCLE_CHECK == 0 and _cycled(module, states):
                return count
    return count


_CYCLE_CHECK = 25
"""Every this many rewrites the module's shape is compared with the earlier ones'."""


def _cycled(module: ir.Module, states: set[int]) -> bool:
    """The module has a shape it had before (`states`, updated): the rewrites cycle (a factor
    moved back and forth on a program they do not fit), so rewriting stops there. Every
    rewrite is exact, so stopping is sound; two shapes taken for one (the shape leaves out
    attributes) only stop it early."""
    index: dict = {}
    shape = []

    def visit(op):
        refs = []
        for v in op.operands:
            owner = v.owner
            refs.append(index.get(v, ("arg", v.arg_number) if isinstance(owner, ir.Block)
                                  else None))
        for i, r in enumerate(op.results):
            index[r] = (len(shape), i)
        shape.append((op.name, tuple(refs), tuple(str(r.type) for r in op.results)))
        return ir.WalkResult.ADVANCE

    module.operation.walk(visit, ir.WalkOrder.PRE_ORDER)
    state = hash(tuple(shape))
    if state in states:
        return True
    states.add(state)
    return False


def _has_ring(module: ir.Module, ops: list | None) -> bool:
    if ops is not None:
        return any(name == "stablehlo.collective_permute" for name, _ in ops)
    found = []

    def look(op):
        if op.name == "stablehlo.collective_permute":
            found.append(op)
            return ir.WalkResult.INTERRUPT
        return ir.WalkResult.ADVANCE

    module.operation.walk(look)
    return bool(found)


def _either(first, second):
    """Try `first`, then `second` (either may be None)."""
    return lambda op: bool(first and first(op)) or bool(second and second(op))


_REWRITES = {
    "stablehlo.reduce": lambda op: _gathered_sum(op),
    "stablehlo.multiply": lambda op: _rescaled_exp_sum(op),
    "stablehlo.add": lambda op: _shifted_lse(op) or _online_sum(op),
    "stablehlo.maximum": lambda op: _online_max(op),
    "stablehlo.concatenate": lambda op: _sink_concat(op),
    "stablehlo.divide": lambda op: _normalized_after(op),
}


def _rewrite_one(module: ir.Module, rewrites: dict, listed: list | None = None) -> bool:
    ops: list[ir.Operation] = []

    def collect(op):
        if op.name in rewrites:
            ops.append(op)
        return ir.WalkResult.ADVANCE

    if listed is None:
        module.operation.walk(collect)
    else:
        ops = [op for name, op in listed if name in rewrites]
    return any(rewrites[op.name](op) for op in ops)


def _def(value) -> ir.Operation | None:
    owner = value.owner
    if isinstance(owner, ir.Block):
        return None
    return owner.operation if hasattr(owner, "operation") else owner


def _shape(value) -> tuple[int, ...]:
    return tuple(ir.RankedTensorType(value.type).shape)


def _i64s(op, name) -> list[int]:
    return list(ir.DenseI64ArrayAttr(op.attributes[name]))


def _zero_init(op: ir.Operation) -> bool:
    init = _def(op.operands[1])
    if init is None or init.name != "stablehlo.constant":
        return False
    value, _ = constant_value(init.attributes["value"])
    return value.size == 1 and float(value.reshape(-1)[0]) == 0.0


def _sum_reduce(op: ir.Operation | None) -> bool:
    return (op is not None and op.name == "stablehlo.reduce" and len(op.operands) == 2
            and reducer_kind(op) == "add" and _zero_init(op))


def _erase_dead(op: ir.Operation) -> None:
    """Erase `op` and then its operands' producers that it left without uses (memory-safe:
    `ir.erase_dead`)."""
    erase_dead(op, _erasable)


def _erasable(name: str) -> bool:
    return not name.startswith(("func.", "sdy."))


def _copy_attr(src: ir.Operation, dst: ir.Operation, name: str) -> None:
    if name in src.attributes:
        dst.attributes[name] = src.attributes[name]


def _gathered_sum(reduce: ir.Operation) -> int:
    from jaxlib.mlir.dialects import stablehlo

    if len(reduce.operands) != 2:
        return 0
    gather = _def(reduce.operands[0])  # the cheap test first: most reduces sum no all_gather
    if gather is None or gather.name != "stablehlo.all_gather" or len(gather.operands) != 1:
        return 0
    if not _sum_reduce(reduce):
        return 0
    g = gather.attributes["all_gather_dim"].value
    y = gather.operands[0]
    if _shape(y)[g] != 1 or g not in _i64s(reduce, "dimensions"):
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
        squeezed = [n for d, n in enumerate(_shape(y)) if d != g]
        flat = stablehlo.ReshapeOp(ir.RankedTensorType.get(squeezed, element),
                                   summed.results[0]).result
    dims = [d - (d > g) for d in _i64s(reduce, "dimensions") if d != g]
    if dims:
        reduce.operands[0] = flat
        reduce.attributes["dimensions"] = ir.DenseI64ArrayAttr.get(dims)
        _erase_dead(gather)
    else:
        reduce.results[0].replace_all_uses_with(flat)
        _erase_dead(reduce)
    return 1


def _root(value, through: tuple[str, ...] = _MOVES) -> tuple[object, list[ir.Operation]]:
    """The value under a chain of `through` ops (broadcast_in_dim / reshape by default), and the
    chain (outermost first)."""
    chain = []
    op = _def(value)
    while op is not None and op.name in through:
        chain.append(op)
        value = op.operands[0]
        op = _def(value)
    return value, chain


def _index_map(root, chain: list[ir.Operation], created: list[int] = ()) -> np.ndarray | None:
    """For each element of the chain's result, the flat index of the root element it reads.

    Dims in `created` that the outermost broadcast_in_dim creates (from no operand dim or a
    unit one) are computed at size 1: the map does not vary along them, so their slice at 0
    is the map, and a vocab-wide broadcast of a per-token max stays small."""
    shape = _shape(root)
    if math.prod(shape) > _MAX_INDEX:
        return None
    index = np.arange(math.prod(shape)).reshape(shape)
    for op in reversed(chain):
        out = None
        if op is chain[0] and created and op.name == "stablehlo.broadcast_in_dim" and all(
                _created_by(op, d) for d in created):
            out = tuple(1 if d in created else size
                        for d, size in enumerate(_shape(op.results[0])))
        index = _index_map_step(index, op, out)
        if index is None:
            return None
    return index


def _created_by(broadcast: ir.Operation, dim: int) -> bool:
    """Result dim `dim` of a broadcast_in_dim reads no operand dim, or a unit one."""
    dims = _i64s(broadcast, "broadcast_dimensions")
    return dim not in dims or _shape(broadcast.operands[0])[dims.index(dim)] == 1


def _same_along(sub_index: np.ndarray, dims: list[int], kept_index: np.ndarray) -> bool:
    """Every element of `sub_index` reads the root element that `kept_index` (the reduced
    shape) reads at the position it is reduced into."""
    kept = [d for d in range(sub_index.ndim) if d not in dims]
    first = sub_index[tuple(slice(None) if d in kept else slice(0, 1)
                            for d in range(sub_index.ndim))]
    if not (sub_index == first).all():
        return False
    return first.reshape([sub_index.shape[d] for d in kept]).shape == kept_index.shape and (
        first.reshape(kept_index.shape) == kept_index).all()


def _shifted_exp_sum(value):
    """(reduce, x, root of m, root's index map in the reduced shape's terms) when `value` is
    `reduce_add(exp(x - broadcast(m)), D)`; else None. The subtracted tensor's index map is
    checked against `m_value` by the caller."""
    reduce = _def(value)
    if reduce is None or reduce.name != "stablehlo.reduce" or len(reduce.operands) != 2:
        return None
    exp = _def(reduce.operands[0])
    if exp is None or exp.name != "stablehlo.exponential":
        return None
    sub = _def(exp.operands[0])
    if sub is None or sub.name != "stablehlo.subtract":
        return None
    if not _sum_reduce(reduce):  # its reducer and init last: they cost the most to read
        return None
    return reduce, exp, sub


def _shift_matches(sub: ir.Operation, reduce: ir.Operation, m_value) -> bool:
    """The tensor `sub` subtracts is `m_value` broadcast along the reduced dims."""
    root, chain = _root(sub.operands[1])
    m_root, m_chain = _root(m_value)
    if root != m_root:
        return False
    sub_index = _index_map(root, chain, _i64s(reduce, "dimensions"))
    m_index = _index_map(root, m_chain)
    if sub_index is None or m_index is None:
        return False
    return _same_along(sub_index, _i64s(reduce, "dimensions"), m_index)


def _finite_shift(m_value) -> bool:
    """The shift `m` holds no infinity, so exp(x - m) is defined and the rewrite is exact in
    floating point too. (A shard's own max over a row its mask hides throughout is -inf:
    exp(-inf - -inf) = NaN, which the unshifted form would turn into 0.) NaN is not
    tracked: the NaNs programs hold are jnp.take's fill for out-of-range indices, which the
    verifier assumes do not occur, and a NaN reaches both forms alike."""
    return not _kinds(m_value, {}) & (_NEG | _POS)


def _unshifted_exact(reduce: ir.Operation, sub: ir.Operation, devices: int, scale) -> bool:
    """The unshifted `sum(exp(x))` equals the shifted form in the dtype too: no exponential
    on either side overflows, and the largest term does not underflow (`bounds.py`). A
    max shift exists to keep `exp` finite where `x` is large: rewriting it away is exact
    only where `x` is bounded (inputs are not), so a program that drops the shift is not
    taken for one that keeps it (`log(psum(sum(exp(x))))` overflows at x = 100 in float32
    where the reference's `m + log(sum(exp(x - m)))` does not). `scale`: the `m` of
    `exp(m)` the shifted sum is multiplied by, if any; `devices`: the terms an all_reduce
    adds up."""
    from entangle_mlir.normalize.bounds import interval, log_largest, log_tiny

    ranges: dict = {}
    x = sub.operands[0]
    count = devices * math.prod(_shape(x)[d] for d in _i64s(reduce, "dimensions"))
    room = log_largest(x) - math.log(max(count, 1))
    x_lo, x_hi = interval(x, ranges)
    _, shifted_hi = interval(sub.results[0], ranges)
    if not (x_hi < room and shifted_hi < room and x_lo > log_tiny(x)):
        return False
    return scale is None or interval(scale, ranges)[1] < log_largest(x)


def _group(collective: ir.Operation | None) -> int:
    from entangle_mlir.normalize.bounds import _group_size

    return 1 if collective is None else _group_size(collective)


def _unshifted(reduce: ir.Operation, sub: ir.Operation, at: ir.Operation):
    """`reduce_add(exp(x), D)`, built before `at`."""
    from jaxlib.mlir.dialects import stablehlo

    with ir.InsertionPoint(at), at.location:
        exp = stablehlo.ExpOp(sub.operands[0]).result
        clone = reduce.clone(ir.InsertionPoint(at))
    clone.operands[0] = exp
    return clone.results[0]


def _rescaled_exp_sum(mul: ir.Operation) -> int:
    for s, e in ((0, 1), (1, 0)):
        scale = _def(mul.operands[e])
        if scale is None or scale.name != "stablehlo.exponential":
            continue
        found = _shifted_exp_sum(mul.operands[s])
        if found is None:
            continue
        reduce, _, sub = found
        if not _shift_matches(sub, reduce, scale.operands[0]) or not _finite_shift(
                scale.operands[0]) or not _unshifted_exact(reduce, sub, 1, scale.operands[0]):
            continue
        new = _unshifted(reduce, sub, mul)
        mul.results[0].replace_all_uses_with(new)
        _erase_dead(mul)
        return 1
    return 0


def _shifted_lse(add: ir.Operation) -> int:
    for s, m in ((0, 1), (1, 0)):
        log = _def(add.operands[s])
        if log is None or log.name != "stablehlo.log":
            continue
        summed = log.operands[0]
        collective = _def(summed)
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
        if not _shift_matches(sub, reduce, add.operands[m]) or not _finite_shift(
                add.operands[m]):
            continue
        if collective is not None and not _same_on_group(add.operands[m], collective):
            continue
        if not _unshifted_exact(reduce, sub, _group(collective), None):
            continue
        from jaxlib.mlir.dialects import stablehlo

        new = _unshifted(reduce, sub, add)
        if collective is not None:
            gathered = collective.clone(ir.InsertionPoint(add))
            gathered.operands[0] = new
            new = gathered.results[0]
        with ir.InsertionPoint(add), add.location:
            new = stablehlo.LogOp(new).result
        add.results[0].replace_all_uses_with(new)
        _erase_dead(add)
        return 1
    return 0


def _same_on_group(m_value, collective: ir.Operation) -> bool:
    """`m` is read off the result of an all_reduce over the same replica groups as
    `collective`: every device that `collective` sums over holds the same `m`."""
    root, _ = _root(m_value)
    producer = _def(root)
    if producer is None or producer.name != "stablehlo.all_reduce":
        return False
    from entangle_mlir.semantics.groups import has_channel

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


def _splat_of(value, wanted: float) -> bool:
    """`value` is the constant `wanted` everywhere (a constant, or a broadcast of one)."""
    op = _def(value)
    while op is not None and (op.name in _MOVES or op.name == "stablehlo.convert" and (
            ir.RankedTensorType(op.operands[0].type).element_type
            == ir.RankedTensorType(op.results[0].type).element_type)):
        op = _def(op.operands[0])
    if op is None or op.name != "stablehlo.constant":
        return False
    array, _ = constant_value(op.attributes["value"])
    try:
        return bool(np.all(array.astype(float) == wanted))
    except (TypeError, ValueError):
        return False


def _concat(values: list, dim: int, at: ir.Operation):
    """`concatenate(values, dim)` built before `at`, flattening operands that are themselves
    concatenations along `dim` (blocks arrive one step at a time)."""
    from jaxlib.mlir.dialects import stablehlo

    flat = []
    for value in values:
        op = _def(value)
        if op is not None and op.name == "stablehlo.concatenate" and (
                ir.IntegerAttr(op.attributes["dimension"]).value == dim):
            flat += list(op.operands)
        else:
            flat.append(value)
    with ir.InsertionPoint(at), at.location:
        joined = stablehlo.ConcatenateOp(flat, dim)
    joined.operation.attributes[BLOCKS_ATTR] = ir.UnitAttr.get()
    return joined.result


def _online_max(maximum: ir.Operation) -> int:
    """`max(m, reduce_max(s, d))` with `m = reduce_max(x, d)` (or `max(-inf, reduce_max(x,
    d))`, the first step) is `reduce_max(concatenate(x, s, d), d)`: max is associative and
    idempotent, so the init values may repeat."""
    for p, c in ((0, 1), (1, 0)):
        cur = _def(maximum.operands[c])
        dims = _max_reduce(cur)
        if dims is None or len(dims) != 1:
            continue
        prev = _running_max(maximum.operands[p])
        if prev is None or _max_reduce(prev) != dims or not _same_init(prev, cur):
            continue
        x, s = prev.operands[0], cur.operands[0]
        if not _same_but(_shape(x), _shape(s), dims[0]):
            continue
        joined = _concat([x, s], dims[0], maximum)
        clone = cur.clone(ir.InsertionPoint(maximum))
        clone.operands[0] = joined
        maximum.results[0].replace_all_uses_with(clone.results[0])
        _erase_dead(maximum)
        return 1
    return 0


def _running_max(value) -> ir.Operation | None:
    """The max reduction `value` is, also through `max(-inf, .)` (a running max's first
    step); None otherwise."""
    op = _def(value)
    if op is not None and op.name == "stablehlo.maximum":
        for p, c in ((0, 1), (1, 0)):
            if _splat_of(op.operands[p], -math.inf) and _max_reduce(
                    _def(op.operands[c])) is not None:
                return _def(op.operands[c])
        return None
    return op if _max_reduce(op) is not None else None


def _max_reduce(op: ir.Operation | None) -> list[int] | None:
    """The reduced dims of a single-operand max reduction; None for anything else."""
    if op is None or op.name != "stablehlo.reduce" or len(op.operands) != 2:
        return None
    if reducer_kind(op) != "max":
        return None
    return _i64s(op, "dimensions")


def _same_init(a: ir.Operation, b: ir.Operation) -> bool:
    first, second = _def(a.operands[1]), _def(b.operands[1])
    return (first is not None and second is not None and first.name == second.name
            == "stablehlo.constant" and str(first.attributes["value"])
            == str(second.attributes["value"]))


def _same_but(a: tuple[int, ...], b: tuple[int, ...], dim: int) -> bool:
    return len(a) == len(b) and all(x == y for d, (x, y) in enumerate(zip(a, b)) if d != dim)


class _Accumulated:
    """A value `views(F(exp(y - broadcast(m))))` where F sums over one dim `d` of `y`: a
    `reduce_add` over d, or a dot_general contracting d with a value `v` (along `dv`). `index`
    gives, for every element of the value, the flat index of the element of `m` its terms are
    shifted by (the same for all of them: m is constant along d)."""

    def __init__(self, value) -> None:
        self.ok = False
        self.views: list[ir.Operation] = []
        op = _def(value)
        while op is not None and op.name in _VIEWS:
            self.views.append(op)
            op = _def(op.operands[0])
        self.core = op
        if op is None:
            return
        if _sum_reduce(op):
            dims = _i64s(op, "dimensions")
            if len(dims) != 1:
                return
            self.side, self.d, self.v, self.dv = 0, dims[0], None, None
        elif op.name == "stablehlo.dot_general" and len(op.operands) == 2:
            from jaxlib.mlir.dialects import stablehlo

            numbers = stablehlo.DotDimensionNumbers(op.attributes["dot_dimension_numbers"])
            batch = (list(numbers.lhs_batching_dimensions), list(numbers.rhs_batching_dimensions))
            contract = (list(numbers.lhs_contracting_dimensions),
                        list(numbers.rhs_contracting_dimensions))
            sides = [s for s in (0, 1) if _is_exp_of_sub(op.operands[s])]
            if len(sides) != 1 or len(contract[0]) != 1:
                return
            self.side = sides[0]
            self.d, self.dv = contract[self.side][0], contract[1 - self.side][0]
            self.v = op.operands[1 - self.side]
            self.batch = batch
        else:
            return
        exp = _def(op.operands[self.side])
        if not _is_exp_of_sub(op.operands[self.side]):
            return
        self.exp = exp
        self.sub = _def(exp.operands[0])
        self.y = self.sub.operands[0]
        self.m, chain = _root(self.sub.operands[1])
        sub_index = _index_map(self.m, chain)
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
                index = index.transpose(_i64s(view, "permutation"))
            else:
                index = index.reshape(_shape(view.results[0]))
        self.index = index
        self.ok = True

    def _dot_index(self, index: np.ndarray, op: ir.Operation) -> np.ndarray:
        """The shift's index map (over the exp operand's dims but d) laid out as the dot's
        result: batch dims, then the lhs's free dims, then the rhs's."""
        rank = len(_shape(op.operands[self.side]))
        kept = [k for k in range(rank) if k != self.d]
        batch = self.batch[self.side]
        free = [k for k in kept if k not in batch]
        index = index.transpose([kept.index(k) for k in batch + free])
        other_rank = len(_shape(self.v))
        other_free = other_rank - len(self.batch[1 - self.side]) - 1
        shape = list(index.shape)
        at = len(batch) + (0 if self.side == 1 else len(free))
        index = index.reshape(shape[:at] + [1] * other_free + shape[at:])
        return np.broadcast_to(index, _shape(op.results[0]))

    def like(self, other: _Accumulated) -> bool:
        """The same reduction and views, over blocks that differ only along d (and dv)."""
        if self.core.name != other.core.name or self.side != other.side or self.d != other.d:
            return False
        names = _attr_names(self.core)
        if names != _attr_names(other.core) or any(
                str(self.core.attributes[n]) != str(other.core.attributes[n]) for n in names):
            return False
        if len(self.views) != len(other.views) or any(
                a.name != b.name or a.results[0].type != b.results[0].type
                or (a.name == "stablehlo.transpose"
                    and _i64s(a, "permutation") != _i64s(b, "permutation"))
                for a, b in zip(self.views, other.views)):
            return False
        if self.core.results[0].type != other.core.results[0].type:
            return False
        if not _same_but(_shape(self.y), _shape(other.y), self.d):
            return False
        return self.v is None or _same_but(_shape(self.v), _shape(other.v), self.dv)


def _attr_names(op: ir.Operation) -> set[str]:
    return {a if isinstance(a, str) else a.name for a in op.attributes}


def _is_exp_of_sub(value) -> bool:
    exp = _def(value)
    if exp is None or exp.name != "stablehlo.exponential":
        return False
    sub = _def(exp.operands[0])
    return sub is not None and sub.name == "stablehlo.subtract"


def _online_sum(add: ir.Operation) -> int:
    """One step of an online softmax's accumulation, `acc * exp(m_old - m) + F(exp(s - m))`
    with `acc = F(exp(x - m_old))` (F a sum over d, possibly against values v), is
    `F(exp(concatenate(x, s) - m))` (over concatenate(v_x, v_s)); with `acc` = 0 (the first
    step) it is `F(exp(s - m))`. Exact for any m_old and m (rescaling by exp(m_old - m) moves
    the shift of every term from m_old to m), provided every element is rescaled by the
    difference of the very shifts its terms carry: the index maps must say so.

    In floating point it is exact only where m_old > -inf: a row of the earlier blocks that
    is -inf throughout (a causal mask hiding a whole row of the first block) has
    m_old = -inf, exp(-inf - -inf) = NaN, and the program computes NaN there, where the
    softmax over the concatenation is finite. So every row of the earlier blocks must hold
    an element above -inf on every device (`_rows_finite`)."""
    for a, c in ((0, 1), (1, 0)):
        mul = _def(add.operands[a])
        if mul is None or mul.name != "stablehlo.multiply":
            continue
        cur = _Accumulated(add.operands[c])
        if not cur.ok:
            continue
        for x, r in ((0, 1), (1, 0)):
            if _accumulate(add, mul.operands[x], mul.operands[r], add.operands[c], cur):
                return 1
    return 0


def _accumulate(add: ir.Operation, acc_value, rescale, cur_value, cur: _Accumulated) -> int:
    from jaxlib.mlir.dialects import stablehlo

    root, chain = _root(rescale, _MOVES_AND_TRANSPOSES)
    exp = _def(root)
    if exp is None or not _is_exp_of_sub(root):
        return 0
    sub = _def(exp.operands[0])
    old, new = sub.operands
    if new != cur.m or _shape(root) != _shape(cur.m):
        return 0
    index = _index_map(root, chain)
    if index is None or index.shape != cur.index.shape or not (index == cur.index).all():
        return 0
    if _splat_of(acc_value, 0.0):
        add.results[0].replace_all_uses_with(cur_value)
        _erase_dead(add)
        return 1
    prev = _Accumulated(acc_value)
    if not prev.ok or prev.m != old or not prev.like(cur) or not (
            prev.index == cur.index).all():
        return 0
    if not _rows_finite(prev.y, prev.d):
        return 0
    kept = [k for k in range(len(_shape(cur.y))) if k != cur.d]
    if len(_shape(cur.m)) != len(kept):
        return 0
    plain = np.broadcast_to(
        np.arange(math.prod(_shape(cur.m))).reshape(_shape(cur.m)).reshape(
            [n if k != cur.d else 1 for k, n in enumerate(_shape(cur.y))]), _shape(cur.y))
    if not (plain == cur.sub_index).all():
        return 0
    joined = _concat([prev.y, cur.y], cur.d, add)
    element = ir.RankedTensorType(cur.y.type).element_type
    with ir.InsertionPoint(add), add.location:
        shift = stablehlo.BroadcastInDimOp(
            ir.RankedTensorType.get(_shape(joined), element), cur.m, kept).result
        exp_new = stablehlo.ExpOp(stablehlo.SubtractOp(joined, shift).result).result
    core = cur.core.clone(ir.InsertionPoint(add))
    core.operands[cur.side] = exp_new
    if cur.v is not None:
        core.operands[1 - cur.side] = _concat([prev.v, cur.v], cur.dv, core)
    _replace_through_views(add, core.results[0], cur.views)
    return 1


def _replace_through_views(old: ir.Operation, value, views: list[ir.Operation]) -> None:
    """Replace `old`'s result by `value` carried through copies of `views` (innermost last,
    as an accumulator's einsum transposes/reshapes were applied), then erase what is dead."""
    for view in reversed(views):
        clone = view.clone(ir.InsertionPoint(old))
        clone.operands[0] = value
        value = clone.results[0]
    old.results[0].replace_all_uses_with(value)
    _erase_dead(old)


_NEG, _POS, _NAN = 1, 2, 4
_ANY = _NEG | _POS | _NAN
"""Which non-finite values a float tensor may hold (bits): -inf, +inf, NaN."""

_CARRY = frozenset({
    "stablehlo.broadcast_in_dim", "stablehlo.reshape", "stablehlo.transpose",
    "stablehlo.slice", "stablehlo.dynamic_slice", "stablehlo.concatenate", "stablehlo.pad",
    "stablehlo.reverse", "stablehlo.convert", "stablehlo.collective_permute",
    "stablehlo.all_gather", "stablehlo.all_to_all", "stablehlo.select"})
"""Ops whose result holds only values of their operands (the non-finite ones too)."""


def _kinds(value, memo: dict, overflow: bool = True) -> int:
    """The non-finite values `value` may hold, from the constants and ops that compute it
    (program inputs are finite, a shard_map body's arguments are what it is given; a
    division, rsqrt or power is taken at arguments where it is defined, as in the verifier's
    real-number semantics; log may give -inf). Iterative: the cone of a layer's scores is
    the whole program before it. `overflow`: also the infinities an exp, or arithmetic with
    a constant, of finite values may overflow to (`_overflow`); without it only those the
    program builds (masks, log of zero), for the guards of the online softmax's backward
    (`online_backward.py`, whose telescoped forms are left unchecked for overflow)."""
    for top, op, outer in operands_first(value, memo):
        memo[top] = memo[outer] if outer is not None else _kinds_of(top, op, memo)
        if overflow and op is not None and op.name in _OVERFLOWING and not memo[top] & (
                _NEG | _POS) and (
                op.name in _EXPONENTIALS or op.name in _ELEMENTWISE_ARITHMETIC and any(
                    _constant(v) for v in op.operands[
                        1 if op.name == "stablehlo.divide" else 0:])):
            memo[top] |= _overflow(top, memo)
    return memo[value]


def _may_overflow(op: ir.Operation) -> bool:
    """A convert to a float type whose range is smaller than its source's (f32 -> f16,
    i32 -> f8): a finite value can round to +-inf."""
    source = str(ir.RankedTensorType(op.operands[0].type).element_type)
    target = str(ir.RankedTensorType(op.results[0].type).element_type)
    if not precision.rounds(source, target):
        return False
    if source in precision.INT_BITS:
        width, signed = precision.INT_BITS[source]
        limit = precision.FLOAT_FORMATS.get(target, (0, 0, 0))[2]
        return (width - 1 if signed else width) > limit
    wide, narrow = precision.FLOAT_FORMATS.get(source), precision.FLOAT_FORMATS.get(target)
    return wide is None or narrow is None or wide[2] > narrow[2]


_OVERFLOWING = frozenset({
    "stablehlo.add", "stablehlo.subtract", "stablehlo.multiply", "stablehlo.divide",
    "stablehlo.power", "stablehlo.dot_general", "stablehlo.exponential",
    "stablehlo.exponential_minus_one", "chlo.square", "stablehlo.reduce",
    "stablehlo.all_reduce", "stablehlo.reduce_scatter", "stablehlo.convert"})
"""Ops whose result may overflow although their operands are finite: a sum, product or exp
of finite values is finite only where their ranges say so (`bounds.interval`)."""


_ELEMENTWISE_ARITHMETIC = frozenset(op for op, traits in ELEMENTWISE_OPS.items()
                                    if traits.term is not None and traits.arity == 2)
"""Binary arithmetic: add, subtract, multiply, divide."""
_EXPONENTIALS = frozenset({"stablehlo.exponential", "stablehlo.exponential_minus_one",
                           "stablehlo.power"})


def _constant(value) -> bool:
    """`value` is a constant, possibly broadcast or reshaped."""
    root, _ = _root(value)
    op = _def(root)
    return op is not None and op.name == "stablehlo.constant"


def _positive(value, memo: dict) -> bool:
    """`value` is bounded away from zero from above (`bounds.interval`)."""
    from entangle_mlir.normalize.bounds import interval

    return interval(value, memo.setdefault("bounds", {}))[0] > 0


def _overflow(value, memo: dict) -> int:
    """The infinities `value` may overflow to, from its range in its dtype (`bounds.py`).
    An exponential may overflow wherever its argument is not bounded above; arithmetic with a
    constant (`m * 1e38`) where its operands' ranges are finite and its own is not."""
    from entangle_mlir.normalize.bounds import interval

    element = ir.RankedTensorType(value.type).element_type
    if isinstance(element, ir.IntegerType):
        return 0
    ranges = memo.setdefault("bounds", {})
    lo, hi = interval(value, ranges)
    op = _def(value)
    if op is not None and op.name not in _EXPONENTIALS and not all(
            -math.inf < interval(v, ranges)[0] and interval(v, ranges)[1] < math.inf
            for v in op.operands):
        return 0
    return (_NEG if lo == -math.inf else 0) | (_POS if hi == math.inf else 0)


def operands_first(value, memo: dict):
    """The values of `value`'s cone that `memo` lacks, each after its operands (a shard_map
    body argument's operand is the shard_map's operand it receives), as (value, its defining
    op or None, that outer operand or None). The caller puts each value in `memo` before
    asking for the next. Iterative: the cone of a layer is the whole program before it."""
    stack = [value]
    while stack:
        top = stack[-1]
        if top in memo:
            stack.pop()
            continue
        op = _def(top)
        outer = _outer_operand(top) if op is None else None
        waiting = [v for v in (op.operands if op is not None else [outer] if outer else [])
                   if v not in memo]
        if waiting:
            stack.extend(waiting)
            continue
        stack.pop()
        yield top, op, outer


def _outer_operand(value):
    """The operand of the shard_map (`sdy.manual_computation`) whose body argument `value`
    is (None for any other value)."""
    owner = value.owner
    op = owner.owner if isinstance(owner, ir.Block) else None
    if op is None or op.operation.name != "sdy.manual_computation":
        return None
    return op.operation.operands[value.arg_number]


def _kinds_of(value, op: ir.Operation | None, memo: dict) -> int:
    element = ir.RankedTensorType(value.type).element_type
    if isinstance(element, ir.IntegerType):
        return 0
    if op is None:
        return 0 if _program_input(value) else _ANY
    name = op.name
    args = [memo[v] for v in op.operands]
    if name == "stablehlo.constant":
        array, _ = constant_value(op.attributes["value"])
        try:
            array = array.astype(float)
        except (TypeError, ValueError):
            return _ANY
        return ((_NEG if np.any(array == -np.inf) else 0) | (_POS if np.any(array == np.inf)
                else 0) | (_NAN if np.any(np.isnan(array)) else 0))
    if name == "stablehlo.iota":
        return 0
    if name == "stablehlo.select" and _finite_test(op.operands[0], op.operands[1]):
        return args[2]
    if name == "stablehlo.convert" and _may_overflow(op):
        return _union(args) | _NEG | _POS
    if name in _CARRY:
        return _union(args[1:] if name == "stablehlo.select" else args)
    if name == "chlo.top_k":
        return args[0]
    if name in ("stablehlo.gather", "stablehlo.dynamic_update_slice"):
        return _union([args[0], *args[1:2]] if name == "stablehlo.dynamic_update_slice"
                      else args[:1])
    if name == "stablehlo.scatter" and len(op.operands) == 3 and (
            reducer_kind(op) in ("add", "max", "min") or _replaces(op)):
        both = args[0] | args[2]
        return both | (_NAN if both & _NEG and both & _POS else 0)
    if name == "chlo.square":
        return (args[0] & _NAN) | (_POS if args[0] & (_NEG | _POS) else 0)
    if name == "stablehlo.negate":
        return _negated(args[0])
    if name in ("stablehlo.add", "stablehlo.subtract"):
        a, b = args[0], args[1] if name == "stablehlo.add" else _negated(args[1])
        mixed = (a & _NEG and b & _POS) or (a & _POS and b & _NEG)
        return a | b | (_NAN if mixed else 0)
    if name == "stablehlo.divide" and not args[0] & (_NEG | _POS) and args[1] & (
            _NEG | _POS) == _POS and _positive(op.operands[1], memo):
        return (args[0] | args[1]) & _NAN  # x / +inf = 0: sigmoid as 1 / (1 + exp(-x))
    if name in ("stablehlo.multiply", "stablehlo.divide", "stablehlo.power",
                "stablehlo.dot_general"):
        both = _union(args)
        return _ANY if both & (_NEG | _POS) else both
    if name in ("stablehlo.maximum", "stablehlo.minimum"):
        low, high = (_NEG, _POS) if name == "stablehlo.maximum" else (_POS, _NEG)
        both = _union(args)
        return (both & (high | _NAN)) | (low if all(a & low for a in args) else 0)
    if name in ("stablehlo.exponential", "stablehlo.exponential_minus_one"):
        return args[0] & (_POS | _NAN)
    if name in ("stablehlo.tanh", "stablehlo.logistic"):
        return args[0] & _NAN
    if name in ("stablehlo.sine", "stablehlo.cosine"):
        return _NAN if args[0] else 0
    if name in ("stablehlo.sqrt", "stablehlo.rsqrt"):
        return (args[0] & _NAN) | (_NAN if args[0] & _NEG else 0) | (
            args[0] & _POS if name == "stablehlo.sqrt" else 0)
    if name == "stablehlo.abs":
        return (args[0] & _NAN) | (_POS if args[0] & (_NEG | _POS) else 0)
    if name == "stablehlo.reduce" and len(op.operands) == 2:
        return _reduced_kinds(op, args, memo)
    if name == "stablehlo.reduce_scatter" and len(op.operands) == 1 and reducer_kind(op) in (
            "add", "max", "min"):
        return args[0] | (_NAN if args[0] & _NEG and args[0] & _POS else 0)
    if name == "stablehlo.all_reduce" and len(op.operands) == 1 and reducer_kind(op) in (
            "add", "max", "min"):
        if reducer_kind(op) == "max" and args[0] & _NEG and _gathered_max_finite(op, memo):
            return args[0] & (_POS | _NAN)
        return args[0] | (_NAN if args[0] & _NEG and args[0] & _POS else 0)
    return _ANY


def _replaces(scatter: ir.Operation) -> bool:
    """The scatter's update computation returns the update (a plain write)."""
    return reducer_kind(scatter) == "replace"


def _finite_test(pred, value) -> bool:
    """`pred` is is_finite(value) (broadcast alike): `select(pred, value, c)` is value where
    it is finite and c elsewhere (jax's logsumexp guards its max so)."""
    op = _def(pred)
    return op is not None and op.name == "stablehlo.is_finite" and op.operands[0] == value


def _union(kinds: list[int]) -> int:
    out = 0
    for k in kinds:
        out |= k
    return out


def _negated(kinds: int) -> int:
    return (kinds & _NAN) | (_POS if kinds & _NEG else 0) | (_NEG if kinds & _POS else 0)


def _reduced_kinds(op: ir.Operation, args: list[int], memo: dict) -> int:
    """A sum keeps its terms' non-finite values (and +inf + -inf is NaN); a max over rows
    that each hold an element above -inf is not -inf (`_rows_finite`)."""
    kind = reducer_kind(op)
    values, init = args
    if kind == "add":
        both = values | init
        return both | (_NAN if both & _NEG and both & _POS else 0)
    if kind == "max":
        dims = _i64s(op, "dimensions")
        empty = any(_shape(op.operands[0])[d] == 0 for d in dims)
        witnesses = None if empty or not values & _NEG else _row_witnesses(
            op.operands[0], tuple(dims), memo)
        negative = init & _NEG and (empty or values & _NEG and not (
            witnesses is True or witnesses is not None and all(w.all() for w in witnesses)))
        return ((values | init) & (_POS | _NAN)) | (_NEG if negative else 0)
    return _ANY


def _program_input(value) -> bool:
    """`value` is an argument of a function (an input of the program, finite by assumption),
    not a value a loop carries."""
    owner = value.owner
    op = owner.owner if isinstance(owner, ir.Block) else None
    return op is not None and op.operation.name == "func.func"


def _rows_finite(value, dim: int, memo: dict | None = None) -> bool:
    """Every row of `value` along `dim` holds an element above -inf, on every device, and no
    element is +inf (`_row_witnesses`; NaN is not tracked, see `_finite_shift`)."""
    found = _row_witnesses(value, (dim,), {} if memo is None else memo)
    return found is True or found is not None and all(bool(w.all()) for w in found)


def _row_witnesses(value, dims: tuple[int, ...], memo: dict):
    """Per device, for each row of `value` over `dims` (the reduced shape), whether it holds
    an element above -inf; True when every row on every device does (the value holds no
    -inf); None when unknown or when the value may hold +inf. Known for a
    concatenation along one of `dims` (a row is witnessed by any block) and for
    `select(mask, x, -inf)` with x finite and a mask computed from device ids and constants
    alone (evaluated on every device)."""
    kinds = _kinds(value, memo)
    if kinds & _POS:
        return None
    if not kinds & _NEG:
        return True
    op = _def(value)
    if op is None:
        return None
    if op.name == "stablehlo.concatenate" and ir.IntegerAttr(
            op.attributes["dimension"]).value in dims:
        found = [_row_witnesses(v, dims, memo) for v in op.operands]
        if any(f is True for f in found):
            return True
        known = [f for f in found if f is not None]
        if not known:
            return None
        return [np.logical_or.reduce([f[d] for f in known]) for d in range(len(known[0]))]
    if op.name != "stablehlo.select" or _shape(op.operands[0]) != _shape(value):
        return None
    kept = [taken for taken, branch in ((True, 1), (False, 2))
            if not _kinds(op.operands[branch], memo) & (_NEG | _POS)]
    if not kept:
        return None
    masks = _on_every_device(op.operands[0], op)
    if masks is None:
        return None
    rows: dict[int, np.ndarray] = {}
    for mask in masks:
        if id(mask) not in rows:
            rows[id(mask)] = np.any(mask == kept[0], axis=dims)
    return [rows[id(mask)] for mask in masks]


def _gathered_max_finite(op: ir.Operation, memo: dict) -> bool:
    """`op`, an all_reduce max of `reduce_max(y)`, holds no -inf: every row of y is
    witnessed (`_row_witnesses`) on some device of every replica group."""
    inner = _def(op.operands[0])
    if inner is None or _max_reduce(inner) is None:
        return False
    found = _row_witnesses(inner.operands[0], tuple(_max_reduce(inner)), memo)
    if found is True:
        return True
    if found is None:
        return False
    groups = _device_groups(op, len(found))
    if groups is None:
        return False
    for members in groups:
        if any(d >= len(found) for d in members) or not np.logical_or.reduce(
                [found[d] for d in members]).all():
            return False
    return True


def _device_groups(op: ir.Operation, devices: int) -> list[list[int]] | None:
    """The groups of device ids (partition ids, or replica ids in a program run as replicas)
    a collective combines, as StableHLO defines them (`groups.process_groups`); None when
    the grid is not one of those two."""
    from entangle_mlir.mlir.opinfo import describe
    from entangle_mlir.semantics.groups import GroupError, process_groups

    module = op
    while module is not None and module.name != "builtin.module":
        module = module.parent
        module = module.operation if module is not None else None
    attrs = module.attributes if module is not None else {}
    replicas = ir.IntegerAttr(attrs["mhlo.num_replicas"]).value \
        if "mhlo.num_replicas" in attrs else 1
    if replicas not in (1, devices):
        return None
    try:
        return process_groups(op.name, describe(op).attrs, replicas, devices // replicas)
    except GroupError:
        return None


def _on_every_device(value, at: ir.Operation) -> list[np.ndarray] | None:
    """`value` evaluated on every device (indexed by partition id, or by replica id in a
    program run as replicas), when it is computed from device ids, iotas and constants alone
    by the ops `_evaluate` knows; else None."""
    module = at.operation
    while module is not None and module.name != "builtin.module":
        module = module.parent
        module = module.operation if module is not None else None
    if module is None:
        return None
    attrs = module.attributes
    counts = {name: ir.IntegerAttr(attrs[name]).value if name in attrs else 1
              for name in ("mhlo.num_partitions", "mhlo.num_replicas")}
    if min(counts.values()) > 1:
        return None  # device ids would mix partitions and replicas
    cone = _cone_key(value)
    if cone is None:
        return None
    key = (cone, counts["mhlo.num_partitions"], counts["mhlo.num_replicas"])
    if key not in _DEVICE_VALUES:
        if len(_DEVICE_VALUES) > 4096:
            _DEVICE_VALUES.clear()
        _DEVICE_VALUES[key] = _evaluated_on_devices(value, counts)
    return _DEVICE_VALUES[key]


_DEVICE_VALUES: dict = {}
"""`_on_every_device`'s results by the value's whole cone (`_cone_key`): the online-softmax
rewrites ask for the same masks again after every rewrite."""

_CONE_KEYS: dict = {}
_MAX_CONE = 4096


def _cone_key(value) -> int | None:
    """A number naming the computation of `value` completely (ops, attributes, types, and
    the same for every operand), so equal numbers mean equal values on every device. None
    when the cone reads a block argument or holds more than `_evaluate`'s depth allows in
    values: `_evaluate` gives up on those."""
    if len(_CONE_KEYS) > 1 << 16:
        _CONE_KEYS.clear()
        _DEVICE_VALUES.clear()
    keys: dict = {}
    stack = [value]
    while stack:
        top = stack[-1]
        if top in keys:
            stack.pop()
            continue
        op = _def(top)
        if op is None or len(keys) > _MAX_CONE:
            return None
        waiting = [v for v in op.operands if v not in keys]
        if waiting:
            stack.extend(waiting)
            continue
        stack.pop()
        result = next(i for i, r in enumerate(op.results) if r == top)
        key = (op.name, str(top.type), result, tuple(keys[v] for v in op.operands),
               tuple((n, str(op.attributes[n])) for n in sorted(_attr_names(op))),
               str(op) if op.regions else "")
        keys[top] = _CONE_KEYS.setdefault(key, len(_CONE_KEYS))
    return keys[value]


def _evaluated_on_devices(value, counts: dict) -> list[np.ndarray] | None:
    out = []
    for partition in range(counts["mhlo.num_partitions"]):
        for replica in range(counts["mhlo.num_replicas"]):
            ids = _DeviceIds({"stablehlo.partition_id": partition,
                              "stablehlo.replica_id": replica})
            found = _evaluate(value, ids, {}, 64)
            if found is None:
                return None
            if not ids.read:
                return [found] * (counts["mhlo.num_partitions"] * counts["mhlo.num_replicas"])
            out.append(found)
    return out


class _DeviceIds(dict):
    """The device ids `_evaluate` may read; `read` says whether it did (a value computed
    from constants alone is the same on every device)."""

    read = False

    def __getitem__(self, name: str) -> int:
        self.read = True
        return super().__getitem__(name)


_NUMPY_TYPES = {"i1": np.bool_, "i8": np.int8, "i16": np.int16, "i32": np.int32,
                "i64": np.int64, "ui8": np.uint8, "ui16": np.uint16, "ui32": np.uint32,
                "ui64": np.uint64, "f32": np.float32, "f64": np.float64}
_COMPARE = {"EQ": np.equal, "NE": np.not_equal, "LT": np.less, "LE": np.less_equal,
            "GT": np.greater, "GE": np.greater_equal}
_BINARY = {"stablehlo.add": np.add, "stablehlo.subtract": np.subtract,
           "stablehlo.multiply": np.multiply, "stablehlo.maximum": np.maximum,
           "stablehlo.minimum": np.minimum, "stablehlo.and": np.logical_and,
           "stablehlo.or": np.logical_or}


def _evaluate(value, ids: dict[str, int], memo: dict, depth: int) -> np.ndarray | None:
    """The value of a device-id/constant computation on one device (None if it reads
    anything else or uses an op not modelled here)."""
    found = memo.get(value)
    if found is not None:
        return found
    element = str(ir.RankedTensorType(value.type).element_type)
    dtype = _NUMPY_TYPES.get(element)
    op = _def(value)
    if op is None or dtype is None or depth == 0 or math.prod(_shape(value)) > _MAX_INDEX:
        return None
    args = []
    if op.name not in ("stablehlo.constant", "stablehlo.iota", *ids):
        for operand in op.operands:
            found = _evaluate(operand, ids, memo, depth - 1)
            if found is None:
                return None
            args.append(found)
    shape = _shape(value)
    with np.errstate(all="ignore"):
        result = _apply(op, args, ids, shape, dtype)
    if result is None:
        return None
    result = np.asarray(result).astype(dtype).reshape(shape)
    memo[value] = result
    return result


def _apply(op: ir.Operation, args: list[np.ndarray], ids: dict[str, int],
           shape: tuple[int, ...], dtype) -> np.ndarray | None:
    name = op.name
    if name in ids:
        return np.full(shape, ids[name])
    if name == "stablehlo.constant":
        array, _ = constant_value(op.attributes["value"])
        return np.broadcast_to(array, shape) if array.dtype.kind in "biuf" else None
    if name == "stablehlo.iota":
        dim = ir.IntegerAttr(op.attributes["iota_dimension"]).value
        index = [1] * len(shape)
        index[dim] = shape[dim]
        return np.broadcast_to(np.arange(shape[dim]).reshape(index), shape)
    if name in _BINARY:
        return _BINARY[name](*args)
    if name == "stablehlo.divide" and np.issubdtype(dtype, np.integer):
        a, b = args
        if np.any(b == 0):
            return None
        quotient = np.abs(a.astype(np.int64)) // np.abs(b.astype(np.int64))
        return np.where((a < 0) != (b < 0), -quotient, quotient)
    if name == "stablehlo.remainder" and np.issubdtype(dtype, np.integer):
        return None if np.any(args[1] == 0) else np.fmod(*args)
    if name == "stablehlo.negate":
        return np.negative(args[0])
    if name == "stablehlo.not":
        return np.logical_not(args[0]) if dtype is np.bool_ else np.invert(args[0])
    if name == "stablehlo.convert":
        return args[0]
    if name == "stablehlo.select":
        return np.where(*args)
    if name == "stablehlo.compare":
        direction = str(op.attributes["comparison_direction"]).split()[-1].rstrip(">")
        if compare_type(op) == "TOTALORDER":
            return None  # numpy compares floats as FLOAT does
        return _COMPARE[direction](*args) if direction in _COMPARE else None
    if name == "stablehlo.broadcast_in_dim":
        return _index_map_step(args[0], op)
    if name == "stablehlo.reshape":
        return args[0].reshape(shape)
    if name == "stablehlo.transpose":
        return args[0].transpose(_i64s(op, "permutation"))
    if name == "stablehlo.concatenate":
        return np.concatenate(args, ir.IntegerAttr(op.attributes["dimension"]).value)
    return None


def _index_map_step(index: np.ndarray, op: ir.Operation,
                    out: tuple[int, ...] | None = None) -> np.ndarray | None:
    """`index` carried through one broadcast_in_dim, reshape or transpose (to the shape `out`
    instead of the op's result shape where given)."""
    if op.name == "stablehlo.transpose":
        return index.transpose(_i64s(op, "permutation"))
    out = out or _shape(op.results[0])
    if math.prod(out) > _MAX_INDEX:
        return None
    if op.name == "stablehlo.reshape":
        return index.reshape(out)
    dims = _i64s(op, "broadcast_dimensions")
    expanded = [1] * len(out)
    for i, d in enumerate(dims):
        expanded[d] = index.shape[i]
    order = sorted(range(len(dims)), key=lambda i: dims[i])
    return np.broadcast_to(index.transpose(order).reshape(expanded), out)


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
    if BLOCKS_ATTR not in _attr_names(concat):
        return 0
    dim = ir.IntegerAttr(concat.attributes["dimension"]).value
    producers = [_def(v) for v in concat.operands]
    first = producers[0]
    if first is None or any(p is None or p.name != first.name for p in producers):
        return 0
    names = _attr_names(first)
    if any(_attr_names(p) != names or any(str(p.attributes[n]) != str(first.attributes[n])
                                          for n in names) for p in producers):
        return 0
    operand_dims = _operand_dims(first, dim)
    if any(_operand_dims(p, dim) != operand_dims for p in producers[1:]):
        return 0
    if operand_dims is None or (first.name in _SINK_ELEMENTWISE and _integer(first.results[0])):
        return 0
    result_type = concat.results[0].type
    new_operands = []
    for j, d in enumerate(operand_dims):
        values = [p.operands[j] for p in producers]
        joined = _join(values, d, concat)
        if joined is None:
            return 0
        new_operands.append(joined)
    with ir.InsertionPoint(concat), concat.location:
        new = ir.Operation.create(first.name, results=[result_type], operands=new_operands,
                                  attributes={n: first.attributes[n] for n in names},
                                  loc=first.location)
    concat.results[0].replace_all_uses_with(new.results[0])
    _erase_dead(concat)
    return 1


def _operand_dims(op: ir.Operation, dim: int) -> list[int | None] | None:
    """For each operand of `op`, the dim that becomes result dim `dim` (None: the operand has
    no such dim, it must be the same in every block); None if `op` mixes rows along `dim`."""
    out = _shape(op.results[0])
    if op.name in _SINK_ELEMENTWISE:
        return [dim if _shape(v) == out else None for v in op.operands]
    if op.name == "stablehlo.transpose":
        return [_i64s(op, "permutation")[dim]]
    if op.name == "stablehlo.broadcast_in_dim":
        dims = _i64s(op, "broadcast_dimensions")
        if dim in dims and _shape(op.operands[0])[dims.index(dim)] == out[dim]:
            return [dims.index(dim)]
        return [None]
    if op.name == "stablehlo.reshape":
        source = _shape(op.operands[0])
        before = math.prod(out[:dim])
        for d in range(len(source)):
            if math.prod(source[:d]) == before and source[d] == out[dim]:
                return [d]
        return None
    if op.name == "stablehlo.dot_general":
        from jaxlib.mlir.dialects import stablehlo

        numbers = stablehlo.DotDimensionNumbers(op.attributes["dot_dimension_numbers"])
        batch = [list(numbers.lhs_batching_dimensions), list(numbers.rhs_batching_dimensions)]
        contract = [list(numbers.lhs_contracting_dimensions),
                    list(numbers.rhs_contracting_dimensions)]
        free = [[d for d in range(len(_shape(v))) if d not in batch[s] + contract[s]]
                for s, v in enumerate(op.operands)]
        if dim < len(batch[0]):
            return [batch[0][dim], batch[1][dim]]
        k = dim - len(batch[0])
        if k < len(free[0]):
            return [free[0][k], None]
        return [None, free[1][k - len(free[0])]]
    return None


def _join(values: list, dim: int | None, concat: ir.Operation):
    """The blocks' operands joined along `dim`: one value every block shares when `dim` is
    None (the op does not map it to the concatenated dim); else the value re-broadcast to the
    larger shape when every block shares one broadcast along `dim`, or their concatenation."""
    shared = all(_same_value(v, values[0]) for v in values)
    if dim is None:
        return values[0] if shared else None
    if shared:
        broadcast = _broadcast_along(values[0], dim, concat)
        if broadcast is not None:
            return broadcast
    return _concat(values, dim, concat)


def _same_value(a, b, depth: int = 6) -> bool:
    """`a` and `b` are the same value, or the same op (attributes and types) applied to the
    same values (each ring step recomputes its constants and broadcasts)."""
    if a == b:
        return True
    first, second = _def(a), _def(b)
    if depth == 0 or first is None or second is None or first.name != second.name or (
            a.type != b.type or len(first.operands) != len(second.operands)
            or len(first.regions) or len(second.regions)):
        return False
    names = _attr_names(first)
    if names != _attr_names(second) or any(str(first.attributes[n]) != str(second.attributes[n])
                                          for n in names):
        return False
    return all(_same_value(x, y, depth - 1) for x, y in zip(first.operands, second.operands))


def _broadcast_along(value, dim: int, concat: ir.Operation):
    """`value` (a broadcast that is constant along `dim`) re-broadcast to the size the
    concatenation gives `dim`; None for anything else."""
    from jaxlib.mlir.dialects import stablehlo

    op = _def(value)
    total = _shape(concat.results[0])[ir.IntegerAttr(concat.attributes["dimension"]).value]
    if op is None or op.name != "stablehlo.broadcast_in_dim":
        return None
    dims = _i64s(op, "broadcast_dimensions")
    if dim in dims and _shape(op.operands[0])[dims.index(dim)] != 1:
        return None
    shape = list(_shape(value))
    shape[dim] = total
    element = ir.RankedTensorType(value.type).element_type
    with ir.InsertionPoint(concat), concat.location:
        return stablehlo.BroadcastInDimOp(ir.RankedTensorType.get(shape, element),
                                          op.operands[0], dims).result


def _normalized_after(divide: ir.Operation) -> int:
    """`views(F(exp(y - m))) / den` with `den = reduce_add(exp(y - m), d)` (F contracting d
    with values v, the accumulated online softmax divided by its accumulated denominator at
    the end) is `views(F(exp(y - m) / den))`, the softmax's probabilities against v, as a
    plain attention computes it. Exact: den is constant along d, the contracted dim."""
    from jaxlib.mlir.dialects import stablehlo

    acc = _Accumulated(divide.operands[0])
    if not acc.ok or acc.v is None:
        return 0
    root, chain = _root(divide.operands[1], _MOVES_AND_TRANSPOSES)
    den = _Accumulated(root)
    if not den.ok or den.v is not None or den.m != acc.m or den.d != acc.d:
        return 0
    if not _same_value(den.y, acc.y, 12) or _shape(root) != _shape(acc.m):
        return 0
    identity = np.arange(math.prod(_shape(root))).reshape(_shape(root))
    if not (den.index == identity).all():
        return 0
    index = _index_map(root, chain)
    if index is None or index.shape != acc.index.shape or not (index == acc.index).all():
        return 0
    kept = [k for k in range(len(_shape(acc.y))) if k != acc.d]
    plain = np.broadcast_to(identity.reshape(
        [n if k != acc.d else 1 for k, n in enumerate(_shape(acc.y))]), _shape(acc.y))
    if len(_shape(root)) != len(kept) or not (plain == acc.sub_index).all():
        return 0
    exp_value = acc.exp.results[0]
    element = ir.RankedTensorType(exp_value.type).element_type
    with ir.InsertionPoint(divide), divide.location:
        spread = stablehlo.BroadcastInDimOp(
            ir.RankedTensorType.get(_shape(exp_value), element), root, kept).result
        probs = stablehlo.DivOp(exp_value, spread).result
    core = acc.core.clone(ir.InsertionPoint(divide))
    core.operands[acc.side] = probs
    _replace_through_views(divide, core.results[0], acc.views)
    return 1
