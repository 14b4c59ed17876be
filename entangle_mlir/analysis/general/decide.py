"""Deciding one equality of the general tier exactly: two terms over the global inputs.

In order: the same interned term; the same term after `core/normal_form/`; the same once
products with zero are dropped (`without_kept_zeros`: a proof only under --assume-no-overflow,
since `0 * t` is NaN where `t` overflows; without it the reason says what was kept); Z3 on
both terms at their real shapes (integers in their dtype's range, kept integer tables at
their values), first without assumptions, then under the valid-index assumption
(`valid_indices.py`: the terms simplified under the ranges, and the ranges as hypotheses).
There is no tolerance: `unknown`, a timeout or a term over the size caps (elements, and the
multiply-adds a query is built from: Z3's timeout does not bound building it) is "not
proven".
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from entangle_mlir.analysis.valid_indices import IndexRange, Simplifier, index_ranges
from entangle_mlir.core.normal_form import blocks_meet, generic_element, normal_form
from entangle_mlir.core.precision import integer_exact_below
from entangle_mlir.core.terms import (
    DENSE_VALUES,
    Term,
    finite_unless_overflow,
    is_zero_multiple,
    linear_parts,
    make_lin,
    make_splat,
    post_order,
    pretty,
    rebuild,
    splat_value,
    subterms,
)

_MOVES = frozenset({"arg", "splat", "dense", "iota", "broadcast", "reshape", "transpose",
                    "slice", "concatenate", "pad", "stablehlo.select", "stablehlo.reverse",
                    "stablehlo.gather", "dynamic_slice", "stablehlo.dynamic_update_slice",
                    "stablehlo.maximum", "stablehlo.minimum", "reduce_max", "reduce_min",
                    "stablehlo.compare", "stablehlo.and", "stablehlo.or", "stablehlo.not",
                    "stablehlo.xor", "stablehlo.clamp", "stablehlo.convert", "loopvar",
                    "while_result", "region_result", "reduce_and", "reduce_or"})
"""Term ops that compute no float arithmetic of their own (they move, pick, compare or
convert values; a rounding convert is an uninterpreted rounding to Z3)."""


UNINTERPRETED = frozenset(f"stablehlo.{name}" for name in (
    "exponential", "exponential_minus_one", "log", "log_plus_one", "tanh", "logistic", "rsqrt",
    "sqrt", "cbrt", "sine", "cosine", "tan", "atan2", "power", "convert")) | {"chlo.erf"}
"""Term ops Z3 reads as unknown functions (`semantics/element.py`: transcendental functions,
and rounding converts as `round_<dtype>`)."""


@dataclass
class Decision:
    """The outcome of one equality: `status` is "proved", "refuted" (inputs where the two
    differ were found, `counterexample` shows some of them, `inputs` holds them all) or
    "unknown" (`reason`)."""

    status: str
    reason: str = ""
    assumptions: list[str] = field(default_factory=list)
    counterexample: dict[str, str] | None = None
    how: str = ""
    inputs: dict[int, np.ndarray] | None = field(default=None, repr=False)
    """Of a refutation: every argument of the two terms (argument index -> exact values: ints,
    Fractions, bools) on which the terms as built, before any normal form, differ."""

    @property
    def proved(self) -> bool:
        return self.status == "proved"


def computed_float_dtypes(terms: list[Term]) -> set[str]:
    """The float dtypes arithmetic is computed in under `terms` (Z3 reads every float op as
    exact real arithmetic, so terms computed in two float types could meet falsely)."""
    found = set()
    for term in subterms(terms):
        if term.op in _MOVES or not term.dtype.startswith(("f", "bf")):
            continue
        found.add(term.dtype)
    return found


FLOAT_TYPES = "float arithmetic in several types"
"""How `several_float_types`' reason begins (`passes/general_tier.py` shows it as a note)."""


def several_float_types(want: Term, got: Term, floats: set[str]) -> str:
    """Why terms computed in several float types are not decided, naming the types each side
    computes in where they differ (a sharded program's `jnp.prod` or `jnp.sum` of bf16
    values computes in f32, the reference's `jnp.cumprod` in bf16: they round differently)."""
    ours, theirs = computed_float_dtypes([want]), computed_float_dtypes([got])
    where = ""
    if ours != theirs:
        where = (f": the reference computes in {', '.join(sorted(ours)) or 'no float type'}, "
                 f"the sharded program in {', '.join(sorted(theirs)) or 'no float type'}, "
                 "so they round differently")
    return (f"{FLOAT_TYPES} ({', '.join(sorted(floats))}){where}: the "
            "general tier compares exact real values, so it does not tell the roundings apart")


MAX_SCATTER_WORK = 20_000
"""Z3's evaluation of a scatter at symbolic indices compares every update with every element
of its operand, each comparison a new expression over the ones before: past this many
(updates x operand elements), building the query alone takes minutes (a vocab-parallel
embedding's gradient, 512 x 1024: four minutes), so the equality is not decided."""


def scatter_work(terms: list[Term]) -> int:
    """The largest updates x operand elements of a scatter under `terms` whose indices are
    not constants (0 where none is)."""
    work = 0
    for term in subterms(terms):
        if term.op == "stablehlo.scatter" and len(term.args) == 3 and not _constant(
                term.args[1]):
            operand, _, updates = term.args
            work = max(work, math.prod(operand.shape) * math.prod(updates.shape))
    return work


def _constant(term: Term) -> bool:
    """Whether every leaf of `term` is a value the evaluation knows (an iota, a splat, a dense
    constant whose values the term builders kept)."""
    return all(t.args or t.op in ("iota", "splat")
               or t.op == "dense" and t.attrs[0] in DENSE_VALUES for t in subterms([term]))


def _inexact_iota(terms: list[Term]) -> Term | None:
    """A float iota longer than its dtype holds integers exactly: the semantics evaluates
    iotas as exact integers, which such an iota's elements are not (257 is no bf16 value)."""
    for term in subterms(terms):
        if term.op == "iota" and term.dtype.startswith(("f", "bf")):
            exact = integer_exact_below(term.dtype)
            if exact is None or term.shape[0] - 1 > exact:
                return term
    return None


class Decider:
    """Decides equalities against one reference (its outputs give the valid-index ranges);
    a memo of normal forms is shared by every equality."""

    def __init__(self, reference_outputs: list[Term], timeout_ms: int = 5_000,
                 assume_no_overflow: bool = False):
        self.ranges: dict[int, IndexRange] = index_ranges(reference_outputs)
        self.timeout_ms = timeout_ms
        self.memo: dict[int, Term] = {}
        self.assume_no_overflow = assume_no_overflow
        self.without_zeros: dict[int, Term] = {}

    def decide(self, want: Term, got: Term, name: str, timeout_ms: int | None = None,
               ground: bool = True) -> Decision:
        """Whether `want == got` for every input. A refutation is grounded in the terms as
        built: they are evaluated on the inputs found (on the normal forms, the terms the
        valid-index ranges simplified, or by Z3) and must differ there, so that neither a
        normal-form identity nor a simplification can make one; otherwise it is "unknown".
        (Terms of different shapes need no inputs.) `timeout_ms`: this decision's Z3 budget,
        when not the decider's. `ground` False: a refutation is not grounded (the caller only
        asks whether the terms are proven equal)."""
        decision = self._decide(want, got, name, timeout_ms or self.timeout_ms)
        if decision.status != "refuted" or want.shape != got.shape or not ground:
            return decision
        from entangle_mlir.analysis.instance.term_equality import (  # lazy: z3 (~40 ms)
            complete_inputs,
            differ_at,
        )

        inputs = complete_inputs(decision.inputs, [want, got], self._bounds([want, got]))
        if inputs is not None and differ_at(want, got, inputs):
            decision.inputs = inputs
            return decision
        return Decision("unknown", "the decision found the terms different, but they agree on "
                        "the inputs it found" + (f" ({decision.reason})" if decision.reason
                                                 else ""))

    def _without_zeros(self, term: Term) -> Term:
        """`term` in normal form without droppable products with zero
        (`without_kept_zeros`), again where the normal form made new ones (at most
        `MAX_ZERO_ROUNDS` times)."""
        for _ in range(MAX_ZERO_ROUNDS):
            term = normal_form(without_kept_zeros(term, self.without_zeros), self.memo)
            if _kept_zero([term]) is None:
                break
        return term

    def _bounds(self, terms: list[Term]) -> dict[int, tuple[int, int]]:
        """The valid-index ranges of the arguments under `terms`, as (lo, hi) by index."""
        serials = {t.serial for t in subterms(terms)}
        return {r.arg.attrs[0]: (0, r.size - 1) for s, r in self.ranges.items()
                if s in serials}

    def _decide(self, want: Term, got: Term, name: str, timeout_ms: int) -> Decision:
        if want is got:
            return Decision("proved", how="identical terms")
        if want.shape != got.shape:
            return Decision("refuted", f"shapes {want.shape} and {got.shape} differ")
        if want.dtype != got.dtype:
            return Decision("unknown", f"element types {want.dtype} and {got.dtype} differ")
        nw, ng = normal_form(want, self.memo), normal_form(got, self.memo)
        if nw is ng:
            return Decision("proved", how="normal form")
        if blocks_meet(nw, ng, self.memo):
            return Decision("proved", how="normal form, block by block")
        kept = _kept_zero([nw, ng])
        if kept is not None:
            zw, zg = self._without_zeros(nw), self._without_zeros(ng)
            if zw is zg or blocks_meet(zw, zg, self.memo):
                if self.assume_no_overflow:
                    return Decision("proved", assumptions=[NO_OVERFLOW], how="normal form, "
                                    "products with zero of values finite unless overflow")
                factor = [a for a in kept.args if a.op != "splat"]
                shown = pretty(factor[0] if len(factor) == 1 else kept, 3)
                return Decision("unknown", f"equal where nothing overflows, but 0 * {shown} "
                                "is kept: it is NaN where that value overflows (inf * 0), so "
                                "it is not 0 unless no sum or product overflows "
                                "(--assume-no-overflow)")
        inexact = _inexact_iota([nw, ng])
        if inexact is not None:
            return Decision("unknown", f"an iota of {inexact.shape[0]} positions in "
                            f"{inexact.dtype}, which does not hold them all exactly")
        floats = computed_float_dtypes([nw, ng])
        if len(floats) > 1:
            return Decision("unknown", several_float_types(nw, ng, floats))
        from entangle_mlir.analysis.instance.term_equality import (  # lazy: z3 (~40 ms)
            MAX_QUERY_WORK,
            check_term_equality,
            differing_inputs,
        )
        from entangle_mlir.analysis.solver import fresh_contexts  # lazy: z3

        ranges = {r.arg.attrs[0]: r for s, r in self.ranges.items()
                  if any(t.serial == s for t in subterms([nw, ng]))}
        bounds = {i: (0, r.size - 1) for i, r in ranges.items()}
        simplified = None
        if ranges:
            simplifier = Simplifier({r.arg.serial: r for r in ranges.values()})
            simplified = simplifier.simplify(nw), simplifier.simplify(ng)
            assumed = [r.describe() for r in ranges.values()]
            if simplified[0] is simplified[1]:
                return Decision("proved", assumptions=assumed, how="valid indices")
        # Terms computed element by element are compared at one generic element: the
        # same verdict (`generic_element`), with a query n times smaller.
        shapes = {t.attrs[0]: t.shape for t in subterms([nw, ng]) if t.op == "arg"}
        plain_pair = generic_element([nw, ng]) or [nw, ng]
        under_pair = (generic_element(list(simplified)) or list(simplified)) if simplified \
            else None
        # Terms that differ on random inputs (valid indices, where the reference has them)
        # differ for every reading of the unknown functions: no Z3 query can prove them.
        pair = under_pair or plain_pair
        found = differing_inputs(*pair, bounds)
        if found is not None:
            return _failed_at(_widened(found, pair, shapes), list(pair))
        work = scatter_work([nw, ng, *pair])
        if work > MAX_SCATTER_WORK:
            return Decision("unknown", "a scatter at unknown indices too large to evaluate "
                            f"symbolically ({work} update x element comparisons)")
        with fresh_contexts():  # the verdict rests on it: not on what the process asked before
            plain = check_term_equality(*plain_pair, name, timeout_ms, typed=True,
                                        known_dense=True, finite_alike=True,
                                        max_work=MAX_QUERY_WORK)
        if plain.proved:
            return Decision("proved", how="Z3")
        if under_pair is not None:
            with fresh_contexts():
                under = check_term_equality(*under_pair, f"{name}.valid_indices",
                                            timeout_ms, typed=True, known_dense=True,
                                            finite_alike=True, ranges=bounds,
                                            max_work=MAX_QUERY_WORK)
            if under.proved:
                return Decision("proved", assumptions=assumed, how="Z3, valid indices")
            return _widened_decision(_failed(under, under_pair), under_pair, shapes)
        return _widened_decision(_failed(plain, plain_pair), plain_pair, shapes)


def _widened(inputs: dict[int, np.ndarray] | None, terms: list[Term],
             shapes: dict[int, tuple[int, ...]]) -> dict[int, np.ndarray] | None:
    """Inputs found for generic elements (`generic_element`: scalar arguments) as inputs of
    the whole terms (`shapes`: each argument's shape there): every element of an argument
    takes its scalar's value, so the terms differ at every position where the scalars did.
    Inputs of the right shape are kept."""
    if inputs is None:
        return None
    widened = {}
    for index, values in inputs.items():
        target = shapes.get(index, ())
        if target != () and np.shape(values) == ():
            widened[index] = np.full(target, np.asarray(values, dtype=object).item(),
                                     dtype=object)
        else:
            widened[index] = values
    return widened


def _widened_decision(decision: Decision, terms: list[Term],
                      shapes: dict[int, tuple[int, ...]]) -> Decision:
    decision.inputs = _widened(decision.inputs, terms, shapes)
    return decision


def _failed_at(inputs: dict[int, np.ndarray], terms: list[Term]) -> Decision:
    """Terms that differ on these random inputs: a refutation where nothing in them is read
    as an unknown function (or an unknown constant table), else only "not shown equal"."""
    from entangle_mlir.analysis.instance.term_equality import shown_inputs  # lazy: z3

    unknown = _unknown_parts(terms)
    if unknown:
        return Decision("unknown", "they differ on random inputs when "
                        f"{', '.join(unknown)} are read as arbitrary functions",
                        counterexample=shown_inputs(inputs))
    return Decision("refuted", "", counterexample=shown_inputs(inputs), inputs=inputs)


def _unknown_parts(terms: list[Term]) -> list[str]:
    """What Z3 and the random evaluation read as unknown: transcendental functions, rounding
    converts, constant tables whose values the terms did not keep."""
    found = {t.op.split(".")[-1] for t in subterms(terms) if t.op in UNINTERPRETED}
    if any(t.op == "dense" and t.attrs[0] not in DENSE_VALUES for t in subterms(terms)):
        found.add("constant tables")
    return sorted(found)


def _failed(result, terms: list[Term]) -> Decision:
    """A Z3 check that did not prove the equality, as a decision."""
    if result.status == "skipped":
        return Decision("unknown", f"{result.reason}: the general tier checks terms at their "
                        "real shape, up to a size (shape-reduced checks are next)")
    return _not_shown(result, terms)


def _not_shown(result, terms: list[Term]) -> Decision:
    """A Z3 answer other than "proved" as a decision. A counterexample is a refutation only
    where the terms hold no function Z3 reads as unknown (exp, log, ...: it may pick values
    no real function takes); otherwise it is only "not shown"."""
    if result.status != "refuted":
        return Decision("unknown", result.reason or result.status,
                        counterexample=result.counterexample)
    unknown = _unknown_parts(terms)
    if unknown:
        return Decision("unknown", "Z3 finds a counterexample reading "
                        f"{', '.join(unknown)} as unknown functions",
                        counterexample=result.counterexample)
    return Decision("refuted", result.reason, counterexample=result.counterexample,
                    inputs=result.witness)


MAX_ZERO_ROUNDS = 4
"""How many times `Decider._without_zeros` drops products with zero and renormalizes."""

NO_OVERFLOW = ("no sum or product overflows (--assume-no-overflow): 0 * t is 0 for every t "
               "computed from finite inputs without a division by zero or a function outside "
               "its domain")
"""The assumption a decision that dropped kept zeros rests on."""


def _kept_zero(terms: list[Term]) -> Term | None:
    """A product with zero (`terms.zero_multiple`: `0 * t` with `t` not shown finite, or a
    contraction with zeros) among `terms`' subterms whose other factor would be finite
    unless a sum or product overflows (`finite_unless_overflow`), else None."""
    for term in subterms(terms):
        if _droppable(term):
            return term
    return None


def _droppable(term: Term) -> bool:
    """`term` is `0 * t` or a contraction of zeros with `t`, `t` finite unless a sum or
    product overflows."""
    if not (is_zero_multiple(term) or term.op == "stablehlo.dot_general"
            and any(splat_value(a) == 0 for a in term.args)):
        return False
    return all(finite_unless_overflow(a) for a in term.args)


def without_kept_zeros(term: Term, memo: dict[int, Term]) -> Term:
    """`term` with every product with zero whose other factors are finite unless a sum or
    product overflows (`finite_unless_overflow`) replaced by zero, rebuilt bottom-up through
    the builders (which then drop the zero parts of sums and products). Exact where nothing
    overflows, which is what `--assume-no-overflow` takes: there `0 * t` is 0. Memoized by
    serial; each shared subterm is rebuilt once."""
    for top in post_order(term, memo):
        args = tuple(memo[a.serial] for a in top.args)
        out = rebuild(top, args) if args != top.args else top
        memo[top.serial] = _zero_dropped(out)
    return memo[term.serial]


def _zero_dropped(term: Term) -> Term:
    """`term` itself zero when it is a droppable product with zero; a sum without its
    droppable products with zero (which rebuilding a sum may create); else `term`."""
    if _droppable(term):
        return make_splat(0, term.shape, term.dtype)
    if term.op == "lin":
        pairs, constant = linear_parts(term)
        kept = [(k, t) for k, t in pairs if not _droppable(t)]
        if len(kept) != len(pairs):
            return make_lin(kept, constant, term.shape, term.dtype)
    return term
