"""What constant indices and constant values decide: scatters at constant indices
(`scatter_at_constants`, `scatter_replace_at_constants`) and constants folded exactly
(`fold_constant`).

Part of `entangle_mlir.core.normal_form` (the package docstring lists every identity)."""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from fractions import Fraction

from entangle_mlir.core.normal_form.concat import update_slice
from entangle_mlir.core.normal_form.pieces import slice_term
from entangle_mlir.core.rounding import exact_value
from entangle_mlir.core.terms import (
    DENSE_VALUES,
    Term,
    make_dense,
    make_lin,
    make_op,
    make_reshape,
    make_splat,
    splat_value,
)

MAX_SCATTER_WINDOWS = 64
"""The most update windows a scatter at constant indices is written out as."""


def _constant_indices(indices: Term) -> Callable[[tuple[int, ...]], int] | None:
    """The values of a scatter's index tensor when they are known (a splat, or an integer
    table whose values the builders kept), as a function of the position; else None."""
    value = splat_value(indices)
    if isinstance(value, Fraction) and value.denominator == 1:
        return lambda _: int(value)
    if indices.op != "dense" or indices.attrs[0] not in DENSE_VALUES or \
            not indices.dtype.startswith(("i", "ui")) or indices.dtype == "i1":
        return None
    flat = list(getattr(DENSE_VALUES[indices.attrs[0]], "flat", ()))
    if len(flat) != math.prod(indices.shape):
        return None
    strides = [math.prod(indices.shape[d + 1:]) for d in range(len(indices.shape))]
    return lambda at: int(flat[sum(i * s for i, s in zip(at, strides))])


def _constant_windows(term: Term, args: tuple[Term, ...]
                      ) -> list[tuple[tuple[int, ...], Term]] | None:
    """The update windows of `scatter(operand, I, U)` with the indices I known and no
    batching dims: per scatter position of U (in row-major order), the start in the operand
    and that position's window of U reshaped to the operand's rank. None when it is not such
    a scatter, a window does not fit inside the operand (the op's out-of-bounds behaviour is
    implementation-defined) or there are more than MAX_SCATTER_WINDOWS windows."""
    if term.op != "stablehlo.scatter" or len(args) != 3:
        return None
    attrs = dict(term.attrs)
    operand, indices, updates = args
    if attrs.get("input_batching_dims") or attrs.get("scatter_indices_batching_dims"):
        return None
    values = _constant_indices(indices)
    if values is None:
        return None
    window_dims = tuple(attrs["update_window_dims"])
    inserted = tuple(attrs["inserted_window_dims"])
    to_operand = tuple(attrs["scatter_dims_to_operand_dims"])
    ivd = attrs["index_vector_dim"]
    rank = len(operand.shape)
    operand_window = [d for d in range(rank) if d not in inserted]
    if len(operand_window) != len(window_dims) or list(window_dims) != sorted(window_dims) \
            or any(d >= len(updates.shape) for d in window_dims):
        return None
    sizes = [1] * rank
    for k, d in enumerate(operand_window):
        sizes[d] = updates.shape[window_dims[k]]
    scatter_dims = [d for d in range(len(updates.shape)) if d not in window_dims]
    positions = list(itertools.product(*(range(updates.shape[d]) for d in scatter_dims)))
    if len(positions) > MAX_SCATTER_WINDOWS:
        return None
    windows = []
    for position in positions:
        at = list(position)
        if ivd < len(indices.shape):
            vector = [values(tuple(at[:ivd] + [k] + at[ivd:]))
                      for k in range(indices.shape[ivd])]
        else:
            vector = [values(tuple(at))]
        if len(vector) != len(to_operand):
            return None
        start = [0] * rank
        for k, d in enumerate(to_operand):
            start[d] = vector[k]
        if any(not 0 <= start[d] <= operand.shape[d] - sizes[d] for d in range(rank)):
            return None
        window = updates
        for d, p in zip(scatter_dims, position):
            window = slice_term(window, d, p, p + 1)
        windows.append((tuple(start), make_reshape(window, tuple(sizes))))
    return windows


def scatter_at_constants(term: Term, args: tuple[Term, ...]) -> Term | None:
    """`scatter_add(0, I, U)` with the indices I known and every update window inside the
    operand (no batching dims): the sum over U's scatter positions of that position's window
    of U, padded with zeros to where the scatter adds it. Exact: each element of the scatter
    is the sum of the updates landing on it (one addend per window that covers it), which is
    what the sum of the padded windows adds up; in the order-free reading of sums. None
    when it is not such a scatter, a window does not fit (the op's out-of-bounds behaviour
    is implementation-defined) or there are more than MAX_SCATTER_WINDOWS windows."""
    if term.op != "stablehlo.scatter" or len(args) != 3:
        return None
    if dict(term.attrs).get("reducer") != "add" or splat_value(args[0]) != 0:
        return None
    windows = _constant_windows(term, args)
    if windows is None:
        return None
    pieces = []
    for start, window in windows:
        low = start
        high = tuple(n - s - z for n, s, z in zip(term.shape, start, window.shape))
        if any(low) or any(high):
            window = make_op("pad", (window, make_splat(0, (), term.dtype)),
                             (low, high, (0,) * len(low)), term.shape, term.dtype, linear_in=0)
        pieces.append((Fraction(1), window))
    return make_lin(pieces, Fraction(0), term.shape, term.dtype)


_FOLDED = frozenset({"stablehlo.sqrt", "stablehlo.convert"})
"""Ops whose result on a constant IEEE 754 fixes exactly (`rounding.exact_value`)."""


def fold_constant(term: Term) -> Term | None:
    """A square root or float convert of a scalar constant (`jnp.sqrt(8.0)`) as the splat of
    its exact value in its dtype (the correctly rounded root, the rounded conversion), the form
    XLA's constant folding gives the sharded program; None when IEEE 754 does not fix the value
    (another op, a negative root, a conversion that overflows or is not to a float). A slice
    or reshape of an integer or boolean table whose values are kept: the table it gives
    (`_table_part`)."""
    if term.op in ("slice", "reshape") and term.args and term.args[0].op == "dense":
        return _table_part(term)
    if term.op not in _FOLDED:
        return None
    value = exact_value(term)
    return None if value is None else make_splat(value, term.shape, term.dtype)


def _table_part(term: Term) -> Term | None:
    """A slice or reshape of a constant table whose values are kept (`DENSE_VALUES`: small
    integer and boolean tables), as the splat of its value where it holds one (a scan's
    stored step mask read back at a known step), else as the table it is (exact: the same
    values)."""
    import hashlib  # lazy: only for a table sliced at known rows

    import numpy as np  # lazy: terms are pure Python; numpy only for a kept table

    table = DENSE_VALUES.get(term.args[0].attrs[0])
    if table is None:
        return None
    values = np.asarray(table).reshape(term.args[0].shape)
    if term.op == "slice":
        starts, limits, strides = term.attrs
        values = values[tuple(slice(a, b, c) for a, b, c in zip(starts, limits, strides))]
    values = values.reshape(term.shape)
    if values.size and (values == values.flat[0]).all():
        first = values.flat[0]
        return make_splat(bool(first) if values.dtype.kind == "b" else int(first), term.shape,
                          term.dtype)
    key = hashlib.sha1(repr((values.dtype.str, values.shape)).encode()
                       + values.tobytes()).digest()
    return make_dense(key, term.shape, term.dtype, values)


def _overlap(a: tuple[tuple[int, ...], Term], b: tuple[tuple[int, ...], Term]) -> bool:
    """Whether two (start, window) boxes share an element."""
    return all(sa < sb + nb and sb < sa + na for sa, na, sb, nb in
               zip(a[0], a[1].shape, b[0], b[1].shape))


def scatter_replace_at_constants(term: Term, args: tuple[Term, ...]) -> Term | None:
    """`scatter(x, I, U)` writing (its region returns the update) at known indices whose
    windows fit inside x and are pairwise disjoint (no batching dims): x with each window
    replaced by its rows of U, the rows of x around each window concatenated with it dim by
    dim (`update_slice`; what `x.at[i].set(u)` is at a constant i). Exact: every element of
    the result is the one update landing on it, or x's where none does; disjoint windows
    write in any order alike. None where windows overlap (which write wins is then
    implementation-defined), a window does not fit, or the indices are unknown."""
    if term.op != "stablehlo.scatter" or len(args) != 3 or \
            dict(term.attrs).get("reducer") != "replace" or args[0].dtype != term.dtype:
        return None
    windows = _constant_windows(term, args)
    if windows is None or any(_overlap(a, b) for a, b in itertools.combinations(windows, 2)):
        return None
    out = args[0]
    for start, window in windows:
        out = update_slice(out, window, start)
    return out
