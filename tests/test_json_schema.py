"""`docs/report.schema.json` describes what `entangle check --json` really prints.

Real reports (proven, not proven for every reason, bad input, the demo, a JAX report with
evidence) are validated against the schema with a small validator for the draft 2020-12
keywords the schema uses (jsonschema is not a dependency). The validator refuses keywords it
does not implement, so the schema cannot silently outgrow it.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import ClassVar

import pytest

from entangle_mlir import cli
from entangle_mlir.core.reasons import CLAIMS, REASONS
from tests.shared import REPO, last_json, run_jax_script

SCHEMA_PATH = REPO / "docs" / "report.schema.json"
DOC_PATH = REPO / "docs" / "json-schema.md"
EXAMPLES = REPO / "entangle_mlir" / "demo"
DIAGNOSTICS = REPO / "lit_tests" / "diagnostics"


# ----- a small JSON Schema (draft 2020-12) validator ------------------------------------------

ANNOTATIONS = {"$schema", "$id", "$defs", "$comment", "title", "description", "default",
               "examples"}
TYPES = {
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
    "string": lambda v: isinstance(v, str),
    "boolean": lambda v: isinstance(v, bool),
    "null": lambda v: v is None,
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
}


class Validator:
    """Errors of an instance against a schema: `validate(instance) -> list[str]`."""

    KEYWORDS: ClassVar[set[str]] = {"$ref", "type", "enum", "const", "properties", "required",
                "additionalProperties", "items", "minimum", "oneOf", "anyOf", "allOf"}

    def __init__(self, root: dict):
        self.root = root

    def resolve(self, ref: str) -> dict:
        assert ref.startswith("#/"), f"only local references are supported: {ref}"
        node = self.root
        for part in ref[2:].split("/"):
            node = node[part.replace("~1", "/").replace("~0", "~")]
        return node

    def validate(self, instance, schema: dict | bool | None = None, path: str = "$") -> list[str]:
        schema = self.root if schema is None else schema
        if schema is True:
            return []
        if schema is False:
            return [f"{path}: not allowed"]
        unknown = set(schema) - self.KEYWORDS - ANNOTATIONS
        if unknown:
            raise AssertionError(f"schema keywords the validator does not implement: {unknown}")
        errors: list[str] = []
        if "$ref" in schema:
            errors += self.validate(instance, self.resolve(schema["$ref"]), path)
        if "type" in schema:
            names = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
            if not any(TYPES[name](instance) for name in names):
                return errors + [f"{path}: {instance!r:.60} is not of type {names}"]
        if "enum" in schema and not any(_same(instance, v) for v in schema["enum"]):
            errors.append(f"{path}: {instance!r:.60} is not one of {schema['enum']}")
        if "const" in schema and not _same(instance, schema["const"]):
            errors.append(f"{path}: {instance!r:.60} is not {schema['const']!r}")
        if "minimum" in schema and TYPES["number"](instance) and instance < schema["minimum"]:
            errors.append(f"{path}: {instance} < {schema['minimum']}")
        if isinstance(instance, dict):
            errors += self._object(instance, schema, path)
        if isinstance(instance, list) and "items" in schema:
            for i, item in enumerate(instance):
                errors += self.validate(item, schema["items"], f"{path}[{i}]")
        for sub in schema.get("allOf", []):
            errors += self.validate(instance, sub, path)
        if "anyOf" in schema and all(self.validate(instance, s, path) for s in schema["anyOf"]):
            errors.append(f"{path}: matches none of anyOf")
        if "oneOf" in schema:
            matched = sum(not self.validate(instance, s, path) for s in schema["oneOf"])
            if matched != 1:
                errors.append(f"{path}: matches {matched} of oneOf, not exactly one")
        return errors

    def _object(self, instance: dict, schema: dict, path: str) -> list[str]:
        errors = [f"{path}: missing {key!r}" for key in schema.get("required", [])
                  if key not in instance]
        properties = schema.get("properties", {})
        for key, value in instance.items():
            if key in properties:
                errors += self.validate(value, properties[key], f"{path}.{key}")
            elif "additionalProperties" in schema:
                errors += self.validate(value, schema["additionalProperties"], f"{path}.{key}")
        return errors


def _same(a, b) -> bool:
    return type(a) is type(b) and a == b or (
        TYPES["number"](a) and TYPES["number"](b) and a == b)


SCHEMA = json.loads(SCHEMA_PATH.read_text())
VALIDATOR = Validator(SCHEMA)


def assert_valid(document, ref: str | None = None) -> None:
    schema = VALIDATOR.resolve(ref) if ref else None
    errors = VALIDATOR.validate(document, schema)
    assert not errors, "\n".join(errors[:20])


def run_cli(argv: list[str], capsys) -> tuple[int, dict]:
    capsys.readouterr()
    code = cli.main(argv)
    out = capsys.readouterr().out
    return code, json.loads(out)


# ----- the schema itself ----------------------------------------------------------------------

def test_schema_is_draft_2020_12() -> None:
    assert SCHEMA["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    VALIDATOR.validate({}, None)          # every keyword it uses is implemented


def test_reason_enum_is_the_catalogue() -> None:
    assert SCHEMA["$defs"]["reason"]["enum"] == list(REASONS)


def test_validator_is_not_vacuous(capsys) -> None:
    path = str(DIAGNOSTICS / "missing_reduction.mlir")
    _, good = run_cli(["check", path, "--json", "--no-verify-rules"], capsys)
    assert_valid(good)
    broken = [
        {k: v for k, v in good.items() if k != "verdict"},                  # missing key
        {**good, "extra": 1},                                               # unknown key
        {**good, "exit_code": 0},                                           # verdict mismatch
        {**good, "exit_code": 3},                                           # outcome mismatch
        {**good, "outcome": "inconclusive"},
        {**good, "outcome": "proven"},
        {**good, "outputs": [{**good["outputs"][0], "index": -1}]},         # minimum
        {**good, "diagnostics": [{**good["diagnostics"][0], "reason": "typo"}]},
        {**good, "diagnostics": [{**good["diagnostics"][0], "location": {"file": "x"}}]},
        {**good, "stats": {**good["stats"], "ops": "3"}},
        {**good, "explanations": ["not a list of strings"]},
        {"verdict": "bad input", "outcome": "bad input", "exit_code": 1, "error": "x"},
        {"verdict": "bad input", "exit_code": 2, "error": "x"},             # no outcome
    ]
    for document in broken:
        assert VALIDATOR.validate(document), f"accepted: {json.dumps(document)[:200]}"


# ----- real reports ---------------------------------------------------------------------------

def test_proven_report(capsys) -> None:
    ref = EXAMPLES / "megatron_mlp_tp4.ref.mlir"
    sharded = EXAMPLES / "megatron_mlp_tp4.sharded.mlir"
    code, document = run_cli(["check", str(ref), str(sharded), "--json"], capsys)
    assert code == 0 == document["exit_code"]
    assert_valid(document)
    assert document["verdict"] == "proven" == document["outcome"] and not document["diagnostics"]
    assert document["stats"]["rule_instances"]["proved"] > 0
    assert document["evidence"] == {}


@pytest.mark.parametrize("reason", list(REASONS))
def test_not_proven_report(reason: str, capsys) -> None:
    path = str(DIAGNOSTICS / f"{reason}.mlir")
    if reason == "refuted":
        from tests.test_diagnostics_reasons import report_for

        report = report_for(reason)
        code, document = report.exit_code, report.to_json()
    else:
        # The general tier proves cannot_relate's program (block sums): its reason is the
        # layout tier's.
        code, document = run_cli(["check", path, "--json", "--no-general-tier"], capsys)
    expected = 1 if reason in CLAIMS else 3
    assert code == expected == document["exit_code"]
    assert document["outcome"] == ("bug" if reason in CLAIMS else "inconclusive")
    assert document["verdict"] == "not proven"
    assert_valid(document)
    first = document["diagnostics"][0]
    assert first["reason"] == reason and first["severity"] == "error"
    assert first["location"]["file"] == path and first["location"]["line"] > 0


def test_report_without_rule_checks(capsys) -> None:
    path = str(DIAGNOSTICS / "scale.mlir")
    code, document = run_cli(["check", path, "--json", "--no-verify-rules"], capsys)
    assert code == 1
    assert_valid(document)
    assert "rule_instances" not in document["stats"]
    assert document["rule_check_mode"].startswith("skipped (--no-verify-rules)")


@pytest.mark.parametrize("make_input", ["missing file", "unparsable", "no refines"])
def test_bad_input(make_input: str, tmp_path: Path, capsys) -> None:
    path = tmp_path / "input.mlir"
    if make_input == "unparsable":
        path.write_text("this is not MLIR\n")
    elif make_input == "no refines":
        path.write_text("func.func @main(%x: tensor<4xf32>) -> tensor<4xf32> {\n"
                        "  return %x : tensor<4xf32>\n}\n")
    code, document = run_cli(["check", str(path), "--json"], capsys)
    assert code == 2 == document["exit_code"]
    assert_valid(document)
    assert_valid(document, "#/$defs/badInput")
    assert document["verdict"] == "bad input" and "error:" in document["error"]


def test_demo(capsys) -> None:
    code, document = run_cli(["demo", "--json", "--no-verify-rules"], capsys)
    assert code == 0
    assert_valid(document, "#/$defs/demo")
    assert len(document) >= 9
    verdicts = {report["verdict"] for report in document.values()}
    assert verdicts == {"proven", "not proven"}


JAX_REPORT = """
import json, os
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"
import jax, jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec as P
from entangle_mlir.jax import check

def ref(x, w):
    return x @ w

def body(x, w):
    return jax.lax.pmean(x @ w, "tp")

mesh = jax.make_mesh((4,), ("tp",))
specs = (P(None, "tp"), P("tp", None))
sharded = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=specs, out_specs=P()))
avals = [jax.ShapeDtypeStruct(s, jnp.float32, sharding=NamedSharding(mesh, p))
         for s, p in zip(((8, 16), (16, 8)), specs)]
print(json.dumps(check(ref, sharded, *avals).to_json()))
"""


def test_jax_report_with_evidence(tmp_path: Path) -> None:
    document = last_json(run_jax_script(tmp_path, "jax_report.py", JAX_REPORT)[0])
    assert_valid(document)
    first = document["diagnostics"][0]
    assert first["reason"] == "scale"
    assert first["location"]["file"].endswith("jax_report.py")
    assert first["location"]["op_name"]
    at_op = document["evidence"]["at_op"]
    assert at_op["available"] and at_op["max_abs_diff"] > 1e-3
    assert at_op["sharded_location"].startswith(first["location"]["file"])
    broken = [{**at_op, "available": False},                 # no reason
              {k: v for k, v in at_op.items() if k != "relation"},
              {**at_op, "max_abs_diff": "1"},
              {"available": False, "summary": "x", "reason": "y", "extra": 1}]
    for evidence in broken:
        assert VALIDATOR.validate({**document, "evidence": {**document["evidence"],
                                                            "at_op": evidence}}), evidence
    fallback = {"available": False, "summary": "x", "reason": "inside a loop body"}
    assert_valid({**document, "evidence": {**document["evidence"], "at_op": fallback}})
    evidence = document["evidence"]
    assert evidence["seed"] == 0 and evidence["summary"]
    assert all(math.isfinite(d) and d > 0 for d in evidence["max_abs_diff"])


# ----- the documentation ----------------------------------------------------------------------

def _property_names(node, found: set[str]) -> set[str]:
    if isinstance(node, dict):
        found.update(node.get("properties", {}))
        for value in node.values():
            _property_names(value, found)
    elif isinstance(node, list):
        for value in node:
            _property_names(value, found)
    return found


def test_every_field_is_documented() -> None:
    text = DOC_PATH.read_text()
    documented = set(re.findall(r"`([a-z_]+)`", text))
    missing = sorted(_property_names(SCHEMA, set()) - documented)
    assert not missing, f"fields of report.schema.json not described in json-schema.md: {missing}"
    assert "report.schema.json" in text


NAN_REPORT = """
import os
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"
import jax, jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec as P
from entangle_mlir.jax import check

def ref(x):
    return x / 0.0

def body(x):
    return x / 0.0

mesh = jax.make_mesh((4,), ("tp",))
sharded = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("tp"), out_specs=P("tp")))
aval = jax.ShapeDtypeStruct((8, 16), jnp.float32, sharding=NamedSharding(mesh, P("tp")))
print(check(ref, sharded, aval).dumps())
"""


def test_evidence_is_strict_json(tmp_path: Path) -> None:
    def refuse(token):
        raise ValueError(f"not JSON: {token}")

    out, _ = run_jax_script(tmp_path, "nan_report.py", NAN_REPORT)
    document = json.loads(out, parse_constant=refuse)
    assert_valid(document)
UNCHECKED = """\
module {
  sdy.mesh @mesh = <["tp"=2]>
  func.func @ref(%x: tensor<8192x64xf32>) -> tensor<4096x64xf32> {
    %0 = stablehlo.slice %x [0:8192:2, 0:64] : (tensor<8192x64xf32>) -> tensor<4096x64xf32>
    return %0 : tensor<4096x64xf32>
  }
  func.func @sharded(%x: tensor<8192x64xf32>) -> tensor<4096x64xf32> attributes {entangle.refines = @ref} {
    %0 = sdy.manual_computation(%x) in_shardings=[<@mesh, [{}, {"tp"}]>] out_shardings=[<@mesh, [{}, {"tp"}]>] manual_axes={"tp"} (%a: tensor<8192x32xf32>) {
      %1 = stablehlo.slice %a [0:8192:2, 0:32] : (tensor<8192x32xf32>) -> tensor<4096x32xf32>
      sdy.return %1 : tensor<4096x32xf32>
    } : (tensor<8192x64xf32>) -> tensor<4096x64xf32>
    return %0 : tensor<4096x64xf32>
  }
}
"""
"""A strided slice whose 8192 rows stay too many at the reduced shape: both walks' instances
are too large for Z3 and not reducible (tests/analysis/test_instance.py::test_skips_and_budget)."""


def test_unchecked_rule_instances_are_listed(tmp_path: Path, capsys) -> None:
    path = tmp_path / "strided.mlir"
    path.write_text(UNCHECKED)
    code, document = run_cli(["check", str(path), "--json"], capsys)
    assert code == 0 and document["verdict"] == "proven"
    assert_valid(document)
    unchecked = document["unchecked_rule_instances"]
    assert [(u["walk"], u["op_name"], u["location"]["line"]) for u in unchecked] == [
        ("reference", "stablehlo.slice", 4), ("sharded", "stablehlo.slice", 9)]
    assert all("too large to check at its real shape" in u["reason"] for u in unchecked)
    assert document["stats"]["rule_instances"]["skipped"] == 2
    assert any("the 2 rule instances Z3 did not check" in a for a in document["assumptions"])
    capsys.readouterr()
    assert cli.main(["check", str(path)]) == 0
    text = capsys.readouterr().out.splitlines()
    start = text.index(next(line for line in text if line.startswith("not checked by Z3:")))
    assert text[start - 1].startswith("rule checks: ") and "2 skipped" in text[start - 1]
    assert text[start].startswith("not checked by Z3: 2 rule instances;")
    assert text[start + 1] == (f"  {path}:4:10: stablehlo.slice (reference walk): "
                               f"{unchecked[0]['reason']}")
    assert text[start + 2] == f"  {path}:9:12: stablehlo.slice: {unchecked[1]['reason']}"
    assert "  - the 2 rule instances Z3 did not check" in "\n".join(text)


def test_rule_checks_over_budget_are_listed() -> None:
    from entangle_mlir.driver import check_with_pipeline

    report = check_with_pipeline(
        str(DIAGNOSTICS / "scale.mlir"),
        "entangle-normalize,entangle-import-shardings,entangle-infer-relations,"
        "entangle-check-refinement,entangle-verify-rules{budget_seconds=0}")
    counts = report.stats["rule_instances"]
    assert counts["skipped"] == len(report.unchecked) > 0 and counts["proved"] == 0, counts
    assert all(u.reason == "over the time budget of the rule checks (0 CPU s)"
               for u in report.unchecked)
    assert {u.walk for u in report.unchecked} == {"reference", "sharded"}
    assert_valid(report.to_json())
    text = report.render_text()
    assert f"not checked by Z3: {counts['skipped']} rule instances;" in text
    # Not proven for its own reason (a pmean): no assumption about the unchecked ones.
    assert not any("did not check" in a for a in report.assumptions)


def test_no_unchecked_instances_print_nothing(capsys) -> None:
    ref = EXAMPLES / "megatron_mlp_tp4.ref.mlir"
    sharded = EXAMPLES / "megatron_mlp_tp4.sharded.mlir"
    code, document = run_cli(["check", str(ref), str(sharded), "--json"], capsys)
    assert code == 0 and document["unchecked_rule_instances"] == []
    capsys.readouterr()
    cli.main(["check", str(ref), str(sharded)])
    out = capsys.readouterr().out
    assert "not checked by Z3" not in out and "did not check" not in out
