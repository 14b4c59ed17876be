"""Session 13's attacks on the general tier's layer template (on by default): a 1F1B
stage (examples/frontier.py's MLP pipeline at test widths) whose layers are every one the
template's ops, but which reads the wrong inputs: two layers' weights swapped, or one layer
reading the stream of the layer below the one it follows (a layer skipped). The template itself is proven (every layer has its ops), the
numbers differ from the reference's, and the check is not proven: a site stands for the
template applied to the inputs it reads, never to the ones the reference's layer reads."""

from __future__ import annotations

import os

if "--xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                               + " --xla_force_host_platform_device_count=8").strip()

from dataclasses import replace

import pytest

from entangle_mlir.analysis.general import layer_templates as LT
from entangle_mlir.driver import check_texts
from entangle_mlir.mlir.ir import parse_module
from entangle_mlir.mlir.program import from_two_modules
from examples import frontier as F
from examples import pipelines
from examples.heldout.corpus import input_sets, lower_pair, max_error


def weights_swapped(block, params, x):
    """The stage's layers 0 and 1 run with each other's weights."""
    per = params[0].shape[0]
    for i in [1, 0, *range(2, per)]:
        x = block(pipelines.layer(params, i), x)
    return x


def layer_skipped(block, params, x):
    """The stage's layer 2 reads layer 1's input, not its output."""
    below = x
    for i in range(params[0].shape[0]):
        below, x = x, block(pipelines.layer(params, i), below if i == 2 else x)
    return x


def _stage(layers_fn):
    cfg = replace(F.tiny(F.LLAMA_70B, 6), batch=2)
    ex = F.pipeline_step(cfg, 1, 2, 2, micro=2, attention=False)
    body = pipelines.train_fn(pipelines.onef1b_train, F.stage_block(cfg, "tp", False), True,
                              axes=("pp", "dp"), layers=layers_fn)
    return replace(ex, body=body, name=f"{ex.name}_{layers_fn.__name__}",
                   bug=layers_fn.__name__)


@pytest.mark.parametrize("layers_fn", [weights_swapped, layer_skipped],
                         ids=lambda f: f.__name__)
def test_stage_reading_other_inputs_is_not_proven_through_the_template(layers_fn) -> None:
    ex = _stage(layers_fn)
    assert max_error(ex, input_sets(ex)[0]) > 1e-4
    texts = lower_pair(ex)
    program = from_two_modules(parse_module(texts[0], "ref.mlir"),
                               parse_module(texts[1], "sh.mlir"), "ref.mlir", "sh.mlir")
    assert LT.prove_layer_template(program).proven
    report = check_texts(*texts, verify_rules=False, layer_templates=True)
    assert not report.proven and report.diagnostics
