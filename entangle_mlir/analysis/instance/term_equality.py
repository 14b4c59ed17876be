"""The fallback term-equality check: two reference terms the canonicalizer does not identify,
proved equal over the same fresh symbolic arguments (`check_term_equality`)."""

from __future__ import annotations

import time

import numpy as np
import z3

from entangle_mlir.analysis.instance.common import DEFAULT_TIMEOUT_MS, MAX_TERM_COST, term_cost
from entangle_mlir.analysis.instance.sources import Symbolic, leaf_args, leaf_name, opaque_resolver
from entangle_mlir.analysis.solver import ProofResult, prove
from entangle_mlir.core.terms import Term
from entangle_mlir.semantics.element import SemanticsError, collect_divisors, equal, is_z3, to_z3
from entangle_mlir.semantics.evaluate import evaluate_term


def check_term_equality(a: Term, b: Term, name: str = "terms.equal",
                        timeout_ms: int = DEFAULT_TIMEOUT_MS,
                        max_cost: int = MAX_TERM_COST) -> ProofResult:
    """Prove two reference terms equal for every value of their arguments.

    For terms the canonicalizer does not identify (algebra it does not know): both are
    evaluated over the same fresh symbolic arguments and compared elementwise. Large terms
    are "skipped" (no shape reduction here: terms carry their shapes).
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
    source = Symbolic()
    env: dict = {}
    for index, leaf in leaf_args([a, b]).items():
        env[index] = source.tensor(leaf_name(index), leaf.shape, leaf.dtype)
    dense: dict[bytes, np.ndarray] = {}

    def resolve(term: Term) -> np.ndarray:
        key = term.attrs[0]
        if key not in dense:
            dense[key] = source.tensor(f"dense{key.hex()[:8]}", term.shape, term.dtype)
        return dense[key]

    env["dense"] = resolve
    env["opaque"] = opaque_resolver(source)
    memo: dict[int, np.ndarray] = {}
    try:
        with collect_divisors() as divisors:
            left = evaluate_term(a, env, memo)
            right = evaluate_term(b, env, memo)
    except (SemanticsError, z3.Z3Exception, ValueError, TypeError) as err:
        return ProofResult("unknown", None, time.perf_counter() - start, name,
                           f"cannot evaluate: {err}")
    if any(not is_z3(d) for d in divisors):
        return ProofResult("unknown", None, time.perf_counter() - start, name,
                           "a division by zero")
    hypotheses = [to_z3(d) != 0 for d in divisors]
    claims = [equal(x, y) for x, y in zip(left.reshape(-1), right.reshape(-1))]
    if any(c is False for c in claims):
        return ProofResult("refuted", None, time.perf_counter() - start, name,
                           "an element differs for every input")
    symbolic = [c for c in claims if not isinstance(c, bool)]
    if not symbolic:
        return ProofResult("proved", None, time.perf_counter() - start, name)
    result = prove(z3.And(symbolic), hypotheses, name=name, timeout_ms=timeout_ms)
    if result.status == "proved" and hypotheses:
        vacuous = prove(z3.BoolVal(False), hypotheses, name=f"{name}.vacuity",
                        timeout_ms=timeout_ms)
        if vacuous.status != "refuted":
            result = ProofResult("unknown", None, 0.0, name,
                                 "the nonzero-divisor assumptions may be contradictory")
    result.seconds = time.perf_counter() - start
    return result
