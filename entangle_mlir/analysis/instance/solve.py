"""Proving an instance's claim with Z3 (`run_check`); when Z3 answers unknown, a few concrete
evaluations with exact rationals look for a genuine counterexample (`find_counterexample`)."""

from __future__ import annotations

import time

import numpy as np
import z3

from entangle_mlir.analysis.instance.claims import build
from entangle_mlir.analysis.instance.common import DEFAULT_TIMEOUT_MS
from entangle_mlir.analysis.instance.sources import Concrete, Failure, Symbolic
from entangle_mlir.analysis.solver import ProofResult, consistent, prove
from entangle_mlir.core.mesh import Mesh
from entangle_mlir.core.relations import Value
from entangle_mlir.mlir.opinfo import OpInfo
from entangle_mlir.rules.base import RuleContext
from entangle_mlir.semantics.element import SemanticsError, random_functions

CONCRETE_TRIALS = 4
"""Concrete evaluations tried for a counterexample when Z3 answers unknown."""


def run_check(info: OpInfo, ins: list[Value], outs: list[Value], mesh: Mesh | None,
              ctx: RuleContext, name: str = "instance",
              timeout_ms: int = DEFAULT_TIMEOUT_MS) -> ProofResult:
    """Build the symbolic instance and prove it (no cache, no abstraction, no reduction)."""
    start = time.perf_counter()
    source = Symbolic()
    try:
        claims = build(info, ins, outs, mesh, ctx, source)
    except Failure as failure:
        status = failure.status if failure.status in ("refuted", "unknown") else "unknown"
        return ProofResult(status, None, time.perf_counter() - start, name, failure.reason)
    except (SemanticsError, z3.Z3Exception, IndexError, KeyError, TypeError,
            ValueError) as err:
        return ProofResult("unknown", None, time.perf_counter() - start, name,
                           f"cannot build the query: {type(err).__name__}: {err}")
    symbolic = []
    for k, claim in enumerate(claims):
        if isinstance(claim, (bool, np.bool_)):
            if not claim:
                return ProofResult("refuted", {"element": str(k)},
                                   time.perf_counter() - start, name,
                                   "a result element differs for every input")
            continue
        symbolic.append(claim)
    if not symbolic:
        return ProofResult("proved", None, time.perf_counter() - start, name)
    result = prove(conjunction(symbolic), source.hypotheses, name=name, timeout_ms=timeout_ms)
    if result.status == "proved" and source.hypotheses:
        vacuous = consistent(source.hypotheses, name=f"{name}.vacuity",
                             timeout_ms=timeout_ms)
        if vacuous.status != "refuted":
            result = ProofResult("unknown", None, 0.0, name,
                                 "the assumptions (nonzero divisors, partial max/min splits) "
                                 f"may be contradictory: {vacuous.status}")
    if result.status == "unknown":
        witness = find_counterexample(info, ins, outs, mesh, ctx)
        if witness is not None:
            result = ProofResult("refuted", witness, 0.0, name,
                                 "concrete counterexample (Z3 said unknown: "
                                 f"{result.reason})")
    result.seconds = time.perf_counter() - start
    return result


def conjunction(claims: list) -> z3.BoolRef:
    """`z3.And(claims)`: built directly when every claim is a z3 boolean (the same term;
    `z3.And` spends most of a large instance's time checking the claims' sorts one by one)."""
    if claims and all(type(c) is z3.BoolRef for c in claims):
        ctx = claims[0].ctx
        if all(c.ctx is ctx for c in claims):
            args = (z3.Ast * len(claims))(*(c.as_ast() for c in claims))
            return z3.BoolRef(z3.Z3_mk_and(ctx.ref(), len(claims), args), ctx)
    return z3.And(claims)


def find_counterexample(info: OpInfo, ins: list[Value], outs: list[Value], mesh: Mesh | None,
                        ctx: RuleContext, trials: int = CONCRETE_TRIALS) -> dict | None:
    """Look for a concrete violation with exact rationals (None if none found)."""
    for seed in range(trials):
        source = Concrete(seed)
        try:
            with random_functions(seed):
                claims = build(info, ins, outs, mesh, ctx, source)
        except (Failure, SemanticsError, ArithmeticError, TypeError, ValueError):
            continue
        for k, claim in enumerate(claims):
            if isinstance(claim, (bool, np.bool_)) and not claim:
                return {"seed": str(seed), "element": str(k)}
    return None
