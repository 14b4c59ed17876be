"""The general tier (per-device expansion, `analysis/general/`) on programs written the way
others write them, which the layout tier does not prove, and on their nearest wrong twins.

Every label is grounded by execution on simulated CPU devices: a correct program computes
the reference's numbers (floats up to the regrouping of sums), and is proven with the note
naming the general tier; each twin (offset off by one, mask inverted, reduced over the wrong
axis, gathered along the wrong dim, comparison off by one, a constant one ulp off) computes
other numbers and is not proven, nor are programs equal only in exact real arithmetic
(partial products rounded to bf16, zeros made of an overflowing exp, 0 / 0). A program the layout tier proves gets the same report with
the general tier on, and the general tier does not run on it.
"""

from __future__ import annotations

import os
import time

if "--xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
    ).strip()

from dataclasses import dataclass

import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.sharding import PartitionSpec as P

from entangle_mlir.driver import check_files, check_texts
from examples.heldout import corpus
from examples.heldout.jax_docs import (
    block_sum_ref,
    ring_reduce_scatter,
    ring_reduce_scatter_off_by_one,
)
from tests.jax_runs import run_and_lower
from tests.shared import EXAMPLES_MLIR

V, D, S, N = 16, 8, 4, 4
TIER_NOTE = "proven by per-device expansion on {n} devices (general tier)"


@dataclass(frozen=True)
class Program:
    name: str
    reference: object
    body: object
    args: tuple
    specs: tuple
    out_specs: object
    mesh: tuple = (("tp", N),)
    check_vma: bool = True


def _run(program: Program):
    """(reference output, sharded output, lowered pair) on the program's mesh."""
    want, got, texts = run_and_lower(program.reference, program.body, program.args,
                                     program.specs, program.out_specs, program.mesh,
                                     program.check_vma)
    return np.asarray(want), np.asarray(got), texts


RNG = np.random.default_rng(0)
IDS = np.array([1, 9, 15, 4], dtype=np.int32)  # one id in each device's block but the third
TABLE = RNG.standard_normal((V, D)).astype(np.float32)
ROW = RNG.standard_normal((16,)).astype(np.float32)
MATRIX = RNG.standard_normal((8, 4)).astype(np.float32)
SCALE = np.float32(0.125)


def _embedding(offset: int = 0, invert: bool = False, scale=None):
    """The vocab-parallel embedding spelled the common way (issue 18)."""
    def body(ids, w):
        n = w.shape[0]
        start = lax.axis_index("tp") * n + offset
        local = ids - start
        mask = (local >= 0) & (local < n)
        if invert:
            mask = ~mask
        rows = jnp.take(w, jnp.clip(local, 0, n - 1), axis=0)
        out = lax.psum(jnp.where(mask[:, None], rows, 0.0), "tp")
        return out if scale is None else out * scale
    return body


def _embedding_reference(scale=None):
    def reference(ids, w):
        out = jnp.take(w, ids, axis=0)
        return out if scale is None else out * scale
    return reference


def _cumsum(before: bool = True):
    """A per-shard cumsum plus the totals of the blocks before the device's own."""
    def body(x):
        local = jnp.cumsum(x)
        totals = lax.all_gather(local[-1], "tp")
        index = lax.axis_index("tp")
        earlier = jnp.arange(N) < index if before else jnp.arange(N) <= index
        return local + jnp.sum(jnp.where(earlier, totals, 0.0))
    return body


def _block_sums(axis: str):
    return lambda x: lax.psum(x, axis)


def _gather_untiled(axis: int):
    return lambda x: lax.all_gather(x, "tp", tiled=False, axis=axis).reshape(-1, x.shape[1])


def _ring_reduce_scatter(shift: int = 1):
    """psum_scatter as a ring of ppermutes: each step adds the passed partial sum into the
    chunk at a device-dependent index (`chunks.at[i].add`, a scatter at concrete indices on
    each device); `shift=0` adds it into the wrong chunk."""
    def body(x):
        me = lax.axis_index("tp")
        chunks = x.reshape(N, -1)
        for step in range(1, N):
            passed = lax.ppermute(chunks[(me + step) % N], "tp",
                                  [(k, (k - 1) % N) for k in range(N)])
            chunks = chunks.at[(me + step + shift) % N].add(passed)
        return chunks[me]
    return body


def _block_sums_of_4(x):
    return x.reshape(N, N, -1).sum(0).reshape(-1)


EMBED_ARGS = (IDS, TABLE)
EMBED_SPECS = (P(), P("tp", None))
LAYOUT_TIER_NOW = [
    Program("vocab_parallel_embedding", _embedding_reference(), _embedding(), EMBED_ARGS,
            EMBED_SPECS, P()),
    Program("scaled_embedding", _embedding_reference(SCALE), _embedding(scale=SCALE),
            EMBED_ARGS, EMBED_SPECS, P()),
]
"""General-tier cases the layout tier proves since its vocab-parallel lookup rules
(tests/rules/test_vocab_parallel.py)."""

CORRECT = [
    Program("per_shard_cumsum", jnp.cumsum, _cumsum(), (ROW,), (P("tp"),), P("tp")),
    Program("block_sums", lambda x: x.reshape(2, -1).sum(0), _block_sums("tp"), (ROW,),
            (P("tp"),), P(), mesh=(("dp", 2), ("tp", 2))),
    Program("all_gather_untiled_reshape", lambda x: x, _gather_untiled(0), (MATRIX,),
            (P("tp", None),), P(), check_vma=False),
    # at a real size the terms meet in normal form, with no evaluation at all
    Program("ring_reduce_scatter", _block_sums_of_4, _ring_reduce_scatter(), (ROW,),
            (P("tp"),), P("tp")),
    Program("block_sums_4096x64", lambda x: x.reshape(N, -1, 64).sum(0), _block_sums("tp"),
            (RNG.standard_normal((4096, 64)).astype(np.float32),), (P("tp", None),), P()),
    # a device's `.at[(me + k) % n].add(u)` is a scatter-add into zeros at a known row: the
    # padded row, whose sums regroup (no overflow the reference's sum does not also risk)
    Program("ring_reduce_scatter_at_add", block_sum_ref, ring_reduce_scatter, (ROW,), (P("i"),),
            P("i"), mesh=(("i", N),)),
]
TWINS = [
    Program("embedding_offset_off_by_one", _embedding_reference(), _embedding(offset=1),
            EMBED_ARGS, EMBED_SPECS, P()),
    Program("embedding_mask_inverted", _embedding_reference(), _embedding(invert=True),
            EMBED_ARGS, EMBED_SPECS, P()),
    Program("cumsum_comparison_off_by_one", jnp.cumsum, _cumsum(before=False), (ROW,),
            (P("tp"),), P("tp")),
    Program("block_sums_wrong_axis", lambda x: x.reshape(2, -1).sum(0), _block_sums("dp"),
            (ROW,), (P("tp"),), P(), mesh=(("dp", 2), ("tp", 2)), check_vma=False),
    Program("all_gather_untiled_wrong_dim", lambda x: x, _gather_untiled(1), (MATRIX,),
            (P("tp", None),), P(), check_vma=False),
    Program("ring_reduce_scatter_into_the_wrong_chunk", _block_sums_of_4,
            _ring_reduce_scatter(shift=0), (ROW,), (P("tp"),), P("tp")),
    Program("ring_reduce_scatter_chunk_off_by_one", block_sum_ref,
            ring_reduce_scatter_off_by_one, (ROW,), (P("i"),), P("i"), mesh=(("i", N),)),
    Program("embedding_scale_one_ulp_off", _embedding_reference(SCALE),
            _embedding(scale=np.nextafter(SCALE, np.float32(1))), EMBED_ARGS, EMBED_SPECS,
            P()),
]


BIG = np.full((16,), 100.0, dtype=np.float32)  # exp(100) overflows float32
ZEROS = np.zeros((16,), dtype=np.float32)
LEFT = RNG.standard_normal((4, 16)).astype(np.float32)
RIGHT = RNG.standard_normal((16, 4)).astype(np.float32)


def _bf16_partials(x, w):
    return lax.psum((x.astype(jnp.bfloat16) @ w.astype(jnp.bfloat16)).astype(jnp.float32), "tp")


def _exp_minus_exp(x):
    e = jnp.exp(x)
    return lax.psum(x + (e - e), "tp")


def _block_sums_reference(x):
    return x.reshape(N, -1).sum(0)


# What exact real arithmetic would prove but floats do not compute (the general tier reads
# float arithmetic as reals in Z3): partial products rounded to bf16 where the reference
# multiplies in f32, zeros made of an overflowing exp (inf * 0 and inf - inf are NaN), a
# quotient by a value that may be zero (0 / 0 is NaN).
NEAR_MISSES = [
    Program("bf16_partial_products", lambda x, w: x @ w, _bf16_partials, (LEFT, RIGHT),
            (P(None, "tp"), P("tp", None)), P()),
    Program("block_sums_plus_exp_times_zero", _block_sums_reference,
            lambda x: lax.psum(x, "tp") + lax.psum(jnp.exp(x) * 0.0, "tp"), (BIG,),
            (P("tp"),), P()),
    Program("block_sums_plus_exp_minus_exp", _block_sums_reference, _exp_minus_exp, (BIG,),
            (P("tp"),), P()),
    Program("block_sums_of_x_times_x_over_x", _block_sums_reference,
            lambda x: lax.psum(x * x / x, "tp"), (ZEROS,), (P("tp"),), P()),
]


def _devices(program: Program) -> int:
    return int(np.prod([s for _, s in program.mesh]))


@pytest.mark.parametrize("program", CORRECT, ids=lambda p: p.name)
def test_correct_programs_are_proven_by_the_general_tier(program: Program) -> None:
    want, got, (ref_text, sharded_text) = _run(program)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)  # grounded: same numbers
    layout = check_texts(ref_text, sharded_text, general_tier=False)
    assert not layout.proven, "the layout tier proves it: no longer a general-tier case"
    report = check_texts(ref_text, sharded_text)
    assert report.proven, report.render_text()
    assert TIER_NOTE.format(n=_devices(program)) in report.notes
    assert report.stats["tier"] == "general"
    general = report.stats["general_tier"]
    assert general["proven"] and general["rule_instances"]["refuted"] == 0
    assert general["rule_instances"]["unknown"] == 0
    assert report.to_json()["verdict"] == "proven"


def test_out_of_its_budget_the_general_tier_proves_nothing() -> None:
    """`general_budget` (`entangle check --general-budget`) bounds the tier: with none left,
    a program only it proves is not proven, and the reason says why."""
    _, _, (ref_text, sharded_text) = _run(CORRECT[0])
    report = check_texts(ref_text, sharded_text, verify_rules=False, general_budget=0)
    assert not report.proven
    assert report.stats["general_tier"]["reason"] == "out of time"
    assert any("stopped before deciding: out of time" in n and "--general-budget" in n
               for n in report.notes), report.notes
    assert check_texts(ref_text, sharded_text, verify_rules=False, general_budget=30).proven


@pytest.mark.parametrize("error", [RecursionError(), ValueError("a defect")])
def test_a_general_tier_stopped_by_its_own_error_says_so(monkeypatch, error) -> None:
    """A general tier stopped by Python's recursion limit or a defect of its own proves
    nothing and decides nothing: the program it would prove is not proven, and the report
    says in a note that the tier stopped and why (not only in its stats), so the layout
    tier's verdict is not mistaken for a decision."""
    from entangle_mlir.analysis.general import tier
    from entangle_mlir.passes.general_tier import STOPPED_NOTE

    def stopped(*args, **kwargs):
        raise error

    _, _, (ref_text, sharded_text) = _run(CORRECT[0])
    monkeypatch.setattr(tier, "general_tier", stopped)
    report = check_texts(ref_text, sharded_text, verify_rules=False)
    assert not report.proven
    reason = report.stats["general_tier"]["reason"]
    assert ("nest too deeply" if isinstance(error, RecursionError) else "a defect") in reason
    assert STOPPED_NOTE.format(reason=reason) in report.notes
    assert f"note: {STOPPED_NOTE.format(reason=reason)}" in report.render_text()


@pytest.mark.parametrize("program", LAYOUT_TIER_NOW, ids=lambda p: p.name)
def test_former_general_tier_cases_are_proven_by_the_layout_tier(program: Program) -> None:
    want, got, (ref_text, sharded_text) = _run(program)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)  # grounded: same numbers
    report = check_texts(ref_text, sharded_text, general_tier=False)
    assert report.proven, report.render_text()
    assert report.stats["tier"] == "layout"


@pytest.mark.parametrize("program", TWINS, ids=lambda p: p.name)
def test_wrong_twins_are_not_proven(program: Program) -> None:
    want, got, (ref_text, sharded_text) = _run(program)
    assert not np.array_equal(got, want)  # grounded: other numbers
    report = check_texts(ref_text, sharded_text)
    assert not report.proven, report.render_text()
    general = report.stats["general_tier"]
    assert not general["proven"] and general["reason"]


@pytest.mark.parametrize("program", NEAR_MISSES, ids=lambda p: p.name)
def test_real_arithmetic_near_misses_are_not_proven(program: Program) -> None:
    want, got, (ref_text, sharded_text) = _run(program)
    assert not np.allclose(got, want, rtol=1e-3, equal_nan=False)  # grounded: NaN or rounded
    report = check_texts(ref_text, sharded_text)
    assert not report.proven, report.render_text()
    assert not report.stats["general_tier"]["proven"]


def test_the_embedding_proof_states_the_valid_index_assumption() -> None:
    _, _, (ref_text, sharded_text) = _run(LAYOUT_TIER_NOW[0])
    report = check_texts(ref_text, sharded_text)
    assert any("valid indices" in a for a in report.assumptions), report.assumptions


def test_a_refuted_embedding_names_a_device_and_a_counterexample() -> None:
    """Where the layout tier could only say it cannot relate a value, the general tier's
    counterexample becomes the diagnostic (it does not claim which op is wrong)."""
    _, _, (ref_text, sharded_text) = _run(TWINS[0])
    report = check_texts(ref_text, sharded_text)
    first = report.diagnostics[0]
    assert first.message.startswith("general tier (per-device expansion on 4 devices): ")
    assert "device 0's block of result #0 differs from the reference" in first.message
    assert "Z3 counterexample: arg0[" in first.message
    assert any(note.message.startswith("the layout tier: ") for note in first.notes)


def test_no_general_tier_keeps_the_layout_report() -> None:
    _, _, (ref_text, sharded_text) = _run(next(p for p in CORRECT if p.name == "block_sums"))
    report = check_texts(ref_text, sharded_text, general_tier=False)
    assert not report.proven and "general_tier" not in report.stats
    assert report.diagnostics[0].category == "wrong_axis"


def test_layout_proofs_are_unchanged_and_the_general_tier_does_not_run() -> None:
    ref = EXAMPLES_MLIR / "megatron_mlp_tp4.ref.mlir"
    sharded = EXAMPLES_MLIR / "megatron_mlp_tp4.sharded.mlir"
    with_tier = check_files(str(ref), str(sharded))
    without = check_files(str(ref), str(sharded), general_tier=False)
    assert with_tier.proven and without.proven
    assert with_tier.render_text() == without.render_text()
    assert with_tier.stats["tier"] == "layout" and "general_tier" not in with_tier.stats


def test_a_large_scatter_at_unknown_indices_is_not_decided(monkeypatch) -> None:
    """The vocab-parallel embedding's gradient (examples/heldout) scatters 4 x 8 x 16 updates
    at unknown ids into a 64 x 16 table: Z3's evaluation would compare every update with every
    element (524288 comparisons, four minutes to build); the general tier says so instead.
    The layout tier proves the program (the forward's mask and local ids read back per device
    by the backward, tests/examples/test_shard_map_residuals.py); with that read-back refused,
    the general tier runs on it."""
    from entangle_mlir.analysis import infer
    from entangle_mlir.core.relations import Opaque

    ex = next(e for e in corpus.examples() if e.name == "grad_vocab_parallel_embed_tp4")
    ref, sharded = corpus.lower_pair(ex)
    assert check_texts(ref, sharded, verify_rules=False).proven
    monkeypatch.setattr(infer.Walker, "_read_back",
                        staticmethod(lambda *args: Opaque("refused by the test")))
    start = time.perf_counter()
    report = check_texts(ref, sharded, verify_rules=False)
    assert not report.proven
    general = report.stats["general_tier"]
    assert "a scatter at unknown indices too large to evaluate symbolically (524288" in \
        general["reason"], general
    assert time.perf_counter() - start < 30


def test_a_query_too_large_to_build_is_not_decided() -> None:
    """Z3's timeout bounds its search, not building and asserting the query (nor the overflow
    claim's, a gradient's chain of dots: minutes): past `MAX_QUERY_WORK` multiply-adds the
    equality is "unknown" at once, never proved; under it, the query is still built."""
    from fractions import Fraction

    from entangle_mlir.analysis.general.decide import Decider
    from entangle_mlir.analysis.instance.term_equality import MAX_QUERY_WORK, query_work
    from entangle_mlir.core.terms import make_arg, make_dot, make_elementwise, make_lin

    def pair(n: int):
        x, w = make_arg(0, (n, n), "f32"), make_arg(1, (n, n), "f32")
        b, c = make_arg(2, (n, n), "f32"), make_arg(3, (n, n), "f32")
        a = make_dot(x, w, ((), (), (1,), (0,)), (n, n), "f32")
        one = Fraction(1)
        # a * (b + c) against a * b + a * c: equal, but no normal form distributes
        want = make_elementwise("stablehlo.multiply", (a, make_lin([(one, b), (one, c)],
                                                                   Fraction(0), (n, n), "f32")))
        got = make_lin([(one, make_elementwise("stablehlo.multiply", (a, b))),
                        (one, make_elementwise("stablehlo.multiply", (a, c)))], Fraction(0),
                       (n, n), "f32")
        return want, got

    big = pair(28)
    assert query_work(list(big)) > MAX_QUERY_WORK
    start = time.perf_counter()
    decision = Decider([big[0]]).decide(*big, "big")
    assert not decision.proved and "multiply-adds" in decision.reason, decision
    assert time.perf_counter() - start < 5
    small = pair(3)
    assert query_work(list(small)) <= MAX_QUERY_WORK
    # (then Z3 runs; a product distributed over a sum may overflow where the other does not)
    assert "multiply-adds" not in Decider([small[0]]).decide(*small, "small").reason


def test_a_refutation_rests_on_checked_rule_instances(monkeypatch) -> None:
    """A refutation rests on the terms the rules built, as a proof does: every rule instance
    is checked first. Where one is refuted, the terms may not be what the programs compute,
    so nothing is refuted (no diagnostic, no counterexample), and the reason says why."""
    from entangle_mlir.analysis.instance import parallel
    from entangle_mlir.analysis.solver import ProofResult

    want, got, (ref_text, sharded_text) = _run(TWINS[0])
    assert not np.array_equal(got, want)  # grounded: a bug
    monkeypatch.setattr(parallel, "check_batch", lambda items, **kwargs: (
        ProofResult("refuted", reason="forced") for _ in items))
    report = check_texts(ref_text, sharded_text)
    assert not report.proven and report.counterexample is None
    assert not any(d.message.startswith("general tier (") for d in report.diagnostics)
    general = report.stats["general_tier"]
    assert general["reason"].startswith("device 0's block of result #0 differs from the "
                                        "reference for some inputs; not claimed: the rule "
                                        "instance for "), general
    assert general["reason"].endswith("was refuted: forced")


def test_a_refutation_the_terms_do_not_show_is_not_made(monkeypatch) -> None:
    """A refutation is grounded in the terms as built, before normal forms and the valid-index
    simplification: a decision that calls a correct program's terms different on inputs where
    they agree (a wrong identity would) is "not shown", no refutation."""
    from entangle_mlir.analysis.general.decide import Decider, Decision
    from entangle_mlir.analysis.instance.term_equality import complete_inputs, shown_inputs

    def wrong(self, want, got, name, timeout_ms):
        inputs = complete_inputs(None, [want, got], {})
        return Decision("refuted", counterexample=shown_inputs(inputs), inputs=inputs)

    want, got, (ref_text, sharded_text) = _run(CORRECT[0])
    np.testing.assert_allclose(got, want, rtol=1e-6)  # grounded: correct
    monkeypatch.setattr(Decider, "_decide", wrong)
    report = check_texts(ref_text, sharded_text)
    assert not report.proven and report.counterexample is None
    assert not any(d.message.startswith("general tier (") for d in report.diagnostics)
    assert "the decision found the terms different, but they agree on the inputs it found" in \
        report.stats["general_tier"]["reason"]


def test_several_float_types_are_named_per_side() -> None:
    """Two terms computed in bf16 and f32 are not decided (exact reals would meet where the
    roundings do not); the reason names each side's types where they differ, and only the
    types where both sides compute alike."""
    from entangle_mlir.analysis.general.decide import Decider, several_float_types
    from entangle_mlir.core.terms import make_arg, make_convert, make_elementwise

    x = make_arg(0, (4,), "bf16")
    in_bf16 = make_elementwise("stablehlo.multiply", (x, x), (), "bf16")
    wide = make_convert(x, "f32")
    in_f32 = make_convert(make_elementwise("stablehlo.multiply", (wide, wide), (), "f32"),
                          "bf16")
    decision = Decider([in_bf16]).decide(in_bf16, in_f32, "types", ground=False)
    assert decision.status == "unknown"
    assert "the reference computes in bf16, the sharded program in f32" in decision.reason
    mixed = make_elementwise("stablehlo.add", (in_bf16, in_f32), (), "bf16")
    alike = several_float_types(mixed, mixed, {"bf16", "f32"})
    assert alike.startswith("float arithmetic in several types (bf16, f32): the general")
