"""Regenerate the XLA dumps in this directory: `python -m tests.mlir.xla_dumps.generate`.

One jitted layer, `tanh(x @ w)` on a 2 x 4 mesh (x split both ways, w by rows, the output by
rows), compiled by XLA on 8 simulated CPU devices with `--xla_dump_to`, once with Shardy and
once with GSPMD; the files kept are the ones users pass by mistake, and the right one
(tests/mlir/test_xla_dumps.py). `async_collectives.txt` is written by hand: XLA's CPU backend
does not make all-reduce-start/-done or copy-start/-done, GPU backends after optimizations do.
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))

_COMPILE = """
import sys
import jax, jax.numpy as jnp
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P
jax.config.update("jax_use_shardy_partitioner", sys.argv[1] == "shardy")
mesh = jax.make_mesh((2, 4), ("dp", "tp"), axis_types=(AxisType.Auto,) * 2)
arg = lambda shape, *spec: jax.ShapeDtypeStruct(shape, jnp.float32,
                                                sharding=NamedSharding(mesh, P(*spec)))
layer = lambda x, w: jnp.tanh(x @ w)
f = jax.jit(layer, out_shardings=NamedSharding(mesh, P("dp")))
lowered = f.lower(arg((8, 16), "dp", "tp"), arg((16, 32), "tp", None))
if sys.argv[1] == "shardy":
    open(sys.argv[2] + "/jit_lowering.mlir", "w").write(lowered.as_text())
    plain = [jax.ShapeDtypeStruct(s, jnp.float32) for s in ((8, 16), (16, 32))]
    open(sys.argv[2] + "/ref.mlir", "w").write(jax.jit(layer).lower(*plain).as_text())
lowered.compile()
"""

_KEEP = {  # dump file (glob) -> fixture name
    "shardy": {
        "*.before_optimizations.txt": "before_optimizations.txt",
        "*after_shardy-xla.before_spmd-partitioning.txt": "before_spmd-partitioning.txt",
        "*after_spmd-partitioning*.txt": "after_spmd-partitioning.txt",
        "*after_spmd-partitioning*.hlo.pb": "after_spmd-partitioning.hlo.pb",
        "*.cpu_after_optimizations.txt": "after_optimizations.txt",
        "*.cpu_after_optimizations-buffer-assignment.txt": "buffer-assignment.txt",
    },
    "keep": {"*after_spmd-partitioning*.txt": "after_spmd-partitioning.keep_shardings.txt"},
    "gspmd": {"*after_sharding-propagation.before_spmd-partitioning.txt":
              "gspmd.before_spmd-partitioning.txt"},
}


def _compile(partitioner: str, directory: str, *flags: str) -> None:
    env = dict(os.environ, XLA_FLAGS=" ".join(
        ["--xla_force_host_platform_device_count=8", f"--xla_dump_to={directory}",
         "--xla_dump_hlo_pass_re=spmd-partitioning", *flags]))
    subprocess.run([sys.executable, "-c", _COMPILE, partitioner, HERE], env=env, check=True)


def main() -> None:
    for name, flags in (("shardy", ["--xla_dump_hlo_as_text", "--xla_dump_hlo_as_proto"]),
                        ("keep", ["--xla_keep_shardings_after_spmd=true"]), ("gspmd", [])):
        with tempfile.TemporaryDirectory() as directory:
            _compile("gspmd" if name == "gspmd" else "shardy", directory, *flags)
            for pattern, fixture in _KEEP[name].items():
                found = sorted(glob.glob(os.path.join(directory, pattern)))
                shutil.copy(found[-1], os.path.join(HERE, fixture))


if __name__ == "__main__":
    main()
