"""Shared fixtures: run the CLIs in-process, write MLIR into temp files, small MLIR programs.

Nothing here imports jax: the CLI tests must stay fast and prove the checker works without it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
EXAMPLES_MLIR = REPO / "entangle_mlir" / "demo"

@dataclass
class Run:
    """Exit code and captured output of one in-process CLI run."""

    code: int
    out: str
    err: str

    @property
    def text(self) -> str:
        return self.out + self.err


def _run(main, argv: list[str], capsys) -> Run:
    capsys.readouterr()
    try:
        code = main([str(a) for a in argv])
    except SystemExit as exc:  # argparse errors
        code = exc.code if isinstance(exc.code, int) else 2
    captured = capsys.readouterr()
    return Run(code, captured.out, captured.err)


@pytest.fixture
def entangle(capsys):
    """`entangle(*argv)` runs `entangle_mlir.cli.main` and returns a `Run`."""
    from entangle_mlir.cli import main

    return lambda *argv: _run(main, list(argv), capsys)


@pytest.fixture
def entangle_opt(capsys):
    """`entangle_opt(*argv)` runs `tools.entangle_opt.main` and returns a `Run`."""
    from entangle_mlir.opt import main

    return lambda *argv: _run(main, list(argv), capsys)


@pytest.fixture
def write(tmp_path):
    """`write(name, text_or_bytes)` -> path (str) of a new file under tmp_path."""

    def _write(name: str, content: str | bytes) -> str:
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content)
        return str(path)

    return _write


def bundled_pairs() -> list[tuple[str, Path, Path]]:
    """(name, ref, sharded) for every committed example pair."""
    out = []
    for ref in sorted(EXAMPLES_MLIR.glob("*.ref.mlir")):
        name = ref.name[: -len(".ref.mlir")]
        out.append((name, ref, ref.with_name(f"{name}.sharded.mlir")))
    return out


BUG_TAGS = ("missing_psum", "pmean", "bias_before_psum", "gelu_before_psum",
            "all_gather_wrong_dim", "local_stats", "psum_wrong_axis")


def is_buggy(name: str) -> bool:
    return any(tag in name for tag in BUG_TAGS)


# ---------------------------------------------------------------------------------------------
# Small hand-written programs: x + y with both arguments split on dim 0 over tp=4.
# ---------------------------------------------------------------------------------------------

REF_ADD = """\
module @ref {
  func.func public @main(%arg0: tensor<8x4xf32>, %arg1: tensor<8x4xf32>) -> tensor<8x4xf32> {
    %0 = stablehlo.add %arg0, %arg1 : tensor<8x4xf32>
    return %0 : tensor<8x4xf32>
  }
}
"""

# {BODY} is the manual body computing %1 from %a, %b (local 2x4 shards).
SHARDED_TEMPLATE = """\
module @sharded {
  sdy.mesh @mesh = <["tp"=4]>
  func.func public @main(%arg0: tensor<8x4xf32>, %arg1: tensor<8x4xf32>) -> tensor<8x4xf32> {
    %0 = sdy.manual_computation(%arg0, %arg1) in_shardings=[<@mesh, [{"tp"}, {}]>, <@mesh, [{"tp"}, {}]>] out_shardings=[<@mesh, [{"tp"}, {}]>] manual_axes={"tp"} (%a: tensor<2x4xf32>, %b: tensor<2x4xf32>) {
{BODY}
      sdy.return %1 : tensor<2x4xf32>
    } : (tensor<8x4xf32>, tensor<8x4xf32>) -> tensor<8x4xf32>
    return %0 : tensor<8x4xf32>
  }
}
"""


def sharded(body: str = "      %1 = stablehlo.add %a, %b : tensor<2x4xf32>") -> str:
    return SHARDED_TEMPLATE.replace("{BODY}", body)


SHARDED_ADD = sharded()

COMBINED_ADD = """\
module {
  sdy.mesh @mesh = <["tp"=4]>
  func.func @ref(%arg0: tensor<8x4xf32>, %arg1: tensor<8x4xf32>) -> tensor<8x4xf32> {
    %0 = stablehlo.add %arg0, %arg1 : tensor<8x4xf32>
    return %0 : tensor<8x4xf32>
  }
  func.func @sharded(%arg0: tensor<8x4xf32>, %arg1: tensor<8x4xf32>) -> tensor<8x4xf32> attributes {entangle.refines = @ref} {
    %0 = sdy.manual_computation(%arg0, %arg1) in_shardings=[<@mesh, [{"tp"}, {}]>, <@mesh, [{"tp"}, {}]>] out_shardings=[<@mesh, [{"tp"}, {}]>] manual_axes={"tp"} (%a: tensor<2x4xf32>, %b: tensor<2x4xf32>) {
      %1 = stablehlo.add %a, %b : tensor<2x4xf32>
      sdy.return %1 : tensor<2x4xf32>
    } : (tensor<8x4xf32>, tensor<8x4xf32>) -> tensor<8x4xf32>
    return %0 : tensor<8x4xf32>
  }
}
"""

# A combined module whose sharded function forgets the psum after a row-parallel matmul.
# The manual_computation is on line 8, the dot_general (where the partial sum starts) on line 9.
COMBINED_MISSING_PSUM = """\
module {
  sdy.mesh @mesh = <["tp"=4]>
  func.func @ref(%arg0: tensor<2x8xf32>, %arg1: tensor<8x4xf32>) -> tensor<2x4xf32> {
    %0 = stablehlo.dot_general %arg0, %arg1, contracting_dims = [1] x [0] : (tensor<2x8xf32>, tensor<8x4xf32>) -> tensor<2x4xf32>
    return %0 : tensor<2x4xf32>
  }
  func.func @sharded(%arg0: tensor<2x8xf32>, %arg1: tensor<8x4xf32>) -> tensor<2x4xf32> attributes {entangle.refines = @ref} {
    %0 = sdy.manual_computation(%arg0, %arg1) in_shardings=[<@mesh, [{}, {"tp"}]>, <@mesh, [{"tp"}, {}]>] out_shardings=[<@mesh, [{}, {}]>] manual_axes={"tp"} (%a: tensor<2x2xf32>, %b: tensor<2x4xf32>) {
      %1 = stablehlo.dot_general %a, %b, contracting_dims = [1] x [0] : (tensor<2x2xf32>, tensor<2x4xf32>) -> tensor<2x4xf32>
      sdy.return %1 : tensor<2x4xf32>
    } : (tensor<2x8xf32>, tensor<8x4xf32>) -> tensor<2x4xf32>
    return %0 : tensor<2x4xf32>
  }
}
"""


@pytest.fixture
def trivial_pair(write):
    """(ref path, sharded path) of a correct x + y pair."""
    return write("ref.mlir", REF_ADD), write("sharded.mlir", SHARDED_ADD)


def run_jax_script(tmp_path: Path, name: str, source: str) -> tuple[str, Path]:
    """Write `source` as `tmp_path/name`, run it in a fresh interpreter on 4 simulated devices
    (it must succeed): (its stdout, the script's path)."""
    import os
    import subprocess
    import sys

    script = tmp_path / name
    script.write_text(source)
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=4"}
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          env=env, cwd=tmp_path, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout, script


def last_json(stdout: str) -> dict:
    """The JSON document a script printed on its last line."""
    import json

    return json.loads(stdout.strip().splitlines()[-1])

