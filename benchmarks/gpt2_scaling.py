"""GPT-2-width forward (hidden 768, 12 heads, seq 128) under Megatron tensor parallelism:
wall time of `entangle check` (Z3 rule-instance checks included) against layers and tp, and
the time XLA needs to compile the same sharded program. Prints ratios measured in this run.

    python benchmarks/gpt2_scaling.py [--layers 1 2 4 8 32] [--tp 2 4 8]

Times `check_texts` in this process (no start-up, warm imports); `benchmarks/scaling.py` is the
full table (a fresh `entangle check` process per row, meshes, Llama-3-8B) and imports the GPT-2
programs from here.
"""

from __future__ import annotations

import argparse
import math
import os
import resource
import sys
import time

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

# GPT-2 small has 12 heads, which tp 8 cannot split evenly (Megatron requires it): 16 heads of
# width 48 keep hidden 768 and divide every tp measured here.
HIDDEN, HEADS, SEQ, BATCH = 768, 16, 128, 1
HEAD_DIM = HIDDEN // HEADS


def layer_norm(x, g, b):
    mean = jnp.mean(x, axis=-1, keepdims=True)
    var = jnp.mean((x - mean) ** 2, axis=-1, keepdims=True)
    return (x - mean) * lax.rsqrt(var + 1e-5) * g + b


def attention(x, wq, wk, wv):
    b, s, _ = x.shape
    q = (x @ wq).reshape(b, s, -1, HEAD_DIM)
    k = (x @ wk).reshape(b, s, -1, HEAD_DIM)
    v = (x @ wv).reshape(b, s, -1, HEAD_DIM)
    scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / jnp.sqrt(jnp.float32(HEAD_DIM))
    scores = jnp.where(jnp.tril(jnp.ones((s, s), dtype=bool)), scores, -jnp.inf)
    out = jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(scores, axis=-1), v)
    return out.reshape(b, s, -1)


def block(x, p, reduce):
    ln1_g, ln1_b, wq, wk, wv, wo, bo, ln2_g, ln2_b, w1, b1, w2, b2 = p
    x = x + reduce(attention(layer_norm(x, ln1_g, ln1_b), wq, wk, wv) @ wo) + bo
    h = jax.nn.gelu(layer_norm(x, ln2_g, ln2_b) @ w1 + b1)
    return x + reduce(h @ w2) + b2


SHAPES = [(HIDDEN,), (HIDDEN,), (HIDDEN, HIDDEN), (HIDDEN, HIDDEN), (HIDDEN, HIDDEN),
          (HIDDEN, HIDDEN), (HIDDEN,), (HIDDEN,), (HIDDEN,), (HIDDEN, 4 * HIDDEN), (4 * HIDDEN,),
          (4 * HIDDEN, HIDDEN), (HIDDEN,)]
SPECS = [P(), P(), P(None, "tp"), P(None, "tp"), P(None, "tp"), P("tp", None), P(), P(), P(),
         P(None, "tp"), P("tp"), P("tp", None), P()]


def programs(layers: int, tp: int, dp: int = 0):
    """(reference, jitted shard_map program, avals): GPT-2 under Megatron tp, and dp over the
    batch when dp > 0."""
    axes = (("dp", dp), ("tp", tp)) if dp else (("tp", tp),)
    shape = tuple(n for _, n in axes)
    mesh = jax.make_mesh(shape, tuple(a for a, _ in axes), axis_types=(AxisType.Auto,) * len(axes),
                         devices=jax.devices()[:math.prod(shape)])
    count = len(SHAPES)

    def ref(x, *params):
        for i in range(layers):
            x = block(x, params[i * count:(i + 1) * count], lambda v: v)
        return x

    def body(x, *params):
        for i in range(layers):
            x = block(x, params[i * count:(i + 1) * count], lambda v: lax.psum(v, "tp"))
        return x

    x_spec = P("dp") if dp else P()
    specs = (x_spec,) + tuple(SPECS) * layers
    sharded = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=specs, out_specs=x_spec))
    shapes = [(max(dp, 1) * BATCH, SEQ, HIDDEN)] + SHAPES * layers
    avals = [jax.ShapeDtypeStruct(s, jnp.float32, sharding=NamedSharding(mesh, spec))
             for s, spec in zip(shapes, specs)]
    return ref, sharded, avals


def measure(layers: int, tp: int, compile_xla: bool) -> dict:
    from entangle_mlir.analysis.instance.checker import DEFAULT_CHECKER
    from entangle_mlir.driver import check_texts
    from entangle_mlir.jax import lower_pair

    ref, sharded, avals = programs(layers, tp)
    ref_text, sharded_text = lower_pair(ref, sharded, *avals)
    DEFAULT_CHECKER.clear()  # every measurement starts cold: no proof reused from another run
    start = time.perf_counter()
    report = check_texts(ref_text, sharded_text)
    seconds = time.perf_counter() - start
    assert report.proven, report.render_text()
    row = {"layers": layers, "tp": tp, "ops": report.stats.get("ops"), "check_s": seconds,
           "z3": report.stats.get("rule_instances", {}).get("proved", 0)}
    if compile_xla:
        start = time.perf_counter()
        sharded.lower(*avals).compile()
        row["xla_compile_s"] = time.perf_counter() - start
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--tp", type=int, nargs="+", default=[2, 4, 8])
    parser.add_argument("--no-xla", action="store_true", help="skip timing XLA's compile")
    args = parser.parse_args()
    rows = []
    print(f"{'layers':>6} {'tp':>3} {'ops':>6} {'check s':>8} {'z3 inst':>7} {'xla s':>7}")
    for layers in args.layers:
        for tp in args.tp:
            row = measure(layers, tp, not args.no_xla)
            rows.append(row)
            xla = f"{row['xla_compile_s']:7.2f}" if "xla_compile_s" in row else "      -"
            print(f"{layers:>6} {tp:>3} {row['ops']:>6} {row['check_s']:8.3f} {row['z3']:>7} "
                  f"{xla}", flush=True)
    by = {(r["layers"], r["tp"]): r for r in rows}
    top = max(args.layers)
    if (top, 8) in by and (top, 2) in by:
        print(f"t(tp 8) / t(tp 2) at {top} layers: "
              f"{by[(top, 8)]['check_s'] / by[(top, 2)]['check_s']:.2f}")
    if (8, 8) in by and (32, 8) in by:
        print(f"t(32 layers) / t(8 layers) at tp 8: "
              f"{by[(32, 8)]['check_s'] / by[(8, 8)]['check_s']:.2f}")
    for r in rows:
        if "xla_compile_s" in r:
            print(f"layers {r['layers']} tp {r['tp']}: check / XLA compile = "
                  f"{r['check_s'] / r['xla_compile_s']:.2f}")
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"peak RSS of this process (includes jax): {peak:.0f} MiB", file=sys.stderr)


if __name__ == "__main__":
    main()
