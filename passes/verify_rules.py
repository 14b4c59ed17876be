"""entangle-verify-rules: Z3 proves every rule instance the sharded walk used.

Instances are checked with the op's real attributes at a reduced shape and cached by
signature, so a repeated layer costs a dictionary lookup. A refuted or inconclusive instance
withdraws the verdict ("not proven", with the reason).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from entangle_mlir.pipeline import ModulePass, PassState


@dataclass
class VerifyRulesPass(ModulePass):
    name = "entangle-verify-rules"
    summary = "prove each rule instance used by the walk with Z3 (cached by signature)"
    budget_seconds: int = 60
    rlimit: int = 0
    inject_fault: str = ""

    def apply(self, state: PassState) -> None:
        """`rlimit` caps Z3's work per query (deterministic `unknown` past it); `inject_fault`
        (testing only) doubles the inferred term of every op of that name before its check,
        so the "refuted" path can be exercised."""
        from entangle_mlir import z3check
        from entangle_mlir.verify import verify_walk

        walk = state.walks.get("sharded")
        if walk is None or state.report is None:
            return
        before = len(state.report.diagnostics)
        z3check.set_resource_limit(self.rlimit)
        try:
            verify_walk(walk, state.report, budget_seconds=self.budget_seconds,
                        inject_fault=self.inject_fault)
        finally:
            z3check.set_resource_limit(0)
        state.diagnostics.extend(state.report.diagnostics[before:])
        state.report.stats["seconds"] = round(time.perf_counter() - state.started, 4)
