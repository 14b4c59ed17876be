"""Programs of JAX's shard_map test suite (tests/shard_map_test.py in jax-ml/jax), rewritten in
our style: the same collectives, specs and meshes (the tests' 2x2x2 'x'/'y'/'z' mesh, 1-D meshes of
2-8), small float32 inputs, and a reference for each (the tests check values against numpy
expressions or only that nothing crashes; here every program gets a global reference). Each
description names the test it follows.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import PartitionSpec as P

from .corpus import Arg, Example, f32, program

XYZ = (("x", 2), ("y", 2), ("z", 2))
X8 = (("x", 8),)
X4 = (("x", 4),)
X2 = (("x", 2),)
I4 = (("i", 4),)
XY22 = (("x", 2), ("y", 2))


def _p(prog: str, mesh, reference, body, args, out, test: str, **kw) -> Example:
    return program("jax_tests", prog, mesh, reference, body, args, out,
                   f"shard_map_test.py {test}", **kw)


# ----- collectives on the 2x2x2 mesh ----------------------------------------------------------

def gathered_copies_ref(a):
    return jnp.tile(a, (2, 1)), jnp.tile(a, (1, 4))


def all_gather_two_ways(a):
    return (lax.all_gather(a, "z", axis=0, tiled=True),
            lax.all_gather(a, ("x", "y"), axis=-1, tiled=True))


def matmul_scatter_ref(a, b):
    c = a @ b
    return c, c[:4] + c[4:]


def matmul_psum_scatter_two_ways(a, b):
    c = jnp.matmul(a, b)
    return (lax.psum_scatter(c, "y", scatter_dimension=0, tiled=True),
            lax.psum_scatter(c, ("z", "y"), scatter_dimension=0, tiled=True))


def roll_rows_ref(a):
    return jnp.roll(a, 1, axis=0)


def ppermute_next(a):
    n = lax.axis_size("x")
    return lax.ppermute(a, "x", perm=[(j, (j + 1) % n) for j in range(n)])


def ppermute_next_hardcoded_4(a):
    return lax.ppermute(a, "x", perm=[(j, (j + 1) % 4) for j in range(4)])  # BUG


def _roll_blocks(a, merged: tuple[int, int]):
    """`a` (4, 16) laid out P('x', ('y', 'z')) on the 2x2x2 mesh: each device's block moved to
    the next device along the merged mesh axes `merged` (0 = x, 1 = y, 2 = z)."""
    blocks = a.reshape(2, 2, 2, 2, 4).transpose(0, 2, 3, 1, 4)  # x, y, z, rows, cols
    first, _ = merged
    shape = blocks.shape
    grouped = blocks.reshape(shape[:first] + (4,) + shape[first + 2:])
    rolled = jnp.roll(grouped, 1, axis=first).reshape(shape)
    return rolled.transpose(0, 3, 1, 2, 4).reshape(4, 16)


def ppermute_tuple_axes_ref(a):
    return _roll_blocks(a, (0, 1)), _roll_blocks(a, (1, 2))


def ppermute_tuple_axes(a):
    xy = lax.axis_size(("x", "y"))
    yz = lax.axis_size(("y", "z"))
    return (lax.ppermute(a, ("x", "y"), perm=[(j, (j + 1) % xy) for j in range(xy)]),
            lax.ppermute(a, ("y", "z"), perm=[(j, (j + 1) % yz) for j in range(yz)]))


def ppermute_tuple_axes_one_reversed(a):
    xy = lax.axis_size(("x", "y"))
    yz = lax.axis_size(("y", "z"))
    return (lax.ppermute(a, ("x", "y"), perm=[(j, (j + 1) % xy) for j in range(xy)]),
            lax.ppermute(a, ("y", "z"), perm=[(j, (j - 1) % yz) for j in range(yz)]))  # BUG


# ----- all_to_all -----------------------------------------------------------------------------

def transpose_flat_ref(a):
    return jnp.reshape(a.T, (1, 64))


def all_to_all_x(a):
    return lax.all_to_all(a, "x", split_axis=1, concat_axis=1, tiled=True)


def all_to_all_xy(a):
    return lax.all_to_all(a, ("x", "y"), split_axis=1, concat_axis=1, tiled=True)


def all_to_all_yx(a):
    return lax.all_to_all(a, ("y", "x"), split_axis=1, concat_axis=1, tiled=True)  # BUG


def quadrants_ref(a):
    return jnp.concatenate([blk for rows in jnp.split(a, 2, axis=0)
                            for blk in jnp.split(rows, 2, axis=1)], axis=1)


def all_to_all_groups(a):
    return lax.all_to_all(a, "x", split_axis=1, concat_axis=0,
                          axis_index_groups=((0, 1), (2, 3)), tiled=True)


def identity_ref(a):
    return a


def all_to_all_rows_to_cols(x):
    return lax.all_to_all(x, "x", split_axis=1, concat_axis=0, tiled=True)


def _grad_sum_twice(f):
    return jax.grad(lambda x: f(x).sum() * 2)


# ----- autodiff, axis_index, control flow ------------------------------------------------------

def sin_cos_ref(x, y):
    return jnp.sin(x) + 3 + jnp.tan(2.) * jnp.cos(x) + jnp.tile(y, 2)


def sin_cos(x, y):
    return jnp.sin(x) + 3 + jnp.tan(2.) * jnp.cos(x) + y


def _grad_sum_xy(f):
    return jax.grad(lambda x, y: f(x, y).sum(), argnums=(0, 1))


def plus_axis_index_ref(x):
    return x + jnp.repeat(jnp.arange(4, dtype=x.dtype), x.shape[0] // 4)


def plus_axis_index(x):
    return x + lax.axis_index("x")


def two_axes_index_ref(x):
    return (x + jnp.arange(4.0)[:, None], x + jnp.arange(2.0)[None, :],
            x + jnp.arange(8.0).reshape(4, 2))


def two_axes_index(x):
    return (x + lax.axis_index("i"), x + lax.axis_index("j"), x + lax.axis_index(("i", "j")))


def two_axes_index_swapped(x):
    return (x + lax.axis_index("i"), x + lax.axis_index("j"),
            x + lax.axis_index(("j", "i")))  # BUG


_conv_dot = functools.partial(lax.conv_general_dilated, window_strides=(), padding="VALID",
                              dimension_numbers=("NC", "IO", "NC"))


def conv_psum(x, y):
    return lax.psum(_conv_dot(x, y), "i")


def conv_no_psum(x, y):
    return _conv_dot(x, y)  # BUG


def cumsum_per_block_ref(x):
    return jnp.concatenate([jnp.cumsum(b) for b in jnp.split(x, 4)])


def block_max_ref(x):
    return functools.reduce(jnp.maximum, jnp.split(x, 4))


def pmax_i(x):
    return lax.pmax(x, "i")


def block_min_ref(x):
    return functools.reduce(jnp.minimum, jnp.split(x, 4))


def pmin_i(x):
    return lax.pmin(x, "i")


def argmax_per_block_ref(x):
    return x.reshape(8, 2, 4).argmax(axis=-1)


def argmax_keepdims(x):
    return x.argmax(axis=-1, keepdims=True)


def top2_per_block_ref(x):
    values, indices = lax.top_k(x.reshape(2, 4), 2)
    return values.reshape(-1), indices.reshape(-1)


def approx_top2(x):
    return lax.approx_max_k(x, 2)


def cond_per_block_ref(x, y):
    blocks = x.reshape(2, 4)
    positive = jnp.any(blocks > 0, axis=1, keepdims=True)
    return jnp.where(positive, blocks, blocks + 1).reshape(-1)


def cond_on_own_block(x, y):
    return lax.cond(jnp.any(x > 0), lambda x, y: x, lambda x, y: x + 1, x, y)


def cond_on_other_ref(x, y):
    xb = x.reshape(2, 1, 4)
    positive = jnp.any(y.reshape(1, 2, 4) > 0, axis=-1, keepdims=True)
    return jnp.where(positive, xb, xb + 1).reshape(-1)


def cond_on_other_input(x, y):
    return lax.cond(jnp.any(y > 0), lambda x, y: x, lambda x, y: x + 1, x, y)


def _cond_inputs():
    rng = np.random.default_rng(7)
    x = rng.standard_normal(8).astype(np.float32)
    y = rng.standard_normal(8).astype(np.float32)
    x[:4], y[4:] = -np.abs(x[:4]), -np.abs(y[4:])
    return [[x, y]]


def switch_ref(n, x, y):
    return lax.switch(n, [lambda x: x, lambda x: x + 1, lambda x: x + 2], x)


def switch_branches(n, x, y):
    return lax.switch(n, [lambda x, _: x, lambda x, _: x + 1, lambda x, _: x + 2], x, y)


def switch_branches_reordered(n, x, y):
    return lax.switch(n, [lambda x, _: x, lambda x, _: x + 2, lambda x, _: x + 1], x, y)  # BUG


def _switch_inputs():
    rng = np.random.default_rng(3)
    x = rng.standard_normal(8).astype(np.float32)
    y = rng.standard_normal(8).astype(np.float32)
    return [[np.int32(k), x, y] for k in range(3)]


def slice_per_block_ref(x):
    return jnp.concatenate([b[1:3] for b in jnp.split(x, 2)])


def dynamic_slice_block(x):
    return lax.dynamic_slice_in_dim(x, jnp.array(1, dtype=np.int32), 2)


def _grad_sum(f):
    return jax.grad(lambda x: jnp.sum(f(x)))


# ----- the systematic tests (ShardMapSystematicTest: functions applied block by block) ---------

def sin_dot_sin_ref(x1, x2):
    return jnp.sin(jnp.dot(jnp.sin(x1), x2))


def sin_dot_sin(x1, x2):
    return jnp.sin(jnp.dot(jnp.sin(x1), x2))


def sin_dot_sin_blocks_ref(x1, x2):
    return jnp.concatenate([sin_dot_sin(a, b) for a, b in zip(jnp.split(x1, 4, axis=1),
                                                                jnp.split(x2, 4, axis=0))])


def ravel_blocks_ref(x):
    return jnp.concatenate([blk.ravel() for rows in jnp.split(x, 2, axis=0)
                            for blk in jnp.split(rows, 4, axis=1)])


def ravel(x):
    return x.ravel()


def fanout_grad_ref(x):
    return jax.grad(lambda x: (jnp.tile(x, 4) ** 2).sum())(x)


def fanout(x):
    return x


def _grad_sum_squares(f):
    return jax.grad(lambda x: (f(x) ** 2).sum())


def identity_and_sum_ref(x):
    return x, sum(jnp.split(x, 8))


def identity_and_psum(x_block):
    return x_block, lax.psum(x_block, axis_name="x")


# ----- the corpus -----------------------------------------------------------------------------

def programs() -> list[Example]:
    a88 = f32((8, 8), P("z", "y"), "weight")
    multi = [f32((4, 16), P("x", ("y", "z")))]
    ex = [
        _p("all_gather_two_ways", XYZ, gathered_copies_ref, all_gather_two_ways,
           [f32((8, 8), P("z", ("x", "y")))], (P("z", ("x", "y")),) * 2,
           "test_all_gather: all_gather over 'z' (dim 0) and over ('x', 'y') (last dim)"),
        _p("matmul_reduce_scatter", XYZ, matmul_scatter_ref, matmul_psum_scatter_two_ways,
           [a88, f32((8, 8), P("y", None), "weight")], (P(("z", "y"), None),) * 2,
           "test_matmul_reduce_scatter: psum_scatter over 'y' and over ('z', 'y') (block sums)"),
        _p("collective_permute", X8, roll_rows_ref, ppermute_next, [f32((8, 8), P("x", None))],
           P("x", None), "test_collective_permute"),
        _p("collective_permute", X8, roll_rows_ref, ppermute_next_hardcoded_4,
           [f32((8, 8), P("x", None))], P("x", None), "test_collective_permute",
           bug="ring_of_4_on_8_devices"),
        _p("ppermute_tuple_axes", XYZ, ppermute_tuple_axes_ref, ppermute_tuple_axes, multi,
           (P("x", ("y", "z")),) * 2,
           "test_collective_permute_with_multiple_axis_names: ppermute over ('x','y'), ('y','z')"),
        _p("ppermute_tuple_axes", XYZ, ppermute_tuple_axes_ref, ppermute_tuple_axes_one_reversed,
           multi, (P("x", ("y", "z")),) * 2, "test_collective_permute_with_multiple_axis_names",
           bug="yz_permutation_reversed"),
        _p("all_to_all", X8, transpose_flat_ref, all_to_all_x, [f32((8, 8), P("x", None))],
           P(None, "x"), "test_all_to_all (single axis name): split and concat dim 1"),
        _p("all_to_all_two_axes", (("x", 4), ("y", 2)), transpose_flat_ref, all_to_all_xy,
           [f32((8, 8), P(("x", "y"), None))], P(None, ("x", "y")),
           "test_all_to_all (multiple axis names)"),
        _p("all_to_all_two_axes", (("x", 4), ("y", 2)), transpose_flat_ref, all_to_all_yx,
           [f32((8, 8), P(("x", "y"), None))], P(None, ("x", "y")),
           "test_all_to_all (multiple axis names)", bug="axes_order_swapped"),
        _p("all_to_all_groups", X4, quadrants_ref, all_to_all_groups, [f32((4, 4), P("x", None))],
           P(None, "x"), "test_all_to_all_with_axis_index_groups"),
        _p("all_to_all_rows_to_cols", X4, identity_ref, all_to_all_rows_to_cols,
           [f32((8, 8), P("x", None))], P(None, "x"),
           "test_all_to_all_grad (forward): split dim 1, concat dim 0"),
        _p("grad_all_to_all", X4, _grad_sum_twice(identity_ref), all_to_all_rows_to_cols,
           [f32((8, 8), P("x", None))], P(None, "x"), "test_all_to_all_grad",
           wrap=_grad_sum_twice),
        _p("sin_cos", XY22, sin_cos_ref, sin_cos, [f32((8,), P("x")), f32((4,), P(None))],
           P("x"), "test_reverse_mode_ad (forward)"),
        _p("grad_sin_cos", XY22, _grad_sum_xy(sin_cos_ref), sin_cos,
           [f32((8,), P("x")), f32((4,), P(None))], P("x"), "test_reverse_mode_ad",
           wrap=_grad_sum_xy),
        _p("plus_axis_index", X4, plus_axis_index_ref, plus_axis_index, [f32((8,), P("x"))],
           P("x"), "test_axis_index: each block plus its device's index"),
        _p("axis_index_two_axes", (("i", 4), ("j", 2)), two_axes_index_ref, two_axes_index,
           [f32((4, 2), P("i", "j"))], (P("i", "j"),) * 3, "test_axis_index_twoaxes"),
        _p("axis_index_two_axes", (("i", 4), ("j", 2)), two_axes_index_ref,
           two_axes_index_swapped, [f32((4, 2), P("i", "j"))], (P("i", "j"),) * 3,
           "test_axis_index_twoaxes", bug="axes_order_swapped"),
        _p("conv_as_dot_psum", I4, lambda x, y: x @ y, conv_psum,
           [f32((16, 32), P(None, "i")), f32((32, 8), P("i", None), "weight")], P(None, None),
           "test_conv_general_dilated: a dot spelled as a convolution, psum"),
        _p("conv_as_dot_psum", I4, lambda x, y: x @ y, conv_no_psum,
           [f32((16, 32), P(None, "i")), f32((32, 8), P("i", None), "weight")], P(None, None),
           "test_conv_general_dilated", bug="missing_psum"),
        _p("cumsum_per_block", I4, cumsum_per_block_ref, jnp.cumsum, [f32((8,), P("i"))],
           P("i"), "test_cumsum: jnp.cumsum of each block (per-device result by design)"),
        _p("pmax", I4, block_max_ref, pmax_i, [f32((8,), P("i"))], P(),
           "test_pmax: elementwise max of the blocks"),
        _p("pmin", I4, block_min_ref, pmin_i, [f32((8,), P("i"))], P(), "test_pmin"),
        _p("argmax_per_block", XY22, argmax_per_block_ref, argmax_keepdims,
           [f32((8, 8), P("x", "y"))], P("x", "y"),
           "test_argmax_pvary: argmax (variadic reduce) of each block's rows"),
        _p("approx_top2_per_block", (("i", 2),), top2_per_block_ref, approx_top2,
           [f32((8,), P("i"))], P("i"), "test_approx_top_k: top-2 of each block"),
        _p("cond_on_own_block", XY22, cond_per_block_ref, cond_on_own_block,
           [f32((8,), P("x")), f32((8,), P("y"))], P("x"),
           "test_cond_rep_rule: lax.cond on jnp.any of the local block", chosen=_cond_inputs),
        _p("cond_on_other_input", XY22, cond_on_other_ref, cond_on_other_input,
           [f32((8,), P("x")), f32((8,), P("y"))], P(("x", "y")),
           "test_cond_rep_rule: lax.cond on jnp.any of another input's block",
           chosen=_cond_inputs),
        _p("switch", XY22, switch_ref, switch_branches,
           [Arg((), P(), "int32", "ids", 3), f32((8,), P("x")), f32((8,), P("y"))], P("x"),
           "test_switch_rep_rule: lax.switch on a replicated index", chosen=_switch_inputs),
        _p("switch", XY22, switch_ref, switch_branches_reordered,
           [Arg((), P(), "int32", "ids", 3), f32((8,), P("x")), f32((8,), P("y"))], P("x"),
           "test_switch_rep_rule", bug="branches_reordered", chosen=_switch_inputs),
        _p("dynamic_slice_per_block", X2, slice_per_block_ref, dynamic_slice_block,
           [f32((16,), P("x"))], P("x"), "test_dynamic_slice_transpose (forward)"),
        _p("grad_dynamic_slice_per_block", X2, _grad_sum(slice_per_block_ref),
           dynamic_slice_block, [f32((16,), P("x"))], P("x"), "test_dynamic_slice_transpose",
           wrap=_grad_sum),
        _p("sin_dot_sin", (("i", 2), ("j", 4)), sin_dot_sin_ref, sin_dot_sin,
           [f32((8, 6), P("i", None)), f32((6, 8), P(None, "j"), "weight")], P("i", "j"),
           "ShardMapSystematicTest: sin_dot_sin, rows over 'i', columns over 'j'"),
        _p("sin_dot_sin_blocks", (("j", 4),), sin_dot_sin_blocks_ref, sin_dot_sin,
           [f32((4, 8), P(None, "j")), f32((8, 3), P("j", None), "weight")], P("j", None),
           "ShardMapSystematicTest: sin_dot_sin with the contraction split (per-device dots)"),
        _p("ravel_blocks", (("i", 2), ("j", 4)), ravel_blocks_ref, ravel,
           [f32((4, 8), P("i", "j"))], P(("i", "j")), "ShardMapSystematicTest: ravel"),
        _p("grad_fanout", X4, fanout_grad_ref, fanout, [f32((4,), P())], P("x"),
           "test_fanout_specs_transpose_to_psum: grad of a replicated input tiled out",
           wrap=_grad_sum_squares),
        _p("identity_and_psum", X8, identity_and_sum_ref, identity_and_psum,
           [f32((16,), P("x"))], (P("x"), P()), "test_psum_transpose_non_zero_cts (forward)"),
    ]
    return ex
