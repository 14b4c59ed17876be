"""entangle-import-shardings: find the reference/sharded pair and check their signatures.

Meshes and manual-computation shardings are read where the walk enters them (infer.py); this
pass makes sure the pair exists, in the right order (the reference unsharded), and that
arguments and results agree in count, shape and dtype.
"""

from __future__ import annotations

from dataclasses import dataclass

from entangle_mlir.core.terms import ARG_NAMES
from entangle_mlir.mlir.program import (
    argument_names,
    check_dump,
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
        """Also sets the names terms print for the inputs (`terms.ARG_NAMES`): the
        reference's argument names, else the sharded program's."""
        if state.program is None and has_refines(state.module):
            state.program = from_combined(state.module, state.file)
        ARG_NAMES.set({})
        if state.program is not None:
            check_order(state.program)
            check_dump(state.program)
            check_signatures(state.program)
            check_form(state.program)
            ARG_NAMES.set(argument_names(state.program.ref_func)
                          or argument_names(state.program.sharded_func))
