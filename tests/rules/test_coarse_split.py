"""A dynamic_slice at a coarser split of a mesh axis (`rules/index.py` `_match_coarse`).

MaxText's GQA with fewer K/V heads than tp devices keeps the K/V projections replicated, and
device d takes K/V head `d * kv // tp`: block d // r of the heads split into tp / r blocks. That
is device d's block of the heads with each block repeated r times in place (`repeat_blocks`),
so the value is tiled over the axis. The rule is a lemma proved by Z3 for several divisors r,
dims, block sizes and meshes, with the offsets given as a device table (XLA's per-device form
indexes a constant table by partition_id; jax's axis_index arithmetic evaluates to the same
table); the wrong relations next to it (a group of the wrong size, the modulo reading d % m
of the heads) are refuted, and the modulo offsets are no coarser split at all.

Grounded: the shard_map program computes the reference on simulated CPU devices and is proven
by the layout tier; twins that pick the wrong K/V head per device (modulo, wrong group size)
compute something else and are not proven. XLA's partitioning of the reference (a device
table [0, 0, 1, 1]) computes the reference and is proven too.
"""

from __future__ import annotations

import os

if "--xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                               + " --xla_force_host_platform_device_count=8").strip()

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

from entangle_mlir.core.mesh import Mesh
from entangle_mlir.core.relations import DeviceScalar, Opaque
from entangle_mlir.driver import check_texts
from entangle_mlir.rules import RULES
from entangle_mlir.rules.index import repeat_blocks
from tests.jax_runs import run_and_lower
from tests.rules.test_lemmas import Lemma, arg, prove_lemma, refute, rel, splat

TP4 = Mesh((("tp", 4),))
TP6 = Mesh((("tp", 6),))
DP2_TP4 = Mesh((("dp", 2), ("tp", 4)))

# (mesh, axis, r, dim, block size, global rows along dim)
COARSE = [(TP4, "tp", 2, 1, 1, 2), (TP4, "tp", 2, 0, 2, 4), (TP4, "tp", 2, 1, 1, 3),
          (TP6, "tp", 2, 0, 1, 3), (TP6, "tp", 3, 1, 2, 4), (DP2_TP4, "tp", 2, 0, 1, 2)]


def _offsets(mesh: Mesh, axis: str, size: int, index) -> DeviceScalar:
    return DeviceScalar(tuple(index(mesh.coords(d)[axis]) * size
                              for d in range(mesh.num_devices)), ())


def _lemma(mesh, axis, r, dim, size, rows, index) -> tuple[Lemma, object]:
    shape = (rows, 3) if dim == 0 else (3, rows)
    x = arg(shape)
    starts = [splat(0, (), "i32"), splat(0, (), "i32")]
    starts[dim] = _offsets(mesh, axis, size, index)
    local = tuple(size if d == dim else n for d, n in enumerate(shape))
    lemma = Lemma(f"dynamic_slice-coarse-{mesh.describe()}-r{r}-dim{dim}",
                  "stablehlo.dynamic_slice", [rel(x), *starts], results=[(local, "f32")],
                  attrs={"slice_sizes": local}, mesh=mesh)
    return lemma, x


@pytest.mark.parametrize("mesh,axis,r,dim,size,rows", COARSE)
def test_block_of_a_coarser_split_is_a_tile_of_repeated_blocks(mesh, axis, r, dim, size,
                                                               rows) -> None:
    lemma, x = _lemma(mesh, axis, r, dim, size, rows, lambda i: i // r)
    prove_lemma(lemma)
    tiling = [(), ()]
    tiling[dim] = (axis,)
    n = mesh.size(axis)
    wrong_groups = [q for q in range(1, n + 1) if n % q == 0 and q != r and n // q * size <= rows]
    assert wrong_groups
    for q in wrong_groups[:2]:
        wrong = repeat_blocks(x, dim, size, n // q, q)
        refute(lemma.op, lemma.ins, [rel(wrong, *tiling)], lemma.results, lemma.attrs, mesh)


@pytest.mark.parametrize("mesh,axis,r,dim,size,rows", COARSE)
def test_the_modulo_reading_is_no_coarser_split(mesh, axis, r, dim, size, rows) -> None:
    blocks = mesh.size(axis) // r
    lemma, x = _lemma(mesh, axis, r, dim, size, rows, lambda i: i % blocks)
    out = RULES[lemma.op](lemma.info(), list(lemma.ins), lemma.context())
    assert isinstance(out[0], Opaque), out
    tiling = [(), ()]
    tiling[dim] = (axis,)
    floor = repeat_blocks(x, dim, size, blocks, r)
    refute(lemma.op, lemma.ins, [rel(floor, *tiling)], lemma.results, lemma.attrs, mesh)


# ----- grounded: MaxText GQA with K/V heads replicated over groups of devices ----------------

def _causal(q, k, v):
    scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / np.float32(np.sqrt(q.shape[-1]))
    return jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(scores, axis=-1), v)


def _reference(x, wq, wk, wv, wo):
    q = jnp.einsum("bsd,dhk->bshk", x, wq)
    group = wq.shape[1] // wk.shape[1]
    k = jnp.repeat(jnp.einsum("bsd,dhk->bshk", x, wk), group, axis=2)
    v = jnp.repeat(jnp.einsum("bsd,dhk->bshk", x, wv), group, axis=2)
    return jnp.einsum("bshk,hkd->bsd", _causal(q, k, v), wo)


def _sharded(pick):
    def body(x, wq, wk, wv, wo):
        q = jnp.einsum("bsd,dhk->bshk", x, wq)
        head = pick(lax.axis_index("tp"), lax.axis_size("tp"), wk.shape[1])
        k = jnp.einsum("bsd,dhk->bshk", x, lax.dynamic_slice_in_dim(wk, head, 1, axis=1))
        v = jnp.einsum("bsd,dhk->bshk", x, lax.dynamic_slice_in_dim(wv, head, 1, axis=1))
        out = _causal(q, jnp.repeat(k, q.shape[2], axis=2), jnp.repeat(v, q.shape[2], axis=2))
        return lax.psum(jnp.einsum("bshk,hkd->bsd", out, wo), "tp")
    return body


SPECS = (P(), P(None, "tp", None), P(), P(), P("tp", None, None))

# name -> (tp, kv heads, K/V head of device i, correct)
PROGRAMS = {
    "floor_r2": (4, 2, lambda i, n, kv: i * kv // n, True),
    "floor_r4": (8, 2, lambda i, n, kv: i * kv // n, True),
    "modulo": (4, 2, lambda i, n, kv: i % kv, False),
    "group_too_large": (8, 4, lambda i, n, kv: i // 4, False),
}


def _args(tp: int, kv: int):
    rng = np.random.default_rng(3)
    heads = tp  # one query head per device
    draw = lambda *s: rng.standard_normal(s).astype(np.float32)
    return [draw(2, 4, 8), draw(8, heads, 4), draw(8, kv, 4), draw(8, kv, 4), draw(heads, 4, 8)]


@pytest.fixture(scope="module")
def runs():
    out = {}
    for name, (tp, kv, pick, _) in PROGRAMS.items():
        out[name] = run_and_lower(_reference, _sharded(pick), _args(tp, kv), SPECS, P(),
                                  mesh=(("tp", tp),))
    return out


@pytest.mark.parametrize("name", list(PROGRAMS))
def test_gqa_with_kv_heads_replicated_over_groups(runs, name: str) -> None:
    correct = PROGRAMS[name][3]
    want, got, texts = runs[name]
    assert np.allclose(want, got, atol=1e-4) == correct
    report = check_texts(*texts, verify_rules=correct, general_tier=False)
    assert report.proven == correct, report.render_text()
    if correct:
        assert " 0 refuted, 0 inconclusive" in report.mode, report.mode
    else:
        assert not check_texts(*texts, verify_rules=False).proven


def test_xla_partitioning_with_a_device_table() -> None:
    from entangle_mlir.jax import check_partitioned

    mesh = jax.make_mesh((4,), ("tp",), axis_types=(AxisType.Auto,))
    args = _args(4, 2)
    avals = [jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=NamedSharding(mesh, s))
             for a, s in zip(args, SPECS)]
    placed = [jax.device_put(a, NamedSharding(mesh, s)) for a, s in zip(args, SPECS)]
    jitted = jax.jit(_reference, out_shardings=NamedSharding(mesh, P()))
    assert np.allclose(jitted(*placed), jax.jit(_reference)(*args), atol=1e-4)
    report = check_partitioned(_reference, *avals, out_shardings=NamedSharding(mesh, P()),
                               verify_rules=False, evidence=False, confirm=False)
    assert report.proven, report.render_text()
