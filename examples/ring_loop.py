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
    python -m examples.ring_loop --write-lit lit_tests/regressions/Inputs --grad   # training
"""

from __future__ import annotations

import argparse
import os
import sys
from functools import partial
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


def ring(bug: str = "", unroll: bool = False):
    """The shard_map body: causal ring attention over 'cp' in a fori_loop (examples/real's
    `ring_attention` with `Par(ring="loop")`), or its twin with `bug`; `unroll`: the ring a
    Python loop over the same steps (no `while`)."""
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
        trips = n - 1 if bug == "short" else n
        if unroll:
            carry = init
            for i in range(trips):
                carry = step(i, carry)
            o, _, den, _, _ = carry
        else:
            o, _, den, _, _ = lax.fori_loop(0, trips, step, init)
        return o / jnp.swapaxes(den, 1, 2)[..., None]
    return body


def rows_reference(q, k, v):
    """Causal attention over rows (tokens) of q, k, v (one head)."""
    pos = jnp.arange(q.shape[0])
    scores = jnp.where(pos[:, None] >= pos[None, :], q @ k.T, -jnp.inf)
    return jax.nn.softmax(scores, axis=-1) @ v


def ring_rows(bug: str = ""):
    """The ring's loop on rows of one head, the running max differentiated (its gradient
    keeps the max's cotangent): `examples/real/repro.py`'s `ring_attention_loop`, K/V passed
    the other way with `bug` "direction"."""
    from examples.real.repro import ring_attention_loop

    return partial(ring_attention_loop, hop=-1 if bug == "direction" else 1)


def grad_reference(q, k, v, w):
    """The gradients of `sum(rows_reference(q, k, v) * w)` with respect to q, k and v."""
    return jax.grad(lambda q, k, v: jnp.sum(rows_reference(q, k, v) * w),
                    argnums=(0, 1, 2))(q, k, v)


def ring_grad(bug: str = ""):
    """The shard_map body of ring attention training: jax's gradient of `ring_rows(bug)`'s
    loop, a pair of loops (the forward storing each step's residuals at its counter's row,
    the backward reading them at n - 1 - i and passing dK and dV back around the ring) that
    `normalize/ring_pair.py` folds by their invariant."""
    forward = ring_rows(bug)

    def body(q, k, v, w):
        return jax.grad(lambda q, k, v: jnp.sum(forward(q, k, v) * w), argnums=(0, 1, 2))(
            q, k, v)
    return body


GRAD_SPEC = P("cp", None)
"""q, k, v, w and the gradients of `ring_grad`: rows split over 'cp'."""


def grad_inputs(n: int, seed: int = 0) -> tuple[np.ndarray, ...]:
    """q, k, v and the output's weights w of a ring of n devices (`S_L` rows a device,
    `D` columns)."""
    rng = np.random.default_rng(seed)
    return tuple(rng.standard_normal((n * S_L, 2 * D)).astype(np.float32) for _ in range(4))


def matmul_reference(x, w):
    return x @ w


def allgather_matmul(bug: str = ""):
    """The shard_map body of an all-gather collective matmul in a fori_loop: x's rows split
    over 'cp', w's columns; each step multiplies the x block held by the local columns of w,
    writes it at the block's rows of the output and passes the block on (each device ends
    with x @ w's columns it holds). Twins (`MATMUL_BUGS`): the blocks passed the other way,
    one trip short, the rows written at the block index off by one."""
    def body(x, w):
        n, me, rows = lax.axis_size("cp"), lax.axis_index("cp"), x.shape[0]
        perm = [(i, (i + (-1 if bug == "direction" else 1)) % n) for i in range(n)]

        def step(i, carry):
            out, xb = carry
            src = (me - i + (1 if bug == "index" else 0)) % n
            out = lax.dynamic_update_slice_in_dim(out, xb @ w, src * rows, axis=0)
            return out, lax.ppermute(xb, "cp", perm)

        out = jnp.zeros((rows * n, w.shape[1]), x.dtype)
        out, _ = lax.fori_loop(0, n - 1 if bug == "short" else n, step, (out, x))
        return out
    return body


MATMUL_BUGS = ("direction", "short", "index")
MATMUL_SPECS = ((P("cp"), P(None, "cp")), P(None, "cp"))
"""(in_specs, out_spec) of the collective matmul."""


def inputs(n: int, seed: int = 0) -> tuple[np.ndarray, ...]:
    """q, k, v of a ring of n devices."""
    rng = np.random.default_rng(seed)
    return tuple(rng.standard_normal((1, n * S_L, H, D)).astype(np.float32) for _ in range(3))


def matmul_inputs(n: int, seed: int = 0) -> tuple[np.ndarray, ...]:
    """x (2 rows a device, 2 columns) and w (2 columns a device) of a ring of n devices."""
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((2 * n, 2)).astype(np.float32),
            rng.standard_normal((2, 2 * n)).astype(np.float32))


def sharded(n: int, bug: str = "", matmul: bool = False, grad: bool = False):
    """The jitted shard_map program (ring attention, its training step with `grad`, or the
    collective matmul) on a mesh ('cp', n) (n host devices needed), and its inputs'
    shardings."""
    mesh = jax.make_mesh((n,), ("cp",), axis_types=(AxisType.Auto,))
    body, (specs, out) = ((allgather_matmul(bug), MATMUL_SPECS) if matmul
                          else (ring_grad(bug), ((GRAD_SPEC,) * 4, (GRAD_SPEC,) * 3)) if grad
                          else (ring(bug), ((SPEC,) * 3, SPEC)))
    fn = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=specs, out_specs=out,
                               check_vma=False))
    return fn, [NamedSharding(mesh, spec) for spec in specs]


def _pair(matmul: bool, grad: bool = False):
    if grad:
        return grad_reference, grad_inputs
    return (matmul_reference, matmul_inputs) if matmul else (reference, inputs)


def run(n: int, bug: str = "", matmul: bool = False, grad: bool = False):
    """(reference output, sharded output) on the same random inputs, executed (tuples of
    the three gradients with `grad`)."""
    fn, shardings = sharded(n, bug, matmul, grad)
    ref_fn, make = _pair(matmul, grad)
    args = make(n)
    got = fn(*(jax.device_put(a, s) for a, s in zip(args, shardings)))
    return jax.tree.map(np.asarray, jax.jit(ref_fn)(*args)), jax.tree.map(np.asarray, got)


def lower(n: int, bug: str = "", matmul: bool = False, grad: bool = False
          ) -> tuple[str, str]:
    """(reference text, sharded text), file names relative to the repo root."""
    from entangle_mlir.jax import lower_pair  # lazy: only the lowering needs it

    fn, shardings = sharded(n, bug, matmul, grad)
    ref_fn, make = _pair(matmul, grad)
    avals = [jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s)
             for a, s in zip(make(n), shardings)]
    ref, text = lower_pair(ref_fn, fn, *avals)
    root = f"{REPO}{os.sep}"
    return ref.replace(root, ""), text.replace(root, "")


def write_lit(directory: Path, n: int = 32, grad: bool = False) -> None:
    """The lit regression's inputs: the ring of n devices (its training step with `grad`)
    and its wrong-direction twin."""
    name = f"ring_attention_loop_{'grad_' if grad else ''}{n}"
    ref, text = lower(n, grad=grad)
    (directory / f"{name}.ref.mlir").write_text(ref)
    (directory / f"{name}.sharded.mlir").write_text(text)
    _, twin = lower(n, "direction", grad=grad)
    (directory / f"{name}_backwards.sharded.mlir").write_text(twin)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write-lit", metavar="DIR", required=True)
    parser.add_argument("--cp", type=int, default=32)
    parser.add_argument("--grad", action="store_true", help="the training step's loops")
    args = parser.parse_args(argv)
    if "--xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
        # Read when jax first makes its CPU backend, which has not happened yet.
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                                   f" --xla_force_host_platform_device_count={args.cp}").strip()
    write_lit(Path(args.write_lit), args.cp, args.grad)
    return 0


if __name__ == "__main__":
    sys.exit(main())
