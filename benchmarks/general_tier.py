"""What the general tier (per-device expansion, `analysis/general/`) costs, per op and per
device, and that programs the layout tier proves cost what they did.

    python benchmarks/general_tier.py             # meshes of 2..64 devices
    python benchmarks/general_tier.py --quick     # 4 and 16 devices

Rows: four programs the layout tier does not prove (tests/analysis/test_general_tier.py), on
a 1-D mesh of n devices with n blocks: the vocab-parallel embedding (4 rows per device), a
per-shard cumsum with block offsets, block sums (psum of a tiled value), an untiled
all_gather + reshape; the last two at a real size (their terms meet in normal form, no
evaluation). Columns: the general tier's seconds (expansion, decisions, rule
instances), the body's ops, distinct per-device computations (devices sharing operands share
one), and milliseconds per op per device. Then the Megatron demo pair (proven by the layout
tier) with the general tier on and off: the least of 5 runs each.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                           + " --xla_force_host_platform_device_count=64").strip()

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

from entangle_mlir.driver import check_files, check_texts
from entangle_mlir.jax import lower_pair


def _embedding(n: int):
    vocab, width, seq = 4 * n, 4, 4

    def reference(ids, w):
        return jnp.take(w, ids, axis=0)

    def body(ids, w):
        rows = w.shape[0]
        local = ids - lax.axis_index("tp") * rows
        mask = (local >= 0) & (local < rows)
        got = jnp.take(w, jnp.clip(local, 0, rows - 1), axis=0)
        return lax.psum(jnp.where(mask[:, None], got, 0.0), "tp")

    return reference, body, [((seq,), jnp.int32, P()), ((vocab, width), jnp.float32,
                                                         P("tp", None))], P()


def _cumsum(n: int):
    def body(x):
        local = jnp.cumsum(x)
        totals = lax.all_gather(local[-1], "tp")
        earlier = jnp.arange(n) < lax.axis_index("tp")
        return local + jnp.sum(jnp.where(earlier, totals, 0.0))

    return jnp.cumsum, body, [((4 * n,), jnp.float32, P("tp"))], P("tp")


def _block_sums(n: int):
    return (lambda x: x.reshape(n, -1).sum(0), lambda x: lax.psum(x, "tp"),
            [((4 * n,), jnp.float32, P("tp"))], P())


def _gather(n: int):
    return (lambda x: x, lambda x: lax.all_gather(x, "tp", tiled=False).reshape(-1, 4),
            [((2 * n, 4), jnp.float32, P("tp", None))], P())


def _block_sums_large(n: int):
    return (lambda x: x.reshape(n, -1, 64).sum(0), lambda x: lax.psum(x, "tp"),
            [((1024 * n, 64), jnp.float32, P("tp", None))], P())


def _gather_large(n: int):
    return (lambda x: x, lambda x: lax.all_gather(x, "tp", tiled=False).reshape(-1, 512),
            [((64 * n, 512), jnp.float32, P("tp", None))], P())


PROGRAMS = {"embedding": _embedding, "cumsum": _cumsum, "block sums": _block_sums,
            "all_gather untiled": _gather, "block sums 1024x64 / device": _block_sums_large,
            "all_gather untiled 64x512 / device": _gather_large}


def lower(build, n: int) -> tuple[str, str]:
    reference, body, args, out_specs = build(n)
    mesh = jax.make_mesh((n,), ("tp",), axis_types=(AxisType.Auto,))
    specs = tuple(spec for _, _, spec in args)
    sharded = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=specs, out_specs=out_specs,
                                    check_vma=False))
    avals = [jax.ShapeDtypeStruct(shape, dtype, sharding=NamedSharding(mesh, spec))
             for shape, dtype, spec in args]
    return lower_pair(reference, sharded, *avals)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    meshes = (4, 16) if args.quick else (2, 4, 8, 16, 32, 64)
    print(f"load average {os.getloadavg()[0]:.1f}")
    print("| program | devices | verdict | general tier s | body ops | computed | "
          "ms / (op x device) |")
    print("| --- | ---: | --- | ---: | ---: | ---: | ---: |")
    for name, build in PROGRAMS.items():
        for n in meshes:
            ref, sharded = lower(build, n)
            report = check_texts(ref, sharded)
            general = report.stats.get("general_tier", {})
            seconds = general.get("seconds", 0.0)
            ops = max(general.get("ops", 0), 1)
            verdict = ("proven" if report.proven else
                       "not proven: " + general.get("reason", "")[:60])
            print(f"| {name} | {n} | {verdict} | {seconds:.3f} | {general.get('ops', 0)} | "
                  f"{general.get('computed', 0)} | {1000 * seconds / (ops * n):.3f} |",
                  flush=True)
    demo = REPO / "entangle_mlir" / "demo"
    pair = (str(demo / "megatron_mlp_tp4.ref.mlir"), str(demo / "megatron_mlp_tp4.sharded.mlir"))
    for general_tier in (True, False):
        times = []
        for _ in range(5):
            start = time.perf_counter()
            report = check_files(*pair, general_tier=general_tier)
            times.append(time.perf_counter() - start)
        print(f"megatron_mlp_tp4 (layout tier proves it), general tier "
              f"{'on' if general_tier else 'off'}: {min(times):.3f} s, "
              f"{report.stats.get('tier')}, general tier ran: "
              f"{'general_tier' in report.stats}")
    np.set_printoptions()


if __name__ == "__main__":
    main()
