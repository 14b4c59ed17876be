"""What test modules share by import: the repository's paths, the bundled demo pairs, small
hand-written MLIR programs, and running a jax script in a fresh interpreter.

Fixtures live in conftest.py, which pytest loads for every folder under tests/; no test imports
it. Nothing here imports jax.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from entangle_mlir.mlir.compat import JAXLIB_VERSION

REPO = Path(__file__).resolve().parents[1]
EXAMPLES_MLIR = REPO / "entangle_mlir" / "demo"


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
    """Whether a bundled pair is one of the buggy twins (its name carries a bug tag)."""
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


def run_jax_script(tmp_path: Path, name: str, source: str) -> tuple[str, Path]:
    """Write `source` as `tmp_path/name`, run it in a fresh interpreter on 4 simulated devices
    (it must succeed): (its stdout, the script's path)."""
    script = tmp_path / name
    script.write_text(source)
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=4"}
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          env=env, cwd=tmp_path, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout, script


def last_json(stdout: str) -> dict:
    """The JSON document a script printed on its last line."""
    return json.loads(stdout.strip().splitlines()[-1])



def check_unprovable(ref_text: str, sharded_text: str, **options):
    """The report on a pair that must not be proven (a mutant, a near miss), at the least
    cost that shows it: first without the rule-instance checks, which can only take a proof
    away (so "not proven" there is "not proven" with them), and with them only where that
    run proves the pair."""
    from entangle_mlir.driver import check_texts

    report = check_texts(ref_text, sharded_text, **{**options, "verify_rules": False})
    if report.proven and options.get("verify_rules", True):
        report = check_texts(ref_text, sharded_text, **options)
    return report


def per_example(items, xfails: dict[str, str] | None = None, marks=lambda ex: ()) -> list:
    """One pytest param an example (`.name`: its id), in the xdist group of its name: under
    `--dist loadgroup` (README's test command) every test of one example runs on one worker, so
    what the modules cache of it (the lowering, the runs, the check) is computed once.
    `xfails`: example name -> strict xfail reason; `marks`: more marks an example."""
    return [pytest.param(ex, id=ex.name, marks=(
        pytest.mark.xdist_group(ex.name), *marks(ex),
        *((pytest.mark.xfail(strict=True, reason=xfails[ex.name]),)
          if xfails and ex.name in xfails else ()))) for ex in items]


def confirmed(report, ref_text, sharded_text):
    """What `entangle check` reports after confirming the claims of a (cached) report by running
    both programs (`entangle_mlir.confirm`), on a copy: the cached report stays as it is."""
    from dataclasses import replace

    from entangle_mlir.confirm import confirm_texts  # lazy: only the corpus tests confirm

    copy = replace(report, evidence=dict(report.evidence), stats=dict(report.stats))
    return confirm_texts(copy, ref_text, sharded_text)


def confirmed_claim(report) -> bool:
    """The report's first diagnostic is a bug claim that running both programs confirmed."""
    from entangle_mlir.confirm import is_confirmed  # lazy: see `confirmed`

    return bool(report.diagnostics and is_confirmed(report.diagnostics[0]))


# ---------------------------------------------------------------------------------------------
# Tests tied to one jaxlib: what an older jax lowers differently (entangle_mlir/mlir/compat.py).
# ---------------------------------------------------------------------------------------------


def needs_jaxlib(version: tuple[int, ...], why: str):
    """Skip a test on a jaxlib older than `version`, saying `why` (what that jaxlib lacks or
    lowers differently). Only for tests whose verdict depends on one jax's lowering or on a
    pass missing from older jaxlibs; everything else runs on every supported jax."""
    wanted = ".".join(map(str, version))
    return pytest.mark.skipif(JAXLIB_VERSION < version,
                              reason=f"needs jaxlib >= {wanted}: {why}")
