"""`entangle-opt`: pass pipelines, shorthand flags, --split-input-file, --verify-diagnostics."""

from __future__ import annotations

import re

import pytest

from tests.shared import COMBINED_ADD, COMBINED_MISSING_PSUM

ALL_PASSES = ["entangle-normalize", "entangle-import-shardings", "entangle-infer-relations",
              "entangle-check-refinement", "entangle-verify-rules"]
CHECK = ("builtin.module(entangle-normalize,entangle-import-shardings,"
         "entangle-infer-relations,entangle-check-refinement)")


@pytest.fixture
def combined(write):
    return write("combined.mlir", COMBINED_ADD)


# --- pipelines --------------------------------------------------------------------------------

def test_pipeline_annotates_relations_and_verdict(entangle_opt, combined) -> None:
    run = entangle_opt(combined, f"--pass-pipeline={CHECK}")
    assert run.code == 0, run.text
    # The per-device add inside the manual body: a tile of the reference's x + y (a sum's
    # operands print in the order this process first built them, which earlier tests change).
    assert re.search(r'stablehlo\.add %\w+, %\w+ \{entangle\.relation = "tile \[\{tp\}, \{\}\] : '
                     r'\((%arg0 \+ %arg1|%arg1 \+ %arg0)\)"\}', run.out), run.out
    assert 'entangle.verdict = "proven"' in run.out
    assert "result#0 = concat over 'tp' along dim 0" in run.out
    assert run.err == ""


def test_pipeline_partial_sum_relation(entangle_opt, write) -> None:
    path = write("missing_psum.mlir", COMBINED_MISSING_PSUM)
    run = entangle_opt(path, f"--pass-pipeline={CHECK}")
    assert run.code == 1
    assert 'entangle.relation = "partial sum {tp} : dot_general(%arg0, %arg1)"' in run.out
    assert 'entangle.verdict = "not proven"' in run.out
    assert f"{path}:9:12: error: value is still a partial sum over 'tp'" in run.err


def test_shorthand_flags_equal_pipeline(entangle_opt, combined) -> None:
    flags = entangle_opt(combined, "--entangle-import-shardings", "--entangle-infer-relations")
    piped = entangle_opt(combined, "--pass-pipeline=builtin.module(entangle-import-shardings,"
                                   "entangle-infer-relations)")
    bare = entangle_opt(combined, "--pass-pipeline=entangle-import-shardings, "
                                  "entangle-infer-relations")
    assert flags.code == piped.code == bare.code == 0
    assert flags.out == piped.out == bare.out
    assert "entangle.relation" in flags.out


def test_no_pass_round_trips(entangle_opt, combined) -> None:
    run = entangle_opt(combined)
    assert run.code == 0
    assert "sdy.manual_computation" in run.out and "entangle.relation" not in run.out


def test_unknown_pass_lists_known_passes(entangle_opt, combined) -> None:
    run = entangle_opt(combined, "--pass-pipeline=builtin.module(entangle-frobnicate)")
    assert run.code == 2
    assert "Traceback" not in run.text and run.out == ""
    assert "unknown pass 'entangle-frobnicate'" in run.err
    for name in ALL_PASSES:
        assert name in run.err


@pytest.mark.parametrize("spec,annotated", [
    ("entangle-infer-relations{annotate=false}", False),
    ("entangle-infer-relations{annotate=true}", True),
    ("entangle-infer-relations{annotate=0}", False),
    ("entangle-infer-relations", True),
])
def test_pass_option(entangle_opt, combined, spec, annotated) -> None:
    run = entangle_opt(combined, f"--pass-pipeline=builtin.module(entangle-import-shardings,"
                                 f"{spec})")
    assert run.code == 0, run.text
    assert ("entangle.relation" in run.out) is annotated


@pytest.mark.parametrize("spec,needle", [
    ("entangle-infer-relations{bogus=1}", "no option 'bogus'"),
    ("entangle-infer-relations{", "cannot parse pass pipeline"),
])
def test_bad_pass_option(entangle_opt, combined, spec, needle) -> None:
    run = entangle_opt(combined, f"--pass-pipeline=builtin.module({spec})")
    assert run.code == 2
    assert needle in run.err and "Traceback" not in run.text
    assert len(run.err.strip().splitlines()) == 1


def test_output_file(entangle_opt, combined, tmp_path) -> None:
    out = tmp_path / "out.mlir"
    run = entangle_opt(combined, "--entangle-import-shardings", "--entangle-infer-relations",
                       "-o", str(out))
    assert run.code == 0 and run.out == ""
    assert "entangle.relation" in out.read_text()


def test_stdin(entangle_opt, monkeypatch) -> None:
    import io

    monkeypatch.setattr("sys.stdin", io.StringIO(COMBINED_ADD))
    run = entangle_opt("-", f"--pass-pipeline={CHECK}")
    assert run.code == 0, run.text
    assert 'entangle.verdict = "proven"' in run.out


# --- --split-input-file -----------------------------------------------------------------------

def _split_file(*chunks: str) -> str:
    return "\n// -----\n".join(chunks)


def test_split_input_file(entangle_opt, write) -> None:
    text = _split_file(COMBINED_ADD, COMBINED_MISSING_PSUM)
    path = write("split.mlir", text)
    run = entangle_opt(path, "--split-input-file", f"--pass-pipeline={CHECK}")
    assert run.code == 1
    # Two modules in, two modules out, with the separator between them.
    assert run.out.count("// -----") == 1
    first, second = run.out.split("// -----")
    assert 'entangle.verdict = "proven"' in first
    assert 'entangle.verdict = "not proven"' in second
    # Diagnostics use lines of the whole file: the missing psum's dot_general is on line 9 of
    # the second chunk, which starts after the first chunk and the separator line.
    offset = len((COMBINED_ADD + "\n// -----\n").splitlines())
    assert f"{path}:{offset + 9}:12: error: value is still a partial sum over 'tp'" in run.err
    assert text.splitlines()[offset + 9 - 1].lstrip().startswith("%1 = stablehlo.dot_general")


def test_split_input_file_parse_error_in_one_chunk(entangle_opt, write) -> None:
    text = _split_file(COMBINED_ADD, "module {\n  func.func @broken( }\n}\n", COMBINED_ADD)
    path = write("split.mlir", text)
    run = entangle_opt(path, "--split-input-file", f"--pass-pipeline={CHECK}")
    assert run.code == 2
    line = text.splitlines().index("  func.func @broken( }") + 1
    pattern = rf"^{re.escape(path)}:{line}:\d+: error: cannot parse MLIR"
    assert re.search(pattern, run.err, re.MULTILINE)
    assert run.out.count('entangle.verdict = "proven"') == 2
    assert "Traceback" not in run.text


def test_without_split_the_separator_is_a_comment(entangle_opt, write) -> None:
    path = write("split.mlir", _split_file(COMBINED_ADD, COMBINED_ADD))
    run = entangle_opt(path, f"--pass-pipeline={CHECK}")
    # Two modules in one file without --split-input-file: one parse error, exit 2.
    assert run.code == 2 and "Traceback" not in run.text


# --- --verify-diagnostics ---------------------------------------------------------------------

def _annotated(error_text: str = "value is still a partial sum over 'tp'",
               note: bool = True) -> str:
    lines = COMBINED_MISSING_PSUM.splitlines()
    # Line 4 holds the reference dot_general (the counterpart note points there), line 8 the
    # manual_computation (where the leaving note points), line 9 the sharded dot_general.
    out = lines[:3]
    if note:
        out.append("    // expected-note @+1 {{corresponds to the reference op "
                   "stablehlo.dot_general}}")
    out += lines[3:7]
    if note:
        out.append("    // expected-note @+1 {{the partial sum leaves shard_map here}}")
    out.append(lines[7])
    out.append(f"      // expected-error @+1 {{{{{error_text}}}}}")
    out += lines[8:]
    return "\n".join(out) + "\n"


def test_verify_diagnostics_success(entangle_opt, write) -> None:
    path = write("v.mlir", _annotated())
    run = entangle_opt(path, "--verify-diagnostics", f"--pass-pipeline={CHECK}")
    assert run.code == 0, run.text
    assert run.err == ""


def test_verify_diagnostics_split(entangle_opt, write) -> None:
    path = write("v.mlir", _split_file(COMBINED_ADD, _annotated(), COMBINED_ADD, _annotated()))
    run = entangle_opt(path, "--split-input-file", "--verify-diagnostics",
                       f"--pass-pipeline={CHECK}")
    assert run.code == 0, run.text


def test_verify_diagnostics_missing_expected(entangle_opt, write) -> None:
    text = _split_file(_annotated(), COMBINED_ADD.replace(
        "      %1 = stablehlo.add",
        "      // expected-error @+1 {{never produced}}\n      %1 = stablehlo.add"))
    path = write("v.mlir", text)
    run = entangle_opt(path, "--split-input-file", "--verify-diagnostics",
                       f"--pass-pipeline={CHECK}")
    assert run.code == 1
    line = text.splitlines().index("      // expected-error @+1 {{never produced}}") + 2
    assert f'{path}:{line}: error: expected error "never produced" was not produced' in run.err


def test_verify_diagnostics_unexpected_error(entangle_opt, write) -> None:
    path = write("v.mlir", _annotated(note=True).replace(
        "      // expected-error @+1 {{value is still a partial sum over 'tp'}}\n", ""))
    run = entangle_opt(path, "--verify-diagnostics", f"--pass-pipeline={CHECK}")
    assert run.code == 1
    assert f"{path}:11:12: error: unexpected error: value is still a partial sum" in run.err


def test_verify_diagnostics_unexpected_note(entangle_opt, write) -> None:
    path = write("v.mlir", _annotated(note=False))
    run = entangle_opt(path, "--verify-diagnostics", f"--pass-pipeline={CHECK}")
    assert run.code == 1
    assert "unexpected note: the partial sum leaves shard_map here" in run.err


def test_verify_diagnostics_wrong_text(entangle_opt, write) -> None:
    path = write("v.mlir", _annotated(error_text="value is 4 x the reference"))
    run = entangle_opt(path, "--verify-diagnostics", f"--pass-pipeline={CHECK}")
    assert run.code == 1
    assert "unexpected error" in run.err and "was not produced" in run.err


def test_verify_diagnostics_parse_error(entangle_opt, write) -> None:
    text = ("module {\n"
            "  // expected-error @+1 {{cannot parse MLIR}}\n"
            "  func.func @broken( }\n"
            "}\n")
    path = write("v.mlir", _split_file(COMBINED_ADD, text))
    run = entangle_opt(path, "--split-input-file", "--verify-diagnostics",
                       f"--pass-pipeline={CHECK}")
    assert run.code == 0, run.text
