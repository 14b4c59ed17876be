"""entangle-verify-rules: Z3 proves every rule instance both walks used.

The reference walk is checked like the sharded one: its terms are built by the same rules and
term constructors, and a proof is only as good as the reference term it compares against.

Instances are checked with the op's real attributes at a reduced shape and cached by
signature, so a repeated layer costs a dictionary lookup. A refuted or inconclusive instance
withdraws the verdict ("not proven", with the reason).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from entangle_mlir.analysis.verify import verify_walks
from entangle_mlir.passes.pipeline import ModulePass, PassState


@dataclass
class VerifyRulesPass(ModulePass):
    name = "entangle-verify-rules"
    summary = "prove each rule instance used by the walk with Z3 (cached by signature)"
    budget_seconds: int = 60
    rlimit: int = 0
    inject_fault: str = ""
    jobs: int = 0

    def apply(self, state: PassState) -> None:
        """`rlimit` caps Z3's work per query (deterministic `unknown` past it); `inject_fault`
        (testing only) doubles the inferred term of every op of that name before its check,
        so the "refuted" path can be exercised (`reference:OP` does it in the reference
        walk; a bare OP in the sharded walk). `jobs`: worker processes for the queries (0:
        one per free core; 1: serial; `analysis/instance/parallel.py`)."""
        from entangle_mlir.analysis import solver  # lazy: z3 takes 40 ms to import

        walks = {key: state.walks[key] for key in ("reference", "sharded")
                 if key in state.walks}
        if "sharded" not in walks or state.report is None:
            return
        before = len(state.report.diagnostics)
        solver.set_resource_limit(self.rlimit)
        try:
            verify_walks(walks, state.report, budget_seconds=self.budget_seconds,
                         inject_fault=self.inject_fault, jobs=self.jobs)
        finally:
            solver.set_resource_limit(0)
        state.diagnostics.extend(state.report.diagnostics[before:])
        state.report.stats["seconds"] = round(time.perf_counter() - state.started, 4)
