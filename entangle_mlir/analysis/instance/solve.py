"""Proving an instance's claim with Z3 (`run_check`); when Z3 answers unknown, a few concrete
evaluations with exact rationals look for a genuine counterexample (`find_counterexample`)."""

from __future__ import annotations

import time

import numpy as np
import z3

from entangle_mlir.analysis.instance.claims import build
from entangle_mlir.analysis.instance.common import DEFAULT_TIMEOUT_MS
from entangle_mlir.analysis.instance.sources import Concrete, Failure, Symbolic
from entangle_mlir.analysis.instance.symbolic_device import symbolic_axes
from entangle_mlir.analysis.solver import ProofResult, consistent, prove_all
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
    """Build the symbolic instance and prove it (no cache, no abstraction, no reduction). A
    device-mask instance is first checked for every device of a class at once, its
    coordinates along the mask's axes symbolic (`symbolic_device`); where that query cannot
    be built or is inconclusive, device by device."""
    start = time.perf_counter()
    single = ctx.is_global or mesh is None
    axes = () if single else symbolic_axes(info, ins, outs, mesh)
    result = _prove(info, ins, outs, mesh, ctx, name, timeout_ms, axes) if axes else None
    if result is not None and result.status in ("proved", "refuted"):
        result.details = {**result.details, "devices": f"symbolic along {', '.join(axes)}"}
    else:
        result = _prove(info, ins, outs, mesh, ctx, name, timeout_ms, ())
    result.seconds = time.perf_counter() - start
    return result


def _prove(info: OpInfo, ins: list[Value], outs: list[Value], mesh: Mesh | None,
           ctx: RuleContext, name: str, timeout_ms: int, device_axes: tuple[str, ...]
           ) -> ProofResult:
    """The claim built (`claims.build`, `device_axes` its symbolic device axes) and proved;
    device by device, a concrete counterexample is looked for when Z3 answers unknown."""
    source = Symbolic()
    try:
        claims = build(info, ins, outs, mesh, ctx, source, device_axes)
    except Failure as failure:
        status = failure.status if failure.status in ("refuted", "unknown") else "unknown"
        return ProofResult(status, None, 0.0, name, failure.reason)
    except (SemanticsError, z3.Z3Exception, IndexError, KeyError, TypeError,
            ValueError) as err:
        return ProofResult("unknown", None, 0.0, name,
                           f"cannot build the query: {type(err).__name__}: {err}")
    symbolic = []
    for k, claim in enumerate(claims):
        if isinstance(claim, (bool, np.bool_)):
            if not claim:
                return ProofResult("refuted", {"element": str(k)}, 0.0, name,
                                   "a result element differs for every input")
            continue
        symbolic.append(claim)
    if not symbolic:
        return ProofResult("proved", None, 0.0, name)
    result = prove_all(symbolic, source.hypotheses, name=name, timeout_ms=timeout_ms)
    if result.status == "proved" and source.hypotheses:
        vacuous = consistent(source.hypotheses, name=f"{name}.vacuity",
                             timeout_ms=timeout_ms)
        if vacuous.status != "refuted":
            result = ProofResult("unknown", None, 0.0, name,
                                 "the assumptions (nonzero divisors, partial max/min splits) "
                                 f"may be contradictory: {vacuous.status}")
    if result.status == "unknown" and not device_axes:
        witness = find_counterexample(info, ins, outs, mesh, ctx)
        if witness is not None:
            result = ProofResult("refuted", witness, 0.0, name,
                                 "concrete counterexample (Z3 said unknown: "
                                 f"{result.reason})")
    return result


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
