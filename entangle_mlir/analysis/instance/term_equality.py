"""The fallback term-equality check: two reference terms the canonicalizer does not identify,
proved equal over the same fresh symbolic arguments (`check_term_equality`)."""

from __future__ import annotations

import math
import random
import time
from collections.abc import Sequence
from fractions import Fraction

import numpy as np
import z3

from entangle_mlir.analysis.instance.common import DEFAULT_TIMEOUT_MS, MAX_TERM_COST, term_cost
from entangle_mlir.analysis.instance.divisors import same_divisors
from entangle_mlir.analysis.instance.sources import Symbolic, leaf_args, leaf_name, opaque_resolver
from entangle_mlir.analysis.solver import ProofResult, consistent, prove, prove_all
from entangle_mlir.core.precision import FLOAT_FORMATS, is_float
from entangle_mlir.core.terms import DENSE_VALUES, Term, post_order, subterms
from entangle_mlir.semantics.element import (
    SemanticsError,
    collect_divisors,
    collect_roundings,
    equal,
    int_limits,
    is_bool_dtype,
    is_z3,
    monotone_hypotheses,
    random_functions,
    to_z3,
)
from entangle_mlir.semantics.evaluate import evaluate_term

MAX_QUERY_WORK = 20_000
"""The most multiply-adds (`query_work`) a term pair is evaluated into Z3 expressions for:
Z3's timeout bounds only the solver's search, not building and asserting the query, which
for contractions past this (a gradient's chain of dots, 45 698: 36 s; FSDP's, minutes) costs
more than the search is ever given."""


def query_work(terms: Sequence[Term]) -> int:
    """The size of the Z3 expressions the symbolic evaluation builds for `terms`: every
    distinct subterm's elements, times the contracted length for a dot_general, and a
    reduction's operand elements."""
    work = 0
    for term in subterms(terms):
        size = math.prod(term.shape)
        if term.op == "stablehlo.dot_general" and len(term.args) == 2:
            size *= math.prod(term.args[0].shape[d] for d in term.attrs[2])
        elif term.op.startswith("reduce") and term.args:
            size = max(size, math.prod(term.args[0].shape))
        work += size
    return work


def check_term_equality(a: Term, b: Term, name: str = "terms.equal",
                        timeout_ms: int = DEFAULT_TIMEOUT_MS,
                        max_cost: int = MAX_TERM_COST, *, typed: bool = False,
                        known_dense: bool = False,
                        ranges: dict[int, tuple[int, int]] | None = None,
                        finite_alike: bool = False,
                        max_work: int | None = None) -> ProofResult:
    """Prove two reference terms equal for every value of their arguments.

    For terms the canonicalizer does not identify (algebra it does not know): both are
    evaluated over the same fresh symbolic arguments and compared elementwise. Large terms
    are "skipped" (no shape reduction here: terms carry their shapes), by elements
    (`max_cost`) and, when given, by the size of the query (`max_work`, `query_work`: the
    solver's timeout does not bound building it, nor the overflow claim's).

    `typed`: integer arguments range over their dtype's values (else over all integers: a
    proof then holds a fortiori). `known_dense`: dense constants whose values the term
    builders kept (`terms.DENSE_VALUES`) are those values (else unknowns: a proof holds for
    every value of them). `ranges`: argument index -> (lo, hi), every element of that integer
    argument assumed in [lo, hi] (the valid-index assumption; the caller states it).

    `finite_alike`: Z3 reads float arithmetic as exact reals, where nothing overflows and
    `t * 0`, `t - t` are 0 for every t; a float program computes inf there (and NaN from it).
    So the proof must also show that one term computes a value out of its dtype's range
    exactly where the other does, counting every value either computes except sums (a
    regrouped sum may overflow differently: liberty 1) and values that only move or pick
    others (`OVERFLOW_FREE`). Inputs are finite values of their dtype (the policy's
    assumption 2). A failure here is "unknown", with the reason.
    """
    start = time.perf_counter()
    if a is b:
        return ProofResult("proved", None, 0.0, name, "identical terms")
    if a.shape != b.shape:
        return ProofResult("refuted", None, 0.0, name, f"shapes {a.shape} vs {b.shape}")
    cost = term_cost([a, b])
    if cost > max_cost:
        return ProofResult("skipped", None, 0.0, name,
                           f"terms too large to evaluate ({cost} elements)")
    work = 0 if max_work is None else query_work([a, b])
    if max_work is not None and work > max_work:
        return ProofResult("skipped", None, 0.0, name,
                           f"terms too large to evaluate ({work} multiply-adds)")
    source = Symbolic()
    env: dict = {}
    for index, leaf in leaf_args([a, b]).items():
        env[index] = source.tensor(leaf_name(index), leaf.shape, leaf.dtype)
    dense: dict[bytes, np.ndarray] = {}

    def resolve(term: Term) -> np.ndarray:
        key = term.attrs[0]
        if known_dense and key not in dense and key in DENSE_VALUES:
            table = np.asarray(DENSE_VALUES[key]).reshape(term.shape)
            dense[key] = np.array([_exact(v) for v in table.flat] or [], dtype=object
                                  ).reshape(term.shape)
        if key not in dense:
            dense[key] = source.tensor(f"dense{key.hex()[:8]}", term.shape, term.dtype)
        return dense[key]

    env["dense"] = resolve
    env["opaque"] = opaque_resolver(source)
    memo: dict[int, np.ndarray] = {}
    try:
        with collect_divisors() as divisors, collect_roundings() as roundings:
            left = evaluate_term(a, env, memo)
            of_a = len(divisors)
            # apart, so that each term's divisors are all collected (shared ones twice)
            right = evaluate_term(b, env, {} if finite_alike else memo)
    except (SemanticsError, z3.Z3Exception, ValueError, TypeError) as err:
        return ProofResult("unknown", None, time.perf_counter() - start, name,
                           f"cannot evaluate: {err}")
    if finite_alike:
        evaluate_term(b, env, memo)  # every node's value, for the overflow claim
    if finite_alike and not same_divisors(divisors[:of_a], divisors[of_a:]):
        return ProofResult("unknown", None, time.perf_counter() - start, name,
                           "one of them divides by a value the other does not divide by "
                           "(a division by zero is inf or NaN, which exact reals do not show)")
    if any(not is_z3(d) for d in divisors):
        return ProofResult("unknown", None, time.perf_counter() - start, name,
                           "a division by zero")
    hypotheses = [to_z3(d) != 0 for d in divisors] + monotone_hypotheses(roundings)
    if typed:
        hypotheses.extend(source.hypotheses)
    for index, (lo, hi) in (ranges or {}).items():
        if index in env:
            for element in np.ravel(env[index]):
                hypotheses.extend([to_z3(element) >= lo, to_z3(element) <= hi])
    claims = [equal(x, y) for x, y in zip(left.reshape(-1), right.reshape(-1))]
    if any(c is False for c in claims):
        return ProofResult("refuted", None, time.perf_counter() - start, name,
                           "an element differs for every input")
    symbolic = [c for c in claims if not isinstance(c, bool)]
    if not symbolic and not finite_alike:
        return ProofResult("proved", None, time.perf_counter() - start, name)
    leaves = leaf_args([a, b])
    result = (prove_all(symbolic, hypotheses, name=name, timeout_ms=timeout_ms,
                        witness=lambda model: model_inputs(model, env, leaves))
              if symbolic else ProofResult("proved", None, 0.0, name))
    if result.status == "proved" and finite_alike:
        inputs = _in_range(leaf_args([a, b]).values(), env)
        alike = _finite_alike(a, b, memo)
        if alike is None:
            return ProofResult("unknown", None, time.perf_counter() - start, name,
                               "a float value of a type whose range is unknown")
        if alike is not True:
            overflow = prove(alike, hypotheses + inputs, name=f"{name}.overflow",
                             timeout_ms=timeout_ms)
            if overflow.status != "proved":
                return ProofResult("unknown", overflow.counterexample,
                                   time.perf_counter() - start, name,
                                   "one of them may overflow (inf or NaN) where the other "
                                   "does not" + (f" ({overflow.reason})" if overflow.reason
                                                 else ""))
    if result.status == "proved" and hypotheses:
        vacuous = consistent(hypotheses, name=f"{name}.vacuity",
                             timeout_ms=timeout_ms)
        if vacuous.status != "refuted":
            result = ProofResult("unknown", None, 0.0, name,
                                 "the nonzero-divisor assumptions may be contradictory")
    result.seconds = time.perf_counter() - start
    return result



def _exact(value):
    """A kept table's element as the semantics holds it: a bool, or an exact int."""
    if isinstance(value, bool | np.bool_):
        return bool(value)
    return int(value)


OVERFLOW_FREE = frozenset({
    "arg", "dense", "iota", "broadcast", "reshape", "transpose", "slice",
    "concatenate", "pad", "dynamic_slice", "stablehlo.gather", "stablehlo.dynamic_update_slice",
    "stablehlo.select", "stablehlo.maximum", "stablehlo.minimum", "stablehlo.clamp",
    "reduce_max", "reduce_min", "reduce_window_max", "reduce_window_min", "stablehlo.negate",
    "stablehlo.abs", "chlo.top_k", "loopvar", "while_result", "region_result"})
"""Term ops whose float values are values of their operands (moved, picked, negated): they
overflow only where an operand already did. (A splat is in range unless it is an inf or NaN
constant; dense float constants are finite: MLIR prints inf and NaN as splats or hex.)"""

REGROUPED = frozenset({"lin", "reduce_sum", "reduce_window_sum", "stablehlo.dot_general"})
"""Sums: a sum regrouped (over devices, blocks) may overflow differently from the reference's
(liberty 1 of the semantics policy), so their values are not compared for overflow."""

REGROUPED_PRODUCTS = frozenset({"reduce_mul", "reduce_window_mul"})
"""Product reductions (jnp.prod, jnp.cumprod): a product regrouped over blocks (a block's
product times the products of the blocks before it) may overflow where the reference's
running product does not, and the reverse (liberty 1: float products may be regrouped, which
moves where they overflow), so their values, and those of a `mul` taking one as a factor
(the regrouped product's last step), are not compared for overflow, as a regrouped sum's."""


def _regrouped_product(term: Term) -> bool:
    """A product reduction, or a product with one as a factor (`REGROUPED_PRODUCTS`)."""
    return term.op in REGROUPED_PRODUCTS or term.op == "mul" and any(
        a.op in REGROUPED_PRODUCTS for a in term.args)


def overflow_threshold(dtype: str) -> Fraction | None:
    """The least magnitude that rounds to infinity in float `dtype` (round to nearest even):
    the greatest finite value plus half an ulp of it."""
    fmt = FLOAT_FORMATS.get(dtype)
    if fmt is None:
        return None
    bits, _, top = fmt
    return (2 - Fraction(1, 2 ** bits)) * Fraction(2) ** top


def _in_range(leaves, env) -> list:
    """Inputs are finite values of their float dtype (the policy's assumption 2)."""
    out = []
    for leaf in leaves:
        bound = overflow_threshold(leaf.dtype) if is_float(leaf.dtype) else None
        if bound is None or leaf.attrs[0] not in env:
            continue
        for element in np.ravel(env[leaf.attrs[0]]):
            if is_z3(element):
                limit = to_z3(bound)
                out.append(z3.And(element < limit, element > -limit))
    return out


def scaled_part(term: Term) -> Fraction | None:
    """The constant added to `k * t` when `term` is a `lin` of one part with |k| > 1 (a
    product by a constant, spelled as a sum), else None."""
    if term.op != "lin" or len(term.args) != 1:
        return None
    constant, (coef,) = term.attrs
    return constant if abs(coef) > 1 and isinstance(constant, Fraction) else None


def constant_product_part(term: Term, constant_terms: dict[int, bool]) -> Fraction | None:
    """The constant added to `k * (t * c)` when `term` is a `lin` of one part that is a
    product with a constant factor `c` (no input under it: a splat, an iota, a dense table
    or arithmetic of them), else None.

    The normal form folds constant factors into each other: `x * 7 * 0.1` is `0.7 * x` when
    the 7 is a scalar, `0.1 * (x * c)` when it is a tensor (`axis_index + 7` broadcast on one
    side, `repeat(arange(8) + 7)` on the other). The two are the same float products
    regrouped, which the semantics policy's liberty (1) allows, and their intermediate `x * c`
    overflows where `x * (0.1 * c)` may not: as for a regrouped sum, the point where a chain
    of constant factors overflows depends on the grouping. So the overflow claim counts such
    a chain once, at its folded product `k * t * c` (the `lin`'s value less its constant),
    on both sides alike: a product is never taken as finite, it is the regrouped product
    that is shown finite or shown to overflow exactly where the other side's does. Products
    of inputs (`x * y`) are still counted where they are computed."""
    if term.op != "lin" or len(term.args) != 1 or term.args[0].op != "mul":
        return None
    constant = term.attrs[0]
    if not isinstance(constant, Fraction):
        return None
    factors = term.args[0].args
    if not any(_constant_term(f, constant_terms) for f in factors):
        return None
    return constant


def _constant_term(term: Term, memo: dict[int, bool]) -> bool:
    """Whether `term` is built from constant leaves only (no input, loop variable or opaque
    value under it; memoized over the DAG by serial)."""
    for top in post_order(term, memo):
        memo[top.serial] = (top.op in _CONSTANT_LEAVES if not top.args else
                            top.op not in _SUMMARIES and all(memo[a.serial] for a in top.args))
    return memo[term.serial]


_CONSTANT_LEAVES = frozenset({"splat", "iota", "dense"})
"""Leaves that are constants of the program (any other leaf is an input or unknown)."""

_SUMMARIES = frozenset({"while_result", "region_result"})
"""Nodes whose value is computed by a summarized region, not from their arguments alone."""


def _finite_conditions(roots: list[Term], memo: dict, skip: set[int]) -> list | None:
    """Every value the terms compute (but sums, moves and `skip`) is below the overflow
    threshold of its dtype; None when a dtype's range is unknown. A `lin` of one part
    scaled by |k| > 1 is a product by a constant: its product `k * t` is counted, as a
    multiply by a constant tensor is (`x * 2` and `x * [2, 2]` overflow alike). A `lin` of
    one part that is a product with a constant factor counts that chain of constant factors
    at its folded product, and the product itself is not counted where it is only ever
    scaled so (`constant_product_part`: liberty (1), products regrouped)."""
    out: list = []
    constants: dict[int, bool] = {}
    folded: dict[int, Fraction] = {}
    scaled_only: dict[int, bool] = {}
    for term in subterms(roots):
        offset = constant_product_part(term, constants)
        if offset is not None:
            folded[term.serial] = offset
        for arg in term.args:
            if arg.op == "mul":
                scaled_only[arg.serial] = scaled_only.get(arg.serial, True) and (
                    offset is not None)
    for term in subterms(roots):
        offset = folded.get(term.serial, scaled_part(term))
        if term.serial in skip or term.op in OVERFLOW_FREE or \
                (term.op in REGROUPED and offset is None) or _regrouped_product(term) or \
                scaled_only.get(term.serial, False) or \
                not is_float(term.dtype) or term.serial not in memo:
            continue
        bound = overflow_threshold(term.dtype)
        if bound is None:
            return None
        if term.op == "splat":
            value = term.attrs[0]
            if not isinstance(value, Fraction):
                out.append(z3.BoolVal(False))  # an inf or NaN constant: out of range
            continue
        for element in np.ravel(memo[term.serial]):
            if offset:
                element = to_z3(element) - to_z3(offset) if is_z3(element) else \
                    element - offset
            if is_z3(element):
                value, limit = to_z3(element), to_z3(bound)
                out.append(z3.And(value < limit, value > -limit))
            elif not (isinstance(element, int | Fraction) and abs(element) < bound):
                out.append(z3.BoolVal(False))  # an exact value out of range, inf or NaN
    return out


def _finite_alike(a: Term, b: Term, memo: dict):
    """The claim that `a` computes a value out of range exactly where `b` does (True when
    neither computes a value that may overflow, None when a range is unknown)."""
    under_a = {t.serial for t in subterms([a])}
    under_b = {t.serial for t in subterms([b])}
    only_a = _finite_conditions([a], memo, under_b)
    only_b = _finite_conditions([b], memo, under_a)
    if only_a is None or only_b is None:
        return None
    if not only_a and not only_b:
        return True
    fa, fb = z3.And(only_a) if only_a else z3.BoolVal(True), \
        z3.And(only_b) if only_b else z3.BoolVal(True)
    return fa == fb


def model_inputs(model: z3.ModelRef, env: dict, leaves: dict[int, Term]
                 ) -> dict[int, np.ndarray] | None:
    """The argument values of a Z3 model (argument index -> exact values: ints, Fractions,
    bools; a value the model leaves free completed as Z3 completes it), or None when one is
    not a number (an irrational algebraic value is rounded to a close rational: the caller
    re-evaluates the terms on these inputs before trusting them, `differ_at`)."""
    out: dict[int, np.ndarray] = {}
    try:
        for index in leaves:
            values = env.get(index)
            if values is None:
                continue
            exact = np.empty(values.shape, dtype=object)
            for position in np.ndindex(values.shape):
                element = values[position]
                exact[position] = _model_value(model.eval(to_z3(element), model_completion=True)
                                               ) if is_z3(element) else element
            out[index] = exact
    except (z3.Z3Exception, ValueError, TypeError):
        return None
    return out


def _model_value(value):
    """A model's value as an exact Python value."""
    if z3.is_true(value) or z3.is_false(value):
        return z3.is_true(value)
    if z3.is_int_value(value):
        return value.as_long()
    if z3.is_algebraic_value(value):
        value = value.approx(20)
    if z3.is_rational_value(value):
        return Fraction(value.numerator_as_long(), value.denominator_as_long())
    raise ValueError(f"not a number: {value}")


def shown_inputs(inputs: dict[int, np.ndarray], limit: int = 8) -> dict[str, str]:
    """The first `limit` elements of exact inputs, by element name (`arg0[1,2]`), as text."""
    shown: dict[str, str] = {}
    for index, values in inputs.items():
        for position in np.ndindex(values.shape):
            if len(shown) >= limit:
                return shown
            shown[f"{leaf_name(index)}[{','.join(map(str, position))}]"] = str(values[position])
    return shown


def differ_at(a: Term, b: Term, inputs: dict[int, np.ndarray]) -> bool:
    """Whether the two terms take different values on these exact inputs (every argument of
    either given; dense constants at their kept values): evaluated by the semantics, with
    nothing read as an unknown function. False where they cannot be evaluated so (a
    transcendental function, a constant table not kept, an argument not given)."""
    leaves = leaf_args([a, b])
    if a.shape != b.shape or any(index not in inputs for index in leaves):
        return False
    if any(t.op == "dense" and t.attrs[0] not in DENSE_VALUES for t in subterms([a, b])):
        return False
    env: dict = {index: inputs[index] for index in leaves}
    env["dense"] = lambda term: np.array(
        [_exact(v) for v in np.asarray(DENSE_VALUES[term.attrs[0]]).flat] or [],
        dtype=object).reshape(term.shape)
    try:
        with collect_divisors():
            left = evaluate_term(a, env, {})
            right = evaluate_term(b, env, {})
    except (SemanticsError, ArithmeticError, ValueError, TypeError, z3.Z3Exception):
        return False
    values = list(left.flat) + list(right.flat)
    if any(is_z3(v) for v in values):
        return False
    return any(equal(x, y) is not True for x, y in zip(left.flat, right.flat))


def differing_inputs(a: Term, b: Term, ranges: dict[int, tuple[int, int]] | None = None,
                     seeds=(0, 1, 2), max_cost: int = MAX_TERM_COST
                     ) -> dict[int, np.ndarray] | None:
    """Inputs on which the two terms take different values, looked for on a few random exact
    inputs (integers of their dtype, `ranges` honoured; transcendental functions as fixed
    pseudo-random functions, a model of Z3's unknown functions; dense constants without
    kept values as random ones): the inputs (argument index -> exact values), or None when
    none was found. Cheap next to Z3: a difference found here means Z3 cannot prove the
    terms equal."""
    if a.shape != b.shape or term_cost([a, b]) > max_cost:
        return None
    for seed in seeds:
        rng = random.Random(seed)
        env: dict = {}
        for index, leaf in leaf_args([a, b]).items():
            env[index] = random_tensor(rng, leaf.shape, leaf.dtype, (ranges or {}).get(index))
        tables: dict[bytes, np.ndarray] = {}

        def resolve(term: Term, rng=rng, tables=tables) -> np.ndarray:
            key = term.attrs[0]
            if key not in tables:
                if key in DENSE_VALUES:
                    table = np.asarray(DENSE_VALUES[key]).reshape(term.shape)
                    tables[key] = np.array([_exact(v) for v in table.flat] or [],
                                           dtype=object).reshape(term.shape)
                else:
                    tables[key] = random_tensor(rng, term.shape, term.dtype, None)
            return tables[key]

        env["dense"] = resolve
        try:
            with random_functions(seed), collect_divisors():
                left = evaluate_term(a, env, {})
                right = evaluate_term(b, env, {})
        except (SemanticsError, ArithmeticError, ValueError, TypeError, z3.Z3Exception):
            continue
        if any(is_z3(v) for v in list(left.flat) + list(right.flat)):
            continue
        if any(equal(x, y) is not True for x, y in zip(left.flat, right.flat)):
            return {index: values for index, values in env.items() if isinstance(index, int)}
    return None


def complete_inputs(inputs: dict[int, np.ndarray] | None, terms: Sequence[Term],
                    bounds: dict[int, tuple[int, int]]) -> dict[int, np.ndarray] | None:
    """`inputs` with every argument of `terms` it lacks (one a normal form dropped) at 0, or
    random exact values (`bounds` honoured, seed 0) when there are none (a refutation without
    inputs: an element differs for every input). None when a given argument has another
    shape than the leaf's."""
    rng = random.Random(0)
    out: dict[int, np.ndarray] = {}
    for index, leaf in leaf_args(terms).items():
        if inputs is None:
            out[index] = random_tensor(rng, leaf.shape, leaf.dtype, bounds.get(index))
        elif index in inputs:
            if tuple(inputs[index].shape) != tuple(leaf.shape):
                return None
            out[index] = inputs[index]
        else:
            out[index] = np.full(tuple(leaf.shape), False if is_bool_dtype(leaf.dtype) else 0,
                                 dtype=object)
    return out


def random_tensor(rng: random.Random, shape, dtype: str, bounds) -> np.ndarray:
    """Random exact values of `dtype` (integers in `bounds` when given, else small ones in
    the dtype's range; booleans; small rationals)."""
    out = np.empty(shape, dtype=object)
    limits = int_limits(dtype)
    for idx in np.ndindex(tuple(shape)):
        if is_bool_dtype(dtype):
            out[idx] = rng.random() < 0.5
        elif limits is not None or bounds is not None:
            lo, hi = bounds if bounds is not None else (max(limits[0], -6), min(limits[1], 6))
            out[idx] = rng.randint(lo, hi)
        else:
            out[idx] = Fraction(rng.randint(-40, 40), rng.choice((1, 2, 3, 7)))
    return out
