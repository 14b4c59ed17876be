"""The passes, one module each, and their registry (explicit, in pipeline order)."""

from __future__ import annotations

from .check_refinement import CheckRefinementPass
from .import_shardings import ImportShardingsPass
from .infer_relations import InferRelationsPass
from .normalize import NormalizePass
from .verify_rules import VerifyRulesPass

PASSES = {
    NormalizePass.name: NormalizePass,
    ImportShardingsPass.name: ImportShardingsPass,
    InferRelationsPass.name: InferRelationsPass,
    CheckRefinementPass.name: CheckRefinementPass,
    VerifyRulesPass.name: VerifyRulesPass,
}

DEFAULT_PIPELINE = ("builtin.module(entangle-normalize,entangle-import-shardings,"
                    "entangle-infer-relations,entangle-check-refinement,entangle-verify-rules)")

__all__ = ["DEFAULT_PIPELINE", "PASSES"]
