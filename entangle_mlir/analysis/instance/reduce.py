"""The abstract instance at a reduced shape: its input terms resized (`reduced_info`), the
rule run again there, and its outputs required to have the same layouts and the same term
skeleton as at the real shape (`reduced_instance`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from fractions import Fraction
from functools import reduce as _fold

import numpy as np

from entangle_mlir.analysis.instance.abstraction import run_rule, same_layout
from entangle_mlir.analysis.instance.common import ABSTRACT_BASE, rels_of
from entangle_mlir.analysis.instance.shapes import (
    OFFSET_OPS,
    REDUCED_LOCAL,
    capped,
    reduced_offset_types,
    reduced_types,
    segments,
)
from entangle_mlir.core import intervals
from entangle_mlir.core.mesh import Mesh
from entangle_mlir.core.relations import (
    DEVICE_BLOCK_VALUES,
    GLOBAL,
    BlockIndex,
    DeviceScalar,
    InBlock,
    Masked,
    Permuted,
    Rel,
    Reordered,
    Returning,
    Shifted,
    Value,
    Windowed,
)
from entangle_mlir.core.terms import (
    ARITHMETIC_TERM_OPS,
    COMMUTATIVE,
    Term,
    arg_finite,
    make_arg,
    make_broadcast,
    make_div,
    make_elementwise,
    make_iota,
    make_lin,
    make_mul,
    make_reshape,
    make_roll,
    make_splat,
    make_transpose,
    roll_parts,
    splat_value,
)
from entangle_mlir.core.traits import ELEMENTWISE_OPS
from entangle_mlir.mlir.opinfo import OpInfo, TensorType, scatter_kind
from entangle_mlir.rules.base import RuleContext
from entangle_mlir.rules.common import device_offsets
from entangle_mlir.semantics.ops import dimension_numbers


def _resize_term(term: Term, shape: tuple[int, ...], leaves: dict[int, Term]) -> Term | None:
    """An abstract input term at a new global shape (leaves resized consistently)."""
    if term.op == "splat":
        return make_splat(term.attrs[0], shape, term.dtype)
    if term.op == "iota":
        return make_iota(shape, term.attrs[0], term.dtype)
    if term.op == "arg" and term.attrs[0] >= ABSTRACT_BASE:
        leaf = make_arg(term.attrs[0], shape, term.dtype, arg_finite(term))
        previous = leaves.setdefault(term.attrs[0], leaf)
        return leaf if previous is leaf else None
    if term.op == "concatenate" and len(shape) == len(term.shape):
        (dim,) = term.attrs
        rolled = roll_parts(term, dim)
        if rolled is not None:  # a ring's block moved by whole blocks: the same share moved
            base, shift = rolled
            if (shift * shape[dim]) % term.shape[dim]:
                return None
            inner = _resize_term(base, shape, leaves)
            return None if inner is None else make_roll(
                inner, dim, shift * shape[dim] // term.shape[dim])
    if term.op == "reshape" and _unit_reshape(term.args[0].shape, term.shape):
        kept = iter(s for s in shape if s != 1) if shape else iter(())
        big = [s for s in term.shape if s != 1]
        if len(big) != len([s for s in shape if s != 1]):
            return None
        inner_shape = tuple(next(kept) if s != 1 else 1 for s in term.args[0].shape)
        inner = _resize_term(term.args[0], inner_shape, leaves)
        return None if inner is None else make_reshape(inner, shape)
    if term.op == "transpose":
        (perm,) = term.attrs
        inner_shape = [0] * len(perm)
        for i, p in enumerate(perm):
            inner_shape[p] = shape[i]
        inner = _resize_term(term.args[0], tuple(inner_shape), leaves)
        return None if inner is None else make_transpose(inner, perm)
    if term.op == "broadcast" and term.args[0].op in ("arg", "reshape"):
        (dims,) = term.attrs
        operand = term.args[0]
        op_shape = tuple(shape[d] if operand.shape[i] == term.shape[d] else operand.shape[i]
                         for i, d in enumerate(dims))
        inner = _resize_term(operand, op_shape, leaves)
        return None if inner is None else make_broadcast(inner, dims, shape)
    same_shape = all(a.shape == term.shape for a in term.args)
    if term.args and same_shape and (term.op in ARITHMETIC_TERM_OPS
                                     or term.op in ELEMENTWISE_OPS):
        args = [_resize_term(a, shape, leaves) for a in term.args]
        if any(a is None for a in args):
            return None
        if term.op == "lin":
            constant, coefs = term.attrs
            return make_lin(list(zip(coefs, args)), constant, shape, term.dtype)
        if term.op == "mul":
            return _fold(make_mul, args)
        if term.op == "div":
            return make_div(*args)
        return make_elementwise(term.op, tuple(args), term.attrs, term.dtype)
    return None


def _resized_rel(rel: Rel, local_shape, mesh: Mesh | None, leaves: dict[int, Term]
                 ) -> Rel | None:
    if len(rel.tiling) != len(local_shape):
        return None
    shape = tuple(local * (1 if d in rel.poly or rel.scope == GLOBAL or not axes else
                           mesh.group_size(axes) if mesh else 1)
                  for d, (local, axes) in enumerate(zip(local_shape, rel.tiling)))
    term = _resize_term(rel.term, shape, leaves)
    return None if term is None else replace(rel, term=term)


def _with_length(value: Value, length: int) -> Value | None:
    """A device mask over blocks of `length` rows instead (a gather's or scatter's indexed
    dim at a reduced shape); None when it does not fit."""
    if isinstance(value, BlockIndex):
        if value.clamp is not None:
            lo, hi = value.clamp
            if value.add or lo not in (None, 0) or hi not in (None, value.length - 1):
                return None
            return replace(value, length=length, clamp=(lo, None if hi is None else length - 1))
        return replace(value, length=length) if value.fill < length and not value.add else None
    if isinstance(value, InBlock):
        if value.inside:
            return replace(value, length=length, ranges=((0, length),))
        if value.outside:
            return replace(value, length=length, ranges=intervals.complement(((0, length),)))
        return None
    if isinstance(value, Masked):
        pred = _with_length(value.pred, length)
        return None if pred is None else replace(value, pred=pred)
    return value


def _indexed_dim(info: OpInfo) -> int | None:
    """The operand dim a single-component gather or scatter index addresses."""
    key = "dimension_numbers" if info.name == "stablehlo.gather" else \
        "scatter_dimension_numbers"
    try:
        dims = dimension_numbers(info.attrs, key)
    except Exception:  # noqa: BLE001 - unreadable attributes: no reduction
        return None
    index_map = dims.get("start_index_map", dims.get("scatter_dims_to_operand_dims"))
    return index_map[0] if index_map and len(index_map) == 1 else None


def _unit_reshape(src: tuple[int, ...], dst: tuple[int, ...]) -> bool:
    """A reshape that only adds or drops dims of size 1."""
    return [s for s in src if s != 1] == [s for s in dst if s != 1]


def reduced_info(info: OpInfo, in_values: Sequence[Value], mesh: Mesh | None,
                 cap: int = REDUCED_LOCAL, blocks: dict | None = None
                 ) -> tuple[OpInfo, list[Value]] | None:
    """The op and its (abstract) input relations at a reduced shape, or None.

    Every local dim of size > 1 becomes min(size, cap) (dims tied by the op's attributes stay
    tied; gathers/scatters keep their factor), and each relation's global dim is the new local
    size times its number of blocks. Only shape-uniform ops are reduced, and only abstract
    inputs (fresh leaves, splats, iotas, broadcasts of leaves) can be resized. `blocks`:
    the dims of blocks of reordered and returning values (`shapes.reduced_types`).
    """
    types = reduced_types(info, cap, blocks)
    starts: list[int] = []
    if types is None and info.name in OFFSET_OPS and not blocks:
        found = _offset_types(info, in_values, cap)
        if found is not None:
            types, starts = found[:3], found[3]
    if types is None:
        return None
    new_ops, new_res = types[0], types[1]
    overrides = types[2] if len(types) > 2 else {}
    leaves: dict[int, Term] = {}
    new_ins: list[Value] = []
    for value, old, new in zip(in_values, info.operand_types, new_ops):
        if isinstance(value, Rel):
            if len(value.tiling) != len(new):
                return None
            shape = []
            for d, (local, axes) in enumerate(zip(new, value.tiling)):
                blocks = 1 if d in value.poly or value.scope == GLOBAL or not axes else (
                    mesh.group_size(axes) if mesh else 1)
                shape.append(local * blocks)
            term = _resize_term(value.term, tuple(shape), leaves)
            if term is None:
                return None
            new_ins.append(replace(value, term=term))
        elif isinstance(value, DeviceScalar):
            if tuple(old.shape) != tuple(new):
                return None
            new_ins.append(value)
        elif isinstance(value, Windowed):
            window = _reduced_window(value, tuple(new), mesh, leaves, cap)
            if window is None:
                return None
            new_ins.append(window)
        elif isinstance(value, Reordered):
            rel = _resized_rel(value.rel, new, mesh, leaves)
            if rel is None or new[value.dim] % len(value.orders[0]):
                return None
            new_ins.append(replace(value, rel=rel))
        elif isinstance(value, Returning):
            if not blocks or mesh is None:
                return None
            local = list(new)  # its relation holds every block of its dim
            local[value.dim] *= mesh.group_size(tuple(value.rel.partial))
            rel = _resized_rel(value.rel, tuple(local), mesh, leaves)
            if rel is None:
                return None
            new_ins.append(replace(value, rel=rel))
        elif isinstance(value, Permuted):
            return None
        elif isinstance(value, Shifted):
            rel = _resized_rel(value.rel, new, mesh, leaves)
            if rel is None:
                return None
            new_ins.append(replace(value, rel=rel))
        elif isinstance(value, DEVICE_BLOCK_VALUES):
            resized = [_resized_rel(rel, new, mesh, leaves) for rel in rels_of(value)]
            if any(r is None for r in resized):
                return None
            if info.name in ("stablehlo.gather", "stablehlo.scatter"):
                indexed = _indexed_dim(info)
                if indexed is None:
                    return None
                value = _with_length(value, new_ops[0][indexed])
                if value is None:
                    return None
            if isinstance(value, Masked):
                new_ins.append(replace(value, rel=resized[0],
                                       pred=replace(value.pred, rel=resized[1])))
            else:
                new_ins.append(replace(value, rel=resized[0]))
        else:
            new_ins.append(value)
    first = len(new_ins) - len(starts)
    for i, start in enumerate(starts):
        new_ins[first + i] = _at_start(new_ins[first + i], start)
    attrs = {**info.attrs, **overrides}
    if info.name == "stablehlo.scatter" and not (attrs.get("reducer") or attrs.get("update")):
        # the reduced OpInfo has no MLIR op to read the update region from
        attrs["reducer"] = scatter_kind(info)
    if info.name == "stablehlo.constant":
        value = np.asarray(attrs["value"])
        attrs["value"] = np.full(new_res[0], value.reshape(-1)[0] if value.size else 0,
                                 dtype=value.dtype)
    new_info = replace(info, attrs=attrs,
                       operand_types=[TensorType(tuple(s), t.dtype)
                                      for s, t in zip(new_ops, info.operand_types)],
                       result_types=[TensorType(tuple(s), t.dtype)
                                     for s, t in zip(new_res, info.result_types)],
                       op=None)
    return new_info, new_ins


def _offset_types(info: OpInfo, in_values: Sequence[Value], cap: int):
    """`shapes.reduced_offset_types` for a dynamic_slice or dynamic_update_slice whose start
    operands are each one constant on every device (a splat, or a device scalar whose table
    holds one value; not a partial sum, whose devices' starts are any that add up to it) and
    whose operand (and update) are plain relations (a micro-batch window has its own
    reduction, `_reduced_window`); None otherwise."""
    first = OFFSET_OPS.index(info.name) + 1
    if any(type(v) is not Rel for v in in_values[:first]):
        return None
    starts = []
    for value in in_values[first:]:
        offsets = None if isinstance(value, Rel) and value.partial else device_offsets(value, 1)
        if offsets is None or len(set(offsets)) != 1:
            return None
        starts.append(offsets[0])
    return reduced_offset_types(info, starts, cap)


def _at_start(value: Value, start: int) -> Value:
    """A constant start operand (`_offset_types`) holding `start` instead."""
    if isinstance(value, DeviceScalar):
        return replace(value, values=(start,) * len(value.values))
    return replace(value, term=make_splat(start, value.term.shape, value.term.dtype))


def _reduced_window(window: Windowed, local: tuple[int, ...], mesh: Mesh | None,
                    leaves: dict[int, Term], cap: int) -> Windowed | None:
    """A micro-batch window at a reduced shape: rows [j*L, (j+1)*L) of blocks of m*L rows
    become rows [j*L', (j+1)*L') of blocks of m*L' rows (L' = L capped), every other dim as for
    a relation (summed dims other than the window's capped). Only windows aligned that way,
    without zero rows or per-device starts; None otherwise."""
    rel, dim, length = window.rel, window.dim, window.length
    if mesh is None or window.holes or window.starts or not rel.tiling[dim]:
        return None
    count = mesh.group_size(rel.tiling[dim])
    block = rel.term.shape[dim] // count
    if block % length or window.offset % length or window.offset + length > block:
        return None
    new_length = capped(length, cap)
    kept = [d for d in range(len(rel.term.shape)) if d not in window.summed]
    if len(kept) != len(local) or (not window.summed and local[dim] != new_length):
        return None
    local_of = dict(zip(kept, local))
    shape = []
    for d, axes in enumerate(rel.tiling):
        if d == dim:
            shape.append(block // length * new_length * count)
            continue
        blocks = 1 if d in rel.poly or rel.scope == GLOBAL or not axes else mesh.group_size(axes)
        shape.append(local_of.get(d, capped(rel.term.shape[d] // blocks, cap)) * blocks)
    term = _resize_term(rel.term, tuple(shape), leaves)
    if term is None:
        return None
    return replace(window, rel=replace(rel, term=term), length=new_length,
                   offset=window.offset // length * new_length)


def _skeleton(term: Term, memo: dict[int, tuple]) -> tuple:
    """The term without its shapes (ranks kept): equal skeletons = same computation.

    Operands of commutative terms are ordered by serial number, which depends on creation
    order; the skeleton sorts them instead (with their coefficients for `lin`).
    """
    found = memo.get(term.serial)
    if found is None:
        children = [_skeleton(a, memo) for a in term.args]
        if term.op == "arg":
            found = ("arg", term.attrs[0], len(term.shape))
        elif term.op == "lin":
            constant, coefs = term.attrs
            pairs = tuple(sorted(zip(coefs, children), key=repr))
            found = ("lin", constant, len(term.shape), term.dtype, pairs)
        elif term.op == "stablehlo.gather":
            operand = term.args[0].shape
            attrs = tuple((k, tuple("full" if w == n else w for w, n in zip(v, operand)))
                          if k == "slice_sizes" else (k, v) for k, v in term.attrs)
            found = (term.op, attrs, len(term.shape), term.dtype, tuple(children))
        elif term.op in ("slice", "pad"):
            found = (term.op, _window_skeleton(term), len(term.shape), term.dtype,
                     tuple(children))
        elif term.op == "stablehlo.dynamic_update_slice":
            found = (term.op, len(term.shape), term.dtype, tuple(children[:2]),
                     _update_skeleton(term, children[2:]))
        elif term.op == "mul" or term.op in COMMUTATIVE:
            found = (term.op, term.attrs, len(term.shape), term.dtype,
                     tuple(sorted(children, key=repr)))
        else:
            found = (term.op, term.attrs, len(term.shape), term.dtype, tuple(children))
        memo[term.serial] = found
    return found


def _window_skeleton(term: Term) -> tuple:
    """A slice's or pad's attributes as the reduced shapes keep them (`shapes._reduced_slice`,
    `shapes._reduced_pad`): per dim, which parts exist, capped, where the reduction shrinks it."""
    c = capped
    size = term.args[0].shape
    if term.op == "slice":
        out = []
        for start, stop, stride, n in zip(*term.attrs, size):
            if (start, stop, stride) == (0, n, 1):
                out.append("whole")
            elif stride == 1 and 0 <= start <= stop <= n:
                out.append(("cut", *segments(start, stop, n, c)))
            else:
                out.append((start, stop, stride))
        return tuple(out)
    return tuple(("pad", c(lo), c(hi)) if inner == 0 and lo >= 0 and hi >= 0 else (lo, hi, inner)
                 for lo, hi, inner in zip(*term.attrs))


def _update_skeleton(term: Term, starts: list[tuple]) -> tuple:
    """A dynamic_update_slice term's starts as the reduced shapes keep them
    (`shapes.reduced_offset_types`): per dim, a constant start as the parts of the dim around
    the update, capped (the whole dim where the update covers it); any other start as is."""
    operand, update = term.args[0].shape, term.args[1].shape
    out = []
    for start, skeleton, size, width in zip(term.args[2:], starts, operand, update):
        value = splat_value(start)
        if not (isinstance(value, Fraction) and value.denominator == 1):
            out.append(skeleton)
        elif (value, width) == (0, size):
            out.append("whole")
        else:
            out.append(("cut", *segments(int(value), int(value) + width, size, capped)))
    return tuple(out)


def _blocks(info: OpInfo, ins: list[Value], outs: list[Value], mesh: Mesh | None
            ) -> dict[tuple[str, int, int], tuple[int, int]] | None:
    """The dims of blocks of the instance's reordered and returning values: (block size,
    the size a block shrinks to, at most `REDUCED_LOCAL`); None when there are none or
    one is not a whole number of blocks."""
    found = {}
    for side, values, types in (("in", ins, info.operand_types),
                                ("out", outs, info.result_types)):
        for i, value in enumerate(values):
            if not isinstance(value, Reordered | Returning) or i >= len(types):
                continue
            size = tuple(types[i].shape)[value.dim]
            if isinstance(value, Reordered):
                count = len(value.orders[0])
                if not count or size % count:
                    return None
                size //= count
            elif mesh is None:
                return None
            found[(side, i, value.dim)] = (size, capped(size))
    return found or None


def reduced_instance(info: OpInfo, ins: list[Value], outs: list[Value], mesh: Mesh | None,
                     ctx: RuleContext, strategy: str = ""
                     ) -> tuple[OpInfo, list[Value], list[Value]] | str:
    """The instance at a reduced shape, or why it cannot be reduced. An instance with
    blocks in a device-dependent order (`Reordered`, `Returning`) is first tried with only
    the blocks' dims keeping their number of blocks (each block and every other dim
    shrunk), else with every dim capped at the number of blocks. `strategy`: the
    abstraction's (`abstraction.STATED`: the rule re-run is the op's stated form)."""
    blocks = _blocks(info, ins, outs, mesh)
    if blocks is not None:
        found = _reduced_at(info, ins, outs, mesh, ctx, REDUCED_LOCAL, blocks, strategy)
        if not isinstance(found, str):
            return found
    counts = [len(v.orders[0]) for v in list(ins) + list(outs) if isinstance(v, Reordered)]
    return _reduced_at(info, ins, outs, mesh, ctx, max([REDUCED_LOCAL, *counts]), None,
                       strategy)


def _reduced_at(info: OpInfo, ins: list[Value], outs: list[Value], mesh: Mesh | None,
                ctx: RuleContext, cap: int, blocks: dict | None, strategy: str = ""
                ) -> tuple[OpInfo, list[Value], list[Value]] | str:
    """`reduced_instance` with every dim capped at `cap` but the dims of `blocks`."""
    reduced = reduced_info(info, ins, mesh, cap, blocks)
    if reduced is None:
        return f"{info.name} or its input terms cannot be shape-reduced"
    r_info, r_ins = reduced
    r_outs = run_rule(r_info, r_ins, mesh, ctx, outs, strategy)
    if r_outs is None or len(r_outs) != len(outs):
        return "the rule fails at the reduced shape"
    memo_a: dict[int, tuple] = {}
    memo_r: dict[int, tuple] = {}
    for a, r in zip(outs, r_outs):
        if isinstance(a, Rel) and isinstance(r, Rel):
            pairs, same_extra = [(a, r)], True
        elif isinstance(a, DEVICE_BLOCK_VALUES) and type(a) is type(r):
            if _blank(a) != _blank(r):
                return "the rule gives another device mask at the reduced shape"
            pairs, same_extra = list(zip(rels_of(a), rels_of(r))), True
        elif isinstance(a, Windowed) and isinstance(r, Windowed):
            pairs = [(a.rel, r.rel)]
            same_extra = (a.dim, a.summed, a.holes, a.starts) == (
                r.dim, r.summed, r.holes, r.starts) and a.offset * r.length == r.offset * a.length
        elif isinstance(a, Reordered) and isinstance(r, Reordered):
            pairs, same_extra = [(a.rel, r.rel)], (a.dim, a.orders) == (r.dim, r.orders)
        elif isinstance(a, Returning) and isinstance(r, Returning):
            pairs = [(a.rel, r.rel)]
            same_extra = (a.dim, a.blocks, a.sources) == (r.dim, r.blocks, r.sources)
        elif isinstance(a, Shifted) and isinstance(r, Shifted):
            pairs, same_extra = [(a.rel, r.rel)], a.offsets == r.offsets
        else:
            pairs, same_extra = None, True
        if pairs is not None:
            if not same_extra:
                return "the rule gives another layout at the reduced shape"
            for x, y in pairs:
                if (x.tiling, x.partial, x.kind, x.poly, x.scope) != (
                        y.tiling, y.partial, y.kind, y.poly, y.scope):
                    return "the rule gives another layout at the reduced shape"
                if _skeleton(x.term, memo_a) != _skeleton(y.term, memo_r):
                    return "the rule builds another term at the reduced shape"
        elif not same_layout(a, r):
            return "the rule gives another layout at the reduced shape"
    return r_info, r_ins, r_outs


def _blank(value: Value) -> Value:
    """A device mask without its relations, and its block length blanked (reducing a
    gather's indexed dim shortens the blocks)."""
    if isinstance(value, BlockIndex):
        clamp = value.clamp and tuple("L-1" if end == value.length - 1 else end
                                      for end in value.clamp)
        return replace(value, rel=None, length=0, clamp=clamp)
    if isinstance(value, InBlock):
        ranges = tuple(tuple("L" if end == value.length else end for end in part)
                       for part in value.ranges)
        return replace(value, rel=None, length=0, ranges=ranges)
    if isinstance(value, Masked):
        return replace(value, rel=None, pred=_blank(value.pred))
    return value


def reduced_shifted_scatter(info: OpInfo, ins: list[Value], outs: list[Value],
                            mesh: Mesh | None, ctx: RuleContext):
    """A scatter whose indices are shifted per device (rules/gather_scatter
    ._scatter_into_blocks) at a smaller shape: the scattered operand dim keeps its size (the
    device offsets are multiples of its block), every other dim and the number of updates
    shrink to REDUCED_LOCAL, and operand, ids and updates become fresh leaves. Only when the
    claimed output is exactly the rule's output on the real inputs (so proving the rule,
    which is generic in those terms, at the smaller shape proves the claim), and the rule
    gives the same layout there."""
    operand, indices, updates = ins
    if not (isinstance(operand, Rel) and isinstance(indices, Shifted)
            and isinstance(updates, Rel)) or len(outs) != 1 or not isinstance(outs[0], Rel):
        return None
    claimed = run_rule(info, list(ins), mesh, ctx)
    if (not claimed or len(claimed) != 1 or not isinstance(claimed[0], Rel)
            or claimed[0].term is not outs[0].term or not same_layout(claimed[0], outs[0])):
        return None   # the claim is not the rule's output: check it as it is
    dims = dimension_numbers(info.attrs, "scatter_dimension_numbers")
    to_operand = tuple(dims.get("scatter_dims_to_operand_dims", ()))
    window_dims = dims.get("update_window_dims", ())
    ivd = dims.get("index_vector_dim", len(info.operand_types[1].shape))
    o_shape, i_shape, u_shape = (tuple(t.shape) for t in info.operand_types)
    operand_window = [d for d in range(len(o_shape)) if d not in dims.get(
        "inserted_window_dims", ())]
    new_o = [n if d in to_operand else capped(n) for d, n in enumerate(o_shape)]
    new_u = list(u_shape)
    for k, d in enumerate(operand_window):
        if k >= len(window_dims) or u_shape[window_dims[k]] != o_shape[d]:
            return None
        new_u[window_dims[k]] = new_o[d]
    scatter_dims = [d for d in range(len(u_shape)) if d not in window_dims]
    batch = [d for d in range(len(i_shape)) if d != ivd]
    if len(scatter_dims) != len(batch):
        return None
    new_i = list(i_shape)
    for u, i in zip(scatter_dims, batch):
        new_u[u] = new_i[i] = capped(u_shape[u])

    def leaf(rel: Rel, local: list[int], k: int) -> Rel:
        shape = tuple(n * (mesh.group_size(axes) if mesh and axes else 1)
                      for n, axes in zip(local, rel.tiling))
        return replace(rel, term=make_arg(ABSTRACT_BASE + k, shape, rel.term.dtype),
                       poly=frozenset())

    r_ins = [leaf(operand, new_o, 0), Shifted(leaf(indices.rel, new_i, 1), indices.offsets),
             leaf(updates, new_u, 2)]
    r_info = replace(info, operand_types=[TensorType(tuple(s), t.dtype) for s, t in zip(
        (new_o, new_i, new_u), info.operand_types)], result_types=[
        TensorType(tuple(new_o), info.result_types[0].dtype)], op=None,
        attrs={**info.attrs, "reducer": scatter_kind(info)})
    r_outs = run_rule(r_info, r_ins, mesh, ctx)
    if not r_outs or len(r_outs) != 1 or not isinstance(r_outs[0], Rel):
        return None
    a, r = outs[0], r_outs[0]
    if (a.tiling, a.partial, a.kind, a.scope) != (r.tiling, r.partial, r.kind, r.scope):
        return None
    return r_info, r_ins, r_outs
