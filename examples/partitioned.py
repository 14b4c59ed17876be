"""Functions partitioned by XLA's SPMD partitioner (jit with shardings), checked by entangle.

Every case is a plain jax.numpy function, its argument shapes and shardings on a 1-D or 2-D mesh
of `AxisType.Auto` axes (up to 8 CPU devices), and optionally output shardings or sharding
constraints inside the function. `check_partitioned` lowers the function unsharded as the
reference, takes XLA's after-spmd-partitioning program and proves it refines the reference.

    XLA_FLAGS=--xla_force_host_platform_device_count=8 python -m examples.partitioned [NAME...]

prints the verdict and time of every case (or of those whose name contains one of NAME).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from jax.sharding import AxisType, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

MESHES = {
    "x4": ((4,), ("x",)),
    "x8": ((8,), ("x",)),
    "x2": ((2,), ("x",)),
    "dp2_tp4": ((2, 4), ("dp", "tp")),
    "dp4_tp2": ((4, 2), ("dp", "tp")),
    "dp2_tp2": ((2, 2), ("dp", "tp")),
}


def mesh(name: str):
    shape, axes = MESHES[name]
    return jax.make_mesh(shape, axes, axis_types=(AxisType.Auto,) * len(axes))


@dataclass
class Case:
    """One jitted function to partition: `args` are (shape, PartitionSpec[, dtype])."""

    name: str
    fn: Callable
    mesh: str
    args: list
    out: object = None          # a PartitionSpec, a tuple of them, or None (XLA chooses)
    what: str = ""
    tags: tuple[str, ...] = field(default_factory=tuple)

    def avals(self):
        m = mesh(self.mesh)
        out = []
        for arg in self.args:
            shape, spec, *rest = arg
            dtype = rest[0] if rest else jnp.float32
            out.append(jax.ShapeDtypeStruct(shape, dtype, sharding=NamedSharding(m, spec)))
        return out

    def out_shardings(self):
        if self.out is None:
            return None
        m = mesh(self.mesh)
        if isinstance(self.out, tuple) and not isinstance(self.out, P):
            return tuple(NamedSharding(m, p) for p in self.out)
        return NamedSharding(m, self.out)


def constrain(x, *spec):
    """`with_sharding_constraint` on the ambient mesh given by `use_mesh` in `run`."""
    return jax.lax.with_sharding_constraint(x, P(*spec))


# ----- the functions ----------------------------------------------------------------------------

def matmul(x, w):
    return x @ w


def mlp(x, w1, b1, w2, b2):
    return jax.nn.gelu(x @ w1 + b1) @ w2 + b2


def attention(x, wq, wk, wv, wo):
    """Multi-head self-attention, 4 heads of 8; heads split over tp by the weights."""
    b, s, d = x.shape
    q = (x @ wq).reshape(b, s, 4, 8)
    k = (x @ wk).reshape(b, s, 4, 8)
    v = (x @ wv).reshape(b, s, 4, 8)
    scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) * (8 ** -0.5)
    probs = jax.nn.softmax(scores, axis=-1)
    out = jnp.einsum("bhqk,bkhd->bqhd", probs, v).reshape(b, s, d)
    return out @ wo


def layernorm(x, g, b):
    mean = x.mean(axis=-1, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=-1, keepdims=True)
    return (x - mean) * jax.lax.rsqrt(var + 1e-5) * g + b


def reduce_sum(x):
    return x.sum(axis=1)


def reduce_max(x):
    return x.max(axis=0)


def reduce_mean(x):
    return x.mean()


def transpose(x):
    return x.T


def reshape_split(x):
    return x.reshape(8, 4, 16)


def reshape_merge(x):
    return x.reshape(32, 4)


def roll(x):
    return jnp.roll(x, 1, axis=0)


def shift(x):
    """x[i-1] along the sharded dim, zero at the start (a halo exchange)."""
    return jnp.concatenate([jnp.zeros_like(x[:1]), x[:-1]], axis=0)


def concat(x, y):
    return jnp.concatenate([x, y], axis=1)


def concat_sharded(x, y):
    return jnp.concatenate([x, y], axis=0)


def slicing(x):
    return x[4:12] * 2.0


def pad(x):
    return jnp.pad(x, ((0, 0), (2, 2)))


def pad_sharded(x):
    return jnp.pad(x, ((2, 2), (0, 0)))


def cumsum(x):
    return jnp.cumsum(x, axis=1)


def take(table, idx):
    return table[idx]


def scatter_add(x, idx, upd):
    return x.at[idx].add(upd)


def uneven_rows(x, w):
    """10 rows on 4 devices: the partitioner pads each shard to 3 rows."""
    rows = constrain(x[:10] * 2.0, "x", None)
    return jnp.tanh(rows @ w)


def uneven_sum(x):
    rows = constrain(x[:10] * 2.0, "x", None)
    return rows.sum(axis=0)


def _block(x, wqkv, wo, w1, w2):
    b, s, d = x.shape
    h = layernorm(x, 1.0, 0.0)
    qkv = h @ wqkv
    q, k, v = jnp.split(qkv, 3, axis=-1)
    q, k, v = (t.reshape(b, s, 4, d // 4) for t in (q, k, v))
    scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) * (d / 4) ** -0.5
    att = jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(scores, axis=-1), v).reshape(b, s, d)
    x = x + att @ wo
    h = layernorm(x, 1.0, 0.0)
    return x + jax.nn.gelu(h @ w1) @ w2


def transformer2(x, wqkv1, wo1, w11, w21, wqkv2, wo2, w12, w22):
    x = _block(x, wqkv1, wo1, w11, w21)
    return _block(x, wqkv2, wo2, w12, w22)


def mlp_loss(x, w1, w2):
    return jnp.mean((jax.nn.gelu(x @ w1) @ w2) ** 2)


def mlp_grad(x, w1, w2):
    return jax.grad(mlp_loss, argnums=(1, 2))(x, w1, w2)


def constrained_mlp(x, w1, w2):
    h = constrain(jnp.tanh(x @ w1), None, "x")
    return constrain(h @ w2, None, None)


R = P()
CASES: list[Case] = [
    # matmuls with every operand sharding
    Case("matmul_lhs_rows", matmul, "x4", [((16, 8), P("x", None)), ((8, 12), R)], P("x", None)),
    Case("matmul_rhs_cols", matmul, "x4", [((16, 8), R), ((8, 12), P(None, "x"))],
         P(None, "x")),
    Case("matmul_contracting", matmul, "x4", [((16, 8), P(None, "x")), ((8, 12), P("x", None))],
         R),
    Case("matmul_contracting_scatter", matmul, "x4",
         [((16, 8), P(None, "x")), ((8, 12), P("x", None))], P("x", None)),
    Case("matmul_lhs_cols_only", matmul, "x4", [((16, 8), P(None, "x")), ((8, 12), R)], R),
    Case("matmul_2d_rows_contract", matmul, "dp2_tp4",
         [((8, 16), P("dp", "tp")), ((16, 32), P("tp", None))], P("dp", None)),
    Case("matmul_2d_out", matmul, "dp2_tp4", [((8, 16), P("dp", None)), ((16, 32), P(None, "tp"))],
         P("dp", "tp")),
    Case("matmul_both_rows", matmul, "x8", [((16, 16), P("x", None)), ((16, 8), P("x", None))],
         P("x", None)),
    # models
    Case("mlp_megatron", mlp, "x4",
         [((4, 8, 16), R), ((16, 32), P(None, "x")), ((32,), P("x")), ((32, 16), P("x", None)),
          ((16,), R)], R),
    Case("mlp_dp_tp", mlp, "dp2_tp4",
         [((4, 8, 16), P("dp")), ((16, 32), P(None, "tp")), ((32,), P("tp")),
          ((32, 16), P("tp", None)), ((16,), R)], P("dp")),
    Case("attention_heads", attention, "x4",
         [((2, 8, 32), R), ((32, 32), P(None, "x")), ((32, 32), P(None, "x")),
          ((32, 32), P(None, "x")), ((32, 32), P("x", None))], R),
    Case("layernorm_hidden", layernorm, "x4",
         [((4, 8, 32), P(None, None, "x")), ((32,), P("x")), ((32,), P("x"))],
         P(None, None, "x")),
    # reductions
    Case("sum_sharded_dim", reduce_sum, "x4", [((8, 16), P(None, "x"))], R),
    Case("max_sharded_dim", reduce_max, "dp2_tp4", [((16, 8), P("tp", "dp"))], P("dp")),
    Case("mean_all", reduce_mean, "dp2_tp4", [((8, 16), P("dp", "tp"))], R),
    # data movement
    Case("transpose_sharded", transpose, "dp2_tp4", [((8, 16), P("dp", "tp"))], P("tp", "dp")),
    Case("reshape_split_sharded", reshape_split, "x4", [((32, 16), P("x", None))],
         P("x", None, None)),
    Case("reshape_merge_sharded", reshape_merge, "x4", [((8, 4, 4), P("x", None, None))],
         P("x", None)),
    Case("roll_sharded", roll, "x4", [((16, 4), P("x", None))], P("x", None)),
    Case("shift_sharded", shift, "x4", [((16, 4), P("x", None))], P("x", None)),
    Case("concat_unsharded_dim", concat, "x4", [((16, 4), P("x", None)), ((16, 6), P("x", None))],
         P("x", None)),
    Case("concat_sharded_dim", concat_sharded, "x4",
         [((8, 4), P("x", None)), ((8, 4), P("x", None))], P("x", None)),
    Case("slice_sharded", slicing, "x4", [((16, 4), P("x", None))], P("x", None)),
    Case("pad_unsharded_dim", pad, "x4", [((16, 4), P("x", None))], P("x", None)),
    Case("pad_sharded_dim", pad_sharded, "x4", [((16, 4), P("x", None))], P("x", None)),
    Case("cumsum_unsharded_dim", cumsum, "x4", [((16, 8), P("x", None))], P("x", None)),
    Case("cumsum_sharded_dim", cumsum, "x4", [((8, 16), P(None, "x"))], P(None, "x")),
    # gather / scatter
    Case("take_sharded_table", take, "x4", [((16, 8), P("x", None)), ((6,), R, jnp.int32)], R),
    Case("take_sharded_indices", take, "x4", [((16, 8), R), ((8,), P("x"), jnp.int32)],
         P("x", None)),
    Case("scatter_add", scatter_add, "x4",
         [((16, 8), P("x", None)), ((6,), R, jnp.int32), ((6, 8), R)], P("x", None)),
    # uneven shapes
    Case("uneven_rows", uneven_rows, "x4", [((12, 8), P("x", None)), ((8, 6), R)], R),
    Case("uneven_sum", uneven_sum, "x4", [((12, 8), P("x", None))], R),
    # a 2-layer transformer on dp x tp, a backward pass, sharding constraints
    Case("transformer2_dp_tp", transformer2, "dp2_tp4",
         [((4, 8, 32), P("dp")),
          ((32, 96), P(None, "tp")), ((32, 32), P("tp", None)), ((32, 64), P(None, "tp")),
          ((64, 32), P("tp", None)),
          ((32, 96), P(None, "tp")), ((32, 32), P("tp", None)), ((32, 64), P(None, "tp")),
          ((64, 32), P("tp", None))], P("dp")),
    Case("mlp_backward", mlp_grad, "dp2_tp4",
         [((8, 16), P("dp", None)), ((16, 32), P(None, "tp")), ((32, 16), P("tp", None))],
         (P(None, "tp"), P("tp", None))),
    Case("constrained_mlp", constrained_mlp, "x4", [((8, 16), P("x", None)), ((16, 32), R),
                                                    ((32, 8), R)], None),
]


def run(case: Case, verify_rules: bool = True):
    from entangle_mlir.jax import check_partitioned

    with jax.set_mesh(mesh(case.mesh)):
        return check_partitioned(case.fn, *case.avals(), out_shardings=case.out_shardings(),
                                 verify_rules=verify_rules)


def lower(case: Case) -> tuple[str, bytes]:
    from entangle_mlir.jax import lower_partitioned

    with jax.set_mesh(mesh(case.mesh)):
        return lower_partitioned(case.fn, *case.avals(), out_shardings=case.out_shardings())


def main(argv: list[str]) -> int:
    import time

    failed = 0
    for case in CASES:
        if argv and not any(a in case.name for a in argv):
            continue
        start = time.perf_counter()
        report = run(case)
        seconds = time.perf_counter() - start
        failed += not report.proven
        print(f"{case.name:32s} {case.mesh:8s} {report.verdict:11s} {seconds:6.2f}s  "
              f"check {report.stats.get('seconds', 0):.3f}s")
        if not report.proven:
            print("    " + report.render_text().replace("\n", "\n    "))
    return 1 if failed else 0


if __name__ == "__main__":
    import sys

    sys.exit(main(sys.argv[1:]))
