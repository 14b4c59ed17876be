"""Whole-layer reuse on XLA's per-device form (issue 21); the grounded whole-model rows are
tests/examples/test_vocab_parallel_programs.py's `test_real_models_in_xla_form` (4 layers).

A layer input that is a reshape of a hole's argument (XLA reads a bias slice as (1, 1, d))
is walked as that view over the hole (`view_over` finds it, exactly), and a layer changed in
XLA's program (its GELU tanh turned into a logistic) is still found: the numbers differ and
the check, rechecked op by op, is not proven.
"""

from __future__ import annotations

import os

if "--xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
    ).strip()

from dataclasses import replace

from entangle_mlir.analysis.layer_reuse import apply_view, view_over
from entangle_mlir.core.terms import make_arg, make_reshape, make_transpose
from entangle_mlir.driver import check_texts

LAYERS = 4


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
