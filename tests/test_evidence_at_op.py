"""Evidence at the diverging op: the op the first diagnostic names is run on its own (sharded
per device, reassembled with the relation the check expected there) against its reference
counterpart, on a random input.

Grounded both ways: for the buggy twins of examples/catalog.py the values at the named op
differ; for correct programs the same machinery, applied to every op whose term the reference
computes, finds them equal (so a nonzero difference is the bug, not the reassembly).
"""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import examples.catalog  # noqa: F401 - sets XLA_FLAGS (8 CPU devices) before jax starts
from entangle_mlir.core.mesh import Mesh
from entangle_mlir.core.relations import Rel
from entangle_mlir.evidence import op_evidence, reassemble
from entangle_mlir.jax import assert_refines, check
from examples.catalog import EXAMPLES, by_name, make_mesh, reference_fn, sharded_fn
from tests.shared import EXAMPLES_MLIR, REPO


def _avals(ex) -> list[jax.ShapeDtypeStruct]:
    mesh = make_mesh(ex)
    return [jax.ShapeDtypeStruct(s, jnp.float32, sharding=NamedSharding(mesh, spec))
            for s, spec in zip(ex.arg_shapes, ex.in_specs, strict=True)]


def _check(ex):
    return check(reference_fn(ex), sharded_fn(ex), *_avals(ex), verify_rules=False)


# Every kind of bug of the catalogue whose diverging op has a reference counterpart, at two
# mesh sizes (all_gather_wrong_dim has none: tested below as a fallback).
AT_OP = [e.name for e in EXAMPLES if e.bug and e.bug != "all_gather_wrong_dim"
         and not e.name.endswith("_tp8")]


@pytest.mark.parametrize("name", AT_OP)
def test_values_differ_at_the_named_op(name: str) -> None:
    report = _check(by_name(name))
    assert not report.proven
    at_op = report.evidence["at_op"]
    assert at_op["available"], at_op["summary"]
    first = report.diagnostics[0]
    assert at_op["sharded_location"] == str(first.loc)
    assert at_op["max_abs_diff"] > 1e-3 * max(1.0, at_op["max_abs_reference"]), at_op
    assert at_op["seed"] == report.evidence["seed"] == 0
    text = report.render_text()
    assert f"evidence: on a random input (seed 0), at {at_op['sharded_op']} ({first.loc})" in text


def test_assert_refines_message_carries_the_op_evidence() -> None:
    ex = by_name("megatron_mlp_pmean_tp4")
    with pytest.raises(AssertionError) as caught:
        assert_refines(reference_fn(ex), sharded_fn(ex), *_avals(ex), verify_rules=False)
    message = str(caught.value)
    assert "evidence: on a random input (seed 0), at stablehlo.divide (" in message
    assert "differs from the reference's stablehlo.dot_general" in message


def test_wrong_dim_gather_falls_back_to_the_outputs() -> None:
    report = _check(by_name("seqpar_mlp_all_gather_wrong_dim_tp4"))
    at_op = report.evidence["at_op"]
    assert not at_op["available"] and at_op["reason"]
    assert "the outputs are compared instead" in at_op["summary"]
    assert report.evidence["max_abs_diff"][0] > 1e-3


def test_correct_program_claims_no_evidence() -> None:
    ex = by_name("megatron_mlp_tp4")
    report = _check(ex)
    assert report.proven and report.evidence == {} and report.focus is None
    assert "evidence" not in report.render_text()
    assert_refines(reference_fn(ex), sharded_fn(ex), *_avals(ex), verify_rules=False)


def _loop_ref(x, w):
    return lax.fori_loop(0, 3, lambda i, c: c + x @ w, jnp.ones((x.shape[0], w.shape[1])))


def _loop_body(x, w):   # the psum belongs inside the loop
    return lax.fori_loop(0, 3, lambda i, c: c + x @ w, jnp.ones((x.shape[0], w.shape[1])))


def test_op_inside_a_loop_body_falls_back_to_the_outputs() -> None:
    mesh = jax.make_mesh((4,), ("tp",))
    specs = (P(None, "tp"), P("tp", None))
    sharded = jax.jit(jax.shard_map(_loop_body, mesh=mesh, in_specs=specs, out_specs=P(),
                                    check_vma=False))
    avals = [jax.ShapeDtypeStruct(s, jnp.float32, sharding=NamedSharding(mesh, p))
             for s, p in zip(((8, 16), (16, 4)), specs)]
    report = check(_loop_ref, sharded, *avals, verify_rules=False)
    assert not report.proven
    at_op = report.evidence["at_op"]
    assert not at_op["available"]
    assert "stablehlo.while" in at_op["reason"], at_op
    assert report.evidence["max_abs_diff"][0] > 1e-3


# ----- the machinery itself, on correct programs -----------------------------------------------

def _walks(ref_text: str, sharded_text):
    from entangle_mlir.mlir.ir import context, parse_module
    from entangle_mlir.mlir.program import from_two_modules
    from entangle_mlir.passes import PASSES
    from entangle_mlir.passes.pipeline import PassState, parse_pipeline, run_pipeline

    program = from_two_modules(parse_module(ref_text), parse_module(sharded_text), "ref", "shd")
    state = PassState(program.sharded_module, "shd", program=program)
    names = "entangle-normalize,entangle-import-shardings,entangle-infer-relations{annotate=false}"
    with context():
        run_pipeline(parse_pipeline(names, PASSES), state)
    return program, state.walks["reference"], state.walks["sharded"]


def _lowered(name: str):
    """(reference, sharded) of a catalogue example (shard_map) or, prefixed `xla:`, of a case of
    examples/partitioned.py (XLA's per-device program)."""
    if name.startswith("xla:"):
        from tests.mlir.test_partitioned import lowered

        return lowered(name[4:])
    from examples.catalog import lower_pair

    return lower_pair(by_name(name))


@pytest.mark.parametrize("name", ["megatron_mlp_tp4", "seqpar_mlp_tp2", "layernorm_hidden_tp4",
                                  "gpt2_block_dp2_tp2", "xla:mlp_dp_tp", "xla:layernorm_hidden"])
def test_correct_program_agrees_at_every_op(name: str) -> None:
    """Every op of a correct program whose term the reference computes, reassembled with its
    relation, equals the reference op computing that term."""
    from entangle_mlir.analysis.refine import _focus, _Reference

    program, ref, sharded = _walks(*_lowered(name))
    reference = _Reference(ref)
    foci = []
    for record in sharded.records:
        value = next((v for v in record.outputs if isinstance(v, Rel)), None)
        if (value is None or value.is_global or value.term.op in ("splat", "dense", "iota")
                or value.term.serial not in reference.by_term or not value.term.shape):
            continue
        focus = _focus(record, reference, sharded.mesh, "")
        if not focus.unavailable and reference.by_term[value.term.serial] is focus.reference:
            foci.append(focus)
    assert len(foci) >= 4, f"only {len(foci)} ops to check"
    layouts = set()
    for focus in foci[::max(1, len(foci) // 10)]:    # about 10, spread over the program
        focus.modules = (program.ref_module, program.sharded_module)
        at_op = op_evidence(focus)
        assert at_op["available"], at_op["summary"]
        assert at_op["max_abs_diff"] <= 1e-4 * max(1.0, at_op["max_abs_reference"]), at_op
        layouts.add(at_op["relation"])
    assert len(layouts) >= 2, layouts


def test_reassemble_concat_and_partial_sum() -> None:
    mesh = Mesh((("dp", 2), ("tp", 2)))
    whole = np.arange(8.0).reshape(4, 2)
    from entangle_mlir.core.terms import make_arg

    term = make_arg(0, (4, 2), "f32")
    split = [whole[2 * mesh.coords(d)["dp"]:2 * mesh.coords(d)["dp"] + 2] for d in range(4)]
    assert np.array_equal(reassemble(split, Rel(term, (("dp",), ())), mesh), whole)
    partial = [block / 2 for block in split]
    rel = Rel(term, (("dp",), ()), partial=("tp",), kind="sum")
    assert np.array_equal(reassemble(partial, rel, mesh), whole)


# Mutations of XLA's partitioned programs (tests/mlir/test_partitioned.py) with an op-level run.
XLA_AT_OP = ["dropped_all_reduce", "dropped_all_reduce_mlp", "max_reducer",
             "max_reducer_layernorm", "wrong_replica_groups"]


@pytest.mark.parametrize("name", XLA_AT_OP)
def test_values_differ_at_the_mutated_op_of_a_partitioned_program(name: str) -> None:
    from entangle_mlir.driver import check_texts
    from tests.mlir.test_partitioned import BY_MUTATION, lowered, mutated_program

    text, what = mutated_program(name)
    report = check_texts(lowered(BY_MUTATION[name].case)[0], text, verify_rules=False)
    at_op = op_evidence(report.focus)
    assert at_op["available"], at_op["summary"]
    assert at_op["sharded_location"] == str(report.diagnostics[0].loc)
    assert at_op["max_abs_diff"] > 1e-3 * max(1.0, at_op["max_abs_reference"]), (what, at_op)


def test_rounded_reciprocal_is_proven_without_evidence() -> None:
    """attention_div_sqrt used to be the correct program that could not be proven, where
    evidence had to show agreement. XLA folds `sqrt(8.0)` into the float32 constant 2.82842708
    and still divides by it: the exact float32 value of the reference's `sqrt(8.0)` (IEEE's
    correctly rounded square root), so the proof is exact, assumes no rounding of constants,
    and claims no evidence."""
    from entangle_mlir.driver import check_texts
    from tests.mlir.test_partitioned import lowered

    report = check_texts(*lowered("attention_div_sqrt"), verify_rules=False)
    assert report.proven, report.render_text()
    assert not any("constant rounding" in note for note in report.notes), report.notes
    assert report.focus is None


# ----- `entangle check --evidence` on MLIR files ------------------------------------------------

DIAGNOSTICS = REPO / "lit_tests" / "diagnostics"


@pytest.mark.parametrize("reason", ["missing_reduction", "scale", "wrong_axis",
                                    "duplicate_reduction", "partial_mixed"])
def test_cli_evidence_on_mlir_files(reason: str, capsys) -> None:
    from entangle_mlir import cli
    from tests.test_json_schema import assert_valid

    path = str(DIAGNOSTICS / f"{reason}.mlir")
    capsys.readouterr()
    code = cli.main(["check", path, "--json", "--no-verify-rules", "--evidence"])
    document = json.loads(capsys.readouterr().out)
    assert code == 1
    assert_valid(document)
    at_op = document["evidence"]["at_op"]
    assert at_op["available"], at_op["summary"]
    assert at_op["sharded_location"].startswith(path)
    assert at_op["max_abs_diff"] > 1e-3 * max(1.0, at_op["max_abs_reference"]), at_op


def test_cli_evidence_is_not_claimed_for_a_proven_pair(capsys) -> None:
    from entangle_mlir import cli

    mlir = EXAMPLES_MLIR
    capsys.readouterr()
    code = cli.main(["check", str(mlir / "megatron_mlp_tp4.ref.mlir"),
                     str(mlir / "megatron_mlp_tp4.sharded.mlir"), "--no-verify-rules",
                     "--evidence"])
    out = capsys.readouterr().out
    assert code == 0 and "evidence" not in out


def test_ring_order_mismatch_compares_the_outputs_only() -> None:
    """Ring attention's permuted K/V blocks differ from the reference's K by design, in the
    correct program too: a wrong ring direction is shown by the outputs, not at the permute
    (under `--assume-no-overflow`: by default the online softmax's fold is refused first)."""
    from examples.real.catalog import _avals as real_avals
    from examples.real.catalog import by_name as real_by_name
    from examples.real.catalog import reference_fn as real_reference
    from examples.real.catalog import sharded_fn as real_sharded

    ex = real_by_name("llama3_stack_ring_ring_wrong_direction_cp4")
    report = check(real_reference(ex), real_sharded(ex), *real_avals(ex, True),
                   verify_rules=False, assume_no_overflow=True)
    assert not report.proven
    assert "blocks assembled in different orders" in report.diagnostics[0].message
    at_op = report.evidence["at_op"]
    assert not at_op["available"] and "by design (a ring)" in at_op["reason"], at_op
    assert max(report.evidence["max_abs_diff"]) > 1e-3, report.evidence
