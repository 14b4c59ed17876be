"""Whole-layer reuse never proves a stack with one changed layer (grounded fuzz cases).

Random repeated stacks (`fuzz.stack`, fixed seeds) and hand-written near misses
(`fuzz.layer_cases`) are lowered, executed on 8 simulated CPU devices and
checked as `entangle check` does (whole-layer reuse first, Z3 rule-instance checks on). A
program whose numbers differ from the reference's must not be proven; the correct ones are
proven with regions summarized in both walks, and each mutant below is one where the sharded
walk did summarize regions (so the reuse path itself met the changed layer).
`python benchmarks/fuzz_layers.py` runs the same at scale.
"""

from __future__ import annotations

import pytest

from fuzz.gen import RandomChooser
from fuzz.layer_cases import CASES, run_near_miss
from fuzz.stack import copy_mutations, generate_stack, run_case

RANDOM = [
    (8, None),
    (8, "copy 3: combine add layer 3.2 (combine)"),
    (8, "copy 5 reads the input of copy 3"),
    (55, "copy 2: sub instead of mul layer 2.0 (binarg)"),
    (61, "copy 3 reads the input of copy 2"),
    (66, "copy 4: where factor layer 4.3 (where)"),
    (45, "copy 2 reads copy 1's parameters"),
]

NEAR_MISSES = [
    "correct_stacked_params",
    "missing_psum_in_copy_3",
    "pmean_instead_of_psum_in_copy_3",
    "stacked_copy_3_slices_w_2",
    "copy_3_reads_input_of_copy_1",  # a false proof if `layer_reuse._fits` always says yes
    "copy_3_residual_from_copy_1",
    "stacked_copy_3_slices_w2_of_layer_2",
    "computed_positions_restart_in_copy_3",
    "copy_3_residual_of_normed_x",
    "deferred_psum_correct",
    "attention_correct",
    "positions_correct",
    "attention_mask_wider_in_copy_3",
    "positions_plus_1_in_copy_3",
    "deferred_psum_missing_in_copy_3",
    "copy_3_params_split_over_b_psum_over_a",
    "fixed_then_hole_copy_2_stale",
]


def _stack_case(seed: int, mutation: str | None):
    stack = generate_stack(RandomChooser(seed), seed=seed)
    assert stack is not None
    if mutation is None:
        return run_case(stack)
    c = int(mutation.split()[1].rstrip(":"))
    found = [apply for desc, apply in copy_mutations(stack, c) if desc == mutation]
    assert found, f"seed {seed} has no mutation {mutation!r}"
    from dataclasses import replace

    return run_case(replace(found[0](stack), mutation=mutation))


def _grounded(case, correct: bool) -> None:
    assert case.status not in ("false_proof", "crash", "timeout", "input_error"), (
        case.status, case.message, case.source)
    if correct:
        assert case.status == "proven", (case.message, case.source)
        assert case.error < 1e-3
        assert case.reused and case.fired[0] > 0 and case.fired[1] > 0, case.fired
    else:
        assert case.status in ("caught", "rejected"), (case.status, case.message)
        assert case.error > 1e-3  # grounded: the numbers differ
        assert case.fired[1] > 0, "the sharded walk did not summarize any region"


@pytest.mark.parametrize(("seed", "mutation"), RANDOM)
def test_random_stack(seed: int, mutation: str | None) -> None:
    _grounded(_stack_case(seed, mutation), mutation is None)


@pytest.mark.parametrize("name", NEAR_MISSES)
def test_near_miss(name: str) -> None:
    _grounded(run_near_miss(name), CASES[name][1])
