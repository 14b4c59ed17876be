"""entangle-verify-rules: Z3 proves every rule instance the sharded walk used.

Instances are checked with the op's real attributes at a reduced shape and cached by
signature, so a repeated layer costs a dictionary lookup. A refuted or inconclusive instance
withdraws the verdict ("not proven", with the reason).
"""

from __future__ import annotations

from dataclasses import dataclass

from entangle_mlir.pipeline import ModulePass, PassState


@dataclass
class VerifyRulesPass(ModulePass):
    name = "entangle-verify-rules"
    summary = "prove each rule instance used by the walk with Z3 (cached by signature)"
    budget_seconds: int = 60

    def apply(self, state: PassState) -> None:
        from entangle_mlir.verify import verify_walk

        walk = state.walks.get("sharded")
        if walk is None or state.report is None:
            return
        before = len(state.report.diagnostics)
        verify_walk(walk, state.report, budget_seconds=self.budget_seconds)
        state.diagnostics.extend(state.report.diagnostics[before:])
