"""Input that cannot be used at all: exit 2, exactly one clear message, no traceback.

Never "verified", never a crash; the message names the problem, and the position when the input
has one.
"""

from __future__ import annotations

import json
import random
import time

import pytest

from tests.shared import (
    COMBINED_ADD,
    EXAMPLES_MLIR,
    REF_ADD,
    SHARDED_ADD,
    run_jax_script,
    sharded,
)


def _one_error(run, *needles: str) -> str:
    """Assert exit 2 and one single-line `error:` message containing every needle."""
    text = run.text
    assert run.code == 2, text
    assert "Traceback" not in text
    assert "verified" not in text and "proven" not in text
    lines = [line for line in text.splitlines() if line.strip()]
    assert len(lines) == 1, f"expected one message, got:\n{text}"
    assert "error: " in lines[0], lines[0]
    for needle in needles:
        assert needle in lines[0], f"{needle!r} not in {lines[0]!r}"
    return lines[0]


def _check(entangle, ref: str, shd: str):
    return entangle("check", ref, shd, "--no-verify-rules")


# --- files that are not MLIR ------------------------------------------------------------------

def test_malformed_text(entangle, write) -> None:
    bad = write("bad.mlir", "module {\n  func.func @main( }\n}\n")
    line = _one_error(_check(entangle, bad, write("s.mlir", SHARDED_ADD)),
                      f"{bad}:2:", "cannot parse MLIR")
    assert "expected" in line


def _bytecode() -> bytes:
    import io

    from jaxlib.mlir import ir

    from entangle_mlir.mlir.ir import context

    with context():
        module = ir.Module.parse(REF_ADD)
        buffer = io.BytesIO()
        module.operation.write_bytecode(buffer)
    return buffer.getvalue()


def test_valid_bytecode_is_accepted(entangle, write) -> None:
    ref = write("ref.mlirbc", _bytecode())
    run = _check(entangle, ref, write("s.mlir", SHARDED_ADD))
    assert run.code == 0, run.text


def test_truncated_bytecode(entangle, write) -> None:
    data = _bytecode()
    ref = write("ref.mlirbc", data[: len(data) // 2])
    _one_error(_check(entangle, ref, write("s.mlir", SHARDED_ADD)), ref, "cannot parse MLIR")


def test_truncated_bytecode_has_no_fake_position(entangle, write) -> None:
    data = _bytecode()
    ref = write("ref.mlirbc", data[: len(data) // 2])
    line = _one_error(_check(entangle, ref, write("s.mlir", SHARDED_ADD)))
    assert ":0:0:" not in line


@pytest.mark.parametrize("prefix", [b"", b"ML\xefR"], ids=["plain", "bytecode-magic"])
def test_random_bytes(entangle, write, prefix) -> None:
    rng = random.Random(1234)
    data = prefix + b"\xff" + bytes(rng.randrange(256) for _ in range(4096))
    path = write("random.bin", data)
    _one_error(_check(entangle, write("r.mlir", REF_ADD), path), path)


def test_non_utf8_text(entangle, write) -> None:
    path = write("latin1.mlir", "module {\n// caf\xe9\n}\n".encode("latin-1"))
    _one_error(_check(entangle, path, write("s.mlir", SHARDED_ADD)), path, "UTF-8")


@pytest.mark.parametrize("content", ["", "   \n\n"], ids=["empty", "blank"])
def test_empty_file(entangle, write, content) -> None:
    path = write("empty.mlir", content)
    _one_error(_check(entangle, write("r.mlir", REF_ADD), path), path, "empty")


def test_directory(entangle, write, tmp_path) -> None:
    _one_error(_check(entangle, str(tmp_path), write("s.mlir", SHARDED_ADD)), str(tmp_path),
               "directory")


def test_missing_file(entangle, write, tmp_path) -> None:
    missing = str(tmp_path / "nope.mlir")
    _one_error(_check(entangle, write("r.mlir", REF_ADD), missing), missing,
               "No such file")


# --- MLIR that entangle cannot use ------------------------------------------------------------

FOO_BODY = ('      %1 = "foo.bar"(%a, %b) : (tensor<2x4xf32>, tensor<2x4xf32>) '
            "-> tensor<2x4xf32>")


def test_unknown_dialect_op(entangle, write) -> None:
    shd = write("s.mlir", sharded(FOO_BODY))
    _one_error(_check(entangle, write("r.mlir", REF_ADD), shd), f"{shd}:5:")


def test_unknown_dialect_op_is_named(entangle, write) -> None:
    shd = write("s.mlir", sharded(FOO_BODY))
    line = _one_error(_check(entangle, write("r.mlir", REF_ADD), shd), f"{shd}:5:", "foo.bar")
    assert "allow-unregistered-dialect" not in line


def _dynamic(text: str) -> str:
    return (text.replace("%arg0: tensor<8x4xf32>", "%arg0: tensor<?x4xf32>", 1)
            .replace("stablehlo.add %arg0, %arg1 : tensor<8x4xf32>",
                     "stablehlo.add %arg1, %arg1 : tensor<8x4xf32>"))


def test_dynamic_shape_in_sharded(entangle, write) -> None:
    shd_text = SHARDED_ADD.replace(
        "func.func public @main(%arg0: tensor<8x4xf32>",
        "func.func public @main(%arg9: tensor<?x4xf32>, %arg0: tensor<8x4xf32>")
    ref_text = REF_ADD.replace("func.func public @main(",
                               "func.func public @main(%arg9: tensor<?x4xf32>, ")
    ref, shd = write("r.mlir", ref_text), write("s.mlir", shd_text)
    _one_error(_check(entangle, ref, shd), "tensor<?x4xf32>", "static")


def test_dynamic_shape_in_reference_names_the_reference(entangle, write) -> None:
    ref = write("ref_dyn.mlir", _dynamic(REF_ADD))
    shd = write("sharded.mlir", SHARDED_ADD)
    _one_error(_check(entangle, ref, shd), "ref_dyn.mlir", "tensor<?x4xf32>")


def test_manual_computation_without_mesh(entangle, write) -> None:
    text = SHARDED_ADD.replace('  sdy.mesh @mesh = <["tp"=4]>\n', "")
    shd = write("s.mlir", text)
    _one_error(_check(entangle, write("r.mlir", REF_ADD), shd), f"{shd}:3:", "@mesh")


def test_manual_axis_not_in_mesh(entangle, write) -> None:
    shd = write("s.mlir", SHARDED_ADD.replace('"tp"}', '"dp"}'))
    _one_error(_check(entangle, write("r.mlir", REF_ADD), shd), f"{shd}:4:", '"dp"')


@pytest.mark.parametrize("ref_text,needles", [
    (REF_ADD.replace("%arg0: tensor<8x4xf32>,", "%arg0: tensor<8x4xf32>, %x: tensor<8x4xf32>,"),
     ("3 arguments", "takes 2")),
    (REF_ADD.replace("tensor<8x4xf32>", "tensor<8x8xf32>"),
     ("argument #0", "tensor<8x8xf32>", "tensor<8x4xf32>")),
    (REF_ADD.replace("xf32>", "xf16>"), ("argument #0", "tensor<8x4xf16>", "tensor<8x4xf32>")),
    (REF_ADD.replace("-> tensor<8x4xf32>", "-> (tensor<8x4xf32>, tensor<8x4xf32>)")
     .replace("return %0 : tensor<8x4xf32>", "return %0, %0 : tensor<8x4xf32>, tensor<8x4xf32>"),
     ("returns 2 results", "returns 1")),
], ids=["arg-count", "arg-shape", "arg-dtype", "result-count"])
def test_signature_mismatch(entangle, write, ref_text, needles) -> None:
    ref, shd = write("r.mlir", ref_text), write("s.mlir", SHARDED_ADD)
    _one_error(_check(entangle, ref, shd), f"{shd}:3:3:", *needles)


TWO_PUBLIC = """\
module {
  func.func public @f(%arg0: tensor<8x4xf32>, %arg1: tensor<8x4xf32>) -> tensor<8x4xf32> {
    return %arg0 : tensor<8x4xf32>
  }
  func.func public @g(%arg0: tensor<8x4xf32>, %arg1: tensor<8x4xf32>) -> tensor<8x4xf32> {
    return %arg1 : tensor<8x4xf32>
  }
}
"""


def test_no_entry_point(entangle, write) -> None:
    ref = write("r.mlir", TWO_PUBLIC)
    _one_error(_check(entangle, ref, write("s.mlir", SHARDED_ADD)), ref, "entry point")


def test_combined_without_refines(entangle, write) -> None:
    path = write("c.mlir", COMBINED_ADD.replace(" attributes {entangle.refines = @ref}", ""))
    _one_error(_check(entangle, path, path), path, "entangle.refines")


def test_refines_names_missing_function(entangle, write) -> None:
    path = write("c.mlir", COMBINED_ADD.replace("entangle.refines = @ref",
                                                "entangle.refines = @nothere"))
    _one_error(_check(entangle, path, path), f"{path}:7:", "@nothere")


# --- the two programs in the wrong order ------------------------------------------------------

_PER_DEVICE_REF = """\
func.func @main(%x: tensor<16x8xf32>) -> tensor<16x8xf32> {
  %0 = stablehlo.tanh %x : tensor<16x8xf32>
  return %0 : tensor<16x8xf32>
}
"""

_PER_DEVICE = """\
module attributes {mhlo.num_partitions = 4 : i32} {
  func.func @main(%x: tensor<4x8xf32> {mhlo.sharding = "{devices=[4,1]<=[4]}"}) -> (tensor<4x8xf32> {mhlo.sharding = "{devices=[4,1]<=[4]}"}) {
    %0 = stablehlo.tanh %x : tensor<4x8xf32>
    return %0 : tensor<4x8xf32>
  }
}
"""


@pytest.mark.parametrize("pair,marker", [
    ("add", "a shard_map (sdy.manual_computation)"),
    ("megatron_mlp_tp4", "a shard_map (sdy.manual_computation)"),
    ("per_device", "shardings on its parameters (a per-device program)"),
])
def test_swapped_programs(entangle, write, pair, marker) -> None:
    """`entangle check SHARDED REF`: one line saying the order, with the command to run; the
    right order is proven."""
    if pair == "add":
        ref, shd = write("ref.mlir", REF_ADD), write("sharded.mlir", SHARDED_ADD)
    elif pair == "per_device":
        ref, shd = write("ref.mlir", _PER_DEVICE_REF), write("sharded.mlir", _PER_DEVICE)
    else:
        ref = str(EXAMPLES_MLIR / f"{pair}.ref.mlir")
        shd = str(EXAMPLES_MLIR / f"{pair}.sharded.mlir")
    assert _check(entangle, ref, shd).code == 0
    line = _one_error(_check(entangle, shd, ref), "the programs are in the wrong order",
                      f"{shd} is the sharded program, it holds {marker}",
                      f"{ref} has nothing sharded",
                      "the order is `entangle check REF SHARDED`",
                      f"`entangle check {ref} {shd}`")
    assert line.startswith("error: "), line
    doc = json.loads(entangle("check", shd, ref, "--json").out)
    assert (doc["verdict"], doc["exit_code"]) == ("bad input", 2)
    assert "wrong order" in doc["error"]


def test_refines_on_the_reference(entangle, write) -> None:
    """A combined file whose `entangle.refines` sits on the unsharded function."""
    text = (COMBINED_ADD.replace(" attributes {entangle.refines = @ref}", "")
            .replace("func.func @ref(%arg0: tensor<8x4xf32>, %arg1: tensor<8x4xf32>) -> "
                     "tensor<8x4xf32> {",
                     "func.func @ref(%arg0: tensor<8x4xf32>, %arg1: tensor<8x4xf32>) -> "
                     "tensor<8x4xf32> attributes {entangle.refines = @sharded} {"))
    assert text.count("entangle.refines = @sharded") == 1
    path = write("combined.mlir", text)
    _one_error(_check(entangle, path, path),
               "@ref carries `entangle.refines = @sharded`, but @sharded is the sharded program",
               "put `entangle.refines = @ref` on @sharded instead")


def test_both_unsharded_is_not_called_swapped(entangle, write) -> None:
    """Nothing sharded on either side: the old message (nothing to check), not a swap."""
    ref, other = write("ref.mlir", REF_ADD), write("other.mlir", REF_ADD)
    line = _one_error(_check(entangle, ref, other), "nothing sharded to check")
    assert "wrong order" not in line


def test_both_sharded_is_not_called_swapped(entangle, write) -> None:
    shd, other = write("sharded.mlir", SHARDED_ADD), write("other.mlir", SHARDED_ADD)
    run = _check(entangle, shd, other)
    assert "wrong order" not in run.text


SWAPPED_API = """
import os
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"
import jax, jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec as P
from entangle_mlir.core.diagnostics import InputError
from entangle_mlir.jax import check

def ref(x, w):
    return x @ w

def body(x, w):
    return jax.lax.psum(x @ w, "tp")

def replicated_body(x, w):
    return x @ w

mesh = jax.make_mesh((4,), ("tp",))
specs = (P(None, "tp"), P("tp", None))
sharded = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=specs, out_specs=P()))
avals = [jax.ShapeDtypeStruct(s, jnp.float32, sharding=NamedSharding(mesh, p))
         for s, p in zip(((8, 16), (16, 8)), specs)]
assert check(ref, sharded, *avals, verify_rules=False).proven
# jax cannot lower a shard_map without its shardings: its ValueError becomes InputError.
try:
    check(sharded, ref, *avals, verify_rules=False)
except InputError as err:
    print("SPLIT:", err.message)
# A shard_map over replicated inputs lowers either way: the programs tell the order.
replicated = jax.jit(jax.shard_map(replicated_body, mesh=mesh, in_specs=(P(), P()),
                                   out_specs=P(), check_vma=False))
plain = [jax.ShapeDtypeStruct(s, jnp.float32, sharding=NamedSharding(mesh, P()))
         for s in ((8, 16), (16, 8))]
assert check(ref, replicated, *plain, verify_rules=False).proven
try:
    check(replicated, ref, *plain, verify_rules=False)
except InputError as err:
    print("REPLICATED:", err.message)
# Other lowering errors stay jax's own.
bad = [jax.ShapeDtypeStruct((8, 15), jnp.float32, sharding=NamedSharding(mesh, specs[0])),
       avals[1]]
try:
    check(ref, sharded, *bad, verify_rules=False)
except InputError as err:
    print("WRONG:", err.message)
except Exception as err:
    print("JAX:", type(err).__name__)
"""


def test_swapped_functions_in_the_python_api(tmp_path) -> None:
    out, _ = run_jax_script(tmp_path, "swapped.py", SWAPPED_API)
    lines = dict(line.split(": ", 1) for line in out.strip().splitlines())
    for key in ("SPLIT", "REPLICATED"):
        message = lines[key]
        assert message.startswith("the functions are in the wrong order: the first one "), message
        assert "is the sharded program, it holds a shard_map (sdy.manual_computation)" in message
        assert "the order is check(reference_fn, sharded_fn, *avals)" in message
    assert "(body)" in lines["SPLIT"] and "(replicated_body)" in lines["REPLICATED"]
    assert lines.get("JAX") in ("ValueError", "TypeError"), out


def test_json_bad_input(entangle, write) -> None:
    bad = write("bad.mlir", "module {\n  func.func @main( }\n}\n")
    run = entangle("check", bad, write("s.mlir", SHARDED_ADD), "--json", "--no-verify-rules")
    assert run.code == 2 and "Traceback" not in run.text
    doc = json.loads(run.out)
    assert doc["verdict"] == "bad input" and doc["exit_code"] == 2
    assert f"{bad}:2:" in doc["error"]


# --- big input --------------------------------------------------------------------------------

def _big_combined(rows: int = 256, cols: int = 1024, chain: int = 2000) -> str:
    """A few MB: a dense constant added on both sides, then a chain of adds."""
    rng = random.Random(0)
    values = ",".join("[" + ",".join(f"{rng.uniform(-1, 1):.6f}" for _ in range(cols)) + "]"
                      for _ in range(rows))
    g, loc = f"tensor<{rows}x{cols}xf32>", f"tensor<{rows // 4}x{cols}xf32>"
    const = f"stablehlo.constant dense<[{values}]> : {g}"
    ref_chain = "\n".join(f"    %r{i + 1} = stablehlo.add %r{i}, %arg0 : {g}"
                          for i in range(chain))
    shd_chain = "\n".join(f"      %s{i + 1} = stablehlo.add %s{i}, %a : {loc}"
                          for i in range(chain))
    return f"""module {{
  sdy.mesh @mesh = <["tp"=4]>
  func.func @ref(%arg0: {g}) -> {g} {{
    %c = {const}
    %r0 = stablehlo.add %arg0, %c : {g}
{ref_chain}
    return %r{chain} : {g}
  }}
  func.func @sharded(%arg0: {g}) -> {g} attributes {{entangle.refines = @ref}} {{
    %c = {const}
    %0 = sdy.manual_computation(%arg0, %c) in_shardings=[<@mesh, [{{"tp"}}, {{}}]>, <@mesh, [{{"tp"}}, {{}}]>] out_shardings=[<@mesh, [{{"tp"}}, {{}}]>] manual_axes={{"tp"}} (%a: {loc}, %b: {loc}) {{
      %s0 = stablehlo.add %a, %b : {loc}
{shd_chain}
      sdy.return %s{chain} : {loc}
    }} : ({g}, {g}) -> {g}
    return %0 : {g}
  }}
}}
"""


def test_large_file(entangle, write) -> None:
    text = _big_combined()
    assert len(text) > 2_000_000
    path = write("big.mlir", text)
    start = time.perf_counter()
    run = _check(entangle, path, path)
    elapsed = time.perf_counter() - start
    assert "Traceback" not in run.text
    assert run.code in (0, 2), run.text
    if run.code == 0:
        assert "result#0 = concat over 'tp' along dim 0" in run.out
    else:
        _one_error(run)
    assert elapsed < 30, f"{len(text)} bytes took {elapsed:.1f}s"


# --- entangle-opt -----------------------------------------------------------------------------

def test_entangle_opt_malformed(entangle_opt, write) -> None:
    bad = write("bad.mlir", "module {\n  func.func @main( }\n}\n")
    run = entangle_opt(bad, "--entangle-infer-relations")
    _one_error(run, f"{bad}:2:", "cannot parse MLIR")
    assert run.out == ""


def test_entangle_opt_missing_file(entangle_opt, tmp_path) -> None:
    missing = str(tmp_path / "nope.mlir")
    _one_error(entangle_opt(missing, "--entangle-infer-relations"), missing, "No such file")
