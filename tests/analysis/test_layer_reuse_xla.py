"""Whole-layer reuse on XLA's per-device form (issue 21).

examples/real's GPT-2 jitted with Megatron's shardings and partitioned by XLA: each layer's
148-ish ops repeat a short run inside them (found first before periods were ranked by ops
equal one period on), the layer's bias slices are read through reshapes to (1, 1, d) where
the reference reads the slices, and the residual stream reaches the second layer equal to
the reference's only under the valid-index assumption and constant rounding at once. The
sharded walk follows the reference's summary: grounded on simulated devices; a lookup that
adds a row twice computes other numbers and is not proven.
"""

from __future__ import annotations

import os

if "--xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
    ).strip()

from dataclasses import replace

import jax
import numpy as np
import pytest
from jax import lax
from jax import numpy as jnp

from entangle_mlir.analysis.layer_reuse import apply_view, view_over
from entangle_mlir.core.terms import make_arg, make_reshape, make_transpose
from entangle_mlir.driver import check_texts

LAYERS = 4


def _lookup_mask_le_n(ids, w):
    """The Megatron lookup with an inclusive upper bound: the next block's first id also reads
    this block's last row, so two devices add a row for it."""
    n = w.shape[0]
    local = ids - lax.axis_index("tp") * n
    mask = (local >= 0) & (local <= n)
    rows = jnp.take(w, jnp.clip(local, 0, n - 1), axis=0)
    return lax.psum(jnp.where(mask[..., None], rows, 0.0), "tp")


@pytest.mark.parametrize("wrong", [False, True], ids=["megatron_lookup", "mask_le_n"])
def test_xla_form_follows_the_reference_summary(wrong: bool) -> None:
    from examples.real.catalog import _avals, _compiled, random_inputs
    from examples.real.models.config import GPT2
    from examples.real.xla_form import lower_xla_pair, megatron_lookup, xla_form

    cfg = replace(GPT2, n_layers=LAYERS, batch=1)
    form = xla_form("gpt2", cfg, 0, 2, _lookup_mask_le_n if wrong else megatron_lookup)
    inputs = random_inputs(form.example)
    n = cfg.vocab // 2
    inputs[-1] = np.resize(np.array([0, n - 1, n, 2 * n - 1], np.int32), inputs[-1].shape)
    want = _compiled(jax.jit(form.example.reference), tuple(_avals(form.example, False)))(
        *inputs)
    got = form.run(inputs)
    assert np.allclose(got[0], np.asarray(want), atol=1e-4) is not wrong
    report = check_texts(*lower_xla_pair(form))
    assert report.proven is not wrong, report.render_text()
    if not wrong:
        reused = report.stats.get("layers reused", "")
        assert "0 sharded" not in reused and "sharded" in reused, report.stats
        assert any("valid indices" in note and "summarized layer" in note
                   for note in report.notes), report.notes


def test_view_over_a_hole_argument() -> None:
    """A view found over an argument rebuilds the term exactly; another argument of the same
    base, or a transposed term, is not that view of it."""
    base = make_arg(0, (2, 6), "f32")
    other = make_arg(1, (2, 6), "f32")
    term = make_reshape(base, (1, 2, 6))
    view = view_over(term, base)
    assert view is not None and apply_view(base, view) is term
    assert apply_view(other, view) is not term
    assert view_over(term, other) is None
    flipped = make_transpose(make_reshape(base, (2, 3, 2)), (2, 1, 0))
    view = view_over(flipped, base)
    assert view is not None and apply_view(base, view) is flipped
    assert view_over(make_transpose(base, (1, 0)), make_reshape(base, (6, 2))) is None


def test_a_changed_layer_of_the_xla_form_is_found() -> None:
    """The third layer's GELU tanh turned into a logistic in XLA's per-device program: the
    programs compute other numbers (both run on simulated devices) and the check is not
    proven (rechecked op by op, `layer_reuse.recheck_op_by_op`)."""
    from entangle_mlir.evidence import compare_programs
    from entangle_mlir.mlir.ir import context, parse_module
    from entangle_mlir.mlir.program import from_two_modules
    from examples.real.models.config import GPT2
    from examples.real.xla_form import lower_xla_pair, megatron_lookup, xla_form

    cfg = replace(GPT2, n_layers=LAYERS, batch=1)
    form = xla_form("gpt2", cfg, 0, 2, megatron_lookup)
    ref_text, per_device = lower_xla_pair(form)
    with context():
        text = str(parse_module(per_device, "sharded.mlir"))
    parts = text.split("stablehlo.tanh")
    assert len(parts) == LAYERS + 1
    changed = "stablehlo.tanh".join(parts[:3]) + "stablehlo.logistic" + \
        "stablehlo.tanh".join(parts[3:])
    with context():
        program = from_two_modules(parse_module(ref_text, "reference.mlir"),
                                   parse_module(changed, "sharded.mlir"),
                                   "reference.mlir", "sharded.mlir")
        ids = len(form.example.args) - 1
        comparisons = compare_programs(program, index_ranges={ids: cfg.vocab})
    assert any(c.differs for c in comparisons)
    report = check_texts(ref_text, changed)
    assert not report.proven
    assert "layers reused" not in report.stats  # the verdict of the op-by-op recheck
