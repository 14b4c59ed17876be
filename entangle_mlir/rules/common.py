"""Helpers shared by the rule families and the value kinds (`kinds/`): poly dims, splats,
layout agreement, which ops are elementwise, iotas, sums."""

from __future__ import annotations

import operator
from dataclasses import replace
from fractions import Fraction

from entangle_mlir.core.mesh import axes_str
from entangle_mlir.core.relations import (
    DEVICE_BLOCK_VALUES,
    GLOBAL,
    DeviceScalar,
    Masked,
    Opaque,
    Rel,
    Value,
)
from entangle_mlir.core.terms import (
    ARITHMETIC_TERM_OPS,
    Term,
    linear_parts,
    make_broadcast,
    make_iota,
    make_lin,
    make_op,
    make_reshape,
    make_splat,
    make_transpose,
    rebuild_elementwise,
    scale,
    single_scaled,
    splat_value,
)
from entangle_mlir.core.traits import ELEMENTWISE_OPS
from entangle_mlir.mlir.opinfo import OpInfo
from entangle_mlir.rules.base import RuleContext

COMPARISONS = {"EQ": operator.eq, "NE": operator.ne, "LT": operator.lt, "LE": operator.le,
               "GT": operator.gt, "GE": operator.ge}
"""stablehlo.compare's directions on exact numbers."""


def first_opaque(values: list[Value]) -> Opaque | None:
    for value in values:
        if isinstance(value, Opaque):
            return value
    return None


def replicated(term: Term, ctx: RuleContext, poly: frozenset[int] = frozenset()) -> Rel:
    """A value identical on every device (or a global value outside manual computations)."""
    return Rel(term, ((),) * len(term.shape), poly=poly,
               scope=GLOBAL if ctx.is_global else "")


def splat_rel(value, shape: tuple[int, ...], dtype: str, ctx: RuleContext) -> Rel:
    """A splat constant: every dim is poly, so it adapts to whatever it is combined with."""
    return uniform_rel(make_splat(value, shape, dtype), ctx)


def uniform_rel(term: Term, ctx: RuleContext) -> Rel:
    """A value equal at every position (a splat, a broadcast scalar): every dim is poly."""
    is_global = ctx.is_global
    return Rel(term, ((),) * len(term.shape),
               poly=frozenset() if is_global else frozenset(range(len(term.shape))),
               scope=GLOBAL if is_global else "")


def local_iota(rel: Rel, ctx: RuleContext) -> Rel:
    """An iota built at the local shape (jax's indices for argmax and argsort) is constant
    along its other dims, as a broadcast is: those dims take the size and split of the values
    it is paired with (`unify_dims`)."""
    term = rel.term
    if ctx.is_global or rel.tiled_axes or rel.partial or rel.poly or term.op != "broadcast" \
            or term.args[0].op != "iota":
        return rel
    (dims,) = term.attrs
    return replace(rel, poly=frozenset(d for d in range(len(term.shape)) if d not in dims))


def freeze(rel: Rel) -> Rel:
    """Forget poly dims: the local size is taken as the global one (always sound)."""
    if not rel.poly:
        return rel
    return Rel(rel.term, rel.tiling, rel.partial, rel.kind, frozenset(), rel.scope,
               rel.partial_origin)


def resize(term: Term, dim: int, size: int) -> Term | None:
    """The same constant-along-`dim` value with `dim` of global size `size`, if derivable."""
    if term.shape[dim] == size:
        return term
    shape = term.shape[:dim] + (size,) + term.shape[dim + 1:]
    if term.op == "splat":
        return make_splat(term.attrs[0], shape, term.dtype)
    if term.op == "broadcast":
        (dims,) = term.attrs
        operand = term.args[0]
        if dim in dims and operand.shape[dims.index(dim)] != 1:
            return None
        return make_broadcast(operand, dims, shape)
    if term.shape[dim] == 1:
        return make_broadcast(term, tuple(range(len(shape))), shape)
    if term.op == "transpose":
        (perm,) = term.attrs
        inner = resize(term.args[0], perm[dim], size)
        return None if inner is None else make_transpose(inner, perm)
    if term.op == "reshape" and term.args[0].shape == tuple(
            s for d, s in enumerate(term.shape) if d != dim) and term.shape[dim] == 1:
        return make_broadcast(term.args[0], tuple(d for d in range(len(shape)) if d != dim),
                              shape)
    if term.op == "lin":
        pairs, constant = linear_parts(term)
        resized = [(k, resize(t, dim, size)) for k, t in pairs]
        if any(t is None for _, t in resized):
            return None
        return make_lin(resized, constant, shape, term.dtype)
    if term.op in ARITHMETIC_TERM_OPS or (term.op.startswith("stablehlo.")
                                          and is_elementwise_term(term)):
        args = [resize(a, dim, size) for a in term.args]
        if any(a is None for a in args):
            return None
        return rebuild_elementwise(term, tuple(args))
    return None


def is_elementwise_term(term: Term) -> bool:
    return term.op in ELEMENTWISE_OPS and all(a.shape == term.shape for a in term.args)


def _local_shape_ok(rel: Rel, local: tuple[int, ...], ctx: RuleContext) -> bool:
    expected = tuple(
        size if dim in rel.poly or ctx.is_global
        else size // ctx.mesh.group_size(axes) if ctx.mesh else size
        for dim, (size, axes) in enumerate(zip(rel.term.shape, rel.tiling)))
    return expected == tuple(local)


def check_local_shapes(info: OpInfo, results: list[Value], ctx: RuleContext) -> list[Value]:
    """Guard every rule: a relation whose local shape disagrees with the op's type is dropped."""
    mesh, is_global = ctx.mesh, ctx.is_global
    if mesh is None and not is_global:
        return results
    checked = []
    for value, rtype in zip(results, info.result_types):
        if isinstance(value, Rel):
            local = rtype.shape
            expected = value.term.shape if is_global or not (mesh and any(value.tiling)) else (
                tuple(size if dim in value.poly else size // mesh.group_size(axes)
                      for dim, (size, axes) in enumerate(zip(value.term.shape, value.tiling))))
            if expected != local or len(value.tiling) != len(local):
                value = Opaque(f"internal: inferred local shape {expected} does not match the "
                               f"op's type {local}", category="internal")
        elif isinstance(value, DEVICE_BLOCK_VALUES):
            rels = [value.rel] + ([value.pred.rel] if isinstance(value, Masked) else [])
            if any(not _local_shape_ok(rel, rtype.shape, ctx) for rel in rels):
                value = Opaque("internal: a device mask's local shape does not match the "
                               "op's type", category="internal")
        elif isinstance(value, DeviceScalar) and value.shape != rtype.shape:
            value = Opaque("internal: device scalar shape mismatch", category="internal")
        checked.append(value)
    return checked


def unify_dims(rels: list[Rel], dims_of: list[list[int]], ctx: RuleContext,
               what: str) -> tuple[list[Rel], list[tuple[int, tuple[str, ...]]], set[int]] | Opaque:
    """Make operands agree dim by dim: `dims_of[k][i]` is operand k's dim for joint dim i.

    Returns the operands with poly dims resized, the joint (global size, tiling) per dim and the
    joint dims that stay poly (every operand poly there).
    """
    first, dims0 = rels[0], dims_of[0]
    shape0, tiling0 = first.term.shape, first.tiling
    for rel, dims in zip(rels, dims_of):
        if rel.poly or rel.term.shape != shape0 or rel.tiling != tiling0 or dims != dims0:
            break
    else:
        # Operands laid out alike (the common case): every joint dim is theirs, none resized.
        return list(rels), [(shape0[d], tiling0[d]) for d in dims0], set()
    joint: list[tuple[int, tuple[str, ...]]] = []
    still_poly: set[int] = set()
    mesh = ctx.mesh
    count = len(dims_of[0])
    for i in range(count):
        fixed = [(rel.term.shape[d[i]], rel.tiling[d[i]]) for rel, d in zip(rels, dims_of)
                 if d[i] not in rel.poly and not _unit(rel, d[i])]
        if not fixed:
            fixed = [(rel.term.shape[d[i]], rel.tiling[d[i]]) for rel, d in zip(rels, dims_of)
                     if d[i] not in rel.poly]
        if not fixed:
            sizes = {rel.term.shape[d[i]] for rel, d in zip(rels, dims_of)}
            if len(sizes) != 1:
                # Several poly operands of different local sizes (only 1 vs n can occur).
                sizes.discard(1)
            joint.append((max(sizes), ()))
            still_poly.add(i)
            continue
        size, axes = fixed[0]
        for other_size, other_axes in fixed[1:]:
            if (other_size, other_axes) != (size, axes):
                return Opaque(_disagree(what, i, axes, other_axes, size, other_size),
                              category="layout_mismatch")
        joint.append((size, axes))
    resized = []
    for rel, dims in zip(rels, dims_of):
        term, tiling = rel.term, list(rel.tiling)
        for i, d in enumerate(dims):
            if (d not in rel.poly and not _unit(rel, d)) or i in still_poly:
                continue
            if _unit(rel, d) and (term.shape[d], tiling[d]) == joint[i]:
                continue
            size, axes = joint[i]
            blocks = mesh.group_size(axes) if mesh and axes else 1
            local = term.shape[d]
            if local * blocks != size:
                return Opaque(f"{what}: dim {i} has local size {local} but its partner is "
                              f"{size} split {blocks} ways", category="layout_mismatch")
            new_term = resize(term, d, size)
            if new_term is None:
                return Opaque(f"{what}: cannot widen dim {d} of a broadcast value",
                              category="internal")
            term = new_term
            tiling[d] = axes
        poly = frozenset(d for i, d in enumerate(dims) if d in rel.poly and i in still_poly)
        resized.append(Rel(term, tuple(tiling), rel.partial, rel.kind, poly, rel.scope,
                           rel.partial_origin))
    return resized, joint, still_poly


def _unit(rel: Rel, dim: int) -> bool:
    """A whole (untiled) dim of size 1 broadcasts like a poly dim: it is constant along itself."""
    return rel.term.shape[dim] == 1 and not rel.tiling[dim] and rel.scope != GLOBAL


def _disagree(what: str, dim: int, axes_a, axes_b, size_a, size_b) -> str:
    def words(axes):
        return f"split over {axes_str(axes)}" if axes else "not split"

    if axes_a != axes_b:
        return (f"{what}: operands are laid out differently along dim {dim} "
                f"({words(axes_a)} vs {words(axes_b)})")
    return f"{what}: operands have different global sizes along dim {dim} ({size_a} vs {size_b})"


def is_zero(rel: Rel) -> bool:
    return splat_value(rel.term) == 0


def device_offsets(value: Value, count: int) -> tuple[int, ...] | None:
    """An integer start index per device: a device table, or a constant (the same on all
    `count` devices); None when it is neither (data-dependent)."""
    if isinstance(value, DeviceScalar):
        return value.values
    constant = splat_value(value.term) if isinstance(value, Rel) else None
    if isinstance(constant, Fraction) and constant.denominator == 1:
        return (int(constant),) * count
    return None


def iota_dim(term: Term) -> tuple[int, Fraction] | None:
    """(dim, factor) when term == factor * iota along dim (possibly broadcast)."""
    factor, base = single_scaled(term)
    if base.op == "iota":
        return base.attrs[0], factor
    if base.op == "broadcast" and base.args[0].op == "iota":
        (dims,) = base.attrs
        inner = base.args[0]
        return dims[inner.attrs[0]], factor
    if base.op == "reshape" and base.args[0].op == "iota" and len(base.args[0].shape) == 1:
        big = [d for d, size in enumerate(base.shape) if size != 1]
        if len(big) == 1 and base.shape[big[0]] == base.args[0].shape[0]:
            return big[0], factor
    return None


def widen_iota(term: Term, dim: int, size: int) -> Term | None:
    """`term` (a scaled iota along `dim`, possibly broadcast or reshaped: `iota_dim`) with
    `dim` of size `size`: the global iota a device's block of it is cut from."""
    factor, base = single_scaled(term)
    shape = base.shape[:dim] + (size,) + base.shape[dim + 1:]
    if base.op == "iota":
        widened = make_iota(shape, base.attrs[0], base.dtype)
    elif base.op == "reshape":
        widened = make_reshape(make_iota((size,), 0, base.dtype), shape)
    else:
        (dims,) = base.attrs
        inner = base.args[0]
        inner_shape = list(inner.shape)
        inner_shape[inner.attrs[0]] = size
        widened = make_broadcast(make_iota(tuple(inner_shape), inner.attrs[0], inner.dtype),
                                 dims, shape)
    return scale(widened, factor) if factor != 1 else widened


def sum_term(term: Term, dims: tuple[int, ...], shape: tuple[int, ...], dtype: str) -> Term:
    """`reduce_sum(term, dims)` (of result `shape`), looking through a reshape that only adds or
    drops unit dims, and merging it with a reduce_sum right under that reshape.

    jax sums a broadcast bias's cotangent in two steps with a keepdims reshape between them;
    with one sequence per device the local program keeps a different split of the same sum
    (the batch dim summed in the second step, not the first). Both are one sum over the union
    of the dims, so they meet: `reduce_sum(reshape(reduce_sum(t, d1)), d2)` is
    `reshape(reduce_sum(t, d1 + d2'))`, d2' being d2 read through the reshape (a reduced unit
    dim sums one element)."""
    k, base = single_scaled(term)
    if base.op == "reshape":
        mapped = _through_unit_reshape(base.args[0].shape, base.shape, dims)
        if mapped is not None:
            k_inner, inner = single_scaled(base.args[0])
            if inner.op == "reduce_sum" and len(inner.args) == 1:
                source, done = inner.args[0], tuple(inner.attrs[0])
                kept = [d for d in range(len(source.shape)) if d not in done]
                merged = tuple(sorted(set(done) | {kept[d] for d in mapped}))
                factor = k * k_inner
            else:
                source, merged, factor = base.args[0], tuple(mapped), k
            out = source
            if merged:
                reduced = tuple(n for d, n in enumerate(source.shape) if d not in merged)
                out = make_op("reduce_sum", (source,), (merged,), reduced, dtype, linear_in=0)
            out = make_reshape(out, shape)
            return out if factor == 1 else scale(out, factor)
    return make_op("reduce_sum", (term,), (dims,), shape, dtype, linear_in=0)


def _through_unit_reshape(src: tuple[int, ...], dst: tuple[int, ...], dims: tuple[int, ...]
                          ) -> list[int] | None:
    """The dims of `src` that the non-unit `dims` of `dst` are, when the reshape `src -> dst`
    only adds or drops unit dims; else None."""
    src_big = [d for d, n in enumerate(src) if n != 1]
    dst_big = [d for d, n in enumerate(dst) if n != 1]
    if [src[d] for d in src_big] != [dst[d] for d in dst_big]:
        return None
    where = dict(zip(dst_big, src_big))
    return sorted(where[d] for d in dims if dst[d] != 1)
