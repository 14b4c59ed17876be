"""The lit suite covers the rule table, the seven bugs and the correct examples, and its
generated inputs are fresh. (lit itself is run separately: `lit lit_tests -v`.)"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from entangle_mlir.rules import FAMILIES, RULES
from tests.shared import REPO

LIT = REPO / "lit_tests"
RULE_TESTS = LIT / "rules"
RULE_RUN = ("// RUN: entangle-opt %s --split-input-file --entangle-normalize "
            "--entangle-import-shardings --entangle-infer-relations | filecheck %s")
SEVEN_BUGS = ("missing_psum", "pmean", "bias_before_psum", "gelu_before_psum",
              "all_gather_wrong_dim", "local_stats", "psum_wrong_axis")


def rule_test(op: str) -> Path:
    return RULE_TESTS / f"{op.replace('.', '_')}.mlir"


def lit_test_problem(op: str) -> str | None:
    """What is wrong with `op`'s lit test (missing, no standard RUN line, no CHECK on the
    relation of `op`), or None."""
    path = rule_test(op)
    if not path.is_file():
        return f"{op} has no lit test: add {path.relative_to(REPO)}"
    text = path.read_text()
    if not text.startswith(RULE_RUN):
        return f"{path.name}: first line must be the standard RUN line"
    checks = [line for line in text.splitlines()
              if re.match(r"\s*// CHECK(-NEXT|-DAG)?: ", line)]
    # The relation follows the op on the same line, or (ops with regions) on the next CHECK.
    checked = [a for a, b in zip(checks, checks[1:] + [""])
               if op in a and ("entangle.relation" in a or "entangle.relation" in b)]
    if not checked:
        return f"{path.name}: no CHECK on the entangle.relation of {op}"
    return None


@pytest.mark.parametrize("op", list(RULES))
def test_every_rule_has_a_lit_test(op: str) -> None:
    problem = lit_test_problem(op)
    assert problem is None, problem


def test_no_orphan_rule_tests() -> None:
    expected = {rule_test(op).name for op in RULES}
    present = {p.name for p in RULE_TESTS.glob("*.mlir")}
    assert present - expected == set(), "lit rule tests for ops that are not in RULES"


def test_families_are_disjoint() -> None:
    # One op, one rule, one file: a key in two families would hide one of the rules.
    assert sum(len(table) for table in FAMILIES.values()) == len(RULES)


def test_refusals_are_tested() -> None:
    """Every family has at least one refusal (an `opaque:` relation) under test."""
    for family, table in FAMILIES.items():
        refused = [op for op in table if "opaque: " in rule_test(op).read_text()]
        assert refused, f"no lit test shows a rule of family {family} refusing"


@pytest.mark.parametrize("bug", SEVEN_BUGS)
def test_every_bug_has_a_lit_test(bug: str) -> None:
    text = (LIT / "bugs" / f"{bug}.mlir").read_text()
    run = text.splitlines()[0]
    assert run.startswith("// RUN: not entangle check %S/Inputs/"), run
    for name in re.findall(r"%S/Inputs/(\S+\.mlir)", run):
        assert (LIT / "bugs" / "Inputs" / name).is_file(), name
    assert re.search(r"// CHECK: examples/models\.py:\d+:\d+: error: ", text)
    assert "// CHECK: not proven: " in text


def test_every_correct_tp4_example_has_a_lit_test() -> None:
    inputs = sorted((LIT / "examples" / "Inputs").glob("*.ref.mlir"))
    names = [p.name[: -len(".ref.mlir")] for p in inputs]
    assert len(names) >= 9
    for name in names:
        text = (LIT / "examples" / f"{name}.mlir").read_text()
        assert "// CHECK: verified: the sharded program refines the reference" in text
        assert "// CHECK-NEXT: result#0 = " in text


def test_known_issues_are_expected_failures() -> None:
    for path in sorted((LIT / "known_issues").glob("*.mlir")):
        text = path.read_text()
        assert "// XFAIL: *" in text.splitlines()[1], f"{path.name}: XFAIL must be on line 2"
        assert "// Known issue: " in text, f"{path.name}: explain the issue"


def test_lit_inputs_are_fresh() -> None:
    """Regenerating the example inputs gives the committed text (imports jax in a subprocess,
    about 2 s; run `python -m examples.generate_lit` after changing the models or catalogue)."""
    result = subprocess.run([sys.executable, "-m", "examples.generate_lit", "--check"],
                            check=False, cwd=REPO, capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
