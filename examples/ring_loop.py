"""Ring attention forward in a `lax.fori_loop` over the cp ring (issue 19), with its unsharded
reference and its nearest wrong twins: the programs `normalize/ring_fold.py` folds by the
loop's invariant, at any ring length.

Queries, keys and values (batch 1, `S_L` tokens a device, `H` heads of `D`) are split over the
sequence; each step scores the local queries against the K block held (causal mask from the
block's positions), updates an online softmax (running max, rescaled denominator and
accumulator) and passes K and V to the next device. The twins (`BUGS`): the blocks passed the
other way round, one trip short, the key block index off by one, the accumulators rescaled by
exp(m_new - m_old), the weighted values rescaled by another row's max (a reshape where the
transpose belongs), the denominator never rescaled.

    python -m examples.ring_loop --write-lit lit_tests/regressions/Inputs   # cp 32, a twin
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

S_L, H, D = 2, 2, 2
SPEC = P(None, "cp")
BUGS = ("direction", "short", "index", "rescale", "rows", "unscaled")
REPO = Path(__file__).resolve().parents[1]


def reference(q, k, v):
    """Causal attention over the whole sequence."""
    pos = jnp.arange(q.shape[1])
    scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / jnp.sqrt(jnp.float32(D))
    scores = jnp.where(pos[:, None] >= pos[None, :], scores, -jnp.inf)
    return jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(scores, axis=-1), v)


def ring(bug: str = ""):
    """The shard_map body: causal ring attention over 'cp' in a fori_loop (examples/real's
    `ring_attention` with `Par(ring="loop")`), or its twin with `bug`."""
    def body(q, k, v):
        n, me = lax.axis_size("cp"), lax.axis_index("cp")
        s_l = k.shape[1]
        q_pos = me * s_l + jnp.arange(s_l)
        perm = [(i, (i + (-1 if bug == "direction" else 1)) % n) for i in range(n)]
        b, _, h, d = q.shape

        def step(i, carry):
            o, m, den, kb, vb = carry
            src = (me - i + (1 if bug == "index" else 0)) % n
            k_pos = src * s_l + jnp.arange(s_l)
            scores = jnp.einsum("bqhd,bkhd->bhqk", q, kb) / jnp.sqrt(jnp.float32(d))
            scores = jnp.where(q_pos[:, None] >= k_pos[None, :], scores, -jnp.inf)
            m_new = jnp.maximum(m, jnp.max(scores, axis=-1))
            p = jnp.exp(scores - m_new[..., None])
            corr = jnp.exp(m_new - m) if bug == "rescale" else jnp.exp(m - m_new)
            den = (den if bug == "unscaled" else den * corr) + jnp.sum(p, axis=-1)
            rows = corr.reshape(b, s_l, h) if bug == "rows" else jnp.swapaxes(corr, 1, 2)
            o = o * rows[..., None] + jnp.einsum("bhqk,bkhd->bqhd", p, vb)
            return o, m_new, den, lax.ppermute(kb, "cp", perm), lax.ppermute(vb, "cp", perm)

        init = (jnp.zeros(q.shape, q.dtype), jnp.full((b, h, s_l), -jnp.inf, q.dtype),
                jnp.zeros((b, h, s_l), q.dtype), k, v)
        o, _, den, _, _ = lax.fori_loop(0, n - 1 if bug == "short" else n, step, init)
        return o / jnp.swapaxes(den, 1, 2)[..., None]
    return body


def inputs(n: int, seed: int = 0) -> tuple[np.ndarray, ...]:
    """q, k, v of a ring of n devices."""
    rng = np.random.default_rng(seed)
    return tuple(rng.standard_normal((1, n * S_L, H, D)).astype(np.float32) for _ in range(3))


def sharded(n: int, bug: str = ""):
    """The jitted shard_map program on a mesh ('cp', n) (n host devices needed)."""
    mesh = jax.make_mesh((n,), ("cp",), axis_types=(AxisType.Auto,))
    fn = jax.jit(jax.shard_map(ring(bug), mesh=mesh, in_specs=(SPEC,) * 3, out_specs=SPEC,
                               check_vma=False))
    return fn, NamedSharding(mesh, SPEC)


def run(n: int, bug: str = "") -> tuple[np.ndarray, np.ndarray]:
    """(reference output, sharded output) on the same random inputs, executed."""
    fn, sharding = sharded(n, bug)
    args = inputs(n)
    return (np.asarray(jax.jit(reference)(*args)),
            np.asarray(fn(*(jax.device_put(a, sharding) for a in args))))


def lower(n: int, bug: str = "") -> tuple[str, str]:
    """(reference text, sharded text), file names relative to the repo root."""
    from entangle_mlir.jax import lower_pair  # lazy: only the lowering needs it

    fn, sharding = sharded(n, bug)
    avals = [jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=sharding) for a in inputs(n)]
    ref, text = lower_pair(reference, fn, *avals)
    root = f"{REPO}{os.sep}"
    return ref.replace(root, ""), text.replace(root, "")


def write_lit(directory: Path, n: int = 32) -> None:
    """The lit regression's inputs: the ring of n devices and its wrong-direction twin."""
    ref, text = lower(n)
    (directory / f"ring_attention_loop_{n}.ref.mlir").write_text(ref)
    (directory / f"ring_attention_loop_{n}.sharded.mlir").write_text(text)
    _, twin = lower(n, "direction")
    (directory / f"ring_attention_loop_{n}_backwards.sharded.mlir").write_text(twin)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write-lit", metavar="DIR", required=True)
    parser.add_argument("--cp", type=int, default=32)
    args = parser.parse_args(argv)
    if "--xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
        # Read when jax first makes its CPU backend, which has not happened yet.
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                                   f" --xla_force_host_platform_device_count={args.cp}").strip()
    write_lit(Path(args.write_lit), args.cp)
    return 0


if __name__ == "__main__":
    sys.exit(main())
