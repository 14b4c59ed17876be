"""`normal_form`: a term rebuilt bottom-up through the identities of this package (memoized
by serial, repeated to a fixed point), node by node (`_rewritten`).

Part of `entangle_mlir.core.normal_form` (the package docstring lists every identity)."""

from __future__ import annotations

from fractions import Fraction

from entangle_mlir.core import selection
from entangle_mlir.core.normal_form.concat import (
    make_concat,
    reshape_of_concat,
    slice_of_concat,
    transpose_of_concat,
)
from entangle_mlir.core.normal_form.constants import (
    fold_constant,
    scatter_at_constants,
    scatter_replace_at_constants,
)
from entangle_mlir.core.normal_form.pieces import _ELEMENTWISE, _REDUCTIONS
from entangle_mlir.core.normal_form.regroup import (
    merge_contracted_dims,
    merge_summed_dims,
    merge_through_broadcast,
    reshape_through_dot,
    reshape_through_reduction,
    sum_of_blocks,
    swapped_dot,
)
from entangle_mlir.core.normal_form.slices import (
    slice_of_reduction,
    slice_of_reshape,
    slice_through,
)
from entangle_mlir.core.normal_form.squeeze import squeeze, unit_kept_reduction
from entangle_mlir.core.normal_form.sums import join_sums
from entangle_mlir.core.terms import (
    LONG_LIN,
    Term,
    lin_keys,
    make_broadcast,
    make_lin,
    make_splat,
    post_order,
    rebuild,
)


def normal_form(term: Term, memo: dict[int, Term] | None = None) -> Term:
    """`term` rebuilt bottom-up through the builders and this module's identities; again
    (at most MAX_PASSES times) where a rewrite built new terms the builders left outside the
    normal form (a slice the builders pushed under a reshape)."""
    memo = {} if memo is None else memo
    result = _normal_pass(term, memo, chains=False)
    for count in range(1, MAX_PASSES):
        again = _normal_pass(result, memo, chains=count >= PASSES_BEFORE_CHAINS)
        if again is result:
            break
        memo[term.serial] = result = again
    return result


MAX_PASSES = 12
PASSES_BEFORE_CHAINS = 4
"""Passes made before a pass reads each operand at the end of its memo chain (`_latest`):
a term still moving after that many is a deep stack, which the chains normalize in a few
passes more; before it each pass reads its operands' results of the last pass only (the
forms two programs' pieces meet in, which an earlier chain end recorded for the other
program's terms can move apart)."""
"""How many bottom-up passes `normal_form` makes at most (each identity is exact, so
stopping early only leaves two forms unmet)."""


def _normal_pass(term: Term, memo: dict[int, Term], chains: bool) -> Term:
    read = _latest if chains else (lambda a, memo: memo[a.serial])
    for top in post_order(term, memo):
        if top.op == "lin" and len(top.args) >= LONG_LIN:
            memo[top.serial] = _normal_long_sum(top, memo, read)
            continue
        args = tuple(read(a, memo) for a in top.args)
        memo[top.serial] = _normal_node(top, args, memo)
    return read(term, memo)


def _normal_long_sum(term: Term, memo: dict[int, Term], read) -> Term:
    """The normal form of a `lin` of at least `LONG_LIN` parts; when its first parts (all
    but the last `PREFIX_REACH` at most) are, with the same coefficients, the parts of a
    long `lin` normalized before (`_SUM_PREFIXES`, its form in `memo`) and the two
    constants are the same rational, that form plus the remaining parts' forms, rebuilt and
    joined as any sum (`_finished`). Exact: `sum_i k_i t_i + c` is `(sum_{i<m} k_i t_i + c)
    + sum_{i>=m} k_i t_i`, a regrouping of the sum. A stack's residual stream of l layers is
    one flat `lin` holding every layer's parts (l x tp of them), each layer's the layer
    below's plus its own: this way a layer's stream touches only its own parts, not the
    parts of every layer below again (which made the normal form quadratic in the layers)."""
    serials, coef_keys = lin_keys(term)
    found = _normal_prefix(term, serials, coef_keys, memo)
    if found is None:
        out = _normal_node(term, tuple(read(a, memo) for a in term.args), memo)
    else:
        base, m = found
        coefs = term.attrs[1]
        pairs = [(_ONE, read(base, memo))]
        pairs.extend((coefs[i], read(term.args[i], memo)) for i in range(m, len(coefs)))
        out = _finished(make_lin(pairs, _ZERO, term.shape, term.dtype))
    if len(_SUM_PREFIXES) >= MAX_SUM_PREFIXES:
        _SUM_PREFIXES.clear()
    _SUM_PREFIXES[serials] = term
    return out


def _normal_prefix(term: Term, serials: tuple[int, ...], coef_keys: tuple,
                   memo: dict[int, Term]) -> tuple[Term, int] | None:
    """(base, m) for the longest long `lin` `base` normalized in `memo` whose parts are
    `term`'s first m parts with the same coefficients (m at least `len - PREFIX_REACH`)
    and whose constant is `term`'s, a rational; else None."""
    constant = term.attrs[0]
    if type(constant) is not Fraction:
        return None
    for m in range(len(serials) - 1, max(LONG_LIN, len(serials) - PREFIX_REACH) - 1, -1):
        base = _SUM_PREFIXES.get(serials[:m])
        if base is None or base.serial not in memo or type(base.attrs[0]) is not Fraction \
                or base.attrs[0] != constant or lin_keys(base)[1] != coef_keys[:m]:
            continue
        return base, m
    return None


PREFIX_REACH = 16
"""How many parts after a normalized prefix `_normal_prefix` looks for it across (one
layer's tp-partial contributions, several micro-batches')."""

_SUM_PREFIXES: dict[tuple[int, ...], Term] = {}
"""Long `lin`s normalized, by their parts' serials (`terms.lin_keys`; interned terms: a
serial is never reused), for `_normal_prefix`."""

MAX_SUM_PREFIXES = 1 << 16
"""The most sums `_SUM_PREFIXES` keeps before it starts over."""

_ONE = Fraction(1)
_ZERO = Fraction(0)


MAX_CHAIN = 64
"""How many memo entries `_latest` follows from one term."""


def _latest(term: Term, memo: dict[int, Term]) -> Term:
    """The last term of `term`'s chain in `memo` (`term` -> its pass's result -> that
    result's next pass's -> ...), at most MAX_CHAIN steps: a pass records a node's result
    of that pass only, so a node the builders make again later (a layer's residual stream,
    rebuilt while the layers above it are joined) would otherwise move one step a pass, and
    a stack of L layers would take L passes. Each step is an exact identity, so any point
    of the chain is the same value."""
    out = memo[term.serial]
    for _ in range(MAX_CHAIN):
        following = memo.get(out.serial)
        if following is None or following is out:
            break
        out = following
    if out is not memo[term.serial]:
        memo[term.serial] = out
    return out


def _renormal(rewritten: Term, term: Term, args: tuple[Term, ...],
              memo: dict[int, Term]) -> Term | None:
    """The normal form of a node's rewrite, or None where the rewrite gave the node back
    (a slice of a reshape whose box squeezes back to that slice): normalizing it again
    would not end."""
    if rewritten is term or (rewritten.op == term.op and rewritten.args == args
                             and rewritten.attrs == term.attrs):
        return None
    return normal_form(rewritten, memo)


def _normal_node(term: Term, args: tuple[Term, ...], memo: dict[int, Term]) -> Term:
    out = _rewritten(term, args, memo)
    return out if out is not None else _rebuilt_node(term, args)


def _rewritten(term: Term, args: tuple[Term, ...], memo: dict[int, Term]) -> Term | None:
    """A node rewritten by one of this module's identities (in normal form), or None."""
    if term.op == "concatenate":
        return make_concat(args, term.attrs[0])
    if term.op == "slice":
        spanning = slice_of_concat(args[0], *term.attrs)
        if spanning is not None:
            return spanning
        for rewrite in (slice_of_reshape, slice_through):
            box = rewrite(args[0], *term.attrs)
            found = None if box is None else _renormal(box, term, args, memo)
            if found is not None:
                return found
        reduced = slice_of_reduction(args[0], *term.attrs)
        if reduced is not None:
            return reduced
    if term.op == "reduce_sum":
        blocks = sum_of_blocks(term, args[0])
        if blocks is not None:
            return join_sums(blocks)
        merged = merge_summed_dims(term, args[0])
        if merged is not None:
            return _renormal(merged, term, args, memo)
    if term.op in _REDUCTIONS and len(args) == 1:
        kept_apart = unit_kept_reduction(term, args[0])
        if kept_apart is not None:
            return _renormal(kept_apart, term, args, memo)
    if term.op == "stablehlo.dot_general":
        merged = merge_contracted_dims(term, args)
        if merged is not None:
            return _renormal(merged, term, args, memo)
    if term.op == "transpose" and args[0].op == "concatenate":
        return transpose_of_concat(args[0], term.attrs[0])
    if term.op == "reshape":
        pieces = reshape_of_concat(term, args[0])
        if pieces is not None:
            return pieces
        squeezed = squeeze(args[0], term.shape)
        if squeezed is None:
            squeezed = reshape_through_reduction(args[0], term.shape)
        if squeezed is None:
            squeezed = merge_through_broadcast(args[0], term.shape)
        if squeezed is None:
            squeezed = reshape_through_dot(args[0], term.shape)
        if squeezed is not None:
            return _renormal(squeezed, term, args, memo)
    if term.op == "transpose":
        swapped = swapped_dot(term, args[0])
        if swapped is not None:
            return swapped
    if term.op == "stablehlo.scatter":
        placed = scatter_at_constants(term, args)
        if placed is None:
            placed = scatter_replace_at_constants(term, args)
        if placed is not None:
            return placed
    return None


def _rebuilt_node(term: Term, args: tuple[Term, ...]) -> Term:
    """A node over its normal arguments, through the builders, constant folding, the joins
    of sums and the selection identities."""
    return _finished(rebuild(term, args) if args != term.args else term)


def _finished(out: Term) -> Term:
    """A node rebuilt over its normal arguments taken through constant folding, the joins
    of sums and the selection identities."""
    folded = fold_constant(out)
    if folded is not None:
        return folded
    hoisted = broadcast_hoisted(out)
    if hoisted is not None:
        return hoisted
    if out.op == "lin":
        out = join_sums(out)
    for _ in range(_MAX_SELECTION_STEPS):
        selected = selection.rewrite(out, make_concat)
        if selected is None:
            break
        out = selected
    return out


def broadcast_hoisted(term: Term) -> Term | None:
    """An elementwise op whose every operand is a broadcast (or splat) that leaves some dims
    of more than one element unfilled, as the broadcast along those dims of the op on the
    operands without them (exact: no operand's element depends on its index along them, so
    neither does the op's). A table computed from copies of one row block (four micro-batches'
    RoPE angles, reshaped out of copies of one (seq, d) table) meets the reference's table
    computed once and broadcast. None for other terms."""
    if term.op not in _ELEMENTWISE or not term.args or any(
            a.shape != term.shape or a.op not in ("broadcast", "splat") for a in term.args):
        return None
    filled = {d for a in term.args if a.op == "broadcast" for d in a.attrs[0]}
    free = [d for d, n in enumerate(term.shape) if n > 1 and d not in filled]
    if not free:
        return None
    kept = [d for d in range(len(term.shape)) if d not in free]
    at = {d: i for i, d in enumerate(kept)}
    shape = tuple(term.shape[d] for d in kept)
    args = tuple(make_splat(a.attrs[0], shape, a.dtype) if a.op == "splat" else
                 make_broadcast(a.args[0], tuple(at[d] for d in a.attrs[0]), shape)
                 for a in term.args)
    return make_broadcast(_rebuilt_node(term, args), tuple(kept), term.shape)


_MAX_SELECTION_STEPS = 4
"""How many of `selection.py`'s identities one node is rewritten by in a row (a decided
predicate, then the select it picks)."""
