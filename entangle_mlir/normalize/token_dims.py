"""Flattened token dims: keep `(batch, seq)` apart through per-token computations.

Mixture-of-experts layers (and any token-wise block) flatten `(batch, seq, d)` to
`(batch * seq, d)`, compute per token, and reshape back. Under sequence parallelism the
sequence dim is split, so each device's flattened tokens are `batch` strided runs of the global
token dim: no tiling of the flattened dim describes them. The per-token computation itself never
mixes the two factors, so it can be written with both dims kept. `split_token_dims` does that
rewrite, in place, on every connected *token region*: the values reachable from a merging
reshape `(.., b, s, ..) -> (.., b*s, ..)` through ops that treat the merged dim as one index
(elementwise ops, broadcasts, transposes, reductions, dot_general batch/free/contracting dims,
top_k rows, scatter batching dims, iota and splat constants along other dims), up to the
reshapes that split it back. Every value of the region gets `(b, s)` in place of its token dim,
every dim attribute is renumbered, and the merging and splitting reshapes disappear.

The rewrite is exact (each op computes the same elements, indexed by `(i // s, i % s)` instead of
`i`), so it is sound on any program; it runs on the reference and the sharded program alike
(entangle-normalize), where it makes the sequence split a plain tiling. A region that reaches an
op not listed here, a block argument, a function result or a dim of the same size used another
way is left untouched.
"""

from __future__ import annotations

from jaxlib.mlir import ir
from jaxlib.mlir.dialects import stablehlo

from entangle_mlir.core.traits import ELEMENTWISE_OPS
from entangle_mlir.mlir.opinfo import op_location

NONE = -1
"""A value of the region's ops that has no token dim (a weight, a scalar, an init value)."""

_ELEMENTWISE = frozenset(ELEMENTWISE_OPS)


class _Refuse(Exception):
    """The region reaches something the rewrite does not handle: leave it alone."""


def _shape(value) -> tuple[int, ...]:
    return tuple(ir.RankedTensorType(value.type).shape)


def _owner(value):
    owner = value.owner
    if isinstance(owner, ir.Block):
        return None
    return owner.operation if hasattr(owner, "operation") else owner


def _merge_dim(src: tuple[int, ...], dst: tuple[int, ...]) -> int | None:
    """p when `dst` is `src` with dims p, p+1 (both > 1) merged into one."""
    if len(dst) != len(src) - 1:
        return None
    for p in range(len(dst)):
        if (src[:p] == dst[:p] and src[p + 2:] == dst[p + 1:] and src[p] > 1 and src[p + 1] > 1
                and src[p] * src[p + 1] == dst[p]):
            return p
    return None


def _prod(xs) -> int:
    out = 1
    for x in xs:
        out *= x
    return out


def _kept_dim(src: tuple[int, ...], p: int, dst: tuple[int, ...]) -> int | None:
    """The dim of a reshape's result that holds dim p of its operand unchanged (same size, the
    same number of elements before it), if any."""
    before = _prod(src[:p])
    for q, size in enumerate(dst):
        if size == src[p] and _prod(dst[:q]) == before:
            return q
    return None


def _i64s(op, name) -> list[int]:
    return list(ir.DenseI64ArrayAttr(op.attributes[name]))


class _Region:
    """One connected token region: the token dim of every value in it, the factors (b, s)."""

    def __init__(self, factors: tuple[int, int]):
        self.factors = factors
        self.dims: dict[object, int] = {}
        self.ops: dict[object, ir.Operation] = {}

    def assign(self, value, dim: int | None, queue: list) -> None:
        if dim is None:
            return
        known = self.dims.get(value)
        if known is None:
            if dim != NONE and _shape(value)[dim] != self.factors[0] * self.factors[1]:
                raise _Refuse("token dim of the wrong size")
            self.dims[value] = dim
            if dim != NONE:
                queue.append(value)
        elif known != dim:
            raise _Refuse("a value with two token dims")


def _complete(op, region: _Region, final: bool) -> tuple[list, list]:
    """The token dim of each operand and result of `op` (None: not known yet), from the ones
    known; raises `_Refuse` when the op cannot keep the factors apart. With `final`, unknown
    dims count as NONE."""
    name = op.name
    default = NONE if final else None
    ins = [region.dims.get(v, default) for v in op.operands]
    outs = [region.dims.get(v, default) for v in op.results]

    def known(xs):
        return [x for x in xs if x is not None]

    if name in _ELEMENTWISE:
        shape = _shape(op.results[0])
        full = [i for i, v in enumerate(op.operands) if _shape(v) == shape]
        if len(full) + sum(1 for v in op.operands if _shape(v) == ()) != len(ins):
            raise _Refuse("elementwise op with broadcast operands")
        seen = set(known([ins[i] for i in full]) + known(outs))
        if len(seen) > 1:
            raise _Refuse("elementwise operands disagree")
        d = seen.pop() if seen else None
        new_ins = [d if i in full else NONE for i in range(len(ins))]
        return new_ins, [d] * len(outs)
    if name == "stablehlo.reshape":
        src, dst = _shape(op.operands[0]), _shape(op.results[0])
        (p,), (q,) = ins, outs
        if p is not None and p != NONE:
            kept = _kept_dim(src, p, dst)
            if kept is not None:
                return [p], [kept]
            if _split_at(src, p, dst, region.factors) is not None:
                return [p], [NONE]
            raise _Refuse("reshape regroups the token dim")
        if q is not None and q != NONE:
            kept = _kept_dim(dst, q, src)
            if p is None and kept is not None:
                return [kept], [q]
            if _merge_dim(src, dst) == q and src[q:q + 2] == region.factors:
                return [NONE], [q]
            raise _Refuse("reshape regroups the token dim")
        return ins, outs
    if name == "stablehlo.broadcast_in_dim":
        dims = _i64s(op, "broadcast_dimensions")
        src, dst = _shape(op.operands[0]), _shape(op.results[0])
        (p,), (q,) = ins, outs
        if p is not None and p != NONE:
            if src[p] != dst[dims[p]]:
                raise _Refuse("broadcast of the token dim")
            return [p], [dims[p]]
        if q is not None and q != NONE:
            if q in dims and src[dims.index(q)] != 1:
                return [dims.index(q)], [q]
            return [NONE], [q]
        if q == NONE and p is None and final:
            return [NONE], [NONE]
        return ins, outs
    if name == "stablehlo.transpose":
        perm = _i64s(op, "permutation")
        (p,), (q,) = ins, outs
        if p is not None and p != NONE:
            return [p], [perm.index(p)]
        if q is not None and q != NONE:
            return [perm[q]], [q]
        return ins, outs
    if name == "stablehlo.reduce":
        n = len(op.results)
        dims = _i64s(op, "dimensions")
        seen = set(known(ins[:n]))
        if len(seen) > 1:
            raise _Refuse("reduce operands disagree")
        p = seen.pop() if seen else None
        q = next((x for x in outs if x is not None and x != NONE), None)
        if p is None and q is not None:
            p = [d for d in range(len(_shape(op.operands[0]))) if d not in dims][q]
        if p is None:
            return ins, outs
        if p == NONE:
            q = NONE
        else:
            q = NONE if p in dims else p - sum(1 for d in dims if d < p)
        if any(x is not None and x != q for x in outs):
            raise _Refuse("reduce results disagree")
        return [p] * n + [NONE] * n, [q] * n
    if name == "stablehlo.dot_general":
        return _complete_dot(op, ins, outs, final)
    if name == "chlo.top_k":
        rank = len(_shape(op.operands[0]))
        d = next((x for x in ins + outs if x is not None), None)
        if d is None:
            return ins, outs
        if d == rank - 1:
            raise _Refuse("top_k along the token dim")
        return [d], [d, d]
    if name == "stablehlo.iota":
        (q,) = outs
        if q is not None and q != NONE and op.attributes["iota_dimension"].value == q:
            raise _Refuse("iota along the token dim")
        return [], outs
    if name == "stablehlo.constant":
        (q,) = outs
        if q is not None and q != NONE and not ir.DenseElementsAttr(
                op.attributes["value"]).is_splat:
            raise _Refuse("non-splat constant with a token dim")
        return [], outs
    if name == "stablehlo.scatter":
        return _complete_scatter(op, ins, outs)
    raise _Refuse(f"{name} is not handled")


def _split_at(src, p, dst, factors) -> int | None:
    """q when the reshape `src -> dst` splits dim p of `src` into `factors` at q, q+1."""
    q = _merge_dim(dst, src)
    if q is None or q != p or tuple(dst[q:q + 2]) != tuple(factors):
        return None
    return q


def _dot_numbers(op):
    n = stablehlo.DotDimensionNumbers(op.attributes["dot_dimension_numbers"])
    return (list(n.lhs_batching_dimensions), list(n.rhs_batching_dimensions),
            list(n.lhs_contracting_dimensions), list(n.rhs_contracting_dimensions))


def _complete_dot(op, ins, outs, final):
    lb, rb, lc, rc = _dot_numbers(op)
    lrank, rrank = len(_shape(op.operands[0])), len(_shape(op.operands[1]))
    lfree = [d for d in range(lrank) if d not in lb and d not in lc]
    rfree = [d for d in range(rrank) if d not in rb and d not in rc]
    p, r = ins[0], ins[1]
    (q,) = outs
    if q is not None and q != NONE:
        if q < len(lb):
            want = (lb[q], rb[q])
        elif q < len(lb) + len(lfree):
            want = (lfree[q - len(lb)], NONE)
        else:
            want = (NONE, rfree[q - len(lb) - len(lfree)])
    elif p is not None and p != NONE:
        if p in lb:
            want = (p, rb[lb.index(p)])
        elif p in lc:
            want = (p, rc[lc.index(p)])
        else:
            want = (p, NONE)
    elif r is not None and r != NONE:
        if r in rb:
            want = (lb[rb.index(r)], r)
        elif r in rc:
            want = (lc[rc.index(r)], r)
        else:
            want = (NONE, r)
    else:
        if final or (p == NONE and r == NONE):
            return [NONE, NONE], [NONE]
        return ins, outs
    for got, w in zip((p, r), want):
        if got is not None and got != w:
            raise _Refuse("dot_general pairs the token dim with another dim")
    lp, rp = want
    if lp != NONE and rp != NONE:
        q_new = lb.index(lp) if lp in lb else NONE
        if lp in lb and rb[lb.index(lp)] != rp or lp in lc and rc[lc.index(lp)] != rp:
            raise _Refuse("dot_general pairs the token dim with another dim")
        if lp not in lb and lp not in lc:
            raise _Refuse("two token dims in one dot_general result")
    elif lp != NONE:
        if lp in lb or lp in lc:
            raise _Refuse("dot_general pairs the token dim with a weight dim")
        q_new = len(lb) + lfree.index(lp)
    else:
        if rp in rb or rp in rc:
            raise _Refuse("dot_general pairs the token dim with a weight dim")
        q_new = len(lb) + len(lfree) + rfree.index(rp)
    if q is not None and q != q_new:
        raise _Refuse("dot_general result disagrees")
    return [lp, rp], [q_new]


def _scatter_numbers(op):
    return stablehlo.ScatterDimensionNumbers(op.attributes["scatter_dimension_numbers"])


SCATTER_DIM = "the token dim is a scatter dim of the indices and updates (not a batching dim)"
"""Why a region reaching a scatter through its indices' scatter dims is refused: splitting
that dim would need the index vector dim and the updates' scatter dims renumbered too, which
`_rewrite_scatter` does not do (jnp.bincount of a raveled id block: the indices came out
(16, 2, 1) against updates (32,))."""


def _complete_scatter(op, ins, outs):
    """A single-operand scatter whose token dim is a batching dim of operand and indices."""
    if len(op.operands) != 3 or len(op.results) != 1:
        raise _Refuse("variadic scatter")
    n = _scatter_numbers(op)
    ib, sb = list(n.input_batching_dims), list(n.scatter_indices_batching_dims)
    uw = list(n.update_window_dims)
    ivd = n.index_vector_dim
    irank = len(_shape(op.operands[1]))
    urank = len(_shape(op.operands[2]))
    index_dims = [d for d in range(irank) if d != ivd]
    update_scatter = [d for d in range(urank) if d not in uw]
    p = next((x for x in (ins[0], outs[0]) if x is not None and x != NONE), None)
    i = ins[1] if ins[1] is not None and ins[1] != NONE else None
    u = ins[2] if ins[2] is not None and ins[2] != NONE else None
    if p is None and i is not None and i in sb:
        p = ib[sb.index(i)]
    if p is None and u is not None and u in update_scatter:
        k = index_dims[update_scatter.index(u)]
        if k not in sb:
            raise _Refuse(SCATTER_DIM)
        p = ib[sb.index(k)]
    if p is None and i is not None and i not in sb:
        raise _Refuse(SCATTER_DIM)
    if p is None:
        return ins, outs
    if p not in ib:
        raise _Refuse("scatter into the token dim")
    k = sb[ib.index(p)]
    want = [p, k, update_scatter[index_dims.index(k)]]
    for got, w in zip(ins, want):
        if got is not None and got != w:
            raise _Refuse("scatter operands disagree")
    if outs[0] is not None and outs[0] != p:
        raise _Refuse("scatter result disagrees")
    return want, [p]


def split_token_dims(modules: list[ir.Module], listed: list | None = None) -> int:
    """Rewrite in place the token regions that the reference and the sharded program both have;
    the number of regions rewritten.

    The two programs are the two modules (or, for one module holding both, its two functions
    with merging reshapes). A region is rewritten only if its counterpart (the same merging
    source lines, as many times) is rewritable in the other program too: rewriting one side
    alone would be exact but would leave the two programs further apart (a sharded region that
    crosses an all_to_all, say, while the reference's does not). Programs whose merging reshapes
    share no source line (hand-written MLIR) pair their regions in program order.

    `listed`: per module, its ops as `ir.ops_in_order` lists them now, or None (saves walks).
    """
    if len(modules) == 2:
        listed = listed or [None, None]
        programs = [_merges(m.operation, ops) for m, ops in zip(modules, listed)]
    else:
        programs = [merges for func in modules[0].body.operations
                    if (merges := _merges(func.operation))]
    if len(programs) != 2 or not all(programs):
        return 0
    found = [_regions(merges) for merges in programs]
    blocked = {p for regions in found for region, key in regions if region is None for p in key}
    counts: list[dict] = [{}, {}]
    for side, regions in enumerate(found):
        for region, key in regions:
            if region is not None:
                counts[side][key] = counts[side].get(key, 0) + 1
    keys = {key for key, n in counts[0].items()
            if counts[1].get(key) == n and not set(key) & blocked}
    chosen = [r for regions in found for r, key in regions if key in keys]
    if not set(counts[0]) & set(counts[1]) and len(found[0]) == len(found[1]):
        # Locations that are not shared source lines (two hand-written functions of one MLIR
        # file): the regions correspond in program order.
        chosen = [r for pair in zip(*found) if all(r is not None for r, _ in pair)
                  for r, _ in pair]
    with ir.Location.unknown():
        for region in chosen:
            _rewrite(region)
    return len(chosen)


def _merges(func: ir.Operation, ops: list | None = None) -> list[ir.Operation]:
    merges: list[ir.Operation] = []

    def collect(op):
        if op.name == "stablehlo.reshape" and _merge_dim(
                _shape(op.operands[0]), _shape(op.results[0])) is not None:
            merges.append(op)
        return ir.WalkResult.ADVANCE

    if ops is None:
        func.walk(collect)
    else:
        for name, op in ops:
            if name == "stablehlo.reshape":
                collect(op)
    return merges


def _regions(merges: list[ir.Operation]) -> list[tuple[_Region | None, tuple]]:
    """Each seed's region (None: not rewritable) and its key: the source positions of the
    merging reshapes it contains."""
    done: set = set()
    out = []
    for seed in merges:
        if seed.results[0] in done:
            continue
        region = _explore(seed)
        if region is None:
            done.add(seed.results[0])
            out.append((None, (_position(seed),)))
            continue
        done.update(region.dims)
        seeds = [op for op in region.ops.values() if op.name == "stablehlo.reshape"
                 and region.dims.get(op.operands[0], NONE) == NONE]
        out.append((region, tuple(sorted(_position(op) for op in seeds))))
    return out


def _position(op: ir.Operation) -> str:
    loc = op_location(op, "-")
    return str(loc) if loc is not None else "?"


def _explore(seed: ir.Operation) -> _Region | None:
    src, dst = _shape(seed.operands[0]), _shape(seed.results[0])
    p = _merge_dim(src, dst)
    region = _Region((src[p], src[p + 1]))
    queue: list = []
    try:
        region.assign(seed.results[0], p, queue)
        region.ops[seed] = seed
        while queue:
            value = queue.pop()
            neighbours = [use.owner for use in value.uses]
            owner = _owner(value)
            if owner is None:
                raise _Refuse("block argument")
            neighbours.append(owner)
            for op in neighbours:
                op = op.operation if hasattr(op, "operation") else op
                if op.name in ("func.return", "stablehlo.return"):
                    raise _Refuse("the token dim leaves the function")
                region.ops[op] = op
                ins, outs = _complete(op, region, final=False)
                for v, d in zip(list(op.operands) + list(op.results), ins + outs):
                    region.assign(v, d, queue)
        for op in list(region.ops.values()):
            ins, outs = _complete(op, region, final=True)
            for v, d in zip(list(op.operands) + list(op.results), ins + outs):
                if region.dims.get(v, NONE) != d:
                    raise _Refuse("inconsistent token dims")
    except _Refuse:
        return None
    return region


def _expand(dims: list[int], p: int) -> list[int]:
    """Dim indices of a value whose token dim p became two dims."""
    out = []
    for d in dims:
        if d == p:
            out += [p, p + 1]
        else:
            out.append(d + 1 if d > p else d)
    return out


def _shift(d: int, p: int) -> int:
    return d + 1 if p != NONE and d > p else d


def _expanded_type(value, p: int, factors) -> ir.RankedTensorType:
    shape = list(_shape(value))
    shape[p:p + 1] = list(factors)
    return ir.RankedTensorType.get(shape, ir.RankedTensorType(value.type).element_type)


def _rewrite(region: _Region) -> None:
    factors = region.factors
    order = list(region.ops.values())
    for op in order:
        ins = [region.dims.get(v, NONE) for v in op.operands]
        outs = [region.dims.get(v, NONE) for v in op.results]
        name = op.name
        if name == "stablehlo.reshape" and (ins[0] == NONE or outs[0] == NONE):
            continue
        if name == "stablehlo.broadcast_in_dim":
            dims = _i64s(op, "broadcast_dimensions")
            p, q = ins[0], outs[0]
            if p != NONE:
                new = _expand_pairs(dims, p, q)
            else:
                new = [_shift(d, q) for d in dims]
            op.attributes["broadcast_dimensions"] = ir.DenseI64ArrayAttr.get(new)
        elif name == "stablehlo.transpose":
            perm = _i64s(op, "permutation")
            p, q = ins[0], outs[0]
            new = []
            for j, src in enumerate(perm):
                new += [p, p + 1] if j == q else [_shift(src, p)]
            op.attributes["permutation"] = ir.DenseI64ArrayAttr.get(new)
        elif name == "stablehlo.reduce":
            p = ins[0]
            if p != NONE:
                dims = _i64s(op, "dimensions")
                op.attributes["dimensions"] = ir.DenseI64ArrayAttr.get(sorted(_expand(dims, p)))
        elif name == "stablehlo.dot_general":
            _rewrite_dot(op, ins[0], ins[1])
        elif name == "stablehlo.iota":
            dim = op.attributes["iota_dimension"].value
            op.attributes["iota_dimension"] = ir.IntegerAttr.get(
                ir.IntegerType.get_signless(64), _shift(dim, outs[0]))
        elif name == "stablehlo.constant":
            attr = ir.DenseElementsAttr(op.attributes["value"])
            op.attributes["value"] = ir.DenseElementsAttr.get_splat(
                _expanded_type(op.results[0], outs[0], factors), attr.get_splat_value())
        elif name == "stablehlo.scatter":
            _rewrite_scatter(op, ins)
        for result, q in zip(op.results, outs):
            if q != NONE:
                result.set_type(_expanded_type(result, q, factors))
    for op in order:
        if op.name != "stablehlo.reshape":
            continue
        p, q = region.dims.get(op.operands[0], NONE), region.dims.get(op.results[0], NONE)
        if p == NONE or q == NONE:
            op.results[0].replace_all_uses_with(op.operands[0])
            op.erase()


def _expand_pairs(dims: list[int], p: int, q: int) -> list[int]:
    """broadcast_dimensions when operand dim p (mapped to result dim q) becomes two dims."""
    out = []
    for i, d in enumerate(dims):
        if i == p:
            out += [q, q + 1]
        else:
            out.append(_shift(d, q))
    return out


def _rewrite_dot(op, p: int, r: int) -> None:
    lb, rb, lc, rc = _dot_numbers(op)

    def pairs(ls, rs):
        new_l, new_r = [], []
        for a, b in zip(ls, rs):
            if a == p and b == r:
                new_l += [a, a + 1]
                new_r += [b, b + 1]
            else:
                new_l.append(_shift(a, p))
                new_r.append(_shift(b, r))
        return new_l, new_r

    lb, rb = pairs(lb, rb)
    lc, rc = pairs(lc, rc)
    op.attributes["dot_dimension_numbers"] = stablehlo.DotDimensionNumbers.get(
        lhs_batching_dimensions=lb, rhs_batching_dimensions=rb,
        lhs_contracting_dimensions=lc, rhs_contracting_dimensions=rc)


def _rewrite_scatter(op, ins) -> None:
    p, k, u = ins
    if p == NONE:
        return
    n = _scatter_numbers(op)
    op.attributes["scatter_dimension_numbers"] = stablehlo.ScatterDimensionNumbers.get(
        update_window_dims=[_shift(d, u) for d in n.update_window_dims],
        inserted_window_dims=[_shift(d, p) for d in n.inserted_window_dims],
        input_batching_dims=_expand(list(n.input_batching_dims), p),
        scatter_indices_batching_dims=_expand(list(n.scatter_indices_batching_dims), k),
        scattered_dims_to_operand_dims=[_shift(d, p) for d in n.scattered_dims_to_operand_dims],
        index_vector_dim=_shift(n.index_vector_dim, k))
