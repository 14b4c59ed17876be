"""Exact rewrites of the backward of an online softmax (ring / flash attention training).

jax's backward of `o_i = o_{i-1} * c_i + p_i @ v_i`, `l_i = l_{i-1} * c_i + sum(p_i)` with
`p_i = exp(s_i - m_i)`, `c_i = exp(m_{i-1} - m_i)` (the running max's gradient stopped) hands
step i the cotangents `do_i = do_{i+1} * c_{i+1}` and `dl_i = dl_{i+1} * c_{i+1}`: the final
ones rescaled by the later corrections, one multiplication per step. Step i's score cotangent
is `(do_i @ v_i^T + dl_i) * p_i`, its value cotangent `p_i^T do_i`, and the query cotangent
sums `ds_i @ k_i` over the steps. In real arithmetic the corrections telescope:
`p_i * c_{i+1} * ... * c_n = exp(s_i - m_n)`, the block of the probabilities shifted by the
final max, as the reference's softmax backward reads them. These rewrites put the backward in
that form (entangle-normalize runs them on both programs, after the forward's folds):

* telescoping: `(x * F(exp(b - c))) * F(exp(a - b))` is `x * F(exp(a - c))` (F the same
  broadcast of vectors of one shape), and `exp(s - F(a)) * F(exp(a - b))` is
  `exp(s - F(b))`, also when the second factor is applied to a product `z * F(exp(a - b))`;
* a broadcast factor `F(exp(a - b))` (a *row factor*: constant along the dims F creates)
  moves out of a `broadcast_in_dim`, out of a `dot_general` along the operand's free dims
  (it scales the result's rows) or onto the other operand along contracted dims, and out of
  an `add` of two terms it scales alike;
* the query cotangent's sum over the ring steps, `dot(a_1, b_1) + dot(a_2, b_2)` contracting
  the key dim, is `dot(concatenate(a_1, a_2), concatenate(b_1, b_2))` when the b's are blocks
  one ring passes on (collective_permutes of one another): the concatenations then move down
  as the forward's do (`idioms._sink_concat`);
* the models' (b, s, h, d) layout transposes the correction (`swapaxes(corr, 1, 2)`) and
  each einsum's result: a factor's vector moves out of a transpose (transposed to the order
  of the dims it lands on), transposes the rewrites build sink to the leaves, a factor along
  a dot's batch and contracted dims moves onto the other operand only when that operand
  absorbs it (one direction: no cycle), and transposed contributions are summed under one
  transpose;
* grouped-query attention (k, v heads repeated in each step, `jnp.repeat`: a broadcast and a
  reshape) sums each step's key and value cotangents over the repeat: the reverse ring's
  rewrite moves those sums onto the contraction over all the keys with the views, and the
  query gradient's ring blocks are found under the repeat's broadcast.

Each is an identity of real arithmetic. In floating point exp(a - b) is only defined where
the shifts are finite: every shift must hold no infinity (`finite_shift`: a causal
mask hiding a row of a block makes that block's max -inf), and a score that may be +inf is
refused. Every rewrite is grounded by executing the partitioned program before and after it
(tests/test_online_softmax.py).

What each needs in floating point, beyond finite shifts (each function says which):

* telescoping and absorbing multiply two exponentials into one; `exp(b - c) * exp(a - b)` is
  `exp(a - c)` only where neither factor over- or underflows alone (b = 200, a = c = 0:
  inf * 0 = NaN where exp(a - c) is 1). Both rewrite only shifts proven ordered,
  `a <= b <= c` (and `s <= a <= b` for `exp(s - a) * exp(a - b)`), by `order.at_most`
  from the ops that compute them: a running max bounds the maxes it is taken over, and a
  row max bounds every element of its row, also once the forward's folds have put the
  maxes over concatenated blocks and sunk the concatenations to the keys and positions
  (each earlier max is then the max of a slice of a later one's row). Every factor then
  lies in [0, 1]: neither overflows, and where one underflows the product, no larger than
  it, is as small (an error below the dtype's smallest normal), so the product is
  `exp(a - c)` up to rounding; `x * F(exp(b - c))` cannot overflow either. Shifts in no
  proven order are left alone (tests/normalize/test_exact_ring_overflow.py);
* moving a row factor out of an add or a dot along free dims, and a division out of a dot,
  distribute a product over a sum: `(x + y) * e` overflows where `x * e + y * e` (e < 1)
  does not only for x, y near the dtype's largest value; this regrouping is taken as the
  reassociation every proof assumes (the same holds of the unnormalised accumulators,
  `idioms._online_sum`). Moving it onto the other operand along contracted dims only
  regroups products; out of a broadcast it is exact for any values.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from jaxlib.mlir import ir
from jaxlib.mlir.dialects import stablehlo

from entangle_mlir.core.traits import ELEMENTWISE_OPS
from entangle_mlir.normalize import idioms
from entangle_mlir.normalize.finite import (
    NEG,
    POS,
    finite_shift,
    judge,
    nonfinite_kinds,
    overflow_words,
)
from entangle_mlir.normalize.match import (
    MOVES,
    MOVES_AND_TRANSPOSES,
    attr_names,
    created_by,
    defining_op,
    erase_and_prune,
    i64s,
    index_map,
    replace_uses,
    root_of,
    same_attribute,
    same_but,
    same_value,
    set_attribute,
    set_operand,
    shape_of,
    sum_reduce,
    uses_of,
)
from entangle_mlir.normalize.order import at_most

_VIEW_OPS = ("stablehlo.transpose", "stablehlo.reshape")


@dataclass(frozen=True)
class _Factor:
    """`value` = F(exp(a - b)): the vector exp(a - b) (`root`) broadcast by F, its dims
    placed on `dims` of `value` (in order); constant along every other dim."""

    value: object
    root: object
    a: object
    b: object
    dims: tuple[int, ...]


def _factor(value) -> _Factor | None:
    root, chain = root_of(value, MOVES)
    exp = defining_op(root)
    if exp is None or exp.name != "stablehlo.exponential":
        return None
    sub = defining_op(exp.operands[0])
    if sub is None or sub.name != "stablehlo.subtract":
        return None
    if shape_of(sub.operands[0]) != shape_of(root) or shape_of(sub.operands[1]) != shape_of(root):
        return None
    dims = _placement(root, chain, shape_of(value))
    if dims is None:
        return None
    return _Factor(value, root, sub.operands[0], sub.operands[1], dims)


def _placement(root, chain: list[ir.Operation], shape: tuple[int, ...]
               ) -> tuple[int, ...] | None:
    """The dims of `shape` the root's dims land on (in order) when the chain only broadcasts
    the root (every element reads the root element at its positions along those dims)."""
    root_shape = shape_of(root)
    if not chain:
        return tuple(range(len(shape))) if root_shape == shape else None
    index = index_map(root, chain)
    if index is None or index.shape != shape:
        return None
    varying = tuple(d for d in range(len(shape))
                    if not (index == np.take(index, [0], axis=d)).all())
    sizes = tuple(n for n in root_shape if n != 1)
    if tuple(shape[d] for d in varying) != sizes:
        return None
    expected = np.arange(math.prod(root_shape)).reshape(sizes) if sizes else np.zeros(())
    placed = [1] * len(shape)
    for d in varying:
        placed[d] = shape[d]
    order = list(varying)
    if not (index == np.broadcast_to(expected.reshape(placed), shape)).all() or (
            order != sorted(order)):
        return None
    return varying


def _finite(at: ir.Operation, *shifts, score=None) -> bool:
    """The shifts hold no infinity (`finite.finite_shift`) and `score`, if given, no +inf;
    judged at `at`, each caller's last check before it rewrites (`finite.judge`)."""
    def test(memo) -> bool:
        return all(finite_shift(v, memo) for v in shifts) and (
            score is None or not nonfinite_kinds(score, memo) & POS)

    return judge(test, at, _backward_refusal(shifts[0]))


def _backward_refusal(shift) -> str:
    return ("the online softmax's backward rescales by exp(a - b) of running maxes that may "
            "be infinite where a block of scores overflows (" + overflow_words(shift)
            + "): its telescoped form is not exact there; pass --assume-no-overflow to "
            "assume no intermediate overflow")


def _vector(root) -> tuple[int, ...]:
    """The root's non-unit dims' sizes (the vector the factor broadcasts)."""
    return tuple(n for n in shape_of(root) if n != 1)


def _placed(vector_value, dims: tuple[int, ...], shape: tuple[int, ...], at: ir.Operation):
    """`vector_value` broadcast onto `dims` of `shape`: its non-unit dims in order, or every
    dim of it where `dims` places each (a factor read without a broadcast chain is placed on
    all its dims, unit ones included: `_placement`)."""
    element = ir.RankedTensorType(vector_value.type).element_type
    with ir.InsertionPoint(at), at.location:
        value = vector_value
        sizes = _vector(vector_value)
        if len(dims) == len(shape_of(value)):
            sizes = shape_of(value)
        if shape_of(value) != sizes:
            value = stablehlo.ReshapeOp(ir.RankedTensorType.get(sizes, element), value).result
        if sizes == shape and tuple(dims) == tuple(range(len(shape))):
            return value
        return stablehlo.BroadcastInDimOp(ir.RankedTensorType.get(shape, element), value,
                                          list(dims)).result


def _exp_diff(a, b, at: ir.Operation):
    with ir.InsertionPoint(at), at.location:
        return stablehlo.ExpOp(stablehlo.SubtractOp(a, b).result).result


def _mul(x, y, at: ir.Operation):
    with ir.InsertionPoint(at), at.location:
        return stablehlo.MulOp(x, y).result


def _replace(op: ir.Operation, value) -> int:
    replace_uses(op.results[0], value)
    erase_and_prune(op)
    return 1


def _same(x, y) -> bool:
    return same_value(x, y, 12)


def _view(value) -> tuple[object, np.ndarray] | None:
    """(root, flat index map): `value` as the elements of `root` it reads in row-major order,
    through reshapes, transposes and broadcasts (`match.index_map`); None when too large."""
    root, chain = root_of(value, MOVES_AND_TRANSPOSES)
    index = index_map(root, chain)
    return None if index is None else (root, index.reshape(-1))


def _same_view(x, y) -> tuple[object, object] | None:
    """(root of x, root of y) when `x` and `y` read the elements of roots of one shape at the
    same positions in the same order (unit dims aside: a reshape of one sequence or b = 1
    that `_unit_dims_dropped` made, a transpose `_exp_transposed` moved); else None."""
    vx, vy = _view(x), _view(y)
    if vx is None or vy is None or shape_of(vx[0]) != shape_of(vy[0]):
        return None
    return (vx[0], vy[0]) if np.array_equal(vx[1], vy[1]) else None


def _same_shift(x, y) -> bool:
    """`x` and `y` hold the same vector of shifts, unit dims aside: the same value, or the
    same elements of one value (`_same_view`)."""
    if _vector(x) != _vector(y):
        return False
    if _same(x, y):
        return True
    roots = _same_view(x, y)
    return roots is not None and _same(*roots)


def _below(x, m) -> bool:
    """`x <= m` elementwise, unit dims aside (`order.at_most`), also where both read the same
    positions of roots one of which is at most the other."""
    if at_most(x, m):
        return True
    roots = _same_view(x, m) if _vector(x) == _vector(m) else None
    return roots is not None and at_most(*roots)


def _exp_between(a, b, at: ir.Operation):
    """`exp(a - b)` of two vectors of shifts, unit dims aside: at their common shape, else
    both reshaped to their non-unit dims (bit-exact)."""
    if shape_of(a) != shape_of(b):
        element = ir.RankedTensorType(a.type).element_type
        vector = ir.RankedTensorType.get(_vector(a), element)
        with ir.InsertionPoint(at), at.location:
            a, b = (stablehlo.ReshapeOp(vector, v).result for v in (a, b))
    return _exp_diff(a, b, at)


# ---------------------------------------------------------------------------------------------
# Telescoping
# ---------------------------------------------------------------------------------------------

def _telescope(mul: ir.Operation) -> int:
    """`(x * F(exp(b - c))) * F(exp(a - b))` (either factor first) is `x * F(exp(a - c))`.
    Needs both factors in [0, 1], `a <= b <= c` (`order.at_most`, module docstring), and
    a, b, c finite (`_finite`; b = +-inf gives inf * 0)."""
    for i, o in ((0, 1), (1, 0)):
        outer = _factor(mul.operands[o])
        inner_mul = defining_op(mul.operands[i])
        if outer is None or inner_mul is None or inner_mul.name != "stablehlo.multiply":
            continue
        for j, k in ((0, 1), (1, 0)):
            inner = _factor(inner_mul.operands[k])
            if inner is None or inner.dims != outer.dims or _vector(inner.root) != _vector(
                    outer.root):
                continue
            for first, second in ((inner, outer), (outer, inner)):
                if not _same_shift(first.b, second.a) or _vector(first.a) != _vector(
                        second.b):
                    continue
                if not (_below(first.a, first.b) and _below(second.a, second.b)):
                    continue
                if not _finite(mul, first.a, first.b, second.b):
                    continue
                joined = _exp_between(first.a, second.b, mul)
                factor = _placed(joined, outer.dims, shape_of(mul.results[0]), mul)
                return _replace(mul, _mul(inner_mul.operands[j], factor, mul))
    return 0


def _shifted_exp(value):
    """(s, a, dims) when `value` is `exp(s - F(a))`, F broadcasting the vector a onto `dims`
    of s; else None."""
    exp = defining_op(value)
    if exp is None or exp.name != "stablehlo.exponential":
        return None
    sub = defining_op(exp.operands[0])
    if sub is None or sub.name != "stablehlo.subtract":
        return None
    a, chain = root_of(sub.operands[1], MOVES)
    dims = _placement(a, chain, shape_of(value))
    if dims is None or len(dims) == len(shape_of(value)):
        return None
    return sub.operands[0], a, dims


def _absorb(mul: ir.Operation) -> int:
    """`exp(s - F(a)) * F(exp(a - b))` is `exp(s - F(b))`; `(z * F(exp(a - b))) *
    exp(s - F(a))` is `z * exp(s - F(b))`. Needs `s <= a <= b` (both factors in [0, 1],
    `order.at_most`: a is a max over s's row), a and b finite, and s never +inf
    (exp(inf - a) * exp(a - b) is inf or NaN where exp(inf - b) is inf)."""
    for e, f in ((0, 1), (1, 0)):
        shifted = _shifted_exp(mul.operands[e])
        if shifted is None:
            continue
        s, a, dims = shifted
        rest = None
        factor = _factor(mul.operands[f])
        if factor is None:
            other = defining_op(mul.operands[f])
            if other is None or other.name != "stablehlo.multiply":
                continue
            for j, k in ((0, 1), (1, 0)):
                factor = _factor(other.operands[k])
                if factor is not None and factor.dims == dims and _same_shift(factor.a, a):
                    rest = other.operands[j]
                    break
            else:
                continue
        if factor.dims != dims or not _same_shift(factor.a, a) or _vector(
                factor.b) != _vector(a):
            continue
        if not (at_most(s, a, dims) and _below(a, factor.b)):
            continue
        if not _finite(mul, a, factor.b, score=s):
            continue
        spread = _rechained(defining_op(mul.operands[e]).operands[0],
                            _in_shape(factor.b, shape_of(a), mul), mul)
        with ir.InsertionPoint(mul), mul.location:
            new = stablehlo.ExpOp(stablehlo.SubtractOp(s, spread).result).result
        return _replace(mul, new if rest is None else _mul(rest, new, mul))
    return 0


def _in_shape(value, shape: tuple[int, ...], at: ir.Operation):
    """`value` (a vector of shifts) at `shape`, the same non-unit sizes: the value under its
    unit-dim reshapes that has that shape (the spelling the forward's steps read), else a
    reshape of it (bit-exact)."""
    found, op = value, defining_op(value)
    while shape_of(found) != shape and op is not None and op.name == "stablehlo.reshape" \
            and _vector(op.operands[0]) == _vector(found):
        found, op = op.operands[0], defining_op(op.operands[0])
    if shape_of(found) == shape:
        return found
    element = ir.RankedTensorType(value.type).element_type
    with ir.InsertionPoint(at), at.location:
        return stablehlo.ReshapeOp(ir.RankedTensorType.get(shape, element), value).result


def _rechained(sub_value, b, at: ir.Operation):
    """The broadcast chain `sub_value` subtracts, applied to `b` instead of its root (the
    steps' probabilities then share one spelling of the final shift)."""
    _, chain = root_of(defining_op(sub_value).operands[1], MOVES)
    value = b
    for op in reversed(chain):
        clone = op.clone(ir.InsertionPoint(at))
        set_operand(clone, 0, value)
        value = clone.results[0]
    return value


# ---------------------------------------------------------------------------------------------
# Moving a row factor out of broadcasts, dots and adds
# ---------------------------------------------------------------------------------------------

def _scaled(value) -> tuple[object, _Factor] | None:
    """(x, factor) when `value` is `x * F(exp(a - b))` with F a proper broadcast (or any
    placement for vectors: `dims` covers the value). The callers check that its shifts are
    finite (`_finite`, costly: last)."""
    op = defining_op(value)
    if op is None or op.name != "stablehlo.multiply":
        return None
    for x, f in ((0, 1), (1, 0)):
        factor = _factor(op.operands[f])
        if factor is not None:
            return op.operands[x], factor
    return None


def _broadcast_out(broadcast: ir.Operation) -> int:
    """`broadcast(x * F(e))` is `broadcast(x) * broadcast(F(e))`: element by element the same
    product, exact for any values (the shifts are asked to be finite only so that the
    factors it moves are ones the other rewrites take)."""
    found = _scaled(broadcast.operands[0])
    if found is None:
        return 0
    x, factor = found
    out = shape_of(broadcast.results[0])
    dims = i64s(broadcast, "broadcast_dimensions")
    placed = tuple(dims[d] for d in factor.dims)
    if list(placed) != sorted(placed) or not _finite(broadcast, factor.a, factor.b):
        return 0
    element = ir.RankedTensorType(x.type).element_type
    with ir.InsertionPoint(broadcast), broadcast.location:
        spread_x = stablehlo.BroadcastInDimOp(ir.RankedTensorType.get(out, element), x,
                                              dims).result
    spread_f = _placed(factor.root, placed, out, broadcast)
    return _replace(broadcast, _mul(spread_x, spread_f, broadcast))


def _add_out(add: ir.Operation) -> int:
    """`x * F(e) + y * F(e)` is `(x + y) * F(e)`: a product distributed over a sum, taken as
    the regrouping every proof assumes (module docstring); the shifts must be finite. The two
    factors place one vector exp(a - b) alike (spelled alike, or with the same shifts read
    through unit-dim reshapes and transposes: `_same_shift`)."""
    left, right = _scaled(add.operands[0]), _scaled(add.operands[1])
    if left is None or right is None:
        return 0
    (x, f), (y, g) = left, right
    if f.dims != g.dims or not (_same(f.root, g.root) or (
            _same_shift(f.a, g.a) and _same_shift(f.b, g.b))) or not _finite(add, f.a, f.b):
        return 0
    with ir.InsertionPoint(add), add.location:
        summed = stablehlo.AddOp(x, y).result
    return _replace(add, _mul(summed, f.value, add))


def _exp_sum(value) -> bool:
    """`value` is a sum of exponentials over non-empty dims (positive in real arithmetic):
    an online softmax's denominator."""
    root, _ = root_of(value, MOVES_AND_TRANSPOSES)
    op = defining_op(root)
    if not sum_reduce(op) or any(shape_of(op.operands[0])[d] == 0
                                 for d in i64s(op, "dimensions")):
        return False
    exp = defining_op(op.operands[0])
    return exp is not None and exp.name == "stablehlo.exponential"


def _divided(value) -> tuple[object, object, tuple[int, ...]] | None:
    """(x, den, dims) when `value` is `x / F(den)`, F a proper broadcast of a softmax
    denominator onto `dims`."""
    op = defining_op(value)
    if op is None or op.name != "stablehlo.divide" or not _exp_sum(op.operands[1]):
        return None
    root, chain = root_of(op.operands[1], MOVES)
    dims = _placement(root, chain, shape_of(value))
    if dims is None or len(dims) == len(shape_of(value)):
        return None
    return op.operands[0], root, dims


def _dot_divided(dot: ir.Operation) -> int:
    """`dot(x / F(den), w)` with F along free (or batch) dims of x is `dot(x, w) / F'(den)`
    (den a softmax denominator: positive). Not when x is the exponentials themselves: the
    probabilities `exp(...) / den` are the softmax's form (`idioms._normalized_after` puts the
    division there). Along contracted dims, against exponentials w, it moves onto them:
    `dot(x / F(den), exp(..))` is `dot(x, exp(..) / F''(den))`, the probabilities (the value
    cotangent `p^T do` of jax's ring backward, which divides the cotangent first)."""
    batch, contract, free = _dot_dims(dot)
    for side in (0, 1):
        found = _divided(dot.operands[side])
        if found is None:
            continue
        x, den, dims = found
        if _is_exp(x):
            continue
        if all(d in contract[side] or d in batch[side] for d in dims) and any(
                d in contract[side] for d in dims) and _is_exp(dot.operands[1 - side]):
            other = dot.operands[1 - side]
            partner = _partner_dims(dims, side, batch, contract)
            if list(partner) != sorted(partner):
                continue
            spread = _placed(den, partner, shape_of(other), dot)
            with ir.InsertionPoint(dot), dot.location:
                probs = stablehlo.DivOp(other, spread).result
            operands = [x, probs] if side == 0 else [probs, x]
            return _replace(dot, _clone_dot(dot, operands))
        if not all(d in batch[side] or d in free[side] for d in dims):
            continue
        positions = tuple(_result_dim(d, side, batch, free) for d in dims)
        if list(positions) != sorted(positions):
            continue
        operands = [x, dot.operands[1]] if side == 0 else [dot.operands[0], x]
        new = _clone_dot(dot, operands)
        spread = _placed(den, positions, shape_of(dot.results[0]), dot)
        with ir.InsertionPoint(dot), dot.location:
            return _replace(dot, stablehlo.DivOp(new, spread).result)
    return 0


def _dot_dims(dot: ir.Operation):
    """(batch, contracting, free) dims of each operand of a dot_general."""
    numbers = stablehlo.DotDimensionNumbers(dot.attributes["dot_dimension_numbers"])
    batch = (list(numbers.lhs_batching_dimensions), list(numbers.rhs_batching_dimensions))
    contract = (list(numbers.lhs_contracting_dimensions),
                list(numbers.rhs_contracting_dimensions))
    free = [[d for d in range(len(shape_of(v))) if d not in batch[s] + contract[s]]
            for s, v in enumerate(dot.operands)]
    return batch, contract, free


def _dot_out(dot: ir.Operation) -> int:
    """A row factor of one operand of a dot_general: along free (or batch) dims it scales the
    result (`dot(x * F(e), w) = dot(x, w) * F'(e)`), along contracted dims it moves onto the
    other operand (`dot(x * F(e), w) = dot(x, w * F''(e))`)."""
    batch, contract, free = _dot_dims(dot)
    ranks = [len(shape_of(v)) for v in dot.operands]
    out = shape_of(dot.results[0])
    for side in (0, 1):
        found = _scaled(dot.operands[side])
        if found is None:
            continue
        x, factor = found
        if len(factor.dims) == ranks[side]:
            continue
        other = dot.operands[1 - side]
        if all(d in contract[side] for d in factor.dims):
            partner = tuple(contract[1 - side][contract[side].index(d)] for d in factor.dims)
            if list(partner) != sorted(partner) or not _finite(dot, factor.a, factor.b):
                continue
            moved = _mul(other, _placed(factor.root, partner, shape_of(other), dot), dot)
            operands = [x, moved] if side == 0 else [moved, x]
            return _replace(dot, _clone_dot(dot, operands))
        if all(d in contract[side] or d in batch[side] for d in factor.dims):
            partner = _partner_dims(factor.dims, side, batch, contract)
            if not _absorbs(other, factor, partner, dot):
                continue
            moved = _mul(other, _placed(factor.root, partner, shape_of(other), dot), dot)
            operands = [x, moved] if side == 0 else [moved, x]
            return _replace(dot, _clone_dot(dot, operands))
        if all(d in batch[side] or d in free[side] for d in factor.dims):
            positions = tuple(_result_dim(d, side, batch, free) for d in factor.dims)
            if list(positions) != sorted(positions) or not _finite(dot, factor.a, factor.b):
                continue
            operands = [x, other] if side == 0 else [other, x]
            new = _clone_dot(dot, operands)
            return _replace(dot, _mul(new, _placed(factor.root, positions, out, dot), dot))
    return 0


def _partner_dims(dims, side: int, batch, contract) -> tuple[int, ...]:
    """The other operand's dims paired with `dims` (batch or contracted) of operand `side`."""
    return tuple(batch[1 - side][batch[side].index(d)] if d in batch[side]
                 else contract[1 - side][contract[side].index(d)] for d in dims)


def _absorbs(other, factor: _Factor, partner: tuple[int, ...], at: ir.Operation) -> bool:
    """`other` is `exp(s - G(a))` with G placing a on `partner`, the factor's `a`: the factor,
    moved onto `other` along a dot's batch and contracted dims, is absorbed there
    (`_absorb`). A factor along batch and contracted dims moves only onto such a target, so
    it never moves back and forth between a dot's operands; it must be one `_absorb` takes
    (ordered shifts), or it would stay there."""
    shifted = _shifted_exp(other)
    if shifted is None or list(partner) != sorted(partner):
        return False
    s, a, dims = shifted
    return (dims == partner and _same_shift(factor.a, a) and _vector(factor.b) == _vector(a)
            and at_most(s, a, dims) and _below(a, factor.b)
            and _finite(at, a, factor.b, score=s))


def _result_dim(d: int, side: int, batch, free) -> int:
    if d in batch[side]:
        return batch[side].index(d)
    return len(batch[0]) + (0 if side == 0 else len(free[0])) + free[side].index(d)


def _clone_dot(dot: ir.Operation, operands: list):
    clone = dot.clone(ir.InsertionPoint(dot))
    for i, value in enumerate(operands):
        set_operand(clone, i, value)
    return clone.results[0]


# ---------------------------------------------------------------------------------------------
# Transposes (the models' (b, s, h, d) layout: `swapaxes(corr, 1, 2)`, the einsums' transposes)
# ---------------------------------------------------------------------------------------------

_ELEMENTWISE = frozenset(op for op, traits in ELEMENTWISE_OPS.items() if traits.transpose)
"""Ops acting on each element alike: a transpose of one is the op of its transposed operands
(`Traits.transpose`)."""


def _transposed(value, permutation: list[int], at: ir.Operation, depth: int = 6):
    """`transpose(value, permutation)` built before `at`, moved down to the leaves (bit-exact:
    a transpose moves elements): composed with a transpose `value` is (none when the
    composition is the identity), into a broadcast_in_dim (its operand transposed so its dims
    stay in order), under a reshape that only drops or inserts unit dims (`_lifted`: one
    sequence or b = 1) and through ops acting on each element alike (`depth` of them). A row
    vector transposed back to its own layout is then the vector itself, spelled as the
    reference and the telescoping and absorbing rewrites read it."""
    permutation = list(permutation)
    if permutation == list(range(len(permutation))):
        return value
    op = defining_op(value)
    shape = shape_of(value)
    element = ir.RankedTensorType(value.type).element_type
    out = ir.RankedTensorType.get([shape[p] for p in permutation], element)
    if op is not None and op.name == "stablehlo.transpose":
        inner = i64s(op, "permutation")
        return _transposed(op.operands[0], [inner[p] for p in permutation], at, depth)
    if op is not None and op.name == "stablehlo.broadcast_in_dim":
        landing = [permutation.index(d) for d in i64s(op, "broadcast_dimensions")]
        order = sorted(range(len(landing)), key=lambda j: landing[j])
        source = _transposed(op.operands[0], order, at, depth)
        with ir.InsertionPoint(at), at.location:
            return stablehlo.BroadcastInDimOp(out, source, sorted(landing)).result
    if op is not None and op.name == "stablehlo.reshape" and _vector(op.operands[0]) == \
            _vector(value):
        moved = _transposed(op.operands[0], _lifted(permutation, shape,
                                                    shape_of(op.operands[0])), at, depth)
        with ir.InsertionPoint(at), at.location:
            return stablehlo.ReshapeOp(out, moved).result
    if depth > 0 and op is not None and op.name in _ELEMENTWISE and all(
            shape_of(v) == shape for v in op.operands):
        operands = [_transposed(v, permutation, at, depth - 1) for v in op.operands]
        clone = op.clone(ir.InsertionPoint(at))
        for i, v in enumerate(operands):
            set_operand(clone, i, v)
        clone.results[0].set_type(out)
        return clone.results[0]
    with ir.InsertionPoint(at), at.location:
        return stablehlo.TransposeOp(value, permutation).result


def _lifted(permutation: list[int], shape: tuple[int, ...], source: tuple[int, ...]
            ) -> list[int]:
    """A permutation of `source`'s dims that orders its non-unit dims as `permutation`
    orders those of `shape` (the same non-unit sizes: a reshape that drops or inserts unit
    dims), its unit dims first: transpose(reshape(v), permutation) is
    reshape(transpose(v, lifted)), element for element."""
    kept = [d for d, n in enumerate(shape) if n != 1]
    inner = [d for d, n in enumerate(source) if n != 1]
    order = [kept.index(p) for p in permutation if shape[p] != 1]
    return [d for d, n in enumerate(source) if n == 1] + [inner[k] for k in order]


def _exp_transposed(exp_value, permutation: list[int], at: ir.Operation):
    """`transpose(exp(a - b))` as `exp(transpose(a) - transpose(b))` (bit-exact: a transpose
    moves elements, the subtraction and exponential act on each alike)."""
    sub = defining_op(defining_op(exp_value).operands[0])
    return _exp_diff(_transposed(sub.operands[0], permutation, at),
                     _transposed(sub.operands[1], permutation, at), at)


def _exp_out_of_transpose(transpose: ir.Operation) -> int:
    """`transpose(exp(a - b))` read only by broadcasts (a row factor's vector, as
    `swapaxes(corr, 1, 2)[..., None]` spells it) is `exp(transpose(a) - transpose(b))`: the
    factor's vector then lies in the order of the dims it lands on, so its broadcast is a
    placement `_factor` reads."""
    exp = defining_op(transpose.operands[0])
    if exp is None or exp.name != "stablehlo.exponential":
        return 0
    sub = defining_op(exp.operands[0])
    if sub is None or sub.name != "stablehlo.subtract" or any(
            shape_of(v) != shape_of(exp.results[0]) for v in sub.operands):
        return 0
    uses = uses_of(transpose.results[0])
    if not uses or any(u.owner.name not in MOVES for u in uses):
        return 0
    return _replace(transpose, _exp_transposed(exp.results[0], i64s(transpose, "permutation"),
                                               transpose))


def _transpose_out(transpose: ir.Operation) -> int:
    """`transpose(x * F(e))` is `transpose(x) * G(e')`, `transpose(x / F(den))` is
    `transpose(x) / G(den')` (F, G proper broadcasts of a row vector; e', den' the vector
    transposed to the order of the dims it lands on after the transpose, so G is a placement).
    Bit-exact: a transpose moves elements, the product or quotient acts on each alike."""
    operand = transpose.operands[0]
    scaled, divided = _scaled(operand), _divided(operand)
    if scaled is not None:
        x, factor = scaled
        root, dims = factor.root, factor.dims
    elif divided is not None:
        x, root, dims = divided
    else:
        return 0
    permutation = i64s(transpose, "permutation")
    landing = [permutation.index(d) for d in dims]
    order = sorted(range(len(landing)), key=lambda j: landing[j])
    at = transpose
    if order != list(range(len(order))) and shape_of(root) != _vector(root):
        if len(dims) != len(_vector(root)):
            return 0
        root = _unit_dims_dropped(root, scaled is not None, at)
    if scaled is not None:
        vector = (root if order == list(range(len(order)))
                  else _exp_transposed(root, order, at))
    else:
        vector = _transposed(root, order, at)
    with ir.InsertionPoint(at), at.location:
        moved = stablehlo.TransposeOp(x, permutation).result
    spread = _placed(vector, tuple(sorted(landing)), shape_of(transpose.results[0]), at)
    if scaled is not None:
        return _replace(transpose, _mul(moved, spread, at))
    with ir.InsertionPoint(at), at.location:
        return _replace(transpose, stablehlo.DivOp(moved, spread).result)


def _unit_dims_dropped(root, exponential: bool, at: ir.Operation):
    """`root` reshaped to its non-unit dims (`_vector`), the dims a factor places (one
    sequence, b = 1, leaves a unit dim in every row vector): bit-exact, a reshape keeps the
    elements in order. An exponential `exp(a - b)` as `exp(reshape(a) - reshape(b))`, so it
    stays a factor's form."""
    element = ir.RankedTensorType(root.type).element_type
    vector = ir.RankedTensorType.get(_vector(root), element)
    if not exponential:
        with ir.InsertionPoint(at), at.location:
            return stablehlo.ReshapeOp(vector, root).result
    sub = defining_op(defining_op(root).operands[0])
    with ir.InsertionPoint(at), at.location:
        a, b = (stablehlo.ReshapeOp(vector, v).result for v in sub.operands)
    return _exp_diff(a, b, at)


def _transposed_sum(add: ir.Operation) -> int:
    """`transpose(dot_1, P) + transpose(dot_2, P)` is `transpose(dot_1 + dot_2, P)` (bit-exact;
    the sum of the ring steps' query-gradient contractions, each transposed back to
    (b, s, h, d) by its einsum, then meets `_contracted_sum`)."""
    ops = [defining_op(v) for v in add.operands]
    if any(op is None or op.name != "stablehlo.transpose" for op in ops):
        return 0
    if i64s(ops[0], "permutation") != i64s(ops[1], "permutation"):
        return 0
    inner = [op.operands[0] for op in ops]
    if inner[0].type != inner[1].type or any(
            defining_op(v) is None or defining_op(v).name != "stablehlo.dot_general"
            for v in inner):
        return 0
    with ir.InsertionPoint(add), add.location:
        summed = stablehlo.AddOp(inner[0], inner[1]).result
        return _replace(add, stablehlo.TransposeOp(summed, i64s(ops[0], "permutation")).result)


# ---------------------------------------------------------------------------------------------
# The sum over ring steps of contractions along the key dim
# ---------------------------------------------------------------------------------------------

_BLOCK_OPS = (*_VIEW_OPS, "stablehlo.broadcast_in_dim")
"""Ops between a ring step's block and the operand a step's contraction reads: views, and
the broadcast of grouped-query attention's head repeat (`jnp.repeat(k, r, axis=2)` is a
broadcast_in_dim and a reshape)."""


def _ring_root(value):
    """The value under views, broadcasts and collective_permutes (the block a ring step holds
    comes from it); the value itself when it is none of them."""
    op = defining_op(value)
    while op is not None and (op.name in _BLOCK_OPS or op.name == "stablehlo.collective_permute"):
        value = op.operands[0]
        op = defining_op(value)
    return value


def _ring_blocks(value) -> list:
    """The blocks of a concatenation the folds built (under views and broadcasts), or
    [value]."""
    op = defining_op(value)
    while op is not None and op.name in _BLOCK_OPS:
        value = op.operands[0]
        op = defining_op(value)
    if op is not None and op.name == "stablehlo.concatenate" and idioms.BLOCKS_ATTR in (
            attr_names(op)):
        return list(op.operands)
    return [value]


def _permuted(value) -> bool:
    """`value` is a block a collective_permute brought (under views and broadcasts)."""
    op = defining_op(value)
    while op is not None and op.name in _BLOCK_OPS:
        op = defining_op(op.operands[0])
    return op is not None and op.name == "stablehlo.collective_permute"


def _contracted_sum(add: ir.Operation) -> int:
    """`dot(a_1, b_1) + dot(a_2, b_2)` (the same dimension numbers, one contracted dim, the
    blocks differing only along it) is `dot(concatenate(a_1, a_2), concatenate(b_1, b_2))`,
    when every b block is a ring step's block of one value (views and collective_permutes
    of the same root): the ring's per-step contributions to the query cotangent."""
    dots = [defining_op(v) for v in add.operands]
    if any(d is None or d.name != "stablehlo.dot_general" or len(d.operands) != 2 for d in dots):
        return 0
    first, second = dots
    names = attr_names(first)
    if names != attr_names(second) or any(
            not same_attribute(first.attributes[n], second.attributes[n]) for n in names):
        return 0
    if first.results[0].type != second.results[0].type:
        return 0
    _, contract, _ = _dot_dims(first)
    if len(contract[0]) != 1:
        return 0
    for s in (0, 1):
        if not same_but(shape_of(first.operands[s]), shape_of(second.operands[s]),
                        contract[s][0]):
            return 0
    for side in (0, 1):
        blocks = [b for d in dots for b in _ring_blocks(d.operands[side])]
        roots = [_ring_root(b) for b in blocks]
        if all(_same(r, roots[0]) for r in roots) and any(_permuted(b) for b in blocks):
            break
    else:
        return 0
    operands = [idioms.concat_blocks([first.operands[s], second.operands[s]], contract[s][0], add)
                for s in (0, 1)]
    clone = first.clone(ir.InsertionPoint(add))
    for s in (0, 1):
        set_operand(clone, s, operands[s])
    return _replace(add, clone.results[0])


# ---------------------------------------------------------------------------------------------
# Contributions sent back around the reverse ring (dK, dV)
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class _ReturnStep:
    """One level of `acc_i = x_i + collective_permute(acc_{i+1})` (the innermost has no add:
    `acc = x`): `x` is `views(dot)`."""

    add: ir.Operation | None
    permute: ir.Operation | None
    dot: ir.Operation
    views: tuple[ir.Operation, ...]


def _viewed_dot(value) -> tuple[ir.Operation, tuple[ir.Operation, ...]] | None:
    """(dot_general, the views and sums from it to `value`, innermost first) or None."""
    views: list[ir.Operation] = []
    op = defining_op(value)
    while op is not None and (op.name in _VIEW_OPS or sum_reduce(op)):
        views.append(op)
        op = defining_op(op.operands[0])
    if op is None or op.name != "stablehlo.dot_general" or len(op.operands) != 2:
        return None
    return op, tuple(reversed(views))


def _return_chain(add: ir.Operation) -> list[_ReturnStep] | None:
    """The levels of the accumulation ending at `add`, step 0 (no hop) first."""
    steps: list[_ReturnStep] = []
    node = add.results[0]
    while True:
        op = defining_op(node)
        if op is not None and op.name == "stablehlo.add":
            permutes = [i for i in (0, 1) if defining_op(op.operands[i]) is not None
                        and defining_op(op.operands[i]).name == "stablehlo.collective_permute"]
            if len(permutes) != 1:
                return None
            permute = defining_op(op.operands[permutes[0]])
            found = _viewed_dot(op.operands[1 - permutes[0]])
            if found is None:
                return None
            steps.append(_ReturnStep(op, permute, *found))
            node = permute.operands[0]
            continue
        found = _viewed_dot(node)
        if found is None:
            return None
        steps.append(_ReturnStep(None, None, *found))
        return steps


def _ring_return(add: ir.Operation) -> int:
    """The keys' and values' cotangents sent back around the reverse ring: `acc_0 = x_0 +
    P(acc_1)`, ..., `acc_{k-1} = x_{k-1}` (P collective_permutes: which ones does not matter
    to the rewrite, the walk judges where the contributions land),
    each `x_i = views(dot(a_i, b))` with one shared operand b, the same dimension numbers, and
    a_i of one shape with exactly one free dim f. Each `dot(a_i, b)` becomes slice i (along
    f's result dim) of `dot(concatenate(a_0, ..., a_{k-1}, f), b)`: exact for any a_i (a
    contraction's rows along a free dim are the contractions of the operand's rows). The
    views (transposes, reshapes) and sums (grouped-query attention's sum over the repeat of
    the heads) applied alike at every step move onto the whole contraction as long as they
    keep f's dim (`_whole_view`), the rest follows each slice. The
    concatenation then sinks like the forward's (`idioms._sink_concat`), so no per-step block
    stays alive; whether the slices, the permutes and the adds give the reference's cotangent
    is the walk's to judge (`rules/kinds/returning.py`). Only at the last level of a chain (the add
    no collective_permute reads), so the whole chain is taken at once."""
    if any(use.owner.name == "stablehlo.collective_permute" for use in uses_of(add.results[0])):
        return 0
    steps = _return_chain(add)
    if steps is None or len(steps) < 2:
        return 0
    first = steps[0].dot
    names = attr_names(first)
    if any(attr_names(s.dot) != names or any(
            not same_attribute(s.dot.attributes[n], first.attributes[n]) for n in names)
            or s.dot.results[0].type != first.results[0].type
            or [str(v.name) for v in s.views] != [str(v.name) for v in steps[0].views]
            for s in steps):
        return 0
    batch, _, free = _dot_dims(first)
    for shared in (0, 1):
        varying = 1 - shared
        if all(_same(s.dot.operands[shared], first.operands[shared]) for s in steps) and (
                len(free[varying]) == 1 and not all(
                    _same(s.dot.operands[varying], first.operands[varying]) for s in steps)):
            break
    else:
        return 0
    if any(s.dot.operands[varying].type != first.operands[varying].type for s in steps):
        return 0
    f = free[varying][0]
    out_dim = _result_dim(f, varying, batch, free)
    if any(a.results[0].type != b.results[0].type or any(
            not same_attribute(a.attributes[n], b.attributes[n])
            for n in ("permutation", "dimensions")
            if n in attr_names(b)) for s in steps for a, b in zip(s.views, steps[0].views)):
        return 0
    at = add
    joined = idioms.concat_blocks([s.dot.operands[varying] for s in steps], f, at)
    block = shape_of(first.results[0])[out_dim]
    shape = list(shape_of(first.results[0]))
    shape[out_dim] = block * len(steps)
    element = ir.RankedTensorType(first.results[0].type).element_type
    operands = [first.operands[shared], joined] if shared == 0 else [joined,
                                                                     first.operands[shared]]
    with ir.InsertionPoint(at), at.location:
        whole = ir.Operation.create("stablehlo.dot_general",
                                    results=[ir.RankedTensorType.get(shape, element)],
                                    operands=operands,
                                    attributes={n: first.attributes[n] for n in names},
                                    loc=first.location).results[0]
    moved = 0
    for view in steps[0].views:
        placed = _whole_view(view, whole, out_dim, len(steps), at)
        if placed is None:
            break
        whole, out_dim = placed
        moved += 1
    rank = len(shape_of(whole))
    parts = []
    for i, step in enumerate(steps):
        start = [0] * rank
        limit = list(shape_of(whole))
        start[out_dim], limit[out_dim] = i * block, (i + 1) * block
        with ir.InsertionPoint(at), at.location:
            value = stablehlo.SliceOp(whole, start, limit, [1] * rank).result
        for view in step.views[moved:]:
            clone = view.clone(ir.InsertionPoint(at))
            set_operand(clone, 0, value)
            value = clone.results[0]
        parts.append(value)
    acc = parts[-1]
    for i in range(len(steps) - 2, -1, -1):
        step = steps[i]
        permute = step.permute.clone(ir.InsertionPoint(at))
        set_operand(permute, 0, acc)
        new_add = step.add.clone(ir.InsertionPoint(at))
        which = 0 if step.add.operands[0] == step.permute.results[0] else 1
        set_operand(new_add, which, permute.results[0])
        set_operand(new_add, 1 - which, parts[i])
        acc = new_add.results[0]
    return _replace(add, acc)


def _whole_view(view: ir.Operation, whole, out_dim: int, count: int, at: ir.Operation):
    """(the view applied to the contraction over all the steps, where the steps' dim lands)
    when it commutes with cutting `whole` into `count` blocks along `out_dim` (a step's view
    then is the view's block); else None. A transpose moves the dim; a reshape that keeps it
    (the same size, the same number of elements before it: the elements before, at and after
    it keep their row-major indices) scales it; a sum over other dims keeps it."""
    element = ir.RankedTensorType(view.results[0].type).element_type
    if view.name == "stablehlo.transpose":
        permutation = i64s(view, "permutation")
        with ir.InsertionPoint(at), at.location:
            return stablehlo.TransposeOp(whole, permutation).result, permutation.index(out_dim)
    if view.name == "stablehlo.reshape":
        source, target = shape_of(view.operands[0]), list(shape_of(view.results[0]))
        kept = [e for e in range(len(target)) if target[e] == source[out_dim] and math.prod(
            target[:e]) == math.prod(source[:out_dim])]
        if not kept:
            return None
        target[kept[0]] *= count
        with ir.InsertionPoint(at), at.location:
            return stablehlo.ReshapeOp(ir.RankedTensorType.get(target, element),
                                       whole).result, kept[0]
    if sum_reduce(view):
        dims = i64s(view, "dimensions")
        if out_dim in dims:
            return None
        landed = out_dim - sum(d < out_dim for d in dims)
        shape = list(shape_of(view.results[0]))
        shape[landed] *= count
        clone = view.clone(ir.InsertionPoint(at))
        set_operand(clone, 0, whole)
        clone.results[0].set_type(ir.RankedTensorType.get(shape, element))
        return clone.results[0], landed
    return None


def _factors(value, out: list) -> None:
    """The leaves of the multiplication tree `value` is."""
    op = defining_op(value)
    if op is not None and op.name == "stablehlo.multiply":
        for operand in op.operands:
            _factors(operand, out)
    else:
        out.append(value)


def _constant_along(value, dims: list[int]) -> bool:
    """`value` is a broadcast_in_dim constant along `dims` (they are new or unit there)."""
    op = defining_op(value)
    return op is not None and op.name == "stablehlo.broadcast_in_dim" and all(
        created_by(op, d) for d in dims)


def _output_leaf(value):
    """(dot, permutation, e side) when `value` is `dot(e, v)` or `dot(v, e)` (e =
    exp(...)), maybe under one transpose (the einsum's, back to (b, s, h, d)); else None.
    `permutation` is the transpose's (the identity without one)."""
    op = defining_op(value)
    permutation = list(range(len(shape_of(value))))
    if op is not None and op.name == "stablehlo.transpose":
        permutation = i64s(op, "permutation")
        op = defining_op(op.operands[0])
    if op is None or op.name != "stablehlo.dot_general" or len(op.operands) != 2:
        return None
    sides = [s for s in (0, 1) if _is_exp(op.operands[s])]
    if len(sides) != 1:
        return None
    return op, permutation, sides[0]


def _reassociated(reduce: ir.Operation) -> int:
    """`reduce_add(x * g * T(dot(e, v)), d)` with d the value dim of `dot(e, v)` (e =
    exp(...) against values v, contracting the key dim k; either operand order; T an
    optional transpose; g constant along d) is `reduce_add(dot(x, v) * g' * e, k)` laid out
    as e (dot(x, v) contracting d, transposed to e's layout, the result transposed back
    to the reduction's): the sum over the values of the cotangent times the unnormalised
    output, read as the sum over the keys of the probabilities times the probabilities'
    cotangent (the softmax backward's form). Exact in real arithmetic (both are sum over d
    and k of x g e v); a regrouping of one sum of products, which every proof assumes, in
    floating point too where the leaves hold no infinity (`x - x` and `0 * x` fail for
    infinities). Only the infinities the program builds (masks, log of zero) are asked
    about (`overflow=False`): the leaves are exponentials of shifted scores, in [0, 1], and
    cotangents and values, unbounded; their overflow is not (the distributed products of
    the module docstring)."""
    if not sum_reduce(reduce):
        return 0
    dims = i64s(reduce, "dimensions")
    leaves: list = []
    _factors(reduce.operands[0], leaves)
    outputs = [(v, found) for v in leaves if (found := _output_leaf(v)) is not None]
    if len(outputs) != 1 or len(leaves) < 2 or len(dims) != 1:
        return 0
    leaf, (dot, permutation, e_side) = outputs[0]
    v_side = 1 - e_side
    batch, contract, free = _dot_dims(dot)
    if len(contract[e_side]) != 1 or len(free[v_side]) != 1:
        return 0
    value_dim = _result_dim(free[v_side][0], v_side, batch, free)
    r = dims[0]
    if permutation[r] != value_dim:
        return 0
    rest = [v for v in leaves if v is not leaf]
    along = [v for v in rest if not _constant_along(v, dims)]
    if len(along) != 1 or shape_of(along[0]) != shape_of(leaf):
        return 0
    if any(nonfinite_kinds(v, {}, overflow=False) & (NEG | POS)
           for v in leaves):
        return 0
    e = dot.operands[e_side]
    rank = len(shape_of(leaf))
    # e's dim for each dim of the dot's result (its contracted dim k for the value dim)
    e_of_result = [0] * rank
    for i, d in enumerate(batch[e_side]):
        e_of_result[i] = d
    for d in free[e_side]:
        e_of_result[_result_dim(d, e_side, batch, free)] = d
    e_of_result[value_dim] = contract[e_side][0]
    e_of_leaf = [e_of_result[permutation[i]] for i in range(rank)]
    x, v = along[0], dot.operands[v_side]
    element = ir.RankedTensorType(x.type).element_type
    e_shape = shape_of(e)
    x_in_result = _transposed(x, [permutation.index(j) for j in range(rank)], reduce)
    x_free = [j for j in range(rank) if j >= len(batch[0]) and j != value_dim]
    numbers = stablehlo.DotDimensionNumbers.get(
        lhs_batching_dimensions=list(range(len(batch[0]))),
        rhs_batching_dimensions=batch[v_side], lhs_contracting_dimensions=[value_dim],
        rhs_contracting_dimensions=free[v_side])
    # dot(x, v)'s dims: the batch dims, x's free dims (e's free dims), v's free dim (k)
    product_dims = ([e_of_result[j] for j in range(len(batch[0]))]
                    + [e_of_result[j] for j in x_free] + [contract[e_side][0]])
    product_shape = tuple(e_shape[d] for d in product_dims)
    with ir.InsertionPoint(reduce), reduce.location:
        product = stablehlo.DotGeneralOp(
            ir.RankedTensorType.get(product_shape, element), x_in_result, v, numbers,
            precision_config=dot.attributes["precision_config"]
            if "precision_config" in attr_names(dot) else None).result
    product = _transposed(product, [product_dims.index(t) for t in range(rank)], reduce)
    for g in rest:
        if g is x:
            continue
        op = defining_op(g)
        placed = [e_of_leaf[i] for i in i64s(op, "broadcast_dimensions")]
        order = sorted(range(len(placed)), key=lambda j: placed[j])
        source = _transposed(op.operands[0], order, reduce)
        with ir.InsertionPoint(reduce), reduce.location:
            spread = stablehlo.BroadcastInDimOp(ir.RankedTensorType.get(e_shape, element),
                                                source, sorted(placed)).result
            product = stablehlo.MulOp(product, spread).result
    with ir.InsertionPoint(reduce), reduce.location:
        product = stablehlo.MulOp(product, e).result
    clone = reduce.clone(ir.InsertionPoint(reduce))
    set_operand(clone, 0, product)
    set_attribute(clone, "dimensions", ir.DenseI64ArrayAttr.get([contract[e_side][0]]))
    kept = [e_of_leaf[i] for i in range(rank) if i != r]
    ranks = sorted(kept)
    clone.results[0].set_type(ir.RankedTensorType.get([e_shape[d] for d in ranks], element))
    return _replace(reduce, _transposed(clone.results[0], [ranks.index(t) for t in kept],
                                        reduce))


def _is_exp(value) -> bool:
    op = defining_op(value)
    return op is not None and op.name == "stablehlo.exponential"


REWRITES = {
    "stablehlo.reduce": _reassociated,
    "stablehlo.multiply": lambda op: _telescope(op) or _absorb(op),
    "stablehlo.broadcast_in_dim": _broadcast_out,
    "stablehlo.add": lambda op: (_add_out(op) or _contracted_sum(op) or _transposed_sum(op)
                                 or _ring_return(op)),
    "stablehlo.transpose": lambda op: _exp_out_of_transpose(op) or _transpose_out(op),
    "stablehlo.dot_general": lambda op: _dot_out(op) or _dot_divided(op),
}
"""The backward's rewrites by op name (entangle-normalize applies them once the forward's
folds are done, `rewrites.rewrite_idioms`)."""
