"""The rule table: op name -> rule, merged from one explicit table per op family.

Adding an op: an entry in its family's table (an elementwise op: a line in
`core/traits.py`), a lit test `lit_tests/rules/<op>.mlir`, and a lemma case in
`tests/rules/test_lemmas.py` (pytest checks both exist for every key); the checklist is
`docs/adding-an-op.md`.
"""

from __future__ import annotations

from entangle_mlir.rules.base import Rule, RuleContext
from entangle_mlir.rules.collectives import COLLECTIVE_RULES
from entangle_mlir.rules.contraction import CONTRACTION_RULES
from entangle_mlir.rules.control import CONTROL_RULES
from entangle_mlir.rules.elementwise import ELEMENTWISE_RULES
from entangle_mlir.rules.gather_scatter import GATHER_SCATTER_RULES
from entangle_mlir.rules.index import INDEX_RULES
from entangle_mlir.rules.movement import MOVEMENT_RULES
from entangle_mlir.rules.reduction import REDUCTION_RULES
from entangle_mlir.rules.sorting import SORTING_RULES

FAMILIES: dict[str, dict[str, Rule]] = {
    "elementwise": ELEMENTWISE_RULES,
    "movement": MOVEMENT_RULES,
    "contraction": CONTRACTION_RULES,
    "reduction": REDUCTION_RULES,
    "collectives": COLLECTIVE_RULES,
    "index": INDEX_RULES,
    "gather_scatter": GATHER_SCATTER_RULES,
    "sorting": SORTING_RULES,
    "control": CONTROL_RULES,
}

RULES: dict[str, Rule] = {name: rule for table in FAMILIES.values()
                          for name, rule in table.items()}

__all__ = ["FAMILIES", "RULES", "Rule", "RuleContext"]
