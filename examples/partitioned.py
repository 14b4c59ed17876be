"""Functions partitioned by XLA's SPMD partitioner (jit with shardings), checked by entangle.

Every case is a plain jax.numpy function, its argument shapes and shardings on a 1-D or 2-D mesh
of `AxisType.Auto` axes (up to 8 CPU devices), and optionally output shardings or sharding
constraints inside the function. `check_partitioned` lowers the function unsharded as the
reference, takes XLA's after-spmd-partitioning program and proves it refines the reference.

    XLA_FLAGS=--xla_force_host_platform_device_count=8 python -m examples.partitioned [NAME...]
    python -m examples.partitioned --mutations
    python -m examples.partitioned --sweep [NAME...]

prints the verdict and time of every case (or of those whose name contains one of NAME), or
runs every mutation (planted partitioner bug) on simulated devices and checks it, or sweeps
generic mutations (drop / retarget collectives, scale constants, swap operands, ...) and fails if
one that changes the numbers is proven.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

import jax
import jax.numpy as jnp
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

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


def attention_div(x, wq, wk, wv, wo):
    """`attention` with the usual `/ jnp.sqrt(d)`: XLA rewrites the division by a constant into a
    multiplication by its float32 reciprocal, which is not exactly the same real number."""
    b, s, d = x.shape
    q, k, v = ((x @ w).reshape(b, s, 4, 8) for w in (wq, wk, wv))
    scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / jnp.sqrt(8.0)
    out = jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(scores, axis=-1), v).reshape(b, s, d)
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


def _attention_block(x, wq, wk, wv, wo, heads=4):
    b, s, d = x.shape
    q, k, v = ((x @ w).reshape(b, s, heads, d // heads) for w in (wq, wk, wv))
    scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) * (d / heads) ** -0.5
    att = jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(scores, axis=-1), v).reshape(b, s, d)
    return att @ wo


def _block(x, wq, wk, wv, wo, w1, w2):
    x = x + _attention_block(layernorm(x, 1.0, 0.0), wq, wk, wv, wo)
    return x + jax.nn.gelu(layernorm(x, 1.0, 0.0) @ w1) @ w2


def transformer2(x, *weights):
    """Two pre-LN transformer layers (attention with 4 heads + GELU MLP)."""
    x = _block(x, *weights[:6])
    return _block(x, *weights[6:])


def fused_qkv_block(x, wqkv, wo):
    """Attention with one fused qkv matmul split in three: with qkv's 96 columns split over 4
    devices the thirds straddle device blocks (the partitioner exchanges halos)."""
    b, s, d = x.shape
    q, k, v = jnp.split(x @ wqkv, 3, axis=-1)
    q, k, v = (t.reshape(b, s, 4, d // 4) for t in (q, k, v))
    scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) * (d / 4) ** -0.5
    att = jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(scores, axis=-1), v).reshape(b, s, d)
    return att @ wo


def mlp_loss(x, w1, w2):
    return jnp.mean((jax.nn.gelu(x @ w1) @ w2) ** 2)


def mlp_grad(x, w1, w2):
    return jax.grad(mlp_loss, argnums=(1, 2))(x, w1, w2)


def embedding(table, ids):
    return table[ids] * 2.0


def scatter_add_cols(x, idx, upd):
    return x.at[idx].add(upd)


def embedding_grad(ids, g):
    """The embedding table's gradient: token gradients added into a zero table."""
    return jnp.zeros((8, g.shape[1]), g.dtype).at[ids].add(g)


def update_slice(x, y):
    return x.at[:, 2:4].set(y)


def softmax(x):
    return jax.nn.softmax(x, axis=-1)


def rmsnorm(x, g):
    return x * jax.lax.rsqrt((x * x).mean(axis=-1, keepdims=True) + 1e-6) * g


def batched_matmul(a, b):
    return jnp.einsum("bij,bjk->bik", a, b)


def layernorm_grad(x, g, b):
    return jax.grad(lambda x, g, b: jnp.sum(jnp.tanh(layernorm(x, g, b))), argnums=(0, 1))(
        x, g, b)


def _row_parallel(x, w):
    return jax.lax.psum(x @ w, "x")


def shard_map_in_jit(x, w):
    """A shard_map (row-parallel matmul with its psum) inside an automatically partitioned jit;
    the reference is the same function lowered without argument shardings."""
    y = jax.shard_map(_row_parallel, in_specs=(P(None, "x"), P("x", None)), out_specs=P())(x, w)
    return jnp.tanh(y) * 2.0


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
    Case("attention_div_sqrt", attention_div, "x4",
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
         [((4, 8, 32), P("dp"))] + [((32, 32), P(None, "tp"))] * 3 + [((32, 32), P("tp", None)),
                                    ((32, 64), P(None, "tp")), ((64, 32), P("tp", None))]
         + [((32, 32), P(None, "tp"))] * 3 + [((32, 32), P("tp", None)),
                                              ((32, 64), P(None, "tp")), ((64, 32), P("tp", None))],
         P("dp")),
    Case("fused_qkv_split", fused_qkv_block, "x4",
         [((2, 8, 32), R), ((32, 96), P(None, "x")), ((32, 32), P("x", None))], R),
    Case("mlp_backward", mlp_grad, "dp2_tp4",
         [((8, 16), P("dp", None)), ((16, 32), P(None, "tp")), ((32, 16), P("tp", None))],
         (P(None, "tp"), P("tp", None))),
    Case("embedding_hidden_split", embedding, "x4",
         [((16, 8), P(None, "x")), ((6,), R, jnp.int32)], P(None, "x")),
    Case("scatter_add_cols", scatter_add_cols, "x4",
         [((16, 8), P(None, "x")), ((6,), R, jnp.int32), ((6, 8), P(None, "x"))], P(None, "x")),
    Case("scatter_add_cols_small", scatter_add_cols, "x2",
         [((8, 4), P(None, "x")), ((3,), R, jnp.int32), ((3, 4), P(None, "x"))], P(None, "x")),
    Case("embedding_grad_tokens", embedding_grad, "x2",
         [((4,), P("x"), jnp.int32), ((4, 2), P("x", None))], R),
    Case("update_slice_rows", update_slice, "x4", [((16, 8), P("x", None)), ((16, 2), P("x", None))],
         P("x", None)),
    Case("softmax_sharded_dim", softmax, "dp2_tp4", [((8, 16), P("dp", "tp"))], P("dp", "tp")),
    Case("rmsnorm_hidden", rmsnorm, "x8", [((4, 32), P(None, "x")), ((32,), P("x"))],
         P(None, "x")),
    Case("batched_matmul_dp_tp", batched_matmul, "dp4_tp2",
         [((4, 8, 16), P("dp", None, "tp")), ((4, 16, 8), P("dp", "tp", None))], P("dp")),
    Case("mlp_x8", mlp, "x8",
         [((4, 8, 16), R), ((16, 32), P(None, "x")), ((32,), P("x")), ((32, 16), P("x", None)),
          ((16,), R)], R),
    Case("layernorm_backward", layernorm_grad, "x4",
         [((4, 32), P(None, "x")), ((32,), P("x")), ((32,), P("x"))],
         (P(None, "x"), P("x"))),
    Case("shard_map_in_jit", shard_map_in_jit, "x4",
         [((16, 8), P(None, "x")), ((8, 12), P("x", None))], R),
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


def random_args(case: Case, seed: int = 0):
    import numpy as np

    rng = np.random.default_rng(seed)
    out = []
    for aval in case.avals():
        if np.issubdtype(aval.dtype, np.integer):
            out.append(rng.integers(-3, 16, aval.shape).astype(aval.dtype))
        else:
            out.append(rng.standard_normal(aval.shape).astype(aval.dtype))
    return out


def max_error(program, case: Case, args) -> float:
    """The largest difference between the per-device results of `program` (run on simulated
    devices) and each device's block of the reference results."""
    import numpy as np

    from entangle_mlir.jax import expected_per_device, run_per_device

    with jax.set_mesh(mesh(case.mesh)):
        want = jax.jit(case.fn)(*args)
    want = [np.asarray(w) for w in (want if isinstance(want, (tuple, list)) else [want])]
    worst = 0.0
    for got, expected in zip(run_per_device(program, *args), expected_per_device(program, want)):
        for g, e in zip(got, expected):
            if g.shape != e.shape:
                return float("inf")
            worst = max(worst, float(np.max(np.abs(g - e), initial=0.0)))
    return worst


def mutation_table() -> int:
    """Every mutation: does it change the numbers (executed), and where is it flagged."""
    from entangle_mlir.driver import check_texts

    cases = {c.name: c for c in CASES}
    for mutation in MUTATIONS:
        case = cases[mutation.case]
        ref, sharded = lower(case)
        text, what = mutated(mutation, sharded)
        args = random_args(case, seed=1)
        before, after = max_error(sharded, case, args), max_error(text, case, args)
        report = check_texts(ref, text, verify_rules=False)
        first = report.diagnostics[0] if report.diagnostics else None
        where = ("at the mutated op" if first and first.loc and first.loc.file == MUTATION_FILE
                 else f"elsewhere ({first.loc if first else 'no diagnostic'})")
        print(f"{mutation.name:28s} {case.name:28s} max |diff| {before:.1e} -> {after:.3g}  "
              f"{report.verdict:10s} {where}")
        print(f"    {what}\n    {first.message if first else ''}")
    return 0


def main(argv: list[str]) -> int:
    import time

    if argv[:1] == ["--mutations"]:
        return mutation_table()
    if argv[:1] == ["--sweep"]:
        return mutation_sweep(argv[1:])
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



# ----- mutations: real partitioner bugs, planted in XLA's output -------------------------------

MUTATION_FILE = "mutation"
"""Mutated ops get the location `"mutation":<line>:1`, so a test can tell where a diagnostic
points (`report.diagnostics[0].loc.file == MUTATION_FILE`)."""


def _ops(module, name: str) -> list:
    """Ops called `name` in the public main, in program order (regions not entered)."""
    from entangle_mlir.mlir.program import public_main

    main = public_main(module, "-")
    return [op.operation for op in main.regions[0].blocks[0].operations
            if op.operation.name == name]


def _mark(op, line: int) -> None:
    from jaxlib.mlir import ir

    op.location = ir.Location.file(MUTATION_FILE, line, 1)


def drop_all_reduce(module, index: int = 0) -> str:
    """The partial sums are never reduced: the all_reduce's users read its operand."""
    op = _ops(module, "stablehlo.all_reduce")[index]
    source = op.operands[0].owner
    _mark(source, 1)
    op.results[0].replace_all_uses_with(op.operands[0])
    op.erase()
    return f"dropped the all_reduce; its input comes from {source.name}"


def all_gather_wrong_dim(module, index: int = 0) -> str:
    """all_gather concatenates along another dim; a reshape restores the expected type."""
    from jaxlib.mlir import ir
    from jaxlib.mlir.dialects import stablehlo

    op = _ops(module, "stablehlo.all_gather")[index]
    old_type = ir.RankedTensorType(op.results[0].type)
    in_type = ir.RankedTensorType(op.operands[0].type)
    dim = ir.IntegerAttr(op.attributes["all_gather_dim"]).value
    wrong = next(d for d in range(in_type.rank) if d != dim)
    factor = old_type.shape[dim] // in_type.shape[dim]
    shape = list(in_type.shape)
    shape[wrong] *= factor
    op.attributes["all_gather_dim"] = ir.IntegerAttr.get(ir.IntegerType.get_signless(64), wrong)
    op.results[0].set_type(ir.RankedTensorType.get(shape, in_type.element_type))
    _mark(op, 2)
    reshape = stablehlo.ReshapeOp(old_type, op.results[0], loc=op.location,
                                  ip=ir.InsertionPoint(_next(op)))
    op.results[0].replace_all_uses_except(reshape.result, reshape.operation)
    return f"all_gather along dim {wrong} instead of {dim} (then reshaped)"


def _next(op):
    """The op after `op` in its block."""
    op = op.operation
    found = False
    for other in op.block.operations:
        if found:
            return other.operation
        if other.operation == op:
            found = True
    raise ValueError("no op after it")


def wrong_replica_groups(module, groups, index: int = 0) -> str:
    """The all_reduce reduces over other device groups."""
    import numpy as np
    from jaxlib.mlir import ir

    op = _ops(module, "stablehlo.all_reduce")[index]
    array = np.array(groups, dtype=np.int64)
    op.attributes["replica_groups"] = ir.DenseIntElementsAttr.get(array)
    _mark(op, 3)
    return f"replica groups {groups}"


def wrong_offset_entry(module, position: int, value: int) -> str:
    """One entry of the offset table indexed by the device id is wrong."""
    import numpy as np
    from jaxlib.mlir import ir

    for op in _ops(module, "stablehlo.dynamic_slice"):
        table = op.operands[0].owner
        if getattr(table, "name", "") != "stablehlo.constant":
            continue
        values = np.array(ir.DenseIntElementsAttr(table.attributes["value"]))
        if values.ndim != 1 or values.size < 2:
            continue
        values = values.copy()
        old = int(values[position])
        values[position] = value
        table.attributes["value"] = ir.DenseIntElementsAttr.get(values.astype(np.int32))
        for user in _users(op):
            for data_slice in _users(user):
                if data_slice.name == "stablehlo.dynamic_slice":
                    _mark(data_slice, 4)
        _mark(table, 4)
        return f"offset table entry {position}: {old} -> {value}"
    raise ValueError("no offset table")


def _users(op) -> list:
    return [use.owner.operation for result in op.results for use in result.uses]


def swap_permute_pairs(module, index: int = 0) -> str:
    """collective_permute sends every block the other way round."""
    import numpy as np
    from jaxlib.mlir import ir

    op = _ops(module, "stablehlo.collective_permute")[index]
    pairs = np.array(ir.DenseIntElementsAttr(op.attributes["source_target_pairs"]))
    op.attributes["source_target_pairs"] = ir.DenseIntElementsAttr.get(
        pairs[:, ::-1].copy().astype(np.int64))
    _mark(op, 5)
    return f"source_target_pairs {pairs.tolist()} reversed"


def max_reducer(module, index: int = 0) -> str:
    """The all_reduce takes the max where it should sum."""
    from jaxlib.mlir import ir
    from jaxlib.mlir.dialects import stablehlo

    op = _ops(module, "stablehlo.all_reduce")[index]
    block = op.regions[0].blocks[0]
    add = next(o.operation for o in block.operations if o.operation.name == "stablehlo.add")
    new = stablehlo.MaxOp(add.operands[0], add.operands[1], loc=add.location,
                          ip=ir.InsertionPoint(add))
    add.results[0].replace_all_uses_with(new.result)
    add.erase()
    _mark(op, 6)
    return "all_reduce with a max reducer"


def slice_before_all_reduce(module, index: int = 0) -> str:
    """Each device slices its own block of the partial sums, then the slices are summed
    (the shape of XLA issue 42481): the all_reduce adds different blocks together."""
    from jaxlib.mlir import ir

    reduce = _ops(module, "stablehlo.all_reduce")[index]
    data_slice = next(u for u in _users(reduce) if u.name == "stablehlo.dynamic_slice")
    moved = reduce.clone(ip=ir.InsertionPoint(_next(data_slice))).operation
    data_slice.operands[0] = reduce.operands[0]
    moved.operands[0] = data_slice.results[0]
    moved.results[0].set_type(data_slice.results[0].type)
    data_slice.results[0].replace_all_uses_except(moved.results[0], moved)
    if not list(reduce.results[0].uses):
        reduce.erase()
    _mark(data_slice, 7)
    _mark(moved, 7)
    return "dynamic_slice moved before the all_reduce"


@dataclass
class Mutation:
    name: str
    case: str
    mutate: Callable
    what: str = ""


MUTATIONS: list[Mutation] = [
    Mutation("dropped_all_reduce", "matmul_contracting", drop_all_reduce,
             "the row-parallel matmul's partial sums are returned unreduced"),
    Mutation("dropped_all_reduce_mlp", "mlp_dp_tp", drop_all_reduce,
             "Megatron MLP on dp x tp without its all_reduce"),
    Mutation("all_gather_wrong_dim", "matmul_lhs_cols_only", all_gather_wrong_dim,
             "the column blocks are gathered along the rows"),
    Mutation("wrong_replica_groups", "mlp_dp_tp",
             lambda m: wrong_replica_groups(m, [[0, 4], [1, 5], [2, 6], [3, 7]]),
             "the tp partial sums are reduced over dp"),
    Mutation("wrong_replica_groups_mixed", "matmul_2d_rows_contract",
             lambda m: wrong_replica_groups(m, [[0, 1, 2, 4], [3, 5, 6, 7]]),
             "groups that match no mesh axes"),
    Mutation("wrong_offset_entry", "matmul_contracting_scatter",
             lambda m: wrong_offset_entry(m, 2, 4),
             "device 2 takes rows 4..7 of the reduced product instead of 8..11"),
    Mutation("swapped_permute_pairs", "roll_sharded", swap_permute_pairs,
             "the halo row goes to the previous device instead of the next"),
    Mutation("max_reducer", "matmul_contracting", max_reducer,
             "the partial products are combined with max"),
    Mutation("max_reducer_layernorm", "layernorm_hidden", max_reducer,
             "the mean's partial sums are combined with max"),
    Mutation("slice_before_all_reduce", "matmul_contracting_scatter", slice_before_all_reduce,
             "each device slices before the all_reduce (XLA issue 42481)"),
]


def mutated(mutation: Mutation, sharded: bytes | str) -> tuple[str, str]:
    """(mutated program as text, description) for a partitioned program."""
    from jaxlib.mlir import ir

    from entangle_mlir.mlir.ir import context, parse_module

    module = parse_module(sharded)
    with context(), ir.Location.unknown():
        what = mutation.mutate(module)
        module.operation.verify()
        return module.operation.get_asm(enable_debug_info=True), what


# ----- generic mutation sweep -------------------------------------------------------------------

SWEEP_KINDS = {
    "stablehlo.all_reduce": ("drop", "toggle_reducer", "singleton_groups"),
    "stablehlo.constant": ("scale",),
    "stablehlo.subtract": ("swap",),
    "stablehlo.divide": ("swap",),
    "stablehlo.collective_permute": ("reverse",),
    "stablehlo.partition_id": ("zero",),
    "stablehlo.transpose": ("identity",),
}
"""Generic mutations per op: every one that changes the numbers must be refused."""


def _all_ops(module) -> list:
    from jaxlib.mlir import ir

    from entangle_mlir.mlir.program import public_main

    found = []

    def visit(op):
        if op.name != "func.func":
            found.append(op)
        return ir.WalkResult.ADVANCE

    public_main(module, "-").walk(visit)
    return found


def sweep_mutants(sharded) -> list[tuple[str, int, str]]:
    """(description, op index, kind) of every generic mutation of a program."""
    from entangle_mlir.mlir.ir import context, parse_module

    module = parse_module(sharded)
    with context():
        return [(f"{kind} {op.name}#{k}", k, kind) for k, op in enumerate(_all_ops(module))
                for kind in SWEEP_KINDS.get(op.name, ())]


def apply_sweep_mutant(sharded, index: int, kind: str) -> str | None:
    """The mutated program's text, or None when the mutation does not apply or type-check."""
    import numpy as np
    from jaxlib.mlir import ir
    from jaxlib.mlir.dialects import stablehlo

    from entangle_mlir.mlir.ir import context, parse_module

    module = parse_module(sharded)
    with context(), ir.Location.unknown():
        op = _all_ops(module)[index]
        if kind == "drop":
            op.results[0].replace_all_uses_with(op.operands[0])
            op.erase()
        elif kind == "toggle_reducer":
            block = op.regions[0].blocks[0]
            inner = next(o.operation for o in block.operations
                         if o.operation.name in ("stablehlo.add", "stablehlo.maximum"))
            build = stablehlo.MaxOp if inner.name == "stablehlo.add" else stablehlo.AddOp
            new = build(inner.operands[0], inner.operands[1], ip=ir.InsertionPoint(inner))
            inner.results[0].replace_all_uses_with(new.result)
            inner.erase()
        elif kind == "singleton_groups":
            count = np.array(ir.DenseIntElementsAttr(op.attributes["replica_groups"])).size
            op.attributes["replica_groups"] = ir.DenseIntElementsAttr.get(
                np.arange(count, dtype=np.int64).reshape(count, 1))
        elif kind == "scale":
            attr = ir.DenseElementsAttr(op.attributes["value"])
            rtype = ir.RankedTensorType(attr.type)
            if str(rtype.element_type) != "f32":
                return None
            if attr.is_splat:
                value = ir.FloatAttr(attr.get_splat_value()).value
                if not np.isfinite(value):
                    return None
                op.attributes["value"] = ir.DenseElementsAttr.get_splat(
                    rtype, ir.FloatAttr.get(rtype.element_type, value * 2 + 1))
            else:
                values = np.array(attr)
                op.attributes["value"] = ir.DenseElementsAttr.get(
                    (values * 2 + 1).astype(np.float32), type=rtype)
        elif kind == "swap":
            lhs, rhs = op.operands[0], op.operands[1]
            op.operands[0], op.operands[1] = rhs, lhs
        elif kind == "reverse":
            pairs = np.array(ir.DenseIntElementsAttr(op.attributes["source_target_pairs"]))
            op.attributes["source_target_pairs"] = ir.DenseIntElementsAttr.get(
                pairs[:, ::-1].copy().astype(np.int64))
        elif kind == "zero":
            rtype = ir.RankedTensorType(op.results[0].type)
            zero = stablehlo.ConstantOp(ir.DenseElementsAttr.get_splat(
                rtype, ir.IntegerAttr.get(rtype.element_type, 0)), ip=ir.InsertionPoint(op))
            op.results[0].replace_all_uses_with(zero.result)
            op.erase()
        elif kind == "identity":
            perm = list(ir.DenseI64ArrayAttr(op.attributes["permutation"]))
            if perm == sorted(perm) or (ir.RankedTensorType(op.operands[0].type).shape
                                        != ir.RankedTensorType(op.results[0].type).shape):
                return None
            op.attributes["permutation"] = ir.DenseI64ArrayAttr.get(sorted(perm))
        try:
            module.operation.verify()
        except Exception:  # noqa: BLE001 - a mutant that does not type-check is skipped
            return None
        return str(module)


def mutation_sweep(names: list[str]) -> int:
    """Every generic mutant of the named cases: numbers changed (executed) => not proven."""
    from entangle_mlir.driver import check_texts

    unsound = 0
    for case in CASES:
        if names and case.name not in names:
            continue
        ref, sharded = lower(case)
        args = random_args(case, seed=3)
        for what, index, kind in sweep_mutants(sharded):
            text = apply_sweep_mutant(sharded, index, kind)
            if text is None:
                continue
            error = max_error(text, case, args)
            report = check_texts(ref, text)
            changed = not error <= 1e-3
            unsound += changed and report.proven
            flag = "UNSOUND" if changed and report.proven else ""
            print(f"{case.name:28s} {what:40s} max |diff| {error:8.3g} {report.verdict} {flag}")
    return 1 if unsound else 0


if __name__ == "__main__":
    import sys

    sys.exit(main(sys.argv[1:]))
