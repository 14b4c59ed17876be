"""Ground the held-out corpus (examples/heldout/: programs written the way other people write
them) by execution on simulated CPU devices: every correct program computes what its reference
computes, on random inputs and on the inputs chosen for it; every buggy twin computes something
else on at least one of them."""

from __future__ import annotations

import linecache

import pytest

from examples.heldout.corpus import SOURCES, Example, bug_line, examples, grounded_correct
from tests.shared import per_example

EXAMPLES = examples()
CORRECT = [e for e in EXAMPLES if e.bug is None]
BUGGY = [e for e in EXAMPLES if e.bug is not None]


@pytest.mark.parametrize("ex", per_example(CORRECT))
def test_correct_matches_reference(ex: Example) -> None:
    same, errors = grounded_correct(ex)
    assert same, f"{ex.name}: relative errors per input set {errors}"


@pytest.mark.parametrize("ex", per_example(BUGGY))
def test_buggy_differs_from_reference(ex: Example) -> None:
    _, errors = grounded_correct(ex)
    assert max(errors) > 1e-2, f"{ex.name}: relative errors per input set {errors}"


@pytest.mark.parametrize("ex", per_example(BUGGY))
def test_bug_line_is_marked(ex: Example) -> None:
    path, line = bug_line(ex)
    assert linecache.getline(path, line).rstrip().endswith("# BUG")


def test_corpus_shape() -> None:
    """At least 80 programs from every source, bugs for a good share, each correct program's
    buggy twin named after it, and the constructs of issue 18 present."""
    names = [e.name for e in EXAMPLES]
    assert len(set(names)) == len(names) and len(names) >= 80
    assert {e.source for e in EXAMPLES} == set(SOURCES)
    assert len(BUGGY) >= 30 and len(CORRECT) >= 80
    correct = set(names)
    for ex in BUGGY:
        assert ex.name.replace(f"_{ex.bug}_", "_", 1) in correct, ex.name
    assert sum(e.partitioned for e in CORRECT) >= 10
    assert sum(e.wrap is not None for e in CORRECT) >= 8
    for needed in ("psum_i_block_sums", "loss_fsdp_untiled", "all_to_all_two_axes",
                   "ulysses_attention_two_axes", "ppermute_tuple_axes",
                   "matmul_allgather_bidi", "matmul_psumscatter_bidi", "collective_matmul_loop",
                   "cumsum_per_block", "grad_loss_fsdp", "argmax_per_block", "sharded_top4",
                   "switch", "cond_on_own_block", "vocab_parallel_embed", "vocab_parallel_ce",
                   "moe_top2_capacity", "vocab_embed_in_jit_model"):
        assert any(n.startswith(needed + "_") for n in correct), needed
