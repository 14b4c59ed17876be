"""The general tier's territory fuzzer (issue 18, "Must show"): shard_map programs with
device-dependent slicing, masks on device offsets, rotating loop carries, all_to_all, untiled
gathers, block sums and per-device results, plus mutants, each labelled correct or buggy by
EXECUTION on simulated CPU devices (`fuzz.territory_run`).

Property: every verdict agrees with its grounded label: no false proof, no false bug report
(a claim that survives confirmation on a program whose numbers match), no crash. The share
proven by each tier is printed (`-s`). The sweep is `benchmarks/fuzz_territory.py`; here a
few fixed seeds that cover every template and check fast.
"""

from __future__ import annotations

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

import pytest

from fuzz.gen import RandomChooser
from fuzz.territory import (
    TEMPLATES,
    apply_mutation,
    generate_seed,
    mutants,
    program_mutations,
)


def test_every_template_and_mutation_renders() -> None:
    """The generator (no jax): each template's programs and all their mutants render to
    Python that compiles, on both sides."""
    seen: set[str] = set()
    for seed in range(150):
        prog = generate_seed(seed)
        seen.add(prog.kind)
        muts = program_mutations(prog)
        assert muts, prog.source()
        assert {k for _, k, _ in muts} <= {"value", "collective"}
        for m in [None, *muts]:
            p = prog if m is None else apply_mutation(prog, m)
            compile(p.source(), f"seed{seed}.py", "exec")
        assert len(mutants(prog, RandomChooser(seed), 2)) == 2
    assert seen == set(TEMPLATES)


def test_mutants_change_only_the_sharded_side() -> None:
    for seed in range(40):
        prog = generate_seed(seed)
        for m in program_mutations(prog):
            mut = apply_mutation(prog, m)
            assert mut.function_source("ref") == prog.function_source("ref")
            assert mut.mutation == m[0] and not prog.mutation


jax = pytest.importorskip("jax")

if len(jax.devices()) < 8:
    pytest.skip("needs 8 (simulated) devices: XLA_FLAGS was set before jax was imported",
                allow_module_level=True)

from entangle_mlir.core.report import PROVEN, Report
from fuzz.territory_run import (
    Built,
    Grounded,
    TOutcome,
    classify,
    problems,
    run_seed,
    summarize,
    table,
    verdict_of,
)

SEEDS = (0, 1, 2, 5, 6, 7, 9, 12, 15, 17)
"""Fixed seeds: every template once or more (checked by `test_sample_covers_the_territory`),
each with two mutants; chosen among fast ones (a vocab-parallel embedding spelled with
`rows * mask` costs the general tier ~25 s: benchmarks only)."""


@pytest.fixture(scope="module")
def sample() -> list[dict]:
    return [o.to_json() for seed in SEEDS for o in run_seed(seed, 2)]


def _show(rs: list[dict]) -> str:
    return "\n\n".join(f"{'; '.join(problems(r))}\nseed={r['seed']} mutation={r['mutation']}\n"
                       f"{r['source']}" for r in rs[:3])


def test_sample_covers_the_territory(sample) -> None:
    kinds = {r["kind"] for r in sample}
    assert kinds == set(TEMPLATES), set(TEMPLATES) - kinds
    labels = {r["label"] for r in sample}
    assert {"correct", "buggy"} <= labels


def test_no_false_proof_no_false_bug_report_no_crash(sample) -> None:
    bad = [r for r in sample if problems(r)]
    assert not bad, _show(bad)


def test_share_proven_by_each_tier_is_reported(sample) -> None:
    s = summarize(sample)
    print("\n" + table(s))
    assert s["proven_layout"] + s["proven_general"] + s["not_proven"] == s["correct"]
    assert s["proven_general"] > 0, "no program reached the general tier"
    assert s["flagged"] + s["false_proofs"] == s["buggy"]
    assert s["flagged"] > 0
    assert s["base_not_correct"] == 0, "a base program's numbers differ: the generator is wrong"


# ----- the consistency check can fail ---------------------------------------------------------

def _outcome(label: str, report: Report, claim: str = "") -> TOutcome:
    out = TOutcome(0, "toy", "i=2", (), "toy mutation", "value", label=label,
                   numbers="differ" if label == "buggy" else "same", claim=claim)
    out.verdict, out.tier, out.reason, out.layout_reason, out.message = verdict_of(
        report, None, "")
    out.status = classify(out.label, out.verdict, out.claim)
    return out


def test_an_unsound_verdict_is_caught() -> None:
    """A fabricated proof (by the general tier) of a program execution labelled buggy is a
    false proof; the same verdict on a correct program is consistent."""
    proof = Report(PROVEN, stats={"tier": "general"})
    bad = _outcome("buggy", proof)
    assert bad.status == "false_proof" and problems(bad), bad
    assert summarize([bad.to_json()])["false_proofs"] == 1
    assert not problems(_outcome("correct", proof))


def test_a_bug_claim_on_a_correct_program_is_caught() -> None:
    refused = Report("not proven", stats={"general_tier": {"proven": False, "reason": "x"}})
    assert classify("correct", "not_proven", "stands") == "false_bug_report"
    assert problems(_outcome("correct", refused, claim="confirmed"))
    assert not problems(_outcome("correct", refused, claim="withdrawn"))
    assert not problems(_outcome("buggy", refused, claim="stands"))


# ----- labels come from execution -------------------------------------------------------------

def _mutant(prog, words: str):
    return apply_mutation(prog, next(m for m in program_mutations(prog) if words in m[0]))


@pytest.fixture(scope="module")
def embedding():
    prog = generate_seed(8)
    assert prog.kind == "embed" and prog.p["epi"] is not None
    return prog, Grounded.of(prog)


def test_a_wrap_that_cancels_is_labelled_correct(embedding) -> None:
    """`(ids + K) - (start + K)` with K = 2^31 - 1 wraps and cancels in int32: an equivalent
    mutant, labelled correct by running it (not by how it was built)."""
    prog, base = embedding
    assert base.label()[0] == "correct"
    mut = _mutant(prog, "wraps and cancels")
    assert base.label_mutant(Built(mut, reference=False))[0] == "correct"


def test_a_wrapping_mask_bound_is_labelled_buggy(embedding) -> None:
    prog, base = embedding
    mut = _mutant(prog, "mask bound shifted")
    assert base.label_mutant(Built(mut, reference=False))[:2] == ("buggy", "differ")


def test_a_one_ulp_constant_is_labelled_buggy_bitwise(embedding) -> None:
    """A constant one ulp off stays inside the float tolerance; on the exact input set
    (integers: no reassociation noise) it shows bit for bit."""
    prog, base = embedding
    mut = _mutant(prog, "one ulp up")
    assert base.label_mutant(Built(mut, reference=False))[:2] == ("buggy", "bits")
