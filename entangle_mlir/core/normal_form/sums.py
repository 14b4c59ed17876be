"""Sums of contractions (or sums) over blocks of one summed dim joined into one over the
joined blocks (`join_sums`), in an order in which some operand meets; scatter-adds into
zeros over blocks of their updates alike.

Part of `entangle_mlir.core.normal_form` (the package docstring lists every identity)."""

from __future__ import annotations

from collections.abc import Iterator

from entangle_mlir.core.normal_form import concat
from entangle_mlir.core.normal_form.concat import make_concat
from entangle_mlir.core.normal_form.pieces import (
    _PROMISES,
    _contraction_key,
    _distinct_slice_starts,
    _first_slice_start,
    _joined,
    _joins,
    _moved_argument,
    _moved_argument_index,
    _sum_view,
    _summed_dims,
    _unique_window_starts,
    _window,
    _window_start,
)
from entangle_mlir.core.terms import (
    Term,
    linear_parts,
    make_dot,
    make_lin,
    make_op,
    make_reshape,
    make_transpose,
    splat_value,
)


def _join_pair(a: Term, b: Term) -> Term | None:
    """One contraction (sum) for `a + b` when they are the same contraction (sum) whose
    operands are adjacent windows along one contracted (summed) dim, in the same order on
    both sides of a contraction (row i of the lhs meets row i of the rhs), else None."""
    if a.op == "transpose" and b.op == "transpose" and a.attrs == b.attrs:
        inner = _join_pair(a.args[0], b.args[0])
        return None if inner is None else make_transpose(inner, a.attrs[0])
    key = _contraction_key(a)
    if key is None or key != _contraction_key(b):
        return None
    for pair in _summed_dims(a):
        dims = [(k, d) for k, d in enumerate(pair) if d is not None]
        if any(a.args[k] is b.args[k] for k, _ in dims):
            continue
        forward = [_joins(a.args[k], b.args[k], d) for k, d in dims]
        backward = [_joins(b.args[k], a.args[k], d) for k, d in dims]
        for joined in (forward, backward):
            if all(j is not None for j in joined):
                args = tuple(joined) + tuple(a.args[len(joined):])
                if a.op == "reduce_sum":
                    return make_op("reduce_sum", args, a.attrs, a.shape, a.dtype,
                                   linear_in=0)
                return make_dot(args[0], args[1], a.attrs, a.shape, a.dtype)
    return None


def join_sums(term: Term) -> Term:
    """A `lin` whose parts with equal coefficients are one contraction (sum) over adjacent
    windows, with those parts joined (repeatedly, until no pair joins)."""
    if term.op != "lin":
        return term
    pairs, constant = linear_parts(term)
    while True:
        found = _first_joinable(pairs)
        if found is None:
            break
        i, j, joined = found
        ki = pairs[i][0]
        pairs = [p for k, p in enumerate(pairs) if k not in (i, j)]
        parts, offset = linear_parts(joined)
        if joined.op == "lin" and offset == 0:
            pairs.extend((ki * k, t) for k, t in parts)  # a factor pulled out
        else:
            pairs.append((ki, joined))
    pairs = _join_groups(pairs)
    if len(pairs) == len(term.args):
        return term
    return make_lin(pairs, constant, term.shape, term.dtype)


def _first_joinable(pairs: list) -> tuple[int, int, Term] | None:
    """(i, j, joined) for the first parts i < j of `pairs` (in that order) that `_join_pair`
    joins with one coefficient, or None. Only candidates are tried: parts keyed alike
    (`_join_keys`) whose first summed operands are adjacent windows of one term, which every
    join needs; a residual stream of hundreds of parts would otherwise try every pair."""
    keys = [_join_keys(k, t) for k, t in pairs]
    starts: dict[tuple, list[int]] = {}
    stops: dict[tuple, list[int]] = {}
    for j, found in enumerate(keys):
        for key, start, stop in found:
            starts.setdefault((key, start), []).append(j)
            stops.setdefault((key, stop), []).append(j)
    for i, found in enumerate(keys):
        candidates = sorted({j for key, start, stop in found
                             for j in (*starts.get((key, stop), ()),
                                       *stops.get((key, start), ())) if j > i})
        for j in candidates:
            joined = _join_pair(pairs[i][1], pairs[j][1])
            if joined is not None:
                return i, j, joined
    return None


def _join_keys(coefficient, term: Term) -> list[tuple[tuple, int, int]]:
    """(key, start, stop) of `term`'s first summed operand's window along each summed dim:
    key holds the coefficient, the transposes around the contraction, the contraction's
    kind (`_contraction_key`), the summed dims, the window's base and its other dims' bounds.
    Two parts `_join_pair` joins share a key, one's stop being the other's start. Memoized
    (`_JOIN_KEYS`): a stack's residual stream of layer l holds the parts of every layer
    below, each asked again at every layer above."""
    key = (coefficient, term.serial)
    found = _JOIN_KEYS.get(key)
    if found is None:
        if len(_JOIN_KEYS) > MAX_JOIN_KEYS:
            _JOIN_KEYS.clear()
        found = _JOIN_KEYS[key] = _computed_join_keys(coefficient, term)
    return found


_JOIN_KEYS: dict[tuple, list[tuple[tuple, int, int]]] = {}
"""`_join_keys` by (coefficient, serial) (interned terms: a serial is never reused)."""

MAX_JOIN_KEYS = 1 << 20
"""The most answers `_JOIN_KEYS` keeps before it starts over."""


def _computed_join_keys(coefficient, term: Term) -> list[tuple[tuple, int, int]]:
    perms = []
    while term.op == "transpose":
        perms.append(term.attrs[0])
        term = term.args[0]
    kind = _contraction_key(term)
    if kind is None:
        return []
    found = []
    for pair in _summed_dims(term):
        k, d = next((k, d) for k, d in enumerate(pair) if d is not None)
        window = _window(term.args[k], d)
        if window is None:
            continue
        base, start, stop, rest = window
        found.append(((coefficient, tuple(perms), kind, pair, base.serial, rest), start, stop))
    return found


def _peel(term: Term) -> tuple[tuple, Term]:
    """(the transposes, reshapes and zero pads around `term`, outermost first, as
    ("transpose", perm), ("reshape", shape) or ("pad", (attrs, shape, zero)); the term under
    them), where a sum dropping unit dims through a reshape is read as a sum over them
    (`_sum_view`) rather than peeled. Exact for a sum of parts wrapped alike: a transpose,
    reshape or zero pad of a sum is the sum of the parts' (a stage's rows of stacked
    layers' gradients)."""
    wrappers = []
    while term.op in ("transpose", "reshape") or term.op == "pad" and splat_value(
            term.args[1]) == 0:
        if term.op == "reshape":
            view = _sum_view(term)
            if view is not term:
                return tuple(wrappers), view
            wrappers.append(("reshape", term.shape))
        elif term.op == "pad":
            wrappers.append(("pad", (term.attrs, term.shape, term.args[1])))
        else:
            wrappers.append(("transpose", term.attrs[0]))
        term = term.args[0]
    return tuple(wrappers), term


def _wrap(core: Term, wrappers: tuple) -> Term:
    """`core` under `wrappers` (`_peel`'s), innermost first."""
    for kind, attr in reversed(wrappers):
        if kind == "transpose":
            core = make_transpose(core, attr)
        elif kind == "pad":
            attrs, shape, zero = attr
            core = make_op("pad", (core, zero), attrs, shape, core.dtype, linear_in=0)
        else:
            core = make_reshape(core, attr)
    return core


def _join_groups(pairs: list) -> list:
    """`pairs` with every group of two or more parts of one coefficient that are one
    contraction (sum), under the same transposes and reshapes, over operands that are not
    adjacent windows (`_join_pair` takes those) joined into one: `sum_i dot(l_i, r_i)`
    contracting (lhs dim a, rhs dim b) is `dot(concat_i l_i along a, concat_i r_i along b)`,
    and `sum_i reduce_sum(x_i)` over a dim d is the reduce_sum of `concat_i x_i along d`
    (exact for any order the pieces are taken in, the same on both operands: a regrouping of
    the sum, which the semantics policy allows; integer sums wrap alike in any order). The
    order is the one in which some operand's pieces meet (`_orders`); a group whose
    concatenations meet in no order stays as it is."""
    groups: dict[tuple, list[int]] = {}
    for i, (k, t) in enumerate(pairs):
        perms, core = _peel(t)
        key = _contraction_key(core) or _scatter_key(core)
        if key is not None:
            groups.setdefault((k, perms, key), []).append(i)
    done: set[int] = set()
    joined = []
    for (k, perms, _), members in groups.items():
        if len(members) < 2 or len(members) > MAX_JOINED:
            continue
        cores = [_peel(pairs[i][1])[1] for i in members]
        core = _join_group(cores)
        parts = [(members, core)] if core is not None else [
            ([members[i] for i in sub], _join_group([cores[i] for i in sub]))
            for sub in _subgroups(cores)]
        for part, core in parts:
            if core is None:
                continue
            done.update(part)
            joined.append((k, _wrap(core, perms)))
    if not joined:
        return pairs
    return [p for i, p in enumerate(pairs) if i not in done] + joined


MAX_JOINED = 4096
"""The most parts of a sum `_join_groups` joins into one contraction: a stack's residual
stream at tp 8 sums layers x 8 of them (80 layers: 640), and the reference's stream joins
its layers' alike, so a smaller cap would leave one side joined and the other not."""


def _subgroups(cores: list[Term]) -> list[list[int]]:
    """The positions of `cores` (one contraction or sum, which do not join all together)
    split by the argument an operand's piece moves (slices, reshapes), for the first summed
    operand whose pieces are so split into several groups (two of them at least twice),
    else likewise by the term the first slice under an operand's piece is a window of:
    the parts of a tp-partial residual stream, `attn_0 @ wo[:k] + attn_1 @ wo[k:] + h_0 @
    w_down[:f] + h_1 @ w_down[f:]`, are two sums (one per weight) that each join, not one.
    A weight comes first, whichever operand it is: split by the first slice under a computed
    lhs, the stream of a pipeline's several micro-batches (stages) splits by micro-batch
    (stage) instead, which the reference's whole-batch stream never does, and the two
    forms do not meet (gap 2 of benchmarks/FRONTIER_RESULTS.md: 4 layers, 2 micro-batches).
    Each subgroup is joined on its own (any grouping of a sum is a regrouping); [] when
    there is no such split."""
    for keyed in (_moved_argument, _first_slice_base):
        for pair in _summed_dims(cores[0]):
            for k, d in enumerate(pair):
                if d is None:
                    continue
                keys = [keyed(c.args[k], d) for c in cores]
                if any(key is None for key in keys):
                    continue
                split: dict[int, list[int]] = {}
                for i, key in enumerate(keys):
                    split.setdefault(key, []).append(i)
                if len(split) > 1 and any(len(sub) > 1 for sub in split.values()):
                    return [sub for sub in split.values() if len(sub) > 1]
    return []


def _first_slice_base(term: Term, dim: int) -> int | None:
    """The serial of the term the first slice under `term` cuts, or None."""
    start = _first_slice_start(term, dim)
    return None if start is None else start[0]


def _scatter_key(term: Term):
    """What a scatter-add into zeros is, but for its indices and updates (attributes, shape,
    dtype), or None for any other term."""
    if term.op != "stablehlo.scatter" or len(term.args) != 3:
        return None
    attrs = dict(term.attrs)
    if attrs.get("reducer") != "add" or splat_value(term.args[0]) != 0 or any(
            attrs.get(a) for a in ("input_batching_dims", "scatter_indices_batching_dims",
                                   *_PROMISES)):
        return None
    return term.op, term.attrs, term.shape, term.dtype


def _join_scatters(cores: list[Term]) -> Term | None:
    """`scatter_add(0, concat I_i, concat U_i)` for `sum_i scatter_add(0, I_i, U_i)` (one
    set of attributes), the indices and updates concatenated along one scatter dim (an
    update dim that is no window dim, and the indices dim it comes from): exact, each update
    window lands where its index says whichever piece holds it, and colliding windows are
    summed either way (a regrouping of the sum). The order is the one in which the pieces'
    first distinct slices stand (`_distinct_slice_starts`); None when no concatenation
    meets."""
    first = cores[0]
    attrs = dict(first.attrs)
    window = tuple(attrs["update_window_dims"])
    vector = attrs["index_vector_dim"]
    updates, indices = first.args[2], first.args[1]
    scatter = [d for d in range(len(updates.shape)) if d not in window]
    rows = [d for d in range(len(indices.shape)) if d != vector]
    if len(scatter) != len(rows):
        return None
    starts = _distinct_slice_starts([c.args[1] for c in cores]) or _distinct_slice_starts(
        [c.args[2] for c in cores])
    if starts is None:
        return None
    ordered = [cores[i] for i in sorted(range(len(cores)), key=lambda i: starts[i])]
    for u, r in zip(scatter, rows):
        if any(c.args[2].shape[d] != updates.shape[d] for c in cores
               for d in range(len(updates.shape)) if d != u) or any(
                c.args[1].shape[d] != indices.shape[d] for c in cores
                for d in range(len(indices.shape)) if d != r):
            continue
        joined_indices = make_concat([c.args[1] for c in ordered], r)
        joined_updates = make_concat([c.args[2] for c in ordered], u)
        if _joined(joined_indices, r) or _joined(joined_updates, u):
            return make_op(first.op, (first.args[0], joined_indices, joined_updates),
                           first.attrs, first.shape, first.dtype, linear_in=2)
    return None


def _join_group(cores: list[Term]) -> Term | None:
    """One contraction (sum) for the sum of `cores` (see `_join_groups`), or None; memoized
    (`_GROUPS`) outside `make_concat`'s lifts, whose unlifted inner concatenations would make
    the answer depend on what is being built around it."""
    if concat._BUILDING:
        return _joined_group(cores)
    key = tuple(c.serial for c in cores)
    if key not in _GROUPS:
        _GROUPS[key] = _after_prefix(key, cores) or _joined_group(cores)
    return _GROUPS[key]


def _after_prefix(key: tuple[int, ...], cores: list[Term]) -> Term | None:
    """The sum of `cores` joined as the sum of a prefix of them already joined (`_GROUPS`,
    one contraction of the same kind) and the parts after it, or None when no prefix of
    the last `PREFIX_REACH` lengths joined. Exact as `_join_groups` is (a regrouping of the
    sum); a stack's residual stream of layer l holds layer l - 1's parts and its own, so
    each layer joins its own parts onto the layers below instead of all l layers' again."""
    for m in range(len(cores) - 1, max(1, len(cores) - PREFIX_REACH), -1):
        before = _GROUPS.get(key[:m])
        if before is not None and _contraction_key(before) == _contraction_key(cores[0]):
            return _joined_group([before, *cores[m:]])
    return None


PREFIX_REACH = 16
"""How many parts after a joined prefix `_after_prefix` looks for it across (one layer's
tp-partial contractions, several micro-batches')."""


_GROUPS: dict[tuple[int, ...], Term | None] = {}
"""`_join_group` by its parts' serials (terms are interned for the whole run): every pass of
the normal form rebuilds each sum, and a stack's residual stream asks again to join the
layers' contractions that did not join before."""


def _joined_group(cores: list[Term]) -> Term | None:
    first = cores[0]
    if first.op == "stablehlo.scatter":
        return _join_scatters(cores)
    for pair in _summed_dims(first):
        dims = [(k, d) for k, d in enumerate(pair) if d is not None]
        for order in _candidate_orders(cores, dims):
            ordered = [cores[i] for i in order]
            args = [make_concat([c.args[k] for c in ordered], d) for k, d in dims]
            if not any(_joined(a, d) for a, (_, d) in zip(args, dims)):
                continue
            if first.op == "reduce_sum":
                return make_op("reduce_sum", tuple(args), first.attrs, first.shape,
                               first.dtype, linear_in=0)
            return make_dot(args[0], args[1], first.attrs, first.shape, first.dtype)
    return None


def _orders(cores: list[Term], dims: list[tuple[int, int]]) -> list[tuple[int, ...]]:
    """Every order `_candidate_orders` yields, in its order."""
    return list(_candidate_orders(cores, dims))


def _candidate_orders(cores: list[Term], dims: list[tuple[int, int]]
                      ) -> Iterator[tuple[int, ...]]:
    """Orders to try the pieces of a sum in (any order is exact; these are the ones in which a
    concatenation can meet): by the argument each piece's operand moves, where each moves
    another (`q @ wq + k @ wk` over concatenated weights: one order on both sides, whichever
    order the pieces came in); by the start of each operand piece's window along its summed
    dim, where the pieces are windows of one term; then by the first slice found under each
    operand piece (the same position in pieces computed alike), where those are windows of
    one term at distinct starts. Yielded one at a time, each key computed only once the
    orders before it did not join: the later keys walk each piece's subterms
    (`_distinct_slice_starts`), whose terms hold every layer below in a deep stack."""
    found: list[tuple[int, ...]] = []
    for k, _ in dims:
        weights = [_moved_argument_index(c.args[k]) for c in cores]
        if None not in weights and len(set(weights)) == len(weights):
            found.append(tuple(sorted(range(len(cores)), key=lambda i: weights[i])))
            yield found[-1]
    for keyed in (_window_start, _first_slice_start):
        for k, d in dims:
            keys = [keyed(c.args[k], d) for c in cores]
            if any(key is None for key in keys) or len({key[0] for key in keys}) != 1 \
                    or len({key[1] for key in keys}) != len(keys):
                continue
            order = tuple(sorted(range(len(cores)), key=lambda i: keys[i][1]))
            if order not in found:
                found.append(order)
                yield order
    for k, _ in dims:
        for starts_of in (_distinct_slice_starts, _unique_window_starts):
            starts = starts_of([c.args[k] for c in cores])
            if starts is not None:
                order = tuple(sorted(range(len(cores)), key=lambda i: starts[i]))
                if order not in found:
                    found.append(order)
                    yield order
