"""`entangle check-many` (entangle_mlir/many.py): the bundled manifest checked afresh, then
from the results cache, then with one file changed (only it checked again); the pool, serial
and Ray executors agree; jax entry points at several meshes; the worst exit code; manifests
that cannot be used. The CLI runs in-process (`cli.main`), claims unconfirmed (`--no-confirm`:
no jax run) unless a test says otherwise."""

from __future__ import annotations

import importlib.util
import json
import shutil
import time
from pathlib import Path

import pytest

from entangle_mlir import many
from entangle_mlir.cli import main
from tests.shared import REPO

MANIFEST = REPO / "examples" / "check_many.toml"
EXPECTED = {"megatron_mlp_tp4": 0, "megatron_mlp_missing_psum_tp4": 1, "layernorm_seq_tp4": 0,
            "row_linear_gelu": 0, "seqpar_mlp_all_gather_wrong_dim_tp4": 1}


def _run(capsys, *args: str) -> tuple[int, dict]:
    code = main(["check-many", *map(str, args), "--json"])
    return code, json.loads(capsys.readouterr().out)


def _verdicts(document: dict) -> dict:
    """What must not depend on how or where the checks ran: per check, its exit code and its
    report's verdict and diagnostics."""
    return {c["name"]: (c["exit_code"], c["verdict"],
                        [d["message"] for d in (c.get("report") or {}).get("diagnostics", [])])
            for c in document["checks"]}


@pytest.fixture
def copied(tmp_path) -> Path:
    """The bundled manifest and its programs, copied (so that a test may change a file)."""
    (tmp_path / "examples").mkdir()
    shutil.copy(MANIFEST, tmp_path / "examples" / MANIFEST.name)
    shutil.copytree(REPO / "entangle_mlir" / "demo", tmp_path / "entangle_mlir" / "demo")
    return tmp_path / "examples" / MANIFEST.name


def test_bundled_manifest_is_cached_and_only_a_changed_file_is_checked_again(
        copied, tmp_path, capsys) -> None:
    cache = tmp_path / "cache"
    code, first = _run(capsys, copied, "--cache-dir", cache, "--no-confirm", "--jobs", "1")
    assert code == 1 and first["exit_code"] == 1
    assert {c["name"]: c["exit_code"] for c in first["checks"]} == EXPECTED
    assert [c["name"] for c in first["checks"]] == list(EXPECTED)  # the manifest's order
    assert not any(c["cached"] for c in first["checks"])
    assert first["counts"] == {"proven": 3, "bug": 2, "inconclusive": 0, "bad input": 0}

    code, second = _run(capsys, copied, "--cache-dir", cache, "--no-confirm", "--jobs", "1")
    assert code == 1 and all(c["cached"] for c in second["checks"]) and second["cached"] == 5
    assert _verdicts(second) == _verdicts(first)
    assert [c["report"] for c in second["checks"]] == [c["report"] for c in first["checks"]]

    changed = copied.parent.parent / "entangle_mlir" / "demo" / "layernorm_seq_tp4.sharded.mlir"
    changed.write_text(changed.read_text() + "// changed\n")
    code, third = _run(capsys, copied, "--cache-dir", cache, "--no-confirm", "--jobs", "1")
    assert {c["name"] for c in third["checks"] if not c["cached"]} == {"layernorm_seq_tp4"}
    assert _verdicts(third) == _verdicts(first)

    # other options are another key: checked again
    code, other = _run(capsys, copied, "--cache-dir", cache, "--no-confirm", "--jobs", "1",
                       "--no-verify-rules")
    assert not any(c["cached"] for c in other["checks"])
    assert {c["name"]: c["exit_code"] for c in other["checks"]} == EXPECTED


def test_summary_table(copied, tmp_path, capsys) -> None:
    code = main(["check-many", str(copied), "--no-cache", "--no-confirm", "--jobs", "1"])
    out = capsys.readouterr().out
    assert code == 1
    lines = out.splitlines()
    assert lines[0].split() == ["check", "verdict", "exit", "time", "cached"]
    row = next(line for line in lines if line.startswith("megatron_mlp_missing_psum_tp4 "))
    assert row.split()[1:5] == ["not", "proven", "1", "bug"] and row.endswith("no")
    assert "5 checks: 3 proven, 2 bug, 0 inconclusive, 0 bad input; 0 from the cache" in out
    assert "exit code 1" in out
    assert ("megatron_mlp_missing_psum_tp4: examples/models.py:79:8: error: value is still a "
            "partial sum over 'tp'") in out


def test_the_pool_says_what_one_process_says(copied, tmp_path, capsys) -> None:
    _, serial = _run(capsys, copied, "--no-cache", "--no-confirm", "--jobs", "1")
    _, pooled = _run(capsys, copied, "--no-cache", "--no-confirm", "--jobs", "2")
    assert _verdicts(pooled) == _verdicts(serial)
    assert [c["name"] for c in pooled["checks"]] == list(EXPECTED)


def test_ray_says_what_the_pool_says(copied, tmp_path, capsys) -> None:
    """Ray's local cluster (2 CPUs) and the local pool: the same results (skipped without
    Ray: it is an optional extra)."""
    ray = pytest.importorskip("ray")
    _, pooled = _run(capsys, copied, "--no-cache", "--no-confirm", "--jobs", "2")
    started = time.perf_counter()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": str(REPO)}})
    try:
        code, on_ray = _run(capsys, copied, "--cache-dir", tmp_path / "cache", "--no-confirm",
                            "--ray")
    finally:
        ray.shutdown()
    print(f"Ray: {time.perf_counter() - started:.1f} s")
    assert code == 1 and _verdicts(on_ray) == _verdicts(pooled)
    assert not any(c["cached"] for c in on_ray["checks"])


@pytest.mark.skipif(importlib.util.find_spec("ray") is not None, reason="Ray is installed")
def test_without_ray_asking_for_it_is_bad_input(copied, capsys) -> None:
    assert main(["check-many", str(copied), "--no-cache", "--ray"]) == 2
    assert "pip install 'entangle-mlir[ray]'" in capsys.readouterr().err


def test_jax_entry_points_at_several_meshes(tmp_path, capsys, monkeypatch) -> None:
    monkeypatch.chdir(REPO)
    manifest = tmp_path / "jax.json"
    manifest.write_text(json.dumps({"options": {"confirm": False}, "jax": [
        {"entry": "examples.check_many_entries:megatron_mlp", "meshes": [{"tp": 2}, {"tp": 4}]},
        {"entry": "examples.check_many_entries:megatron_mlp_missing_psum", "name": "bug",
         "meshes": [{"tp": 2}]},
        {"entry": "examples.check_many_entries:no_such_function", "meshes": [{"tp": 2}]},
    ]}))
    # (both runs from one line: the lowered text's locations name the caller's frames)
    (code, document), (_, again) = [
        _run(capsys, manifest, "--cache-dir", tmp_path / "cache", "--jobs", "1")
        for _ in range(2)]
    assert {c["name"]: c["exit_code"] for c in document["checks"]} == {
        "megatron_mlp_tp2": 0, "megatron_mlp_tp4": 0, "bug_tp2": 1,
        "no_such_function_tp2": 2}
    assert code == 2  # the worst: bad input
    assert "has no function no_such_function" in document["checks"][-1]["error"]
    assert document["checks"][0]["report"]["mesh"] == "tp=2"
    assert [c["cached"] for c in again["checks"]] == [True, True, True, False]


@pytest.mark.parametrize("codes,expected", [
    ((0, 3, 1, 0), 1), ((3, 0), 3), ((0, 0), 0), ((1, 2, 3), 2), ((), 0)])
def test_the_worst_exit_code_wins(codes, expected) -> None:
    assert many.worst(codes) == expected


@pytest.mark.parametrize("text,message", [
    ("[[pairs]]\nref = 'a.mlir'\n", "unknown manifest key(s) pairs"),
    ("[[pair]]\nref = 'a.mlir'\nshard = 'b.mlir'\n", "unknown key(s) shard"),
    ("[options]\nconfirm = 'yes'\n", "`confirm` is true or false"),
    ("[options]\nconfrim = true\n", "options: unknown key(s) confrim"),
    ("[[pair]]\nsharded = 'b.mlir'\n", "`ref` must be a non-empty string"),
    ("[[jax]]\nentry = 'nomodule'\nmeshes = [{tp = 2}]\n", "is not `module:function`"),
    ("[[jax]]\nentry = 'm:f'\nmeshes = [{tp = 0}]\n", "`meshes` must be a non-empty list"),
    ("[[pair]]\nref = 'a.mlir'\n[[pair]]\nref = 'a.mlir'\n", "two checks are named 'a'"),
    ("", "lists no check"),
    ("[[pair\n", "not a valid TOML manifest"),
])
def test_a_manifest_that_cannot_be_used_is_bad_input(text, message, tmp_path, capsys) -> None:
    manifest = tmp_path / "m.toml"
    manifest.write_text(text)
    assert main(["check-many", str(manifest), "--no-cache"]) == 2
    assert message in capsys.readouterr().err


def test_the_default_cache_is_the_users(monkeypatch, tmp_path) -> None:
    monkeypatch.delenv("ENTANGLE_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert many.default_cache_dir() == tmp_path / "xdg" / "entangle"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert many.default_cache_dir() == tmp_path / "home" / ".cache" / "entangle"
    monkeypatch.setenv("ENTANGLE_CACHE_DIR", str(tmp_path / "mine"))
    assert many.default_cache_dir() == tmp_path / "mine"
