"""Finding repeated layers (`entangle_mlir/analysis/layer_reuse.py`): runs, signatures,
preludes.

End-to-end checks with reuse (a 32-layer model proven, changed layers found and named, all
grounded by execution) are in tests/analysis/test_layer_reuse.py; these pin the structural part on
small hand-written stacks: what counts as the same layer and what does not.
"""

from __future__ import annotations

import pytest

from entangle_mlir.analysis import layer_reuse as layers
from entangle_mlir.core.terms import make_arg, make_iota, make_mul
from entangle_mlir.mlir.ir import context, parse_module


def _stack(count: int = 4, changed: int | None = None, constant: int | None = None,
           stacked: bool = False, stale: int | None = None) -> str:
    """x -> g(x, w_i, b) `count` times. Layer `changed` adds where the others multiply,
    layer `constant` scales by 3 instead of 2, layer `stale` reads the input of the layer
    before it; `stacked` slices every w_i out of one (count, 4) parameter."""
    if stacked:
        args = ["%x: tensor<4xf32>", f"%w: tensor<{count}x4xf32>", "%b: tensor<4xf32>"]
    else:
        args = ["%x: tensor<4xf32>"] + [f"%w{i}: tensor<4xf32>" for i in range(count)]
        args.append("%b: tensor<4xf32>")
    lines = [f"func.func @main({', '.join(args)}) -> tensor<4xf32> {{"]
    inputs = ["%x"]
    for i in range(count):
        x = inputs[-2] if i == stale else inputs[-1]
        if stacked:
            lines += [(f"  %s{i} = stablehlo.slice %w [{i}:{i + 1}, 0:4] : "
                       f"(tensor<{count}x4xf32>) -> tensor<1x4xf32>"),
                      f"  %w{i} = stablehlo.reshape %s{i} : (tensor<1x4xf32>) -> tensor<4xf32>"]
        op = "add" if i == changed else "multiply"
        factor = "3.0" if i == constant else "2.0"
        lines += [f"  %m{i} = stablehlo.{op} {x}, %w{i} : tensor<4xf32>",
                  f"  %a{i} = stablehlo.add %m{i}, %b : tensor<4xf32>",
                  f"  %t{i} = stablehlo.tanh %a{i} : tensor<4xf32>",
                  f"  %c{i} = stablehlo.constant dense<{factor}> : tensor<4xf32>",
                  f"  %d{i} = stablehlo.multiply %t{i}, %c{i} : tensor<4xf32>",
                  f"  %e{i} = stablehlo.subtract %d{i}, {x} : tensor<4xf32>",
                  f"  %f{i} = stablehlo.exponential %e{i} : tensor<4xf32>",
                  f"  %g{i} = stablehlo.add %f{i}, %t{i} : tensor<4xf32>"]
        inputs.append(f"%g{i}")
    lines += [f"  return {inputs[-1]} : tensor<4xf32>", "}"]
    return "\n".join(lines)


_MODULES: list = []
"""Parsed modules stay alive as long as the facts read from their blocks."""


def _facts(text: str) -> layers.OpFacts:
    module = parse_module(text)
    _MODULES.append(module)
    func = module.body.operations[0].operation
    return layers.read_ops(func.regions[0].blocks[0])


def _signatures(facts: layers.OpFacts, run: layers.Run) -> list:
    count = (run.end - run.start) // run.period
    return [facts.signature(run.start + k * run.period, run.period) for k in range(count)]


def test_a_stack_of_identical_layers_is_one_run_of_equal_layers() -> None:
    with context():
        facts = _facts(_stack())
        runs = layers.find_runs(facts)
        assert runs == [layers.Run(0, 32, 8)]
        signatures = _signatures(facts, runs[0])
        assert all(s == signatures[0] for s in signatures)
        assert not facts.prelude


@pytest.mark.parametrize("change", ["changed", "constant"])
def test_a_changed_layer_is_not_the_same_layer(change: str) -> None:
    """Another op, or the same op with another constant, in layer 2 of 4."""
    with context():
        facts = _facts(_stack(**{change: 2}))
        same = facts.signature(0, 8)
        assert facts.signature(8, 8) == same
        assert facts.signature(16, 8) != same
        assert all(run.start + 2 * run.period <= 16 or run.start >= 24
                   for run in layers.find_runs(facts))


def test_slices_of_a_stacked_parameter_are_inputs_not_layer_ops() -> None:
    """The slice offsets differ per layer; the slices and their reshapes stay outside the
    layers, whose inputs they are."""
    with context():
        facts = _facts(_stack(stacked=True))
        runs = layers.find_runs(facts)
        assert runs == [layers.Run(0, 40, 10)]
        assert facts.prelude == {0, 1, 10, 11, 20, 21, 30, 31}
        signatures = _signatures(facts, runs[0])
        assert all(s == signatures[0] for s in signatures)
        slices = [str(v.owner.operands[0].owner.attributes["start_indices"])
                  for v in (facts.external_inputs(10 * k, 10)[1] for k in range(4))]
        assert len(set(slices)) == 4


def test_a_layer_reading_an_older_input_reads_another_value() -> None:
    """The same function of its inputs, so an equal signature: what differs is the input
    itself, which the walker compares with the reference's (test_layer_reuse.py)."""
    with context():
        facts = _facts(_stack(stale=2))
        assert facts.signature(16, 8) == facts.signature(8, 8)
        older = facts.external_inputs(16, 8)[0]
        assert facts.position[older] == (7, 0)  # %g0, not %g1
        assert facts.position[facts.external_inputs(8, 8)[0]] == (7, 0)


def test_results_read_after_a_layer_are_its_outputs() -> None:
    with context():
        facts = _facts(_stack())
        outputs = facts.used_outside(8, 8)
        assert [facts.position[r] for r in outputs] == [(15, 0)]  # %g1 only


def test_a_template_term_without_holes_is_its_own_summary() -> None:
    hole = layers.fresh_hole((4,), "f32")
    holes = frozenset({hole.serial})
    mask = make_iota((4,), 0, "i32")
    argument = make_arg(0, (4,), "f32")
    assert layers.region_result((argument,), mask, holes, {}) is mask
    summarized = layers.region_result((argument,), make_mul(hole, hole), holes, {})
    assert summarized.op == "region_result" and summarized.args == (argument,)
