"""The catalogue of reasons a check can fail, keyed by the `reason` a diagnostic carries (the
`category` of the Opaque value or of the mismatch). Docs and the JSON schema are generated from
this table; a pytest checks that every category the code emits is listed here.

`CLAIMS` says which reasons claim the program is wrong (exit code 1); every other reason only
says that the check could not decide (exit code 3). `outcome_of` applies it to a report's
diagnostics."""

from __future__ import annotations

from collections.abc import Iterable

REASONS: dict[str, tuple[str, str]] = {
    "missing_reduction": (
        "missing reduction",
        ("a partial sum (or max) over mesh axes reaches a point that needs the full value: an "
        "all_reduce/psum over those axes is missing")),
    "partial_mixed": (
        "partial sum combined with a split value",
        ("a partial sum over an axis is combined with a value split over the same axis; usually "
        "a statistic that still needs its psum")),
    "nonlinear_partial": (
        "nonlinear op applied to a partial sum",
        ("a nonlinear op (gelu, exp, a product of two partial sums, ...) is applied before the "
        "reduction; nonlinear ops do not commute with the sum")),
    "wrong_axis": (
        "reduction over the wrong axis",
        ("a collective reduces over an axis along which the value is split, combining different "
        "blocks")),
    "duplicate_reduction": (
        "duplicate reduction",
        ("a collective sums over an axis where the value is already replicated: it is counted "
        "|axis| times")),
    "duplicate": (
        "duplicate gather",
        "a gather over an axis where the value is replicated concatenates identical copies"),
    "scale": (
        "wrong scale factor",
        ("the value is k x what the reference computes (k printed as a fraction): pmean for "
        "psum, a bias added before the reduction, a mean over the wrong count")),
    "wrong_dim": (
        "wrong dim",
        ("a gather, concat or scatter runs along a different dim than the one the value is "
        "split along")),
    "wrong_layout": (
        "wrong output layout",
        "the value leaving shard_map is laid out differently from its declared out_specs"),
    "wrong_order": (
        "blocks in the wrong order or from the wrong devices",
        ("a gather concatenates blocks in the wrong axis order, or a permute moves blocks to "
        "devices that do not own them")),
    "wrong_groups": (
        "replica groups match no mesh axes",
        "a collective's replica groups are not the device groups of any set of mesh axes"),
    "wrong_reducer": (
        "wrong reduction kind",
        ("a max where a sum was needed (or the reverse), or a reduction that mixes the pieces of "
        "a partial value")),
    "wrong_offset": (
        "device-dependent offset wrong",
        ("a device reads a block other than its own: the offset formula found vs the one "
        "expected")),
    "layout_mismatch": (
        "operands laid out differently",
        ("the operands of one op are split differently, so each device combines unrelated "
        "blocks")),
    "different_function": (
        "different function",
        ("the sharded program computes a different function from the reference; both terms are "
        "shown")),
    "precision_lost": (
        "precision lost",
        ("a value is computed at lower precision than the reference's: a convert rounds "
        "(f32 -> bf16, i32 -> f32 above 2^24) where the reference keeps the precision, or "
        "partial sums are rounded before the all_reduce sums them in the narrower type")),
    "overflow": (
        "may overflow",
        ("an exact rewrite the proof needs (an online softmax's fold over its blocks, its "
        "backward, a running max's zero cotangent, dropping jax.nn.logsumexp's is_finite "
        "guard of its max) holds only where no sum or product of finite values overflows, "
        "which their ranges do not show (q . k of finite inputs can overflow): not proven; "
        "`--assume-no-overflow` assumes it, and a proof that relies on it lists the "
        "assumption. Where the guard is the only difference, the pair is checked again "
        "under the assumption and the report says so first when that proves it")),
    "cannot_relate": (
        "cannot relate (a bug claim not confirmed)",
        ("the layout tier could not match a value to the reference and read the mismatch as "
        "a bug, or the general tier found its terms different from the reference's, but "
        "running both programs did not confirm it (the outputs agree on random inputs and on "
        "the general tier's counterexample, or the programs could not be run): the message "
        "quotes that reading; not proven, no bug claimed")),
    "unrelated": (
        "no relation to the reference",
        "the value has no clean relation to any reference value"),
    "unsupported": (
        "unsupported op",
        "an op (or a form of an op) without a rule: not proven, never a crash"),
    "inconclusive": (
        "proof inconclusive",
        "Z3 answered unknown or timed out on a rule instance: not proven"),
    "refuted": (
        "rule instance refuted",
        "Z3 refuted an inferred relation: an internal error of a rule, reported, never ignored"),
    "internal": (
        "internal limitation",
        "the analysis could not continue (e.g. a shape it cannot reason about): not proven"),
}


CLAIMS: frozenset[str] = frozenset({
    "missing_reduction", "partial_mixed", "nonlinear_partial", "wrong_axis",
    "duplicate_reduction", "duplicate", "scale", "wrong_dim", "wrong_layout", "wrong_order",
    "wrong_reducer", "wrong_offset", "layout_mismatch", "different_function", "precision_lost"})
"""Reasons whose diagnostic states that the program is wrong: a located bug claim. The layout
tier makes them from one op's relations (a psum of a split value, a partial sum leaving
shard_map, an offset other than the device's block, operands split differently) or from a term
the reference never computes. The relation is exact, but that the program's outputs then differ
from the reference's is not shown by it: the reference may compute the same numbers another way
(block sums by design, a per-device cumsum, a collective matmul's rotating chunks). The
general tier's refutation (`different_function`, "general tier (...)") rests on the terms the
rules built and on exact identities, which a wrong one would break. So `entangle check` and the
JAX front-end run both programs before making such a claim (`confirm.py`). The other reasons
say what could not be related (`cannot_relate`, `unrelated`, `wrong_groups`) or is not
supported, or that a proof failed: no claim."""


STOPPED: frozenset[str] = frozenset({"unsupported", "internal", "inconclusive"})
"""Reasons that say the analysis stopped short of a value (an op without a rule, a shape it
cannot reason about, Z3 unknown) and read nothing about the program. Where the layout tier
says only these and the general tier finds inputs on which an output differs, the general
tier's refutation becomes the first diagnostic, a claim (`passes/general_tier.py`); a reading
of the program (a claim, `unrelated`, `wrong_groups`, a refuted rule) keeps its place. No
claim: disjoint from `CLAIMS`."""


BUG = "bug"
INCONCLUSIVE = "inconclusive"

WITHDRAWS_CLAIMS: frozenset[str] = frozenset({"overflow"})
"""Reasons whose diagnostic makes the report's claims consequences rather than findings: a
rewrite refused for a possible overflow leaves the two programs in different forms, so the
walk's mismatches after it (a `different_function` at the refused fold) claim nothing unless
running both programs confirms them (`confirm.py`)."""


def outcome_of(categories: Iterable[str], confirmed: bool = False) -> str:
    """Why a check that is not proven failed, from its error diagnostics' reasons: `BUG` when
    one of them is in `CLAIMS` (the program is claimed wrong: exit code 1), else `INCONCLUSIVE`
    (exit code 3: the check could not decide, and no bug is claimed; also for no reason at all
    or an unknown one). One result claimed wrong is enough, whatever the others say; next to a
    reason in `WITHDRAWS_CLAIMS` only claims `confirmed` by running both programs count."""
    categories = list(categories)
    if WITHDRAWS_CLAIMS.intersection(categories) and not confirmed:
        return INCONCLUSIVE
    return BUG if any(category in CLAIMS for category in categories) else INCONCLUSIVE
