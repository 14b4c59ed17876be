"""entangle-check-refinement: outputs against the reference; ρ or diagnostics.

Attaches `entangle.verdict` and `entangle.rho` to the sharded function so lit can CHECK them.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from jaxlib.mlir import ir

from entangle_mlir.analysis.refine import compare
from entangle_mlir.core.diagnostics import InputError
from entangle_mlir.mlir.ir import context
from entangle_mlir.passes.pipeline import ModulePass, PassState


@dataclass
class CheckRefinementPass(ModulePass):
    name = "entangle-check-refinement"
    summary = "compare sharded outputs with the reference; emit rho or diagnostics"

    def apply(self, state: PassState) -> None:
        if state.program is None:
            raise InputError("no function carries `entangle.refines = @reference`",
                             file=state.file)
        if "sharded" not in state.walks:
            raise InputError("entangle-check-refinement needs entangle-infer-relations first",
                             file=state.file)
        report = compare(state.walks["reference"], state.walks["sharded"])
        report.stats["ops"] = len(state.walks["sharded"].records)
        report.stats["seconds"] = round(time.perf_counter() - state.started, 4)
        if report.focus is not None:
            # The walked (normalized) modules: op-level evidence runs copies of them.
            report.focus.modules = (state.program.ref_module, state.program.sharded_module)
        state.report = report
        state.diagnostics.extend(report.diagnostics)
        func = state.program.sharded_func
        if state.program.sharded_module is state.module:
            with context():
                func.attributes["entangle.verdict"] = ir.StringAttr.get(report.verdict)
                func.attributes["entangle.rho"] = ir.ArrayAttr.get(
                    [ir.StringAttr.get(f"result#{o.index} = {o.rho}") for o in report.outputs])
