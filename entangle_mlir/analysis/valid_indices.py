"""Valid indices: the one assumption a proof may rest on, always stated in the report.

`jnp.take(w, tokens)` returns NaN for a token outside [0, V) (and wraps negative ones); the
vocab-parallel embedding returns zeros there. The two programs agree on every *valid* token,
which is what every user means. So when the output terms differ, the comparison tries again
with each integer input that indexes a table taken to be a valid index of it: an input read as
gather indices (through reshapes, broadcasts, converts and jax's wrap-around of negative
indices) into a dim of size V is assumed to lie in [0, V) (a slice of an input, `route[:, k]`:
only the elements it reads). Under that assumption comparisons
it decides become constants, selects on constants their branch, and a sum over the dims a
scatter-add indexes the sum of its updates. If the terms then agree,
the result is proven *under the assumption*, and the report says which input and which range.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

from entangle_mlir.core.intrange import value_range
from entangle_mlir.core.ranges import exact_convert
from entangle_mlir.core.rounding import Rounded, equal_up_to_rounding
from entangle_mlir.core.terms import (
    HOLE_BASE,
    LOOP_BODY_TERMS,
    Term,
    intern,
    make_op,
    make_reshape,
    make_splat,
    make_transpose,
    post_order,
    rebuild,
    splat_value,
    subterms,
)

GATHER = "stablehlo.gather"
SCATTER = "stablehlo.scatter"
_PEEL = ("reshape", "broadcast", "transpose", "stablehlo.convert")


@dataclass(frozen=True)
class IndexRange:
    """Input `arg` (a term) assumed in [0, size): it indexes a dim of that size."""

    arg: Term
    size: int

    def describe(self) -> str:
        if self.arg.op == "slice":
            starts, limits, strides = self.arg.attrs
            steps = "" if all(s == 1 for s in strides) else f" step {list(strides)}"
            where = ", ".join(f"{a}:{b}" for a, b in zip(starts, limits))
            return (f"input #{self.arg.args[0].attrs[0]}[{where}]{steps} holds valid indices, "
                    f"0 <= value < {self.size} (it indexes a dim of size {self.size})")
        return (f"input #{self.arg.attrs[0]} holds valid indices, 0 <= value < {self.size} "
                f"(it indexes a dim of size {self.size})")


def index_ranges(terms: list[Term]) -> dict[int, IndexRange]:
    """Integer inputs used as gather/scatter indices in `terms`, with the size they index
    (the smallest when several)."""
    found: dict[int, IndexRange] = {}
    for term in subterms(terms):
        if term.op not in (GATHER, SCATTER):
            continue
        attrs = dict(term.attrs)
        index_map = attrs.get("start_index_map", attrs.get("scatter_dims_to_operand_dims"))
        if not index_map or len(index_map) != 1:
            continue
        size = term.args[0].shape[index_map[0]]
        arg = _index_source(term.args[1], size)
        if arg is not None and (arg.serial not in found or found[arg.serial].size > size):
            found[arg.serial] = IndexRange(arg, size)
    return found


def _index_source(term: Term, size: int) -> Term | None:
    """The integer input an index term reads, through data movement and jax's wrap-around
    `select(x < 0, x + size, x)`."""
    while True:
        if term.op == "stablehlo.convert" and not exact_convert(term.args[0].dtype, term.dtype):
            break  # a narrowing convert wraps: the index is not the input's value
        if term.op in _PEEL and len(term.args) == 1:
            term = term.args[0]
        elif term.op == "stablehlo.select" and _is_wrap(term, size):
            term = term.args[2]
        else:
            break
    if term.op == "arg" and term.dtype.startswith(("i", "si", "ui")) and \
            term.attrs[0] < HOLE_BASE:
        return term  # a program input (a summarized layer's hole is any computed value)
    if term.op == "slice" and _index_source(term.args[0], size) is term.args[0] and \
            term.args[0].op == "arg":
        return term  # a slice of one (`route[:, k]`): only the elements the slice reads
    return None


def _is_wrap(term: Term, size: int) -> bool:
    pred, wrapped, plain = term.args
    return (pred.op == "stablehlo.compare" and pred.attrs == ("LT",)
            and pred.args[0] is plain and splat_value(pred.args[1]) == 0
            and wrapped.op == "lin" and wrapped.attrs[0] == size
            and list(wrapped.args) == [plain] and list(wrapped.attrs[1]) == [1])


class Simplifier:
    """Rewrites terms under integer input ranges (memoized over the DAG)."""

    def __init__(self, ranges: dict[int, IndexRange]):
        self.ranges = ranges
        self.memo: dict[int, Term] = {}
        self.bounds: dict[int, tuple[Fraction, Fraction] | None] = {}
        self.assumed = {s: (Fraction(0), Fraction(r.size - 1)) for s, r in ranges.items()}
        self.used: set[int] = set()
        self.sources: dict[int, frozenset[int]] = {}

    def simplify(self, term: Term) -> Term:
        for top in post_order(term, self.memo):
            args = tuple(self.memo[a.serial] for a in top.args)
            out = self._fold(top, args)
            if out is None:
                out = rebuild(top, args) if args != top.args else top
            self.memo[top.serial] = out
        return self.memo[term.serial]

    def _fold(self, term: Term, args: tuple[Term, ...]) -> Term | None:
        op = term.op
        if op == "stablehlo.compare" and len(args) == 2:
            decided = self._decide(args[0], args[1], term.attrs[0])
            if decided is not None:
                return make_splat(int(decided), term.shape, term.dtype)
        if op == "stablehlo.select":
            truth = _truth(args[0])
            if truth is not None:
                return args[1] if truth else args[2]
        if op in ("stablehlo.and", "stablehlo.or"):
            neutral = op == "stablehlo.and"
            kept = [a for a in args if _truth(a) is not neutral]
            if any(_truth(a) is (not neutral) for a in args):
                return make_splat(int(not neutral), term.shape, term.dtype)
            if len(kept) == 1 and kept[0].shape == term.shape:
                return kept[0]
            if not kept:
                return make_splat(int(neutral), term.shape, term.dtype)
        if op == "stablehlo.clamp":
            lo, x, hi = (self.bound(a) for a in args)
            if lo is not None and x is not None and hi is not None and lo[1] <= x[0] \
                    and x[1] <= hi[0]:
                self.used.update(self._sources(args[1]))
                return args[1]
        if op == "while_result":
            index, depth, (cond, yields) = term.attrs
            if cond not in LOOP_BODY_TERMS or any(y not in LOOP_BODY_TERMS for y in yields):
                return None
            body = [self.simplify(LOOP_BODY_TERMS[s]) for s in (cond, *yields)]
            for t in body:
                LOOP_BODY_TERMS[t.serial] = t
            summary = (body[0].serial, tuple(t.serial for t in body[1:]))
            return intern(op, args, (index, depth, summary), term.shape, term.dtype)
        if op in ("reduce_and", "reduce_or") and splat_value(args[0]) is not None:
            return make_splat(splat_value(args[0]), term.shape, term.dtype)
        if op == "reduce_sum" and args[0].op == SCATTER:
            return self._sum_of_scatter(args[0], term.attrs[0], term.shape)
        return None

    def _sum_of_scatter(self, scatter: Term, dims: tuple[int, ...],
                        shape: tuple[int, ...]) -> Term | None:
        """A sum over exactly the dims a scatter-add into zeros indexes is the sum of its
        updates, when every index is in bounds: each update lands at one position of those
        dims (repeated indices add up there), and no update is dropped. The dims kept are the
        batching dims and whole windows, taken from the updates' matching dims. This is the
        one-hot's row sum in the gradient of `log_softmax` picked by `take_along_axis`
        (`sum(scatter(0, labels, g)) = g`). None: not such a sum, or an index not known in
        bounds."""
        layout = scatter_sum_layout(scatter, dims)
        if layout is None:
            return None
        summed, order = layout
        indexed = dict(scatter.attrs)["scatter_dims_to_operand_dims"]
        limit = min(scatter.shape[d] for d in indexed) - 1
        bound = self.bound(scatter.args[1])
        if bound is None or bound[0] < 0 or bound[1] > limit:
            return None
        self.used.update(self._sources(scatter.args[1]))
        updates = scatter.args[2]
        kept = tuple(n for d, n in enumerate(updates.shape) if d not in summed)
        total = make_op("reduce_sum", (updates,), (summed,), kept, scatter.dtype, linear_in=0)
        return make_reshape(make_transpose(total, order), shape)

    def _decide(self, a: Term, b: Term, direction: str) -> bool | None:
        ra, rb = self.bound(a), self.bound(b)
        if ra is None or rb is None:
            return None
        (alo, ahi), (blo, bhi) = ra, rb
        table = {
            "LT": (ahi < blo, alo >= bhi), "LE": (ahi <= blo, alo > bhi),
            "GT": (alo > bhi, ahi <= blo), "GE": (alo >= bhi, ahi < blo),
            "EQ": (alo == ahi == blo == bhi, ahi < blo or alo > bhi),
            "NE": (ahi < blo or alo > bhi, alo == ahi == blo == bhi),
        }
        always, never = table.get(direction, (False, False))
        if always or never:
            self.used.update(self._sources(a) | self._sources(b))
            return bool(always)
        return None

    def _sources(self, term: Term) -> frozenset[int]:
        """The ranged inputs `term` reads (memoized over the DAG: the terms compared are
        often large, and share most of their subterms)."""
        memo = self.sources
        for top in post_order(term, memo):
            found = frozenset((top.serial,)) if top.serial in self.ranges else frozenset()
            for a in top.args:
                found |= memo[a.serial]
            memo[top.serial] = found
        return memo[term.serial]

    def bound(self, term: Term) -> tuple[Fraction, Fraction] | None:
        """[lo, hi] of every element of an integer term, in its dtype's arithmetic (a value
        that may wrap around has its dtype's whole range), or None."""
        return value_range(term, self.assumed, self.bounds)


def scatter_sum_layout(scatter: Term, dims: tuple[int, ...]
                       ) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    """For `reduce_sum(scatter, dims)` where the scatter adds into zeros and `dims` are
    exactly the dims it inserts (every indexed dim among them, every window whole): the
    updates' dims to sum, and the permutation of the updates' remaining dims into the
    operand's order of its kept dims. None otherwise."""
    attrs = dict(scatter.attrs)
    if attrs.get("reducer") != "add" or splat_value(scatter.args[0]) != 0:
        return None
    inserted, indexed = attrs["inserted_window_dims"], attrs["scatter_dims_to_operand_dims"]
    batching = attrs["input_batching_dims"]
    if set(dims) != set(inserted) or not set(indexed) <= set(inserted):
        return None
    indices, updates, windows = scatter.args[1], scatter.args[2], attrs["update_window_dims"]
    vector = attrs["index_vector_dim"]
    index_dims = [d for d in range(len(indices.shape)) if d != vector]
    update_scatter = [d for d in range(len(updates.shape)) if d not in windows]
    if len(update_scatter) != len(index_dims):
        return None
    from_index = dict(zip(index_dims, update_scatter))
    operand_windows = [d for d in range(len(scatter.shape))
                       if d not in inserted and d not in batching]
    source = {b: from_index[i] for b, i in zip(batching, attrs["scatter_indices_batching_dims"])}
    source.update(zip(operand_windows, windows))
    if any(updates.shape[source[d]] != scatter.shape[d] for d in operand_windows):
        return None
    kept_operand = [d for d in range(len(scatter.shape)) if d not in inserted]
    kept_updates = [source[d] for d in kept_operand]
    summed = tuple(d for d in range(len(updates.shape)) if d not in kept_updates)
    remaining = sorted(kept_updates)
    return summed, tuple(remaining.index(u) for u in kept_updates)


def _truth(term: Term) -> bool | None:
    value = splat_value(term)
    if isinstance(value, Fraction):
        return value != 0
    return None


class ValidIndices:
    """The comparison of a program's outputs under the valid-index assumption: the ranges come
    from every reference output, and one memo serves every output."""

    def __init__(self, reference_terms: list[Term]):
        self.ranges = index_ranges(reference_terms)
        self.simplifier = Simplifier(self.ranges)

    def equal(self, want: Term, got: Term) -> list[str] | None:
        """The assumptions (in words, possibly none) under which the two terms are equal,
        when the index-range rewrites make them identical; None otherwise."""
        if not self.ranges:
            return None
        simplifier = self.simplifier
        before = set(simplifier.used)
        if simplifier.simplify(want) is not simplifier.simplify(got):
            return None
        used = set(simplifier.used) - before or self._used_by(want, got)
        return [self.ranges[s].describe() for s in sorted(used)]

    def equal_up_to_rounding(self, want: Term, got: Term
                             ) -> tuple[list[str], list[Rounded]] | None:
        """`equal` where the simplified terms may also differ in constants that are the
        reference's rounded to their dtype (`rounding.equal_up_to_rounding`): the two
        liberties compose (under the ranges each term equals its simplified form, and those
        are the same computation up to the rounded constants). XLA's per-device program of a
        model with a vocab-parallel lookup needs both: the lookup's mask decided by the ranges,
        the attention's `x / sqrt(d)` folded into `x * fl(1 / sqrt(d))`. The assumptions in
        words and the rounded constants, or None."""
        if not self.ranges:
            return None
        simplifier = self.simplifier
        before = set(simplifier.used)
        rounded = equal_up_to_rounding(simplifier.simplify(want), simplifier.simplify(got))
        if rounded is None:
            return None
        used = set(simplifier.used) - before or self._used_by(want, got)
        return [self.ranges[s].describe() for s in sorted(used)], rounded

    def assumed_for(self, term: Term) -> list[str]:
        """The assumptions (in words) the simplifier used on `term`'s integer inputs."""
        return [self.ranges[s].describe() for s in sorted(self._used_by(term, term))]

    def _used_by(self, want: Term, got: Term) -> set[int]:
        """Ranges whose inputs these terms read, when an earlier output already used them
        (the memo does not record which output a decision belongs to)."""
        reads = self.simplifier._sources(want) | self.simplifier._sources(got)
        return reads & set(self.simplifier.used)
