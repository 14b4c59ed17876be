"""The general tier's backward layer template (`analysis/general/backward_templates.py`): a
layer's backward in the reference and in the 1F1B stage (its vjp's recomputation, the tp
psum of the cotangent) compute the same outgoing cotangent, row block by row block, proven
once on holes, for the frontier pipeline (examples/frontier.py's `pipeline_step`, MLP
stages) at test widths; its nearest wrong neighbours (a stage whose backward alone differs:
a custom vjp reading the wrong residual, the gate and up weights swapped, the cotangent
scaled) get no backward template. Every program is run on simulated CPU devices: the
correct ones match their reference, each neighbour does not (the one-ulp neighbour is below
the float noise of a sharded run and is checked on the template alone)."""

from __future__ import annotations

import os

if "--xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                               + " --xla_force_host_platform_device_count=8").strip()

from fractions import Fraction

import jax
import jax.numpy as jnp
import pytest
from jax import lax

from entangle_mlir.analysis.general import backward_templates as BT
from entangle_mlir.analysis.general import layer_templates as LT
from entangle_mlir.analysis.general.decide import Decider
from entangle_mlir.analysis.instance.abstraction import substitute
from entangle_mlir.core.terms import scale
from entangle_mlir.mlir.program import Program
from examples.heldout.corpus import input_sets, lower_pair, max_error
from examples.real.models import llama
from examples.real.models.layers import rms_norm, silu
from tests.analysis.test_general_layer_templates import (
    _program,
    _step,
    same_verdict_with_and_without_templates,
    stats_with_switch,
)


def _templates(program: Program) -> tuple[LT.TemplateProof, LT.TemplateProof]:
    forward = LT.prove_layer_template(program)
    assert forward.proven, forward.reason
    return forward, BT.prove_backward_template(program, forward.template)


@pytest.mark.parametrize("layers, pp, tp, dp", [(6, 2, 2, 1), (8, 2, 4, 1), (6, 2, 2, 2),
                                                (8, 4, 2, 1)])
def test_backward_template_is_proven(layers: int, pp: int, tp: int, dp: int) -> None:
    """Three and four layers a stage (and two: the stage's last layer hands its cotangent to
    the previous stage), tp 2 and 4, one and two dp rows a device: the backward's template
    equality holds (normal form); its forward input and its cotangent are cut into the
    stream's row blocks, its weights into the tp group's blocks as in the forward."""
    ex = _step(layers, pp, tp, dp)
    assert max_error(ex, input_sets(ex)[0]) <= 10 * ex.atol
    forward, backward = _templates(_program(ex))
    assert backward.proven, backward.reason
    template = backward.template
    stream = forward.template.tiling.index("stream")
    cotangent = template.linear
    assert template.tiling[cotangent] == template.tiling[stream] == "stream"
    weights = [cut for k, cut in enumerate(template.tiling) if k not in (stream, cotangent)]
    assert sorted(map(str, weights)) == sorted(
        str(cut) for k, cut in enumerate(forward.template.tiling) if k != stream)
    assert template.blocks == forward.template.blocks == 2 * dp


def test_backward_is_linear_in_its_cotangent() -> None:
    """The linearity a device's scaled cotangent rests on (`Applications.linear_at`): the
    stage's backward at 4 c is 4 times it at c (proven on the holes); its nearest wrong
    variant, 5 times, is not proven."""
    _, backward = _templates(_program(_step(6, 2, 2)))
    template = backward.template
    apps = LT.Applications(template)
    assert apps.linear_at(Fraction(4))
    hole = template.holes[template.linear]
    at_four = substitute(template.term, {hole.serial: scale(hole, Fraction(4))})
    wrong = Decider([template.term], 5_000).decide(scale(template.term, Fraction(5)), at_four,
                                                   "linear.wrong", ground=False)
    assert not wrong.proved


def custom_backward(bwd):
    """Llama's MLP block whose vjp is `bwd(block, p, x, g)` (jax.custom_vjp): the forward as
    the reference's, the backward written by hand."""
    def mlp(p: dict, x, par):
        def block(p, x):
            return llama.mlp_block(p, x, par)

        @jax.custom_vjp
        def f(p, x):
            return block(p, x)

        def fwd(p, x):
            return block(p, x), (p, x)

        def back(res, g):
            return bwd(block, *res, g)

        f.defvjp(fwd, back)
        return f(p, x)
    return mlp


def exact(block, p, x, g):
    return jax.vjp(block, p, x)[1](g)


def next_layers_residual(block, p, x, g):
    """The backward linearized at the next layer's input (x + block(x)), not at x."""
    return jax.vjp(block, p, x + block(p, x))[1](g)


def gate_and_up_swapped(block, p, x, g):
    """The backward reads w_up where w_gate belongs and w_gate where w_up does."""
    def swap(q):
        return {**q, "w_gate": q["w_up"], "w_up": q["w_gate"]}
    dp, dx = jax.vjp(lambda q, y: block(swap(q), y), p, x)[1](g)
    return swap(dp), dx


def cotangent_scaled(factor: float):
    def scaled(block, p, x, g):
        dp, dx = jax.vjp(block, p, x)[1](g)
        return dp, dx * jnp.float32(factor)
    return scaled


def test_hand_written_exact_backward_is_proven() -> None:
    """The positive control of the neighbours below: a custom vjp computing jax's own
    backward has a backward template."""
    ex = _step(6, 2, 2, stage_mlp=custom_backward(exact))
    assert max_error(ex, input_sets(ex)[0]) <= 10 * ex.atol
    _, backward = _templates(_program(ex))
    assert backward.proven, backward.reason


@pytest.mark.parametrize("bwd, differs", [
    (next_layers_residual, 1e-4), (gate_and_up_swapped, 1e-3),
    (cotangent_scaled(1.0625), 1e-5)], ids=["wrong_residual", "gate_up_swapped", "scaled"])
def test_changed_backward_gets_no_backward_template(bwd, differs: float) -> None:
    """Every stage layer's backward changed, its forward not: the numbers differ (the
    cotangent scaled by 1.0625 shows little through the Adam-like update, which is nearly
    scale-free: 2.8e-5 against the correct program's 6e-7) and the forward template is
    proven, the backward's is not."""
    ex = _step(6, 2, 2, stage_mlp=custom_backward(bwd))
    assert max_error(ex, input_sets(ex)[0]) > differs
    _, backward = _templates(_program(ex))
    assert not backward.proven
    assert backward.reason


def test_cotangent_one_ulp_off_gets_no_backward_template() -> None:
    """The cotangent scaled by 1 + 2^-23 (one ulp above 1) in every stage layer's backward:
    below the float noise of running the sharded program, so checked on the template only:
    not proven."""
    ex = _step(6, 2, 2, stage_mlp=custom_backward(cotangent_scaled(1 + 2**-23)))
    _, backward = _templates(_program(ex))
    assert not backward.proven


@jax.custom_vjp
def enter_tp_without_sum(h):
    """Megatron's `f` (identity, tp-replicated to tp-varying) whose backward takes tp rank
    0's part of the cotangent where the sum over tp belongs."""
    return lax.pcast(h, ("tp",), to="varying")


def _enter_fwd(h):
    return enter_tp_without_sum(h), None


def _enter_bwd(_, g):
    return (lax.psum(jnp.where(lax.axis_index("tp") == 0, g, 0.0), "tp"),)  # BUG


enter_tp_without_sum.defvjp(_enter_fwd, _enter_bwd)


def mlp_backward_without_tp_sum(p: dict, x, par):
    """Llama's MLP block whose backward misses the tp sum of its normed input's cotangent
    (the norm weight's gradient and the outgoing cotangent take one rank's part)."""
    h = enter_tp_without_sum(rms_norm(x, p["mlp_norm"]))
    return lax.psum((silu(h @ p["w_gate"]) * (h @ p["w_up"])) @ p["w_down"], "tp")


def test_backward_twin_verdict_does_not_come_from_the_templates() -> None:
    """A stage whose backward misses a tp sum (its forward the reference's): the numbers
    differ, the backward template is not proven, and the pipeline is not proven, with the
    reason, blamed op and diagnostics of the check with every layer expanded."""
    ex = _step(4, 2, 2, stage_mlp=mlp_backward_without_tp_sum)
    assert max_error(ex, input_sets(ex)[0]) > 1e-3
    note = same_verdict_with_and_without_templates(ex)
    assert "not_proven" in note and note["backward"] != "normal form", note


def test_leaf_rows_renaming_is_a_group_action() -> None:
    """`Symmetry.permute_rows` on a leaf of 3 micro-batches x 4 dp blocks: a dp rotation g
    makes block (k, i) of the renamed leaf block (k, i + g) of the leaf (what a device's
    block of a template leaf is to its representative's; its nearest wrong variants, the
    other blocks, are not), tp rotations keep it, and renaming by g then by h is renaming
    by g + h (`Symmetry._composed` relies on it)."""
    from entangle_mlir.analysis.general.symmetry import Symmetry
    from entangle_mlir.analysis.layer_reuse import fresh_hole
    from entangle_mlir.core.mesh import Mesh
    from entangle_mlir.core.normal_form import normal_form, slice_term

    sym = Symmetry(Mesh((("dp", 4), ("tp", 2))), ("dp", "tp"))
    leaf = fresh_hole((24, 5), "f32")
    sym.permute_rows(leaf, 0, 12, ("dp",))

    def block(b: int):
        return slice_term(leaf, 0, 2 * b, 2 * b + 2)

    memo: dict = {}
    for k in range(3):
        for i in range(4):
            for g in range(4):
                renamed = normal_form(sym.rename(block(4 * k + i), (g, 1)), memo)
                for other in range(12):
                    target = normal_form(block(other), memo)
                    assert (renamed is target) == (other == 4 * k + (i + g) % 4)
    for g in range(4):
        for h in range(4):
            for b in range(12):  # block by block: tensors are equal when every block is
                twice = sym.rename(sym.rename(block(b), (g, 0)), (h, 1))
                once = sym.rename(block(b), ((g + h) % 4, 1))
                assert normal_form(twice, memo) is normal_form(once, memo)


def test_devices_along_dp_stay_renamed_after_templated_layers(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """With the templates' leaves given to the renaming, the devices along dp are renamed
    after a templated layer as they are without templates: fewer computed than with the
    leaves kept whole, and still proven."""
    stats = stats_with_switch(lower_pair(_step(4, 2, 2, 2)), monkeypatch, "KEEP_RENAMING",
                              (True, False))
    assert stats[True]["computed"] < stats[False]["computed"]
