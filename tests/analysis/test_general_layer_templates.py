"""The general tier's layer template (`analysis/general/layer_templates.py`): the reference's
repeated layer and the 1F1B stage's repeated Megatron-tp layer compute the same function of
their inputs, proven once on holes, for the frontier pipeline (examples/frontier.py's
`pipeline_step`, MLP stages) at test widths; and its nearest wrong neighbours (a stage layer
differing from the reference's in one weight index, one constant, one op, or missing its tp
psum) compute other numbers and get no template. Every program is run on simulated CPU
devices: the correct one matches its reference, each neighbour does not."""

from __future__ import annotations

import os

if "--xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                               + " --xla_force_host_platform_device_count=8").strip()

from dataclasses import replace

import jax.numpy as jnp
import pytest

from entangle_mlir.analysis.general import layer_templates as LT
from entangle_mlir.analysis.general import tier
from entangle_mlir.driver import check_texts
from entangle_mlir.mlir.ir import parse_module
from entangle_mlir.mlir.program import Program, from_two_modules, functions
from examples import frontier as F
from examples.heldout.corpus import input_sets, lower_pair, max_error
from examples.real.models.layers import rms_norm, silu
from examples.real.models.par import enter_tp, exit_tp


def _program(ex) -> Program:
    ref, sharded = lower_pair(ex)
    return from_two_modules(parse_module(ref, "ref.mlir"), parse_module(sharded, "sh.mlir"),
                            "ref.mlir", "sh.mlir")


def _step(layers: int, pp: int, tp: int, dp: int = 1, **kw):
    cfg = replace(F.tiny(F.LLAMA_70B, layers), batch=2)
    return F.pipeline_step(cfg, dp, pp, tp, micro=2, attention=False, **kw)


@pytest.mark.parametrize("layers, pp, tp, dp", [(6, 2, 2, 1), (8, 2, 4, 1), (6, 2, 2, 2)])
def test_stage_layer_template_is_proven(layers: int, pp: int, tp: int, dp: int) -> None:
    """Three and four layers a stage, tp 2 and 4, one and two dp rows a device: the template
    equality holds (normal form), the tp weights are the blocks of the reference's by the
    layer's psum group, the stream is cut into its row blocks."""
    ex = _step(layers, pp, tp, dp)
    assert max_error(ex, input_sets(ex)[0]) <= 10 * ex.atol
    proof = LT.prove_layer_template(_program(ex))
    assert proof.proven, proof.reason
    template = proof.template
    assert template.tiling == ["stream", None, (1, tp), (1, tp), (0, tp)]
    assert template.blocks == 2 * dp  # micro-batches x (rows / a device's rows)
    assert template.term.shape == template.holes[0].shape


@pytest.mark.parametrize("changed", [False, True])
def test_template_equality_by_z3(changed: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same equality asked of Z3 alone (no normal form) at the smallest widths (one
    token, d_model 2, d_ff 2: one gate/up column and one down row a tp device, still summed by
    the layer's psum): proven; with the stage's MLP output scaled by 1.0625, refuted (at
    d_model 4 Z3 runs out of time on the refutation). The query is built as in a fresh
    process (terms interned from scratch, holes numbered from the start): Z3's search on
    this nonlinear query follows its terms' order and names, which otherwise depend on what
    the worker checked before (it answered "unknown" after other tests)."""
    from entangle_mlir.analysis import layer_reuse
    from entangle_mlir.analysis.instance.term_equality import check_term_equality
    from entangle_mlir.analysis.solver import fresh_contexts
    from entangle_mlir.core import memos

    before = memos.saved()
    memos.start_over()
    monkeypatch.setattr(layer_reuse, "_holes", 0)

    cfg = replace(F.tiny(F.LLAMA_70B, 6), batch=2, seq=1, d_model=2, d_ff=2)
    ex = F.pipeline_step(cfg, 1, 2, 2, micro=2, attention=False,
                         stage_mlp=scaled_residual if changed else None)
    program = _program(ex)
    reference, sharded = LT.repeated_layers(program.ref_func)[0], _stage_layer(program)
    eq = LT.template_equality(program, reference, sharded)
    with fresh_contexts():
        result = check_term_equality(eq.want, eq.got, "template.z3", 60_000, typed=True)
    memos.restore(before)
    assert result.status == ("refuted" if changed else "proved"), result.reason


def test_template_rests_on_the_block_positions(monkeypatch: pytest.MonkeyPatch) -> None:
    """The down projection's rows given to the devices in the reverse of their group order
    (the gate's and up's columns kept): the equality is not proven, so the blocks' positions
    are part of what is proven. (Reversing every weight's blocks at once is a correct
    neighbour, the same psum in another order: proven.)"""
    program = _program(_step(6, 2, 2))
    real = LT.device_block

    def reversed_rows(hole, dim, position, size):
        count = hole.shape[dim] // size
        return real(hole, dim, count - 1 - position if dim == 0 else position, size)

    monkeypatch.setattr(LT, "device_block", reversed_rows)
    proof = LT.prove_layer_template(program)
    assert not proof.proven
    assert "not shown to compute the reference layer" in proof.reason
    monkeypatch.setattr(LT, "device_block", lambda hole, dim, position, size: real(
        hole, dim, hole.shape[dim] // size - 1 - position, size))
    assert LT.prove_layer_template(program).proven


def _stage_layer(program: Program) -> LT.LayerRegion:
    return next(r for f in functions(program.sharded_module) for r in LT.repeated_layers(f))


def up_from_gate(p: dict, x, par):
    return F.changed_mlp(p, x, par)


def scaled_residual(p: dict, x, par):
    """One constant differs: the MLP's output scaled by 1.0625."""
    h = enter_tp(rms_norm(x, p["mlp_norm"]), par)
    return exit_tp((silu(h @ p["w_gate"]) * (h @ p["w_up"])) @ p["w_down"], par) * 1.0625


def tanh_gate(p: dict, x, par):
    """One op differs: tanh where SiLU belongs."""
    h = enter_tp(rms_norm(x, p["mlp_norm"]), par)
    return exit_tp((jnp.tanh(h @ p["w_gate"]) * (h @ p["w_up"])) @ p["w_down"], par)


@pytest.mark.parametrize("kw", [
    {"stage_mlp": up_from_gate}, {"stage_mlp": scaled_residual}, {"stage_mlp": tanh_gate},
    {"bug": "stage_mlp_without_psum"}],
    ids=["weight_index", "constant", "op", "no_psum"])
def test_changed_stage_layer_gets_no_template(kw: dict) -> None:
    """Every layer of every stage changed (so the stage's layers still repeat): the numbers
    differ and no template is proven; the reason says what failed."""
    ex = _step(6, 2, 2, **kw)
    assert max_error(ex, input_sets(ex)[0]) > 1e-3
    proof = LT.prove_layer_template(_program(ex))
    assert not proof.proven
    assert proof.reason  # a pair tried and refused, or no pair whose inputs fit


def test_one_changed_layer_is_no_repeat_of_the_template() -> None:
    """`middle_layer_up_from_gate`: layer L // 2 alone differs; the stage computes both blocks
    and picks per layer, so its layers are not the template's repeats: no template, and the
    changed layer is left to the full expansion (tests/examples/test_frontier_pipeline.py
    names it)."""
    ex = _step(6, 2, 2, bug="middle_layer_up_from_gate")
    assert max_error(ex, input_sets(ex)[0]) > 1e-3
    program = _program(ex)
    proof = LT.prove_layer_template(program)
    assert not proof.proven
    stage_regions = [r for f in functions(program.sharded_module)
                     for r in LT.repeated_layers(f)]
    reference = LT.repeated_layers(program.ref_func)[0]
    assert all(r.signature != reference.signature for r in stage_regions)


@pytest.mark.parametrize("layers, pp, tp, dp", [(6, 2, 2, 1), (8, 2, 2, 2), (8, 4, 2, 1)])
def test_pipeline_is_proven_through_the_template(layers: int, pp: int, tp: int,
                                                 dp: int) -> None:
    """The general tier proves the pipeline with every layer of both programs abstracted by
    the template (the reference's stream outputs named by leaves, the devices' by their row
    blocks) and by the backward template (every reference layer's outgoing cotangent but
    the first's, which has none: `backward_templates.py`; pp 4: two layers a stage, the
    cotangent's shift to the previous stage trimmed off the layer): the try is proven, no
    fallback."""
    ex = _step(layers, pp, tp, dp)
    assert max_error(ex, input_sets(ex)[0]) <= 10 * ex.atol
    report = check_texts(*lower_pair(ex), verify_rules=False, layer_templates=True)
    assert report.proven
    note = report.stats["general_tier"]["layer_template"]
    assert "not_proven" not in note and "error" not in note, note
    assert note["reference_layers"] == layers
    assert note["sharded_layers"] >= layers
    assert note["backward"] == "normal form"
    reference, sharded = note["backward_layers"]
    assert reference == layers - 1 and sharded >= layers - 1


@pytest.mark.parametrize("bug", ["middle_layer_up_from_gate", "stage_mlp_without_psum",
                                 "backward_microbatch_off_by_one"])
def test_twin_verdict_does_not_come_from_the_template(bug: str) -> None:
    """A wrong pipeline is not proven, and the general tier's reason and blamed op are the
    ones of the check with every layer expanded (`layer_templates=False`): a try through the
    template that is not proven leaves the verdict to the full expansion."""
    ex = _step(6, 2, 2, bug=bug)
    assert max_error(ex, input_sets(ex)[0]) > 1e-3
    same_verdict_with_and_without_templates(ex)


def same_verdict_with_and_without_templates(ex) -> dict | None:
    """Check `ex` with the layer templates and without: neither proven, the same verdict,
    general tier reason, refutation, blamed op and diagnostics; the try's note."""
    texts = lower_pair(ex)
    with_template = check_texts(*texts, verify_rules=False, layer_templates=True)
    without = check_texts(*texts, verify_rules=False, layer_templates=False)
    assert not with_template.proven and not without.proven
    assert with_template.verdict == without.verdict
    ours, theirs = (dict(r.stats["general_tier"]) for r in (with_template, without))
    note = ours.pop("layer_template", None)
    for key in ("reason", "refuted", "loc"):
        assert ours.get(key) == theirs.get(key), key
    assert [(d.message, str(d.loc)) for d in with_template.diagnostics] == \
        [(d.message, str(d.loc)) for d in without.diagnostics]
    return note


def test_fallback_after_a_failed_try_is_the_check_without_templates(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A templated try that builds all its terms and is then not proven (forced here: the
    try's result replaced by "not proven") leaves the fallback the intern table and memos as
    they were before it (`memos.restore`): the fallback starts from the same tables as the
    check with templates off, and its verdict and counts are that check's."""
    from entangle_mlir.core import memos

    ex = _step(6, 2, 2)
    assert max_error(ex, input_sets(ex)[0]) <= 10 * ex.atol
    texts = lower_pair(ex)
    real = tier.expanded_tier
    starts: list[dict[str, int]] = []

    def failing_try(program, reference=None, **options):
        if options.get("template") is None:
            starts.append(memos.sizes())
            return real(program, reference, **options)
        tried = real(program, reference, **options)
        assert tried.proven  # the try itself went through: its terms were all built
        return tier.GeneralResult(False, tried.devices, "forced: the try is not proven")

    monkeypatch.setattr(tier, "expanded_tier", failing_try)
    with_try = check_texts(*texts, verify_rules=False, layer_templates=True)
    without = check_texts(*texts, verify_rules=False, layer_templates=False)
    assert with_try.proven and without.proven
    note = with_try.stats["general_tier"]["layer_template"]
    assert note["not_proven"] == "forced: the try is not proven"
    assert len(starts) == 2 and starts[0] == starts[1]
    ours, theirs = (dict(r.stats["general_tier"]) for r in (with_try, without))
    for key in ("decisions", "computed", "ops", "renamed"):
        assert ours.get(key) == theirs.get(key), key


def test_large_stream_inputs_are_not_normalized(monkeypatch: pytest.MonkeyPatch) -> None:
    """`device_stream` does not normalize a stream input of more than `STREAM_NODES`
    distinct subterms (a pipeline's bubble steps): with the bound at 16 nodes, far below the
    default, the 1F1B pipeline (pp 4, bubbles on every stage) is proven through the
    templates at the same sites (a block's stream input is a few nodes), and stream inputs
    were refused by the bound. With every device's value computed (`LAZY` off: with it on,
    the bubble steps' streams are never read)."""
    monkeypatch.setattr(LT, "LAZY", False)
    ex = _step(8, 4, 2)
    texts = lower_pair(ex)
    default = check_texts(*texts, verify_rules=False, layer_templates=True)
    refused = []
    count = LT.more_nodes_than

    def counting(term, bound):
        found = count(term, bound)
        refused.append(found)
        return found

    monkeypatch.setattr(LT, "STREAM_NODES", 16)
    monkeypatch.setattr(LT, "more_nodes_than", counting)
    bounded = check_texts(*texts, verify_rules=False, layer_templates=True)
    assert default.proven and bounded.proven
    ours, theirs = (r.stats["general_tier"]["layer_template"] for r in (bounded, default))
    assert "not_proven" not in ours
    for key in ("reference_layers", "sharded_layers", "backward_layers"):
        assert ours[key] == theirs[key], key
    assert any(refused) and not all(refused)


def test_lazy_expansion_computes_only_what_is_read(monkeypatch: pytest.MonkeyPatch) -> None:
    """Through the templates, a device's value is computed only where read (`LAZY`): the
    1F1B pipeline (pp 4, bubble steps masked on every stage) is proven through the templates
    computing far fewer device values than with every value computed, and its wrong twin (one layer's up projection from w_gate) is still not proven."""
    stats = stats_with_switch(lower_pair(_step(8, 4, 2)), monkeypatch, "LAZY", (True, False))
    assert stats[True]["computed"] < 0.7 * stats[False]["computed"]
    assert stats[True]["layer_template"]["reference_layers"] == \
        stats[False]["layer_template"]["reference_layers"]
    monkeypatch.setattr(LT, "LAZY", True)
    twin = _step(8, 4, 2, bug="middle_layer_up_from_gate")
    assert max_error(twin, input_sets(twin)[0]) > 1e-3
    assert not check_texts(*lower_pair(twin), verify_rules=False, layer_templates=True).proven


def stats_with_switch(texts, monkeypatch: pytest.MonkeyPatch, switch: str, values) -> dict:
    """{value: the general tier's stats} of the pair checked through the templates with
    `layer_templates.<switch>` set to each value: every check proven by the try through the
    templates (no fallback)."""
    stats = {}
    for value in values:
        monkeypatch.setattr(LT, switch, value)
        report = check_texts(*texts, verify_rules=False, layer_templates=True)
        assert report.proven
        stats[value] = report.stats["general_tier"]
        assert "not_proven" not in stats[value]["layer_template"]
    return stats


def test_more_nodes_than_counts_shared_subterms_once() -> None:
    """A chain of 10 exponentials over x read by two ops under one: 14 distinct subterms
    (a tree walk would count 25)."""
    from entangle_mlir.core.terms import make_arg, make_elementwise

    chain = make_arg(0, (2,), "f32")
    for _ in range(10):
        chain = make_elementwise("stablehlo.exponential", (chain,), (), "f32")
    left = make_elementwise("stablehlo.exponential", (chain,), (), "f32")
    right = make_elementwise("stablehlo.log", (chain,), (), "f32")
    term = make_elementwise("stablehlo.atan2", (left, right), (), "f32")
    assert not LT.more_nodes_than(term, 14)
    assert LT.more_nodes_than(term, 13)
