"""Evidence compares values relative to their scale (issue 20): a correct program whose values
reach 1e11 and whose float32 sums were reordered does not "differ" (the old absolute threshold
said it differed by about 1e4); a wrong program whose values are near 1e-11 does (the old
threshold said it agreed, and the claim's confirmation withdrew it). Grounded: both programs
run on simulated CPU devices, from the Python API and from MLIR files through `entangle check
--evidence`, where the outputs are compared by running the whole programs
(`evidence.program_evidence`).
"""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import examples.catalog  # noqa: F401 - sets XLA_FLAGS (8 CPU devices) before jax starts
from entangle_mlir import cli
from entangle_mlir.evidence import (
    MAX_RTOL,
    TOLERANCE_FACTOR,
    compare_values,
    program_evidence,
    sum_precision,
    tolerance,
)
from entangle_mlir.jax import check, lower_pair
from entangle_mlir.mlir.ir import parse_module
from entangle_mlir.mlir.program import from_two_modules
from examples.catalog import EXAMPLES, by_name
from examples.catalog import lower_pair as lower_example

F32_EPS = 2.0 ** -23
OLD_ABSOLUTE = 1e-5    # the outputs' threshold before (max |sharded - reference| > 1e-5)


# ----- the comparison itself ------------------------------------------------------------------

def test_tolerance_per_dtype() -> None:
    assert tolerance(np.int32, 1.0) == 0.0 and tolerance(np.bool_, 1.0) == 0.0
    assert tolerance(np.float32, 0.0) == TOLERANCE_FACTOR * F32_EPS
    assert tolerance(np.float32, 64 * F32_EPS) == TOLERANCE_FACTOR * 64 * F32_EPS
    assert tolerance(np.float64, 0.0) == TOLERANCE_FACTOR * 2.0 ** -52
    assert tolerance(np.float16, 1e9) == MAX_RTOL


def test_compare_is_relative_to_the_scale() -> None:
    rng = np.random.default_rng(0)
    rtol = tolerance(np.float32, 64 * F32_EPS)
    big = rng.standard_normal((8, 8)) * 1e11
    close = big * (1 + 1e-6 * rng.standard_normal((8, 8)))    # reordered sums, near 1e11
    result = compare_values(big, close, rtol)
    assert not result["differs"] and result["max_abs_diff"] > 1e4, result
    small = rng.standard_normal((8, 8)) * 1e-7
    result = compare_values(small, small / 4, rtol)           # a pmean for a psum, near 1e-7
    assert result["differs"] and result["max_abs_diff"] < OLD_ABSOLUTE, result
    # A value that cancels to about zero keeps the rounding of the scale of its tensor.
    cancels = np.array([1e6, 1e-3])
    assert not compare_values(cancels, cancels + [0.5, 0.5], rtol)["differs"]
    assert compare_values(cancels, cancels + [0.0, 1e3], rtol)["differs"]
    # Integers are exact; the same inf or NaN on both sides is no difference.
    assert compare_values(np.array([3, 4]), np.array([3, 5]), 0.0)["differs"]
    same = np.array([np.inf, np.nan, 1.0])
    assert not compare_values(same, same.copy(), rtol)["differs"]
    assert compare_values(np.ones(3), np.ones(4), rtol)["differs"]


def test_sum_precision_reads_the_longest_sum() -> None:
    text = """
    func.func @main(%x: tensor<8x64xf32>, %w: tensor<64x4xf32>, %h: tensor<8x32xbf16>) -> (tensor<8x4xf32>, tensor<8xbf16>) {
      %0 = stablehlo.dot_general %x, %w, contracting_dims = [1] x [0] : (tensor<8x64xf32>, tensor<64x4xf32>) -> tensor<8x4xf32>
      %z = stablehlo.constant dense<0.0> : tensor<bf16>
      %1 = stablehlo.reduce(%h init: %z) applies stablehlo.add across dimensions = [1] : (tensor<8x32xbf16>, tensor<bf16>) -> tensor<8xbf16>
      return %0, %1 : tensor<8x4xf32>, tensor<8xbf16>
    }
    """
    assert sum_precision(parse_module(text)) == max(64 * F32_EPS, 32 * 2.0 ** -7)
    assert sum_precision(parse_module(text.replace("xbf16", "xf32").replace("<bf16>",
                                                                            "<f32>"))) == (
        64 * F32_EPS)


# ----- grounded: a correct program at 1e11, a wrong one at 1e-11 -------------------------------

MESH = jax.make_mesh((4,), ("tp",))
SPECS = (P(None, "tp"), P("tp", None))
AVALS = [jax.ShapeDtypeStruct(s, jnp.float32, sharding=NamedSharding(MESH, p))
         for s, p in zip(((8, 64), (64, 8)), SPECS)]


def _big_ref(x, w):
    # An FFT has no rule (in either tier): inconclusive.
    return jnp.fft.fft((x * 1e5) @ (w * 1e5)).real


def _big_body(x, w):
    return jnp.fft.fft(jax.lax.psum((x * 1e5) @ (w * 1e5), "tp")).real


def _small_ref(x, w):
    return (x * 1e-6) @ (w * 1e-6)


def _small_body(x, w):
    return jax.lax.pmean((x * 1e-6) @ (w * 1e-6), "tp")   # BUG: psum was needed


def _sharded(body):
    return jax.jit(jax.shard_map(body, mesh=MESH, in_specs=SPECS, out_specs=P()))


def _run(ref, body):
    x = np.random.default_rng(0).standard_normal((8, 64)).astype(np.float32)
    w = np.random.default_rng(1).standard_normal((64, 8)).astype(np.float32)
    placed = [jax.device_put(v, a.sharding) for v, a in zip((x, w), AVALS)]
    return np.asarray(jax.jit(ref)(x, w), np.float64), np.asarray(_sharded(body)(*placed),
                                                                    np.float64)


def test_grounding() -> None:
    want, got = _run(_big_ref, _big_body)
    assert np.abs(want).max() > 1e11 and OLD_ABSOLUTE < np.abs(want - got).max()
    assert np.allclose(want, got, rtol=1e-5)                   # correct, up to reordering
    want, got = _run(_small_ref, _small_body)
    assert np.abs(want).max() < 1e-10 and np.abs(want - got).max() < 1e-6
    assert np.allclose(got, want / 4, rtol=1e-5)               # wrong: a quarter


def test_large_correct_program_does_not_differ_in_the_python_api() -> None:
    report = check(_big_ref, _sharded(_big_body), *AVALS, verify_rules=False)
    assert report.outcome == "inconclusive" and report.exit_code == 3, report.render_text()
    evidence = report.evidence
    assert evidence["differs"] == [False], evidence
    assert evidence["max_abs_diff"][0] > OLD_ABSOLUTE and evidence["max_abs_reference"][0] > 1e11
    assert "the outputs agree to" in evidence["summary"]
    assert "differ by" not in report.render_text()


def test_small_wrong_program_differs_in_the_python_api() -> None:
    report = check(_small_ref, _sharded(_small_body), *AVALS, verify_rules=False)
    assert report.outcome == "bug", report.render_text()
    # Confirming the claim by running both programs is relative to the scale too (values near
    # 1e-11: under the old absolute floor of 1e-6 the claim was withdrawn as "agrees").
    assert report.evidence["confirmation"]["confirmed"], report.evidence["confirmation"]
    assert report.diagnostics[0].category == "scale"
    assert any("confirmed by running both programs" in n.message
               for n in report.diagnostics[0].notes)
    evidence = report.evidence
    assert evidence["differs"] == [True] and evidence["max_abs_diff"][0] < OLD_ABSOLUTE, evidence
    assert "the outputs differ by up to" in evidence["summary"]
    at_op = evidence["at_op"]
    assert at_op["available"] and at_op["differs"], at_op
    assert at_op["max_abs_diff"] < OLD_ABSOLUTE and "differs from the reference's" in (
        at_op["summary"])


@pytest.mark.parametrize("case", ["big", "small"])
def test_cli_evidence_compares_the_outputs(case: str, tmp_path, capsys) -> None:
    """`entangle check --evidence` on the lowered files runs both whole programs and prints
    the comparison, also where no op-level run is possible."""
    ref, body = (_big_ref, _big_body) if case == "big" else (_small_ref, _small_body)
    ref_text, sharded_text = lower_pair(ref, _sharded(body), *AVALS)
    (tmp_path / "ref.mlir").write_text(ref_text)
    (tmp_path / "sharded.mlir").write_text(sharded_text)
    argv = ["check", str(tmp_path / "ref.mlir"), str(tmp_path / "sharded.mlir"),
            "--no-verify-rules", "--evidence"]
    capsys.readouterr()
    code = cli.main(argv)
    text = capsys.readouterr().out
    code_json = cli.main([*argv, "--json"])
    document = json.loads(capsys.readouterr().out)
    evidence = document["evidence"]
    assert evidence["seed"] == 0 and evidence["summary"] in text
    if case == "big":
        assert code == code_json == 3
        assert evidence["differs"] == [False] and evidence["max_abs_diff"][0] > OLD_ABSOLUTE
        assert "evidence: on a random input (seed 0) the outputs agree to" in text
        assert "the outputs are compared instead" in text     # no op diverges: outputs shown
    else:
        assert code == code_json == 1
        assert evidence["differs"] == [True] and evidence["max_abs_diff"][0] < OLD_ABSOLUTE
        assert "evidence: on a random input (seed 0) the outputs differ by up to" in text


# ----- the whole programs from MLIR, against execution ------------------------------------------

def _program(ref_text: str, sharded_text: str):
    return from_two_modules(parse_module(ref_text), parse_module(sharded_text), "ref", "shd")


@pytest.mark.parametrize("name", ["megatron_mlp_tp4", "gpt2_block_dp2_tp2",
                                  "megatron_mlp_missing_psum_tp4", "megatron_mlp_pmean_tp4",
                                  "seqpar_mlp_all_gather_wrong_dim_tp4"])
def test_program_evidence_of_shard_maps(name: str) -> None:
    ex = by_name(name)
    evidence = program_evidence(_program(*lower_example(ex)))
    assert evidence["differs"] == [ex.bug is not None] * len(evidence["differs"]), evidence
    assert "seed" in evidence, evidence


@pytest.mark.parametrize("name,bug", [("mlp_dp_tp", False), ("layernorm_hidden", False),
                                      ("dropped_all_reduce", True), ("max_reducer", True)])
def test_program_evidence_of_partitioned_programs(name: str, bug: bool) -> None:
    from tests.mlir.test_partitioned import BY_MUTATION, lowered, mutated_program

    if bug:
        text, _ = mutated_program(name)
        ref_text = lowered(BY_MUTATION[name].case)[0]
    else:
        ref_text, text = lowered(name)
    evidence = program_evidence(_program(ref_text, text))
    assert evidence.get("differs") and any(evidence["differs"]) == bug, evidence


def test_every_catalogue_bug_differs_at_the_outputs() -> None:
    """No buggy twin of the catalogue agrees at its outputs on the random input."""
    for ex in [e for e in EXAMPLES if e.bug and e.name.endswith("_tp4")]:
        evidence = program_evidence(_program(*lower_example(ex)))
        assert any(evidence["differs"]), (ex.name, evidence)
