"""The passes, one module each, and their registry (explicit, in pipeline order)."""

from __future__ import annotations

from entangle_mlir.passes.check_refinement import CheckRefinementPass
from entangle_mlir.passes.general_tier import GeneralTierPass
from entangle_mlir.passes.import_shardings import ImportShardingsPass
from entangle_mlir.passes.infer_relations import InferRelationsPass
from entangle_mlir.passes.normalize import NormalizePass
from entangle_mlir.passes.verify_rules import VerifyRulesPass

PASSES = {
    NormalizePass.name: NormalizePass,
    ImportShardingsPass.name: ImportShardingsPass,
    InferRelationsPass.name: InferRelationsPass,
    CheckRefinementPass.name: CheckRefinementPass,
    VerifyRulesPass.name: VerifyRulesPass,
    GeneralTierPass.name: GeneralTierPass,
}

DEFAULT_PIPELINE = ("builtin.module(entangle-normalize,entangle-import-shardings,"
                    "entangle-infer-relations,entangle-check-refinement,entangle-verify-rules)")

__all__ = ["DEFAULT_PIPELINE", "PASSES"]
