"""GPipe pipelines in a `fori_loop`, checked without unrolling (issue 19): the time of a check
as the number of micro-batches grows, and the program generator the loop tests share.

    python benchmarks/pipeline.py            # 4 / 8 / 16 stages x 8 / 32 / 128 micro-batches
    python benchmarks/pipeline.py --quick    # 4 / 8 stages x 8 / 32 micro-batches, depth 1 / 2 / 4
    python benchmarks/pipeline.py --width 64 # narrower blocks (GPT-2's 768 by default)
    python benchmarks/pipeline.py --write-lit lit_tests/regressions/Inputs

The program (`gpipe`): stage s holds block s of a stack of MLP blocks (`x + gelu(x W1 + b1)
W2 + b2`, the weights stacked and split over the `stages` axis); at step i stage 0 takes
micro-batch i, every stage applies its block and hands its activations to the next stage
(`ppermute`), and the last stage writes micro-batch i - (n - 1) of the outputs, masked during
the bubble; the outputs are summed out of the last stage. The loop runs M + n - 1 steps. The
reference applies the blocks to the whole batch.

Each row: the seconds of `entangle check` (both walks, the general tier with every Z3 rule
instance check), how the loop was read (by invariant: its body expanded once), and for each
stage count the ratio t(128) / t(8) of the largest to the smallest micro-batch count: at most
linear (16) is the target, and under 10 s for 16 stages x 128 micro-batches. Then loops
nested 1 to 6 deep, 3 trips each: the ops expanded grow linearly in the depth (each body
expanded once at its symbolic step, and again in the outermost loop's base trips), where
unrolling would copy the innermost body 3^depth times.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from functools import partial
from pathlib import Path

if __name__ == "__main__":
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                               + " --xla_force_host_platform_device_count=32").strip()

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P
from jaxlib.mlir import ir

from entangle_mlir.driver import check_texts
from entangle_mlir.jax import lower_pair
from entangle_mlir.mlir.ir import context, parse_module

AXIS = "stages"


def block(x, w1, b1, w2, b2):
    """One stage: an MLP block with its residual."""
    return x + jax.nn.gelu(x @ w1 + b1) @ w2 + b2


def reference(w1, b1, w2, b2, xs):
    """Every block applied to the whole batch (micro-batches stacked on dim 0)."""
    x = xs
    for s in range(w1.shape[0]):
        x = block(x, w1[s], b1[s], w2[s], b2[s])
    return x


def gpipe(direction: int = 1, slot_offset: int = 0, masked: bool = True):
    """The GPipe forward as a shard_map body over `AXIS`. Near misses: `direction` -1 hands
    the activations to the previous stage, `slot_offset` writes micro-batch i - (n - 1) +
    offset at step i, `masked` False writes the outputs at every step (the bubble's too, into
    slots taken modulo M)."""
    def body(w1, b1, w2, b2, xs):
        n = lax.axis_size(AXIS)
        stage = lax.axis_index(AXIS)
        m = xs.shape[0]

        def step(i, carry):
            state, out = carry
            feed = lax.dynamic_index_in_dim(xs, jnp.minimum(i, m - 1), keepdims=False)
            state = jnp.where(stage == 0, feed, state)
            state = block(state, w1[0], b1[0], w2[0], b2[0])
            done = i - (n - 1) + slot_offset
            if masked:
                slot = jnp.clip(done, 0, m - 1)
                write = (stage == n - 1) & (done >= 0)
            else:
                slot = done % m
                write = stage == n - 1
            kept = lax.dynamic_index_in_dim(out, slot, keepdims=False)
            out = lax.dynamic_update_index_in_dim(out, jnp.where(write, state, kept), slot, 0)
            state = lax.ppermute(state, AXIS, [(k, (k + direction) % n) for k in range(n)])
            return state, out

        init = (jnp.zeros(xs.shape[1:], xs.dtype), jnp.zeros_like(xs))
        _, out = lax.fori_loop(0, m + n - 1, step, init)
        return lax.psum(jnp.where(stage == n - 1, out, 0.0), AXIS)
    return body


SPECS = (P(AXIS), P(AXIS), P(AXIS), P(AXIS), P())


def shapes(stages: int, micro: int, width: int, rows: int = 4) -> list[tuple[int, ...]]:
    """The arguments' shapes: stacked block weights, then the micro-batches."""
    hidden = 4 * width
    return [(stages, width, hidden), (stages, hidden), (stages, hidden, width),
            (stages, width), (micro, rows, width)]


def mesh_of(stages: int):
    return jax.make_mesh((stages,), (AXIS,), axis_types=(AxisType.Explicit,))


def sharded(body, stages: int):
    """The shard_map of `body` over a mesh of `stages` devices, jitted."""
    return jax.jit(jax.shard_map(body, mesh=mesh_of(stages), in_specs=SPECS, out_specs=P(),
                                 check_vma=False))


def lowered(body, stages: int, micro: int, width: int, rows: int = 4) -> tuple[str, str]:
    """(reference, sharded) StableHLO of a pipeline (no devices run)."""
    mesh = mesh_of(stages)
    avals = [jax.ShapeDtypeStruct(s, jnp.float32, sharding=NamedSharding(mesh, p))
             for s, p in zip(shapes(stages, micro, width, rows), SPECS)]
    return lower_pair(reference, sharded(body, stages), *avals)


# ----- a ring: the all-gather collective matmul, rolled ---------------------------------------

RING = "ring"


def matmul_reference(a, w):
    return a @ w


def ring_matmul(to: int = -1):
    """A[B, D_ring] @ W[D, F] (scaling book, part 10): multiply the local chunk of A by the
    matching rows of W while A's chunks travel around the ring, one chunk a step (`to` -1:
    each device passes its chunk to the previous one, so at step i it holds chunk me + i;
    +1 is the near miss rotating the other way)."""
    def body(a, w):
        n, me, chunk = lax.axis_size(RING), lax.axis_index(RING), a.shape[1]

        def step(i, carry):
            acc, a = carry
            rows = lax.dynamic_slice_in_dim(w, (me + i) % n * chunk, chunk)
            a_next = lax.ppermute(a, RING, [(j, (j + to) % n) for j in range(n)])
            return acc + a @ rows, a_next

        acc, _ = lax.fori_loop(0, n, step, (jnp.zeros((a.shape[0], w.shape[1]), a.dtype), a))
        return acc
    return body


def ring_lowered(body, devices: int, rows: int = 4, chunk: int = 2, cols: int = 4
                 ) -> tuple[str, str]:
    """(reference, sharded) StableHLO of a ring over `devices` devices (no devices run)."""
    mesh = jax.make_mesh((devices,), (RING,), axis_types=(AxisType.Explicit,))
    specs = (P(None, RING), P())
    shard = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=specs, out_specs=P(),
                                  check_vma=False))
    avals = [jax.ShapeDtypeStruct(s, jnp.float32, sharding=NamedSharding(mesh, p))
             for s, p in zip([(rows, chunk * devices), (chunk * devices, cols)], specs)]
    return lower_pair(matmul_reference, shard, *avals)


# ----- nested loops ------------------------------------------------------------------------------

def nested_reference(x, *, depth: int, trips: int):
    return trips ** depth * jnp.tanh(x)


def nested_loops(depth: int, trips: int = 3):
    """`depth` fori_loops nested in one another, `trips` each, the innermost adding tanh(x):
    unrolled, trips^depth copies of the innermost body; by invariant, each body once."""
    def body(x):
        def level(k, acc):
            if k == depth:
                return acc + jnp.tanh(x)
            return lax.fori_loop(0, trips, lambda i, a: level(k + 1, a), acc)
        return lax.pmean(level(0, jnp.zeros_like(x)), AXIS)
    return body


def nested_lowered(depth: int, trips: int = 3, devices: int = 4) -> tuple[str, str]:
    mesh = mesh_of(devices)
    shard = jax.jit(jax.shard_map(nested_loops(depth, trips), mesh=mesh, in_specs=(P(),),
                                  out_specs=P(), check_vma=False))
    aval = jax.ShapeDtypeStruct((8, 16), jnp.float32, sharding=NamedSharding(mesh, P()))
    return lower_pair(partial(nested_reference, depth=depth, trips=trips), shard, aval)


def combined(ref_text: str, sharded_text: str) -> str:
    """One module holding both programs, as entangle-opt reads a pair: the sharded module
    with the reference's `main` moved in as `@ref`, and `entangle.refines = @ref` on the
    sharded `main` (the reference has no other function)."""
    with context():
        ref, sharded_module = parse_module(ref_text), parse_module(sharded_text)
        (ref_main,) = [op for op in ref.body.operations if op.operation.name == "func.func"]
        main = next(op for op in sharded_module.body.operations
                    if op.operation.name == "func.func"
                    and str(op.operation.attributes["sym_name"]) == '"main"')
        main.operation.attributes["entangle.refines"] = ir.FlatSymbolRefAttr.get("ref")
        ref_main.operation.attributes["sym_name"] = ir.StringAttr.get("ref")
        ref_main.operation.move_before(main.operation)
        return sharded_module.operation.get_asm(enable_debug_info=True)


def write_lit_inputs(folder: Path) -> None:
    """The lit regressions' inputs (lit_tests/regressions/Inputs): a GPipe forward of 4
    stages x 16 micro-batches (19 steps, past the unroller's 16) and its twin handing the
    activations to the previous stage; a ring over 32 devices and its twin rotating the
    other way. The repository's path is stripped from the locations."""
    def save(name: str, text: str) -> None:
        (folder / name).write_text(text.replace(f"{REPO}/", ""))

    ref, sharded_text = lowered(gpipe(), 4, 16, 8, rows=2)
    save("gpipe_loop.ref.mlir", ref)
    save("gpipe_loop.sharded.mlir", sharded_text)
    save("gpipe_loop.combined.mlir", combined(ref, sharded_text))
    save("gpipe_loop_backwards.sharded.mlir", lowered(gpipe(direction=-1), 4, 16, 8, rows=2)[1])
    ref, sharded_text = ring_lowered(ring_matmul(), 32)
    save("ring_loop_32.ref.mlir", ref)
    save("ring_loop_32.sharded.mlir", sharded_text)
    save("ring_loop_32_shift_right.sharded.mlir", ring_lowered(ring_matmul(to=+1), 32)[1])


def _row(stages: int, micro: int, width: int) -> float:
    ref_text, sharded_text = lowered(gpipe(), stages, micro, width)
    start = time.perf_counter()
    report = check_texts(ref_text, sharded_text)
    seconds = time.perf_counter() - start
    general = report.stats.get("general_tier", {})
    loops = general.get("loops", {})
    checks = general.get("rule_instances", {})
    print(f"{stages:>6} {micro:>6} {stages + micro - 1:>6} {seconds:>8.2f}  "
          f"{'proven' if report.proven else 'NOT PROVEN':<10} "
          f"{loops.get('by_invariant', 0):>4} {checks.get('proved', 0):>6}", flush=True)
    if not report.proven:
        print("   ", general.get("reason", report.render_text()[:400]))
    return seconds


def _nested_row(depth: int) -> float:
    ref_text, sharded_text = nested_lowered(depth)
    start = time.perf_counter()
    report = check_texts(ref_text, sharded_text)
    seconds = time.perf_counter() - start
    general = report.stats.get("general_tier", {})
    print(f"{depth:>6} {3 ** depth:>8} {seconds:>8.2f}  "
          f"{'proven' if report.proven else 'NOT PROVEN':<10} {general.get('ops', 0):>6}",
          flush=True)
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--width", type=int, default=768)
    parser.add_argument("--write-lit", type=Path, default=None, metavar="DIR",
                        help="write the lit regressions' inputs into DIR and stop")
    args = parser.parse_args()
    if args.write_lit is not None:
        write_lit_inputs(args.write_lit)
        return
    stage_counts = (4, 8) if args.quick else (4, 8, 16)
    micro_counts = (8, 32) if args.quick else (8, 32, 128)
    print(f"GPipe forward, MLP blocks of width {args.width} (hidden {4 * args.width})")
    print("stages  micro  steps  seconds  verdict    loops  Z3 checks")
    _row(2, 4, args.width)  # warm-up: imports, jax, z3
    for stages in stage_counts:
        times = [_row(stages, micro, args.width) for micro in micro_counts]
        print(f"  {stages} stages: t({micro_counts[-1]}) / t({micro_counts[0]}) = "
              f"{times[-1] / times[0]:.2f} (micro-batches x{micro_counts[-1] // micro_counts[0]})")
    print("\nNested fori_loops of 3 trips each (the innermost adds tanh(x)), 4 devices")
    print(" depth  unrolled  seconds  verdict     ops expanded")
    for depth in (1, 2, 4) if args.quick else (1, 2, 3, 4, 5, 6):
        _nested_row(depth)


if __name__ == "__main__":
    main()
