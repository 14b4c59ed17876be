"""Every reason of the catalogue has a lit test in `lit_tests/diagnostics/` on a program where it
is the truth, and that program really produces it. (lit itself runs the files; these tests
check the suite's shape and re-run each example in-process.)

The xfail tests at the bottom pin diagnostics that are misleading today, with the expectation
they should meet.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from entangle_mlir.core.reasons import CLAIMS, REASONS
from entangle_mlir.driver import check_files
from tests.shared import REPO, last_json, run_jax_script

DIAGNOSTICS = REPO / "lit_tests" / "diagnostics"
PIPELINE = ("builtin.module(entangle-normalize,entangle-import-shardings,"
            "entangle-infer-relations,entangle-check-refinement")
OPT_RUN = re.compile(r"^// RUN: entangle-opt %s --split-input-file --pass-pipeline='"
                     + re.escape(PIPELINE) + r"(,entangle-verify-rules(?:\{[^}]*\})?)?\)' "
                     r"--verify-diagnostics$", re.MULTILINE)
JSON_RUN = "// RUN: not entangle check %s --json | filecheck %s"
# Reasons whose example the general tier proves (it is correct; the reason is the layout tier's
# and the confirmation's): their `entangle check` runs without the general tier.
LAYOUT_TIER_REASONS = ("cannot_relate",)
LAYOUT_JSON_RUN = "// RUN: not entangle check %s --no-general-tier --json | filecheck %s"
# Reasons that only the Z3 rule-instance checks produce.
Z3_REASONS = ("inconclusive", "refuted")
# Reasons that only the confirmation of a claim by running both programs produces (entangle
# check, not entangle-opt: its lit test's expected-error is the layout tier's raw reading).
CONFIRM_REASONS = ("cannot_relate",)


def lit_file(reason: str) -> Path:
    return DIAGNOSTICS / f"{reason}.mlir"


def relative(path: Path) -> str:
    return str(path.relative_to(REPO))


@pytest.mark.parametrize("reason", list(REASONS))
def test_every_reason_has_a_lit_test(reason: str) -> None:
    path = lit_file(reason)
    assert path.is_file(), f"reason {reason!r} has no lit test: add {relative(path)}"
    text = path.read_text()
    assert "XFAIL" not in text, f"{path.name}: the example of a reason must pass"
    match = OPT_RUN.search(text)
    assert match, f"{path.name}: no entangle-opt --verify-diagnostics RUN line"
    assert bool(match.group(1)) == (reason in Z3_REASONS), (
        f"{path.name}: entangle-verify-rules belongs in the pipeline exactly for {Z3_REASONS}")
    if reason != "refuted":  # needs the testing-only injected fault: entangle-opt only
        run = LAYOUT_JSON_RUN if reason in LAYOUT_TIER_REASONS else JSON_RUN
        assert run in text, f"{path.name}: no `{run}` RUN line"
        assert f'// CHECK: "reason": "{reason}"' in text
    assert re.search(r"// expected-error @\+1 \{\{", text), f"{path.name}: no expected error"
    assert text.count("// -----") == 0, f"{path.name}: one program per file (docs show it)"


def test_no_orphan_diagnostics_tests() -> None:
    """Files are `<reason>.mlir`, or `<reason>.<variant>.mlir` for more examples."""
    for path in DIAGNOSTICS.glob("*.mlir"):
        reason = path.name.split(".")[0]
        assert reason in REASONS, f"{path.name}: {reason!r} is not a key of REASONS"


@pytest.mark.parametrize("reason", list(REASONS))
def test_example_produces_its_reason(reason: str) -> None:
    """The first diagnostic of `entangle check` on the example carries the reason."""
    path = lit_file(reason)
    report = report_for(reason)
    assert not report.proven and report.exit_code == (1 if reason in CLAIMS else 3)
    assert report.diagnostics, report.render_text()
    first = report.diagnostics[0]
    assert first.category == reason, report.render_text()
    assert first.loc is not None and first.loc.line > 0
    lines = path.read_text().splitlines()
    expected = [m.group(1) for number, line in enumerate(lines, start=1)
                if number + 1 == first.loc.line
                for m in [re.search(r"// expected-error @\+1 \{\{(.*?)\}\}", line)] if m]
    assert expected and expected[0] in first.message, (first.loc.line, first.message)


def report_for(reason: str):
    """The report on the reason's example; `refuted` needs its testing-only injected fault
    (`entangle-verify-rules{inject-fault=stablehlo.add}`, as its lit RUN line)."""
    path = lit_file(reason)
    if reason in CONFIRM_REASONS:
        from entangle_mlir.confirm import confirm_files  # lazy: runs jax

        general_tier = reason not in LAYOUT_TIER_REASONS
        return confirm_files(check_files(str(path), str(path), general_tier=general_tier),
                             str(path), str(path))
    if reason != "refuted":
        return check_files(str(path), str(path))
    from entangle_mlir.driver import check_with_pipeline

    return check_with_pipeline(str(path), "entangle-normalize,entangle-import-shardings,"
                               "entangle-infer-relations,entangle-check-refinement,"
                               "entangle-verify-rules{inject-fault=stablehlo.add}")


@pytest.mark.parametrize("reason", [r for r in REASONS if r not in Z3_REASONS])
def test_walk_alone_finds_the_reason(reason: str) -> None:
    """Without the Z3 checks the same diagnostic comes out (it is the walk's finding)."""
    path = lit_file(reason)
    report = check_files(str(path), str(path), verify_rules=False,
                         general_tier=reason not in LAYOUT_TIER_REASONS)
    if reason in CONFIRM_REASONS:
        from entangle_mlir.confirm import confirm_files  # lazy: runs jax

        report = confirm_files(report, str(path), str(path))
    assert [d.category for d in report.diagnostics][:1] == [reason], report.render_text()


# ----- known problems: the expectation the diagnostics should meet ----------------------------

def test_inconclusive_says_why() -> None:
    path = lit_file("inconclusive")
    report = check_files(str(path), str(path))
    first = report.diagnostics[0]
    assert first.category == "inconclusive"
    assert "division by zero" in first.message, first.message


def test_different_function_names_the_reference_op() -> None:
    path = lit_file("different_function")
    report = check_files(str(path), str(path))
    notes = [n for n in report.diagnostics[0].notes if "corresponds to the reference op" in
             n.message]
    assert notes and "stablehlo.maximum" in notes[0].message
    assert notes[0].loc is not None and notes[0].loc.line == 25


@pytest.mark.parametrize("reason", Z3_REASONS)
def test_withdrawn_verdict_marks_outputs(reason: str) -> None:
    report = report_for(reason)
    assert not report.proven
    assert not any(out.proven for out in report.outputs), report.render_text()


def test_convert_to_int_of_partial_sum_is_caught_by_the_walk() -> None:
    path = DIAGNOSTICS.parent / "regressions" / "convert_to_int_of_partial_sum.mlir"
    report = check_files(str(path), str(path), verify_rules=False)
    assert not report.proven, report.render_text()
    assert report.diagnostics[0].category == "nonlinear_partial"


USER_FRAMES = """
import json, os
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"
import jax, jax.numpy as jnp
from jax import lax
from jax.sharding import NamedSharding, PartitionSpec as P
from entangle_mlir.jax import check

def ref(x, w):
    return x @ w

def body(x, w):
    return lax.pmean(x @ w, "tp")

mesh = jax.make_mesh((4,), ("tp",))
specs = (P(None, "tp"), P("tp", None))
sharded = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=specs, out_specs=P()))
avals = [jax.ShapeDtypeStruct(s, jnp.float32, sharding=NamedSharding(mesh, p))
         for s, p in zip(((8, 16), (16, 8)), specs)]
print(json.dumps(check(ref, sharded, *avals).to_json()))
"""


def test_check_reports_only_user_frames(tmp_path: Path) -> None:
    out, script = run_jax_script(tmp_path, "user_frames.py", USER_FRAMES)
    document = last_json(out)
    files = set()
    for diagnostic in document["diagnostics"]:
        for one in (diagnostic, *diagnostic["notes"]):
            if one["location"]:
                files.add(one["location"]["file"])
    assert files == {str(script)}, files


MISSING_GRAD_SYNC = """
import json, os
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"
import jax, jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec as P
from entangle_mlir.jax import check

def loss(w, x):
    return jnp.sum(jnp.tanh(x @ w))

def ref(params, x):
    return {"w": params["w"] - 0.1 * jax.grad(loss)(params["w"], x)}

def body(params, x):
    g = jax.grad(loss)(params["w"], x)
    return {"w": params["w"] - 0.1 * g}

mesh = jax.make_mesh((4,), ("tp",))
specs = ({"w": P()}, P("tp", None))
sharded = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=specs, out_specs={"w": P()},
                                check_vma=False))
avals = [{"w": jax.ShapeDtypeStruct((8, 4), jnp.float32, sharding=NamedSharding(mesh, P()))},
         jax.ShapeDtypeStruct((16, 8), jnp.float32, sharding=NamedSharding(mesh, specs[1]))]
print(json.dumps(check(ref, sharded, *avals, verify_rules=False).to_json()))
"""


def test_missing_gradient_sync_is_named_a_gradient(tmp_path: Path) -> None:
    """A gradient left partial (each device differentiated its own tokens, no psum): the error
    says it is a gradient whose synchronisation is missing, at the line it differentiates, with
    a note at the update that carries it out and one naming the output by its pytree path; the
    numbers at that op really differ."""
    document = last_json(run_jax_script(tmp_path, "grad_sync.py", MISSING_GRAD_SYNC)[0])
    first = document["diagnostics"][0]
    assert first["reason"] == "missing_reduction"
    assert "a gradient: jax's transpose(jvp(" in first["message"]
    assert "gradient synchronisation of this parameter is missing" in first["message"]
    assert first["location"]["line"] == 9           # `x @ w` in loss, differentiated
    carrier = [n for n in first["notes"] if "reaches the output through" in n["message"]]
    assert carrier and carrier[0]["location"]["line"] == 16, first["notes"]   # w - 0.1 * g
    assert any(n["message"] == "result #0 is result['w']" for n in first["notes"])
    at_op = document["evidence"]["at_op"]
    assert at_op["available"] and at_op["max_abs_diff"] > 1e-3, at_op
