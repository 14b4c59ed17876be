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
    ("entangle-infer-relations{bogus=1}", ("no option 'bogus' (its options: annotate, "
                                          "reuse_layers)")),
    ("entangle-infer-relations{", "cannot parse pass pipeline"),
    ("entangle-verify-rules{budget_seconds=abc}", ("option 'budget_seconds' of pass "
                                                  "'entangle-verify-rules' is a non-negative "
                                                  "integer, not 'abc'")),
    ("entangle-verify-rules{budget_seconds=-3}", "is a non-negative integer, not '-3'"),
    ("entangle-general-tier{max_devices=8.5}", "is a non-negative integer, not '8.5'"),
    ("entangle-infer-relations{annotate=maybe}", ("option 'annotate' of pass "
                                                 "'entangle-infer-relations' is true or false, "
                                                 "not 'maybe'")),
    ("entangle-infer-relations{annotate=yes}", "is true or false, not 'yes'"),
    ("entangle-infer-relations{annotate=false annotate=true}", ("option 'annotate' of pass "
                                                              "'entangle-infer-relations' is "
                                                              "given twice")),
    ("entangle-verify-rules{inject-fault}", ("option 'inject_fault' of pass "
                                            "'entangle-verify-rules' needs a value")),
])
def test_bad_pass_option(entangle_opt, combined, spec, needle) -> None:
    run = entangle_opt(combined, f"--pass-pipeline=builtin.module({spec})")
    assert run.code == 2
    assert needle in run.err and "Traceback" not in run.text
    assert len(run.err.strip().splitlines()) == 1


def test_bare_bool_option_is_true(entangle_opt, combined) -> None:
    run = entangle_opt(combined, "--pass-pipeline=builtin.module(entangle-import-shardings,"
                                 "entangle-infer-relations{annotate})")
    assert run.code == 0, run.text
    assert "entangle.relation" in run.out


def test_shorthand_flags_run_in_the_order_given(entangle_opt, combined) -> None:
    """The check before the relations it checks is refused: the flags' order is the passes'."""
    ordered = entangle_opt(combined, "--entangle-import-shardings", "--entangle-infer-relations",
                           "--entangle-check-refinement")
    swapped = entangle_opt(combined, "--entangle-import-shardings", "--entangle-check-refinement",
                           "--entangle-infer-relations")
    assert ordered.code == 0 and 'entangle.verdict = "proven"' in ordered.out, ordered.text
    assert swapped.code == 2
    assert "entangle-check-refinement needs entangle-infer-relations first" in swapped.err


def test_flags_and_pipeline_are_not_mixed(entangle_opt, combined) -> None:
    run = entangle_opt(combined, "--entangle-import-shardings",
                       "--pass-pipeline=builtin.module(entangle-infer-relations)")
    assert run.code == 2 and run.out == "" and "Traceback" not in run.text
    assert "either as --pass-pipeline or as flags, not both" in run.err


def test_version(entangle_opt) -> None:
    from importlib import metadata

    run = entangle_opt("--version")
    assert run.code == 0
    assert run.out.strip() == f"entangle-opt {metadata.version('entangle-mlir')}"


def test_print_debuginfo(entangle_opt, combined) -> None:
    plain = entangle_opt(combined, "--entangle-import-shardings")
    located = entangle_opt(combined, "--entangle-import-shardings", "--mlir-print-debuginfo")
    assert plain.code == located.code == 0
    assert "loc(" not in plain.out
    assert re.search(r'loc\(".*combined\.mlir":\d+:\d+\)', located.out), located.out


def test_print_debuginfo_counts_lines_of_the_file(entangle_opt, write) -> None:
    text = _split_file(COMBINED_ADD, COMBINED_ADD)
    path = write("two.mlir", text)
    run = entangle_opt(path, "--split-input-file", "--mlir-print-debuginfo")
    assert run.code == 0, run.text
    lines = text.splitlines()
    adds = [n for n, line in enumerate(lines, start=1) if "stablehlo.add" in line]
    for line in adds:
        col = lines[line - 1].index("stablehlo.add") + 1
        assert f'"{path}":{line}:{col})' in run.out, (line, run.out)


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


@pytest.mark.parametrize("expected,code", [
    (r"value is still a partial sum over {{'[a-z]+'}}", 0),
    (r"{{^}}value is {{(still )?}}a partial sum", 0),
    (r"value is still a partial sum over {{'dp'}}", 1),
    (r"value is still a partial {{max|min}}", 1),
])
def test_verify_diagnostics_regex(entangle_opt, write, expected, code) -> None:
    """`expected-error-re`: text outside `{{...}}` literal (its `(`, `.` and `'` included),
    inside a regex; found anywhere in the message, like mlir-opt."""
    text = _annotated().replace(
        "// expected-error @+1 {{value is still a partial sum over 'tp'}}",
        f"// expected-error-re @+1 {{{{{expected}}}}}")
    path = write("v.mlir", text)
    run = entangle_opt(path, "--verify-diagnostics", f"--pass-pipeline={CHECK}")
    assert run.code == code, run.text


def test_verify_diagnostics_parse_error(entangle_opt, write) -> None:
    text = ("module {\n"
            "  // expected-error @+1 {{cannot parse MLIR}}\n"
            "  func.func @broken( }\n"
            "}\n")
    path = write("v.mlir", _split_file(COMBINED_ADD, text))
    run = entangle_opt(path, "--split-input-file", "--verify-diagnostics",
                       f"--pass-pipeline={CHECK}")
    assert run.code == 0, run.text
