"""What every rule receives and returns.

A rule is `rule(info, operands, ctx) -> list[Value]`: from the op's neutral description and its
operands' relations (see `core/relations.py`), the relations of its results. Rules never raise on
unexpected input: they return `Opaque(reason)` so the answer is "not proven", never a crash and
never a false "verified".
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from entangle_mlir.core.mesh import Mesh
from entangle_mlir.core.relations import Value
from entangle_mlir.mlir.opinfo import OpInfo


class ReferenceTerms(frozenset):
    """The serials of every term the reference computes, and the shapes of those terms: what
    the sharded walk consults to choose between equally valid global views of a value."""

    shapes: frozenset = frozenset()

    @classmethod
    def of(cls, terms) -> ReferenceTerms:
        terms = list(terms)
        found = cls(t.serial for t in terms)
        found.shapes = frozenset(t.shape for t in terms)
        return found


@dataclass
class RuleContext:
    """Where the op runs: the mesh and manual axes (none in global scope), plus what the rule
    wants to tell the user if this op turns out to be where things go wrong."""

    mesh: Mesh | None = None
    manual_axes: tuple[str, ...] = ()
    hints: list[tuple[str, str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    reference: set[int] | frozenset[int] | None = None

    @property
    def is_global(self) -> bool:
        return not self.manual_axes

    def hint(self, message: str, category: str = "scale") -> None:
        """What went wrong if this op turns out to be the first divergence, and the reason
        category it belongs to (reasons.py)."""
        self.hints.append((message, category))

    def note(self, message: str) -> None:
        if message not in self.notes:
            self.notes.append(message)


Rule = Callable[[OpInfo, list[Value], RuleContext], list[Value]]
