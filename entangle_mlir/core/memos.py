"""What one check owns beyond its interned terms: the memos keyed by term serials, forgotten
when the next outermost check starts over (`start_over`).

A check interns its terms from scratch (`terms.start_over`) and serials are never reused, so
once the next check starts no key of these memos can be asked for again: their entries only
hold memory, and their values hold the old check's terms alive (a long-lived process, a
`check-many` worker or a pytest worker kept every check's terms, the intern table cleared or
not). With them go the tables that give a check's terms one object for equal shapes and
attributes (`terms._SHAPES`, `_KEYED_ATTRS`, `_INDEX_ATTRS`): their keys may come again, but
forgetting them only unshares objects, and they would grow with every program.
Each memo belongs to the module that fills it and is a pure function of interned terms
(or, for `LOOP_BODY_TERMS`, `REGION_TERMS` and `_ROLLS`, what the builders recorded about the
terms they built): a term met again after its entry is forgotten is computed afresh, or, for
those records, is only known less (read as no loop body, no template, no roll: less is
proven, nothing false). `PER_CHECK` is the one list of what is forgotten.

The intern table and the builders' memo (`terms._TABLE`, `_BUILT`) are cleared by
`terms.start_over` itself. Not in the list, because their keys are content a later program may
ask for again: `terms.DENSE_VALUES` (raw bytes), `repeats._plan_of` and
`terms._moves_no_element` (shapes), `mlir.opinfo`'s attribute memos (one shared MLIR context),
`normalize.finite`'s cone memos (printed ops) and `semantics.element`'s z3 memos (kept while
their expressions are); each is capped or small.
"""

from __future__ import annotations

from entangle_mlir.core import terms
from entangle_mlir.core.normal_form import concat, pieces, rewrite, squeeze, sums

PER_CHECK: tuple[tuple[str, dict | set], ...] = (
    ("terms.LOOP_BODY_TERMS", terms.LOOP_BODY_TERMS),
    ("terms.REGION_TERMS", terms.REGION_TERMS),
    ("terms._LIN_KEYS", terms._LIN_KEYS),
    ("terms._DERIVED", terms._DERIVED),
    ("terms._CONTENT", terms._CONTENT),
    *((f"terms._SKELETONS[{depth}]", memo) for depth, memo in enumerate(terms._SKELETONS)),
    ("terms._PARTS", terms._PARTS),
    *((f"terms._ORIENTATION_KEYS[{depth}]", memo)
      for depth, memo in enumerate(terms._ORIENTATION_KEYS)),
    ("terms._ROLLS", terms._ROLLS),
    ("terms._SHAPES", terms._SHAPES),
    ("terms._KEYED_ATTRS", terms._KEYED_ATTRS),
    ("terms._INDEX_ATTRS", terms._INDEX_ATTRS),
    ("terms._SLICE_MEMO", terms._SLICE_MEMO),
    ("terms._INTERVALS", terms._INTERVALS),
    ("terms._FINITE_UNLESS_OVERFLOW", terms._FINITE_UNLESS_OVERFLOW),
    ("concat._CONCATS", concat._CONCATS),
    ("concat._UNMET", concat._UNMET),
    ("concat._NEAR_INPUTS", concat._NEAR_INPUTS),
    ("sums._JOIN_KEYS", sums._JOIN_KEYS),
    ("sums._GROUPS", sums._GROUPS),
    ("pieces._SLICES", pieces._SLICES),
    ("rewrite._SUM_PREFIXES", rewrite._SUM_PREFIXES),
    ("squeeze._SQUEEZED", squeeze._SQUEEZED),
)
"""(name, memo) of every memo keyed by term serials, and of the sharing tables. The memos are
cleared in place, never rebound, so these are the objects their modules read."""


def start_over() -> None:
    """Intern new terms from scratch (`terms.start_over`) and forget every memo of
    `PER_CHECK`: what the next check computes is as if it were the process's first."""
    terms.start_over()
    for _, memo in PER_CHECK:
        memo.clear()


Saved = tuple[dict, dict, tuple[dict | set, ...]]
"""What `saved` copies: the intern table, the builders' memo, and each memo of `PER_CHECK`."""


def saved() -> Saved:
    """A copy of the intern table, the builders' memo and every memo of `PER_CHECK`, for
    `restore`: a try whose terms must not decide what is built after it (the general tier's
    layer-template try, `tier.general_tier`). Shallow copies, insertion order kept."""
    return (dict(terms._TABLE), dict(terms._BUILT), tuple(memo.copy() for _, memo in PER_CHECK))


def restore(state: Saved) -> None:
    """Every table `saved` copied put back as it was (in place: the modules keep reading the
    same objects): what is built next meets only the terms and memo entries that existed when
    `state` was taken, as if nothing had been built since. Sound as any memo is: each entry
    kept is a fact about terms that still exist, and the serials go on counting, so a term
    built since is equal to no term built after (`terms.start_over`). The order of serials
    among the terms built next is the order they are built in, as without the try, so the
    normal forms are those of a check that never made it."""
    table, built, memos = state
    for live, copy in ((terms._TABLE, table), (terms._BUILT, built),
                       *zip((memo for _, memo in PER_CHECK), memos)):
        live.clear()
        live.update(copy)


def sizes() -> dict[str, int]:
    """Entries of each memo of `PER_CHECK`, and of the intern table (`terms._TABLE`)."""
    return {"terms._TABLE": len(terms._TABLE), **{name: len(memo) for name, memo in PER_CHECK}}
