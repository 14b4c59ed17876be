"""The general tier's weight-gradient templates (`analysis/general/gradient_templates.py`):
each weight gradient of a layer's backward, in the reference (the whole batch) and in the
1F1B stage (one row block, its tp block), proven once on holes to sum over the row blocks
to the reference's, for the frontier pipeline (examples/frontier.py's `pipeline_step`, MLP
stages) at test widths; its nearest wrong neighbours (a stage whose weight gradients alone
differ: one scaled, gate's and up's swapped, the norm's taken at the wrong residual, one
ulp off) get no template for that gradient, and their checks' verdicts are those without
templates. Every program is run on simulated CPU devices: the correct ones match their
reference, each neighbour does not (the one-ulp one is below the float noise of a sharded
run and is checked on the templates alone)."""

from __future__ import annotations

import os

if "--xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                               + " --xla_force_host_platform_device_count=8").strip()

from fractions import Fraction

import jax
import jax.numpy as jnp
import pytest

from entangle_mlir.analysis.general import gradient_templates as GT
from entangle_mlir.analysis.general import layer_templates as LT
from entangle_mlir.analysis.general import tier
from entangle_mlir.analysis.general.decide import Decider
from entangle_mlir.analysis.instance.abstraction import substitute
from entangle_mlir.core.terms import scale
from entangle_mlir.driver import check_texts
from entangle_mlir.mlir.program import Program
from examples.heldout.corpus import input_sets, lower_pair, max_error
from tests.analysis.test_general_backward_templates import custom_backward, exact
from tests.analysis.test_general_layer_templates import (
    _program,
    _step,
    same_verdict_with_and_without_templates,
)


def _gradients(program: Program) -> tuple[LT.LayerTemplate, list[LT.LayerTemplate]]:
    forward = LT.prove_layer_template(program)
    assert forward.proven, forward.reason
    return forward.template, GT.prove_gradient_templates(program, forward.template)


def _weight_cuts(forward: LT.LayerTemplate) -> list[str]:
    return sorted(str(cut) for cut in forward.tiling if cut != "stream")


@pytest.mark.parametrize("layers, pp, tp, dp", [(6, 2, 2, 1), (8, 2, 4, 1), (6, 2, 2, 2),
                                                (8, 4, 2, 1)])
def test_every_weight_gradient_has_a_template(layers: int, pp: int, tp: int, dp: int) -> None:
    """Three and four layers a stage (and two), tp 2 and 4, one and two dp rows a device:
    each of the four MLP weights' gradients has a template, summed over the stream's row
    blocks, linear in the cotangent; a device's gradient is cut as its weight is (the
    column-parallel gate and up along dim 1, the row-parallel down along dim 0, the norm's
    whole, its jax-kept unit dim dropped by a reshape)."""
    ex = _step(layers, pp, tp, dp)
    assert max_error(ex, input_sets(ex)[0]) <= 10 * ex.atol
    forward, gradients = _gradients(_program(ex))
    assert sorted(str(t.output_cut) for t in gradients) == _weight_cuts(forward)
    for template in gradients:
        assert template.summed and template.blocks == forward.blocks == 2 * dp
        assert template.tiling[template.linear] == "stream"


def test_gradient_is_linear_in_its_cotangent() -> None:
    """What a device's scaled cotangent rests on (`Applications.linear_at`): each gradient
    at 4 c is 4 times it at c (proven on the holes); 5 times is not."""
    _, gradients = _gradients(_program(_step(6, 2, 2)))
    assert gradients
    for template in gradients:
        assert LT.Applications(template).linear_at(Fraction(4))
        hole = template.holes[template.linear]
        at_four = substitute(template.term, {hole.serial: scale(hole, Fraction(4))})
        assert not Decider([template.term], 5_000).decide(
            scale(template.term, Fraction(5)), at_four, "linear.wrong", ground=False).proved


def test_hand_written_backward_gets_every_gradient_template() -> None:
    """Another spelling of the same stage, the positive control of the neighbours below: a
    custom vjp computing jax's own backward (its residuals saved by hand, the forward run
    again by `jax.vjp` in the backward): every weight gradient has a template and the
    pipeline (its numbers matching) is proven through them."""
    ex = _step(4, 2, 2, stage_mlp=custom_backward(exact))
    assert max_error(ex, input_sets(ex)[0]) <= 10 * ex.atol
    forward, gradients = _gradients(_program(ex))
    assert sorted(str(t.output_cut) for t in gradients) == _weight_cuts(forward)
    report = check_texts(*lower_pair(ex), verify_rules=False, layer_templates=True)
    assert report.proven
    note = report.stats["general_tier"]["layer_template"]
    assert note["gradients"] == 4 and note["gradient_sites"][0] == 4 * 4, note


def _changed(dp: dict, **new) -> dict:
    return {**dp, **new}


def gradient_scaled(name: str, factor: float):
    """The backward with weight `name`'s gradient scaled by `factor`."""
    def bwd(block, p, x, g):
        dp, dx = jax.vjp(block, p, x)[1](g)
        return _changed(dp, **{name: dp[name] * jnp.float32(factor)}), dx  # BUG
    return bwd


def gate_and_up_gradients_swapped(block, p, x, g):
    """w_gate's gradient returned for w_up and w_up's for w_gate (both of one shape)."""
    dp, dx = jax.vjp(block, p, x)[1](g)
    return _changed(dp, w_gate=dp["w_up"], w_up=dp["w_gate"]), dx  # BUG


def norm_gradient_at_next_input(block, p, x, g):
    """The norm weight's gradient linearized at the next layer's input, the rest at x."""
    dp, dx = jax.vjp(block, p, x)[1](g)
    wrong, _ = jax.vjp(block, p, x + block(p, x))[1](g)
    return _changed(dp, mlp_norm=wrong["mlp_norm"]), dx  # BUG


NEIGHBOURS = [(gradient_scaled("w_down", 1.0625), 5e-5, ["(0, 2)"]),
              (gate_and_up_gradients_swapped, 1e-3, []),
              (norm_gradient_at_next_input, 1e-4, ["None"])]
"""(the backward, the least its numbers differ by, the gradients' cuts without a template).
The exact backward's differ by 3e-8; w_down's gradient scaled shows little through the
Adam-like update, which is scale-free but for its moments. Gate's and up's gradients
swapped keep both templates: the stage computes both functions, and a template is a
function's (which weight's accumulator it is added to is the decisions', and they do not
prove it)."""


@pytest.mark.parametrize("bwd, differs, lost", NEIGHBOURS,
                         ids=["down_scaled", "gate_up_swapped", "norm_at_next_input"])
def test_changed_gradient_gets_no_template(bwd, differs: float, lost: list[str]) -> None:
    """Every stage layer's weight gradients changed, its forward and outgoing cotangent not:
    the numbers differ, the changed gradients have no template (where nothing is lost, every
    gradient has one), and the pipeline is not proven, with the verdict, reason and
    diagnostics of the check with every layer expanded."""
    ex = _step(4, 2, 2, stage_mlp=custom_backward(bwd))
    assert max_error(ex, input_sets(ex)[0]) > differs
    forward, gradients = _gradients(_program(ex))
    kept = [str(t.output_cut) for t in gradients]
    weights = _weight_cuts(forward)
    for cut in lost:
        assert kept.count(cut) <= weights.count(cut) - lost.count(cut)
    if not lost:
        assert sorted(kept) == weights
    same_verdict_with_and_without_templates(ex)


def test_gradient_one_ulp_off_gets_no_template() -> None:
    """w_down's gradient scaled by 1 + 2^-23 (one ulp above 1) in every stage layer: below
    the float noise of running the sharded program, so checked on the templates only: that
    gradient has none."""
    ex = _step(6, 2, 2, stage_mlp=custom_backward(gradient_scaled("w_down", 1 + 2**-23)))
    forward, gradients = _gradients(_program(ex))
    expected = _weight_cuts(forward)
    expected.remove("(0, 2)")
    assert sorted(str(t.output_cut) for t in gradients) == expected


def test_pipeline_is_proven_through_the_gradient_templates(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The correct pipeline (its numbers match) is proven through the templates with every
    layer's weight gradients named by the templates' leaves, in the reference and on the
    devices, and is proven with the gradient templates off too."""
    ex = _step(6, 2, 2, 2)
    assert max_error(ex, input_sets(ex)[0]) <= 10 * ex.atol
    texts = lower_pair(ex)
    notes = {}
    for on in (True, False):
        monkeypatch.setattr(tier, "GRADIENT_TEMPLATES", on)
        report = check_texts(*texts, verify_rules=False, layer_templates=True)
        assert report.proven
        notes[on] = report.stats["general_tier"]["layer_template"]
        assert "not_proven" not in notes[on]
    assert notes[True]["gradients"] == 4
    reference_sites, device_sites = notes[True]["gradient_sites"]
    assert reference_sites == 4 * 6 and device_sites > 0
    assert "gradients" not in notes[False]
