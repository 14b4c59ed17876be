"""`entangle check` / `entangle demo` on the bundled examples and small hand-written programs.

The CLI runs in-process (`entangle_mlir.cli.main`) for speed; one subprocess test checks the
console script and that checking a pair never imports jax.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.shared import (
    COMBINED_ADD,
    COMBINED_MISSING_PSUM,
    REF_ADD,
    REPO,
    bundled_pairs,
    is_buggy,
    sharded,
)

PAIRS = bundled_pairs()
CORRECT = [p for p in PAIRS if not is_buggy(p[0])]
BUGGY = [p for p in PAIRS if is_buggy(p[0])]
DIAG = re.compile(r"^(?P<file>[^\s:]+):(?P<line>\d+):(?P<col>\d+): error: (?P<msg>.+)$", re.MULTILINE)
MODELS = (REPO / "examples" / "models.py").read_text().splitlines()


def test_bundled_set_is_complete() -> None:
    """Every example at tp=4 (correct and buggy) plus the dp2 x tp4 GPT-2 block and its bug."""
    names = {name for name, _, _ in PAIRS}
    assert {"megatron_mlp_tp4", "attention_tp4", "layernorm_hidden_tp4", "rmsnorm_hidden_tp4",
            "layernorm_seq_tp4", "rmsnorm_seq_tp4", "seqpar_mlp_tp4", "row_linear_gelu_tp4",
            "gpt2_block_dp2_tp4", "gpt2_block_psum_wrong_axis_dp2_tp4"} <= names
    assert {n for n in names if is_buggy(n)} >= {
        "megatron_mlp_missing_psum_tp4", "megatron_mlp_pmean_tp4",
        "megatron_mlp_bias_before_psum_tp4", "row_linear_gelu_gelu_before_psum_tp4",
        "seqpar_mlp_all_gather_wrong_dim_tp4", "layernorm_hidden_local_stats_tp4"}
    for _, ref, shd in PAIRS:
        assert shd.exists(), f"{ref.name} has no sharded twin"
        for path in (ref, shd):
            text = path.read_text()
            assert str(REPO) not in text and 'loc("/' not in text, (
                f"{path.name}: absolute path in locations; run python -m examples.generate")


@pytest.mark.parametrize("name,ref,shd", CORRECT, ids=[p[0] for p in CORRECT])
def test_correct_pair_is_proven(entangle, name, ref, shd) -> None:
    run = entangle("check", ref, shd, "--no-verify-rules")
    assert run.code == 0, run.text
    assert "verified" in run.out
    assert re.search(r"^\s*result#0 = \S", run.out, re.MULTILINE), run.out
    assert "not proven" not in run.text and "error:" not in run.text


@pytest.mark.parametrize("name,ref,shd", BUGGY, ids=[p[0] for p in BUGGY])
def test_buggy_pair_is_flagged_at_the_bug_line(entangle, name, ref, shd) -> None:
    run = entangle("check", ref, shd, "--no-verify-rules")
    assert run.code == 1, run.text
    assert "verified" not in run.text
    assert "not proven" in run.out
    first = DIAG.search(run.out)
    assert first, f"no file:line:col: error: diagnostic in\n{run.out}"
    # Locations in the bundled files are relative to the repository root.
    assert first["file"] == "examples/models.py", first.group(0)
    assert MODELS[int(first["line"]) - 1].rstrip().endswith("# BUG"), first.group(0)


def test_wrong_axis_names_the_axis(entangle) -> None:
    name = "gpt2_block_psum_wrong_axis_dp2_tp4"
    run = entangle("check", *_paths(name), "--no-verify-rules")
    assert run.code == 1
    assert "'dp'" in DIAG.search(run.out)["msg"]


def test_missing_psum_says_what_is_missing(entangle) -> None:
    run = entangle("check", *_paths("megatron_mlp_missing_psum_tp4"), "--no-verify-rules")
    assert run.code == 1
    assert "partial sum over 'tp'" in run.out and "all_reduce/psum" in run.out


@pytest.mark.parametrize("name,code", [("megatron_mlp_tp4", 0),
                                       ("megatron_mlp_missing_psum_tp4", 1)])
def test_default_mode_runs_z3_rule_checks(entangle, name, code) -> None:
    run = entangle("check", *_paths(name))
    assert run.code == code, run.text
    assert "rule checks:" in run.out and "skipped (--no-verify-rules)" not in run.out
    assert "Traceback" not in run.text


def test_no_verify_rules_reports_the_mode(entangle) -> None:
    run = entangle("check", *_paths("megatron_mlp_tp4"), "--no-verify-rules")
    assert run.code == 0
    assert "rule checks: skipped (--no-verify-rules)" in run.out
    doc = json.loads(entangle("check", *_paths("megatron_mlp_tp4"), "--no-verify-rules",
                              "--json").out)
    assert "skipped" in doc["rule_check_mode"]


def test_json_correct(entangle) -> None:
    run = entangle("check", *_paths("seqpar_mlp_tp4"), "--no-verify-rules", "--json")
    assert run.code == 0
    doc = json.loads(run.out)
    assert doc["verdict"] == "proven" and doc["exit_code"] == 0
    assert doc["mesh"] == "tp=4"
    assert [o["index"] for o in doc["outputs"]] == [0]
    assert doc["outputs"][0]["proven"] is True
    assert doc["outputs"][0]["rho"] == "concat over 'tp' along dim 1"
    assert doc["diagnostics"] == []


def test_json_buggy(entangle) -> None:
    run = entangle("check", *_paths("megatron_mlp_missing_psum_tp4"), "--no-verify-rules",
                   "--json")
    assert run.code == 1
    doc = json.loads(run.out)
    assert doc["verdict"] == "not proven" and doc["exit_code"] == 1
    assert doc["outputs"][0]["proven"] is False
    diag = doc["diagnostics"][0]
    assert diag["severity"] == "error" and "partial sum" in diag["message"]
    loc = diag["location"]
    assert loc["file"] == "examples/models.py"
    assert MODELS[loc["line"] - 1].rstrip().endswith("# BUG")
    assert loc["col"] > 0


def test_combined_file_given_twice(entangle, write) -> None:
    path = write("combined.mlir", COMBINED_ADD)
    run = entangle("check", path, path, "--no-verify-rules")
    assert run.code == 0, run.text
    assert "result#0 = concat over 'tp' along dim 0" in run.out


def test_combined_file_buggy(entangle, write) -> None:
    path = write("combined.mlir", COMBINED_MISSING_PSUM)
    run = entangle("check", path, path, "--no-verify-rules")
    assert run.code == 1, run.text
    # The partial sum starts at the dot_general (line 9, column 12).
    assert f"{path}:9:12: error: value is still a partial sum over 'tp'" in run.out
    assert "not proven" in run.out and "missing all_reduce/psum" in run.out


def test_combined_file_single_argument(entangle, write) -> None:
    path = write("combined.mlir", COMBINED_ADD)
    run = entangle("check", path, "--no-verify-rules")
    assert run.code == 0, run.text
    assert "result#0 = concat over 'tp' along dim 0" in run.out


def test_combined_file_same_file_two_spellings(entangle, write, monkeypatch) -> None:
    path = Path(write("combined.mlir", COMBINED_ADD))
    monkeypatch.chdir(path.parent)
    run = entangle("check", "./combined.mlir", "combined.mlir", "--no-verify-rules")
    assert run.code == 0, run.text


SORT_BODY = """\
      %s = "stablehlo.sort"(%a) ({
      ^bb0(%x: tensor<f32>, %y: tensor<f32>):
        %c = stablehlo.compare GT, %x, %y : (tensor<f32>, tensor<f32>) -> tensor<i1>
        stablehlo.return %c : tensor<i1>
      }) {dimension = 1 : i64, is_stable = true} : (tensor<2x4xf32>) -> tensor<2x4xf32>
      %1 = stablehlo.add %s, %b : tensor<2x4xf32>"""

FFT_BODY = """\
      %c = stablehlo.convert %a : (tensor<2x4xf32>) -> tensor<2x4xcomplex<f32>>
      %f = stablehlo.fft %c, type = FFT, length = [4] : (tensor<2x4xcomplex<f32>>) -> tensor<2x4xcomplex<f32>>
      %r = stablehlo.real %f : (tensor<2x4xcomplex<f32>>) -> tensor<2x4xf32>
      %1 = stablehlo.add %r, %b : tensor<2x4xf32>"""


@pytest.mark.parametrize("message,body,line", [
    ("not a supported sort: ", SORT_BODY, 5),   # descending: a comparator without a rule
    ("unsupported op stablehlo.fft", FFT_BODY, 6)])
def test_unsupported_op_is_not_proven_at_its_location(entangle, write, message, body,
                                                      line) -> None:
    ref = write("ref.mlir", REF_ADD)
    shd = write("sharded.mlir", sharded(body))
    run = entangle("check", ref, shd, "--no-verify-rules")
    assert run.code == 3, run.text          # inconclusive: the program is not claimed wrong
    assert f"{shd}:{line}:12: error: {message}" in run.out
    assert f"not proven: {message}" in run.out
    assert "inconclusive: the check could not decide" in run.out
    assert "Traceback" not in run.text and "verified" not in run.text
    doc = json.loads(entangle("check", ref, shd, "--no-verify-rules", "--json").out)
    assert (doc["verdict"], doc["outcome"], doc["exit_code"]) == ("not proven", "inconclusive", 3)


def test_bug_and_unsupported_result_claims_the_bug(entangle, write) -> None:
    """One result goes through an op without a rule, the other misses its psum: the bug is
    claimed (exit 1), whichever diagnostic comes first."""
    ref = write("ref.mlir", _TWO_RESULTS_REF)
    shd = write("sharded.mlir", _TWO_RESULTS_SHARDED)
    run = entangle("check", ref, shd, "--no-verify-rules")
    assert run.code == 1, run.text
    assert "unsupported op stablehlo.popcnt" in run.out
    assert "partial sum over 'tp'" in run.out
    assert "inconclusive:" not in run.out
    doc = json.loads(entangle("check", ref, shd, "--no-verify-rules", "--json").out)
    assert sorted(d["reason"] for d in doc["diagnostics"]) == ["missing_reduction",
                                                                "unsupported"]
    assert (doc["outcome"], doc["exit_code"]) == ("bug", 1)


_TWO_RESULTS_REF = """\
func.func @main(%x: tensor<8x16xf32>, %w: tensor<16x8xf32>) -> (tensor<8x16xi32>, tensor<8x8xf32>) {
  %i = stablehlo.convert %x : (tensor<8x16xf32>) -> tensor<8x16xi32>
  %p = stablehlo.popcnt %i : tensor<8x16xi32>
  %0 = stablehlo.dot_general %x, %w, contracting_dims = [1] x [0] : (tensor<8x16xf32>, tensor<16x8xf32>) -> tensor<8x8xf32>
  return %p, %0 : tensor<8x16xi32>, tensor<8x8xf32>
}
"""

_TWO_RESULTS_SHARDED = """\
sdy.mesh @mesh = <["tp"=4]>
func.func @main(%x: tensor<8x16xf32>, %w: tensor<16x8xf32>) -> (tensor<8x16xi32>, tensor<8x8xf32>) {
  %r:2 = sdy.manual_computation(%x, %w) in_shardings=[<@mesh, [{}, {"tp"}]>, <@mesh, [{"tp"}, {}]>] out_shardings=[<@mesh, [{}, {"tp"}]>, <@mesh, [{}, {}]>] manual_axes={"tp"} (%xl: tensor<8x4xf32>, %wl: tensor<4x8xf32>) {
    %i = stablehlo.convert %xl : (tensor<8x4xf32>) -> tensor<8x4xi32>
    %p = stablehlo.popcnt %i : tensor<8x4xi32>
    %d = stablehlo.dot_general %xl, %wl, contracting_dims = [1] x [0] : (tensor<8x4xf32>, tensor<4x8xf32>) -> tensor<8x8xf32>
    sdy.return %p, %d : tensor<8x4xi32>, tensor<8x8xf32>
  } : (tensor<8x16xf32>, tensor<16x8xf32>) -> (tensor<8x16xi32>, tensor<8x8xf32>)
  return %r#0, %r#1 : tensor<8x16xi32>, tensor<8x8xf32>
}
"""


def test_demo(entangle) -> None:
    run = entangle("demo", "--no-verify-rules")
    assert run.code == 0, run.text
    assert f"{len(CORRECT)} of {len(PAIRS)} bundled programs proven" in run.out
    assert "all as expected" in run.out and "UNEXPECTED" not in run.out
    for name, _, _ in BUGGY:
        assert f"== {name}: NOT PROVEN" in run.out
    assert "missing all_reduce/psum" in run.out
    # Every bug claim of the demo is confirmed by running both programs (none withdrawn).
    assert run.out.count("note: confirmed by running both programs") == len(BUGGY), run.out
    assert "cannot relate" not in run.out


def test_demo_json(entangle) -> None:
    run = entangle("demo", "--no-verify-rules", "--json")
    assert run.code == 0
    doc = json.loads(run.out)
    assert set(doc) == {name for name, _, _ in PAIRS}
    for name, report in doc.items():
        assert report["verdict"] == ("not proven" if is_buggy(name) else "proven"), name


# ---------------------------------------------------------------------------------------------
# Subprocesses: the console script, no jax import, --dump-smt (process-wide Z3 caches).
# ---------------------------------------------------------------------------------------------

def _env() -> dict:
    return {**os.environ, "PYTHONPATH": str(REPO)}


def test_console_script_and_no_jax_import(trivial_pair) -> None:
    ref, shd = trivial_pair
    script = Path(sys.executable).with_name("entangle")
    assert script.exists(), f"console script missing next to {sys.executable}"
    done = subprocess.run([str(script), "check", ref, shd, "--no-verify-rules"],
                          check=False, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "result#0 = concat over 'tp' along dim 0" in done.stdout

    # Default mode: the Z3 rule-instance checks run too, and must not pull jax in either.
    code = ("import sys\n"
            "from entangle_mlir.cli import main\n"
            f"rc = main(['check', {ref!r}, {shd!r}])\n"
            "assert rc == 0, rc\n"
            "leaked = sorted(m for m in sys.modules if m == 'jax' or m.startswith('jax.'))\n"
            "assert not leaked, leaked\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=False, timeout=120, env=_env(), cwd=REPO)
    assert done.returncode == 0, done.stdout + done.stderr


def test_dump_smt_writes_smt2_files(tmp_path) -> None:
    """A program whose rule instances need Z3 (a psum over a partial sum; the trivial pair's
    claims are one z3 term on both sides and hold without a query)."""
    ref, shd = _paths("megatron_mlp_tp4")
    out = tmp_path / "smt"
    done = subprocess.run([sys.executable, "-m", "entangle_mlir.cli", "check", ref, shd,
                           "--dump-smt", str(out)], capture_output=True, text=True,
                          check=False, timeout=120, env=_env(), cwd=REPO)
    assert done.returncode == 0, done.stdout + done.stderr
    files = sorted(out.glob("*.smt2"))
    assert files, f"no .smt2 written to {out}"
    assert all("(check-sat)" in f.read_text() for f in files)


def _paths(name: str) -> tuple[str, str]:
    found = [(str(r), str(s)) for n, r, s in PAIRS if n == name]
    assert found, f"bundled example {name} missing"
    return found[0]


def test_readme_quick_start_matches_ci() -> None:
    """README's quick start is exactly two commands; .ci/run runs the second one verbatim, in
    a subshell so that its failure fails CI."""
    readme = (REPO / "README.md").read_text()
    block = re.search(r"## Quick start\s+```sh\n(.*?)```", readme, re.DOTALL)
    assert block, "README.md has no ```sh block under '## Quick start'"
    commands = [line for line in block.group(1).splitlines() if line.strip()]
    assert len(commands) == 2, commands
    install, test = commands
    assert "venv" in install and "pip install -e '.[test]'" in install
    assert install.endswith("entangle demo")
    assert "pytest" in test and "lit" in test
    ci = [line.strip() for line in (REPO / ".ci" / "run").read_text().splitlines()]
    # In a subshell: under `set -e`, a failure left of `&&` would not stop the script.
    assert f"({test})" in ci, f".ci/run does not run the README test command ({test!r})"
    assert os.access(REPO / ".ci" / "run", os.X_OK)


def test_version(entangle) -> None:
    from importlib import metadata

    run = entangle("--version")
    assert run.code == 0 and run.out.strip() == f"entangle {metadata.version('entangle-mlir')}"


@pytest.mark.parametrize("argv,usage", [
    (["check", "ref.mlir", "--bogus"], "usage: entangle check"),
    (["demo", "--bogus"], "usage: entangle demo"),
    (["check-many", "m.toml", "--bogus"], "usage: entangle check-many"),
    (["check-many"], "usage: entangle check-many"),
    (["check"], "usage: entangle check"),
])
def test_argument_errors_show_the_subcommands_usage(entangle, argv, usage) -> None:
    run = entangle(*argv)
    assert run.code == 2 and run.out == "" and "Traceback" not in run.err
    assert run.err.startswith(usage), run.err
    assert "error:" in run.err.splitlines()[-1]


def test_supported_jax_range_is_stated_and_tested() -> None:
    """pyproject's jax range is the README's, and .ci/run's second leg (the oldest jax) runs
    the test files the README's Installation section lists."""
    pyproject = (REPO / "pyproject.toml").read_text()
    bounds = re.findall(r'"(jax\[cpu\]|jaxlib)>=([0-9.]+),<([0-9.]+)"', pyproject)
    assert len(bounds) == 2 and bounds[0][1:] == bounds[1][1:], bounds
    oldest, below = bounds[0][1:]
    install = (REPO / "README.md").read_text().split("## Installation")[1].split("\n## ")[0]
    assert f"`jax[cpu]>={oldest},<{below}`" in install
    ci = (REPO / ".ci" / "run").read_text()
    leg = ci.split(".venv-oldest/bin/python -m pytest")[1].split("\n.venv-oldest/bin/lit")[0]
    files = set(re.findall(r"tests/\S+", leg))
    assert files and files == set(re.findall(r"`(tests/[^`]+)`", install)), files


def test_one_installed_top_level_package() -> None:
    """The distribution installs `entangle_mlir` only (examples, tests, benchmarks and fuzz
    stay in the repository), under the name the README gives."""
    import tomllib

    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert project["project"]["name"] == "entangle-mlir"
    assert project["tool"]["setuptools"]["packages"]["find"]["include"] == ["entangle_mlir*"]
    assert "`entangle-mlir`" in (REPO / "README.md").read_text()


def test_jobs_option(entangle, trivial_pair) -> None:
    """`--jobs N` (rule-instance checks in N worker processes; the verdict does not depend on
    it): a number of processes, 0 automatic; anything else is a usage error (exit 2)."""
    for jobs in ("1", "2", "0"):
        run = entangle("check", *trivial_pair, "--jobs", jobs)
        assert run.code == 0 and "verified" in run.out, run.text
    for bad in ("-1", "two"):
        run = entangle("check", *trivial_pair, "--jobs", bad)
        assert run.code == 2 and "a number of processes" in run.err
