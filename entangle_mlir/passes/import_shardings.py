"""entangle-import-shardings: find the reference/sharded pair and check their signatures.

Meshes and manual-computation shardings are read where the walk enters them (infer.py); this
pass makes sure the pair exists, in the right order (the reference unsharded), and that
arguments and results agree in count, shape and dtype.
"""

from __future__ import annotations

from dataclasses import dataclass

from entangle_mlir.mlir.program import (
    check_form,
    check_order,
    check_signatures,
    from_combined,
    has_refines,
)
from entangle_mlir.passes.pipeline import ModulePass, PassState


@dataclass
class ImportShardingsPass(ModulePass):
    name = "entangle-import-shardings"
    summary = ("find the function with entangle.refines and its reference; check signatures and "
               "that the sharded program is one to check (shard_map or partitioned)")

    def apply(self, state: PassState) -> None:
        if state.program is None and has_refines(state.module):
            state.program = from_combined(state.module, state.file)
        if state.program is not None:
            check_order(state.program)
            check_signatures(state.program)
            check_form(state.program)
