"""Session 13's attacks on the proofs of sessions 12 and 13: for each new rule or rewrite, the
nearest wrong programs (each must not be proven) and the correct neighbours beside them.

* one entry of each device's block (`rules/kinds/entries.py`): dense expert parallelism with
  masks `ids == b*L + i`, the local experts' loop unrolled; its index off by one either way,
  a mask compared with `<=`, an entry skipped or visited twice, the mask's index and the
  weight's index apart, the devices' blocks reversed, and masks that wrap in int32 (ids
  doubled, times 2^30, narrowed to int16, modulo 8); E_local = 1 is left out (its correct
  program is not proven, and finding so takes 12 s);
  correct neighbours: the loop reversed, a wrapped offset added to both sides;
* a divisor's constant factor (`terms.make_div`): `x / (4 * s)` against `(x / 4) / s`
  (exact), a factor one ulp off a power of two, a negative power, f16, integer division; a
  quotient against the product with a reciprocal (`x * (1 / d)`, `3 * (1 / d)`) under a
  compare: both were proven (false proofs, fixed: `terms.make_div` keeps a constant numerator
  other than +-2^e, `element.compared_value` rounds the quotients inside a compared value);
* transposed dot operands read in place (`terms._read_in_blocks`): transposes that reorder free
  dims, a batched dot whose batch dims are permuted, contracting dims permuted;
* value-level: a psum of a bf16 operand, a tolerance hidden in a compare, a select returning
  the other branch, a reducer region returning its other operand, an int32 position iota times
  a stride that wraps.

Each wrong program is grounded (tests/examples/test_heldout_grounded.py): its numbers differ
from its reference's on the random or chosen inputs. Small shapes: each program runs in a few
milliseconds.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import PartitionSpec as P

from .corpus import Arg, Example, f32, ids, program

EP4 = (("ep", 4),)
TP4 = (("tp", 4),)


def _p(prog: str, mesh, reference, body, args, out, what: str, **kw) -> Example:
    return program("attacks13", prog, mesh, reference, body, args, out, what, **kw)


# ----- one entry of each device's block: dense expert parallelism --------------------------------

def _moe_ref(experts: int):
    def ref(x, idx, weights, wi, wo):
        ys = jax.vmap(_expert, in_axes=(None, 0, 0))(x, wi, wo)               # [E, T, D]
        combine = jnp.einsum("tk,tke->te", weights, jax.nn.one_hot(idx, experts))
        return jnp.einsum("te,etd->td", combine, ys)
    return ref


def _expert(x, wi, wo):
    return jax.nn.silu(x @ wi) @ wo


def _dense_experts(x, idx, weights, wi, wo, *, mask, order=None, weight_index=None):
    """Every device gathers the tokens, applies its local experts one at a time (the loop
    unrolled: `order`, default 0..L-1) with the weights chosen by `mask(ids, first, i)`, and
    reduce-scatters the outputs back."""
    xs, ids_, ws = (lax.all_gather(t, "ep", tiled=True) for t in (x, idx, weights))
    local = wi.shape[0]
    first = lax.axis_index("ep") * local
    out = jnp.zeros_like(xs)
    for i in (range(local) if order is None else order):
        chosen = jnp.sum(ws * mask(ids_, first, i), axis=-1)
        k = i if weight_index is None else weight_index(i, local)
        out = out + chosen[:, None] * _expert(xs, wi[k], wo[k])
    return lax.psum_scatter(out, "ep", tiled=True)


def experts(x, idx, weights, wi, wo):
    return _dense_experts(x, idx, weights, wi, wo, mask=lambda t, f, i: t == f + i)


def experts_reversed(x, idx, weights, wi, wo):
    return _dense_experts(x, idx, weights, wi, wo, mask=lambda t, f, i: t == f + i,
                          order=range(wi.shape[0] - 1, -1, -1))


def experts_both_ends(x, idx, weights, wi, wo):
    return _dense_experts(x, idx, weights, wi, wo, mask=lambda t, f, i: (t >= f + i) & (t <= f + i))


def experts_wrapped_offset(x, idx, weights, wi, wo):
    big = jnp.int32(2 ** 31 - 5)
    return _dense_experts(x, idx, weights, wi, wo, mask=lambda t, f, i: t + big == f + i + big)


def experts_next_entry(x, idx, weights, wi, wo):
    return _dense_experts(x, idx, weights, wi, wo, mask=lambda t, f, i: t == f + i + 1)  # BUG


def experts_entry_subtracted(x, idx, weights, wi, wo):
    return _dense_experts(x, idx, weights, wi, wo, mask=lambda t, f, i: t == f - i)  # BUG


def experts_mask_le(x, idx, weights, wi, wo):
    return _dense_experts(x, idx, weights, wi, wo, mask=lambda t, f, i: t <= f + i)  # BUG


def experts_entry_skipped(x, idx, weights, wi, wo):
    return _dense_experts(x, idx, weights, wi, wo, mask=lambda t, f, i: t == f + i,
                          order=(0, 2))  # BUG


def experts_entry_twice(x, idx, weights, wi, wo):
    return _dense_experts(x, idx, weights, wi, wo, mask=lambda t, f, i: t == f + i,
                          order=(0, 1, 1, 2))  # BUG


def experts_weight_rotated(x, idx, weights, wi, wo):
    return _dense_experts(x, idx, weights, wi, wo, mask=lambda t, f, i: t == f + i,
                          weight_index=lambda i, n: (i + 1) % n)  # BUG


def experts_weight_reversed(x, idx, weights, wi, wo):
    return _dense_experts(x, idx, weights, wi, wo, mask=lambda t, f, i: t == f + i,
                          weight_index=lambda i, n: n - 1 - i)  # BUG


def experts_ids_doubled(x, idx, weights, wi, wo):
    return _dense_experts(x, idx, weights, wi, wo,
                          mask=lambda t, f, i: t * 2 == (f + i) * 2)  # BUG


def experts_ids_times_2_30(x, idx, weights, wi, wo):
    big = jnp.int32(2 ** 30)
    return _dense_experts(x, idx, weights, wi, wo,
                          mask=lambda t, f, i: t * big == (f + i) * big)  # BUG


def experts_devices_reversed(x, idx, weights, wi, wo):
    flip = lambda t, f, i: t == (3 * wi.shape[0] - f) + i
    return _dense_experts(x, idx, weights, wi, wo, mask=flip)  # BUG


def experts_ids_int16(x, idx, weights, wi, wo):
    return _dense_experts(x, idx, weights, wi, wo,
                          mask=lambda t, f, i: t.astype(jnp.int16) == f + i)  # BUG


def experts_ids_modulo(x, idx, weights, wi, wo):
    return _dense_experts(x, idx, weights, wi, wo,
                          mask=lambda t, f, i: t % 8 == f + i)  # BUG



def _wrapping_ids(experts_: int):
    """Chosen inputs: ids just past int32's ends, -2^31 + e and 2^31 - e (one_hot of them is
    zero; doubled, or times 2^30, they wrap onto an expert's id)."""
    def make():
        rng = np.random.default_rng(7)
        x = rng.standard_normal((16, 4)).astype(np.float32)
        k = rng.integers(0, experts_, (16, 2))
        idx = np.where(k % 2 == 0, k - 2 ** 31, 2 ** 31 - 8 + k).astype(np.int64)
        idx = idx.astype(np.int32)
        weights = rng.standard_normal((16, 2)).astype(np.float32)
        wi = (rng.standard_normal((experts_, 4, 6)) / 2).astype(np.float32)
        wo = (rng.standard_normal((experts_, 6, 4)) / 2).astype(np.float32)
        return [[x, idx, weights, wi, wo]]
    return make


def _moe_args(experts_: int):
    return [f32((16, 4), P("ep")), ids((16, 2), P("ep"), experts_), f32((16, 2), P("ep")),
            f32((experts_, 4, 6), P("ep"), "weight"), f32((experts_, 6, 4), P("ep"), "weight")]


def moe_programs() -> list[Example]:
    what = "dense expert parallelism: ids == shard offset + i, the local experts unrolled"
    out: list[Example] = []
    for e, prog, wrongs in (
            (8, "experts", [experts_next_entry, experts_entry_subtracted, experts_mask_le,
                            experts_weight_rotated, experts_weight_reversed,
                            experts_ids_doubled, experts_ids_times_2_30,
                            experts_devices_reversed, experts_ids_int16, experts_ids_modulo]),
            (12, "experts3", [experts_entry_skipped, experts_entry_twice])):
        ref, args, chosen = _moe_ref(e), _moe_args(e), _wrapping_ids(e)
        out.append(_p(prog, EP4, ref, experts, args, P("ep"), what, chosen=chosen))
        if e == 8:
            out += [_p(f"{prog}_reversed", EP4, ref, experts_reversed, args, P("ep"), what,
                       chosen=chosen),
                    _p(f"{prog}_both_ends", EP4, ref, experts_both_ends, args, P("ep"), what,
                       chosen=chosen),
                    _p(f"{prog}_wrapped_offset", EP4, ref, experts_wrapped_offset, args,
                       P("ep"), what, chosen=chosen)]
        for bad in wrongs:
            bug = bad.__name__.removeprefix("experts_")
            out.append(_p(prog, EP4, ref, bad, args, P("ep"), what, bug=bug, chosen=chosen))
    return out


# ----- a divisor's constant factor (terms.make_div) ----------------------------------------------

K4_ULP = float(np.nextafter(np.float32(4), np.float32(5)))     # 4 * (1 + 2^-23)
T_ULP = 0.18727885                       # x/(s*K) is just below it at _fill(1.3823367, 1.845292)
T_ULP_BELOW = 0.18727884                 # and (x/s)/K just above it
T_RECIP = -1.9618235                     # x/(1+|s|) at (-5.2974358, -1.7002612); x*(1/..) below
T_RECIP3 = 5.939441                      # 3*(1/s) at s = 0.50509804; 3/s is 5.9394407


def _fill(*values):
    """Chosen inputs: x (8, 16) and s (16,) each filled with one value."""
    def make():
        x, s = values
        return [[np.full((8, 16), x, np.float32), np.full((16,), s, np.float32)]]
    return make


def _at_least(t: float):
    def ref(q):
        return jnp.where(q >= jnp.float32(t), 1.0, 0.0)
    return ref


def _div_ref(k: float, t: float):
    def ref(x, s):
        return _at_least(t)(x / (s * jnp.float32(k)))
    return ref


def div_scaled_divisor(k: float, t: float):
    return lambda x, s: _at_least(t)(x / (s * jnp.float32(k)))


def div_pow2_moved(x, s):
    return _at_least(0.5)((x / s) / jnp.float32(4.0))


def div_neg_pow2_moved(x, s):
    return _at_least(0.5)((x / s) * jnp.float32(-0.25))


def div_ulp_moved(x, s):
    return _at_least(T_ULP)((x / s) / jnp.float32(K4_ULP))  # BUG


def div_ulp_inverted(x, s):
    return _at_least(T_ULP)((x / s) * (1 / jnp.float32(K4_ULP)))  # BUG


def div_neg_ulp_moved(x, s):
    return _at_least(-T_ULP_BELOW)((x / s) / jnp.float32(-K4_ULP))  # BUG




def _f16_ref(e: int):
    def ref(x, s):
        h = x.astype(jnp.float16) / (s.astype(jnp.float16) * jnp.float16(2.0 ** e))
        return h.astype(jnp.float32)
    return ref


def f16_scaled(e: int):
    return _f16_ref(e)




def _recip_ref(x, s):
    return _at_least(T_RECIP)(x / (1.0 + jnp.abs(s)))


def recip(x, s):
    return _at_least(T_RECIP)(x / (1.0 + jnp.abs(s)))


def recip_reciprocal_first(x, s):
    return _at_least(T_RECIP)(x * (1.0 / (1.0 + jnp.abs(s))))  # BUG


def _recip3_ref(x, s):
    return _at_least(T_RECIP3)(jnp.float32(3.0) / s) + 0.0 * x


def recip3(x, s):
    return _at_least(T_RECIP3)(jnp.float32(3.0) / s) + 0.0 * x


def recip3_reciprocal_first(x, s):
    return _at_least(T_RECIP3)(jnp.float32(3.0) * (1.0 / s)) + 0.0 * x  # BUG


def _fill_full(x: float, s: float):
    def make():
        return [[np.full((8, 16), x, np.float32), np.full((8, 16), s, np.float32)]]
    return make


def _int_div_ref(x, s):
    return x // (s * 4)


def int_div(x, s):
    return x // (s * 4)


def int_div_nested(x, s):
    return (x // 4) // s  # BUG


def _int_edges():
    """Chosen inputs: divisors near 2^30 (times 4 they wrap in int32)."""
    def make():
        x = np.arange(-64, 64, dtype=np.int32).reshape(8, 16) * 1_000_003
        s = np.array([2 ** 30 + k for k in range(8)] + [-(2 ** 30) - k for k in range(8)],
                     np.int32)
        return [[x, s]]
    return make


def div_programs() -> list[Example]:
    what = "a quotient by a divisor scaled by a constant, decided by a compare"
    rows = P("tp", None)
    xs = [f32((8, 16), rows), f32((16,), P(), "positive")]
    xi = [Arg((8, 16), rows, "int32", "ids", 1000), Arg((16,), P(), "int32", "ids", 7)]
    out = [_p("div_pow2", TP4, _div_ref(4.0, 0.5), div_scaled_divisor(4.0, 0.5), xs, rows,
              what),
           _p("div_pow2_moved", TP4, _div_ref(4.0, 0.5), div_pow2_moved, xs, rows, what),
           _p("div_neg_pow2_moved", TP4, _div_ref(-4.0, 0.5), div_neg_pow2_moved, xs, rows,
              what),
           _p("div_ulp", TP4, _div_ref(K4_ULP, T_ULP), div_scaled_divisor(K4_ULP, T_ULP), xs,
              rows, what)]
    ulp = _fill(1.3823367, 1.845292)
    out += [_p("div_ulp", TP4, _div_ref(K4_ULP, T_ULP), bad, xs, rows, what,
               bug=bad.__name__.removeprefix("div_ulp_"), chosen=ulp)
            for bad in (div_ulp_moved, div_ulp_inverted)]
    out += [_p("div_neg_ulp", TP4, _div_ref(-K4_ULP, -T_ULP_BELOW),
               div_scaled_divisor(-K4_ULP, -T_ULP_BELOW), xs, rows, what),
            _p("div_neg_ulp", TP4, _div_ref(-K4_ULP, -T_ULP_BELOW), div_neg_ulp_moved, xs, rows,
               what, bug="moved", chosen=ulp)]
    out += [_p("div_f16", TP4, _f16_ref(4), f16_scaled(4), xs, rows, what)]
    full = [f32((8, 16), rows), f32((8, 16), rows)]
    out += [_p("recip", TP4, _recip_ref, recip, full, rows, what),
            _p("recip", TP4, _recip_ref, recip_reciprocal_first, full, rows, what,
               bug="reciprocal_first", chosen=_fill_full(-5.2974358, -1.7002612)),
            _p("recip3", TP4, _recip3_ref, recip3, full, rows, what),
            _p("recip3", TP4, _recip3_ref, recip3_reciprocal_first, full, rows, what,
               bug="reciprocal_first", chosen=_fill_full(1.0, 0.50509804))]
    out += [_p("int_div", TP4, _int_div_ref, int_div, xi, rows, what),
            _p("int_div", TP4, _int_div_ref, int_div_nested, xi, rows, what, bug="nested",
               chosen=_int_edges())]
    return out


# ----- transposed dot operands read in place (terms._read_in_blocks) -----------------------------

def bmm_ref(x, w):
    return jnp.einsum("abij,abjk->abik", x, w)


def bmm_both_swapped(x, w):
    t = (1, 0, 2, 3)
    return jnp.einsum("baij,bajk->baik", x.transpose(t), w.transpose(t)).transpose(t)


def bmm_weight_batch_swapped(x, w):
    return jnp.einsum("abij,bajk->abik", x, w)  # BUG


def bmm_weight_transposed(x, w):
    return jnp.matmul(x, w.transpose(1, 0, 2, 3))  # BUG


def bmm_lhs_batch_swapped(x, w):
    return jnp.einsum("baij,abjk->abik", x, w)  # BUG


def contract2_ref(x, w):
    return jnp.einsum("ijk,jkl->il", x, w)


def contract2_both_transposed(x, w):
    return jnp.einsum("ikj,kjl->il", x.transpose(0, 2, 1), w.transpose(1, 0, 2))


def contract2_one_transposed(x, w):
    return jnp.einsum("ikj,jkl->il", x.transpose(0, 2, 1), w)


def contract2_misread(x, w):
    return jnp.einsum("ijk,jkl->il", x.transpose(0, 2, 1), w)  # BUG


def contract2_paired_wrong(x, w):
    return jnp.einsum("ijk,kjl->il", x, w)  # BUG


def free2_ref(x, w):
    return jnp.einsum("ijk,kl->ijl", x, w)


def free2_through_transpose(x, w):
    return (x.transpose(1, 0, 2) @ w).transpose(1, 0, 2)


def free2_reordered(x, w):
    return (x.transpose(1, 0, 2) @ w).transpose(1, 2, 0)  # BUG


def free2_einsum_reordered(x, w):
    return jnp.einsum("ijk,kl->ilj", x, w)  # BUG


def gram_ref(x):
    return x.T @ x


def gram_local(x):
    return lax.psum(jnp.einsum("ti,tj->ij", x, x), "tp")


def gram_one_side_transposed(x):
    return lax.psum(jnp.einsum("ti,tj->ji", x, x[:, ::-1]), "tp")  # BUG


def dot_programs() -> list[Example]:
    what = "a contraction whose operands are transposed, read in place"
    rows4 = P(None, None, "tp", None)
    bmm = [f32((2, 2, 8, 4), rows4), f32((2, 2, 4, 4), P(), "weight")]
    c2 = [f32((8, 4, 4), P("tp", None, None)), f32((4, 4, 6), P(), "weight")]
    f2 = [f32((8, 4, 6), P("tp", None, None)), f32((6, 4), P(), "weight")]
    out = [_p("bmm", TP4, bmm_ref, bmm_both_swapped, bmm, rows4, what)]
    out += [_p("bmm", TP4, bmm_ref, bad, bmm, rows4, what, bug=bad.__name__.removeprefix("bmm_"))
            for bad in (bmm_weight_batch_swapped, bmm_weight_transposed, bmm_lhs_batch_swapped)]
    out += [_p("contract2", TP4, contract2_ref, contract2_both_transposed, c2, P("tp"), what),
            _p("contract2_one_transposed", TP4, contract2_ref, contract2_one_transposed, c2,
               P("tp"), what)]
    out += [_p("contract2", TP4, contract2_ref, bad, c2, P("tp"), what,
               bug=bad.__name__.removeprefix("contract2_"))
            for bad in (contract2_misread, contract2_paired_wrong)]
    out += [_p("free2", TP4, free2_ref, free2_through_transpose, f2, P("tp"), what)]
    out += [_p("free2", TP4, free2_ref, bad, f2, P("tp"), what,
               bug=bad.__name__.removeprefix("free2_"))
            for bad in (free2_reordered, free2_einsum_reordered)]
    g = [f32((16, 4), P("tp", None))]
    out += [_p("gram", TP4, gram_ref, gram_local, g, P(), what),
            _p("gram", TP4, gram_ref, gram_one_side_transposed, g, P(), what,
               bug="one_side_transposed")]
    return out


# ----- value-level: precision, compares, branches, regions, wrapping positions ------------------

def col_sum_ref(x):
    return jnp.sum(x, axis=1)


def col_sum(x):
    return lax.psum(jnp.sum(x, axis=1), "tp")


def col_sum_bf16_psum(x):
    return lax.psum(jnp.sum(x, axis=1).astype(jnp.bfloat16), "tp").astype(jnp.float32)  # BUG


def col_sum_bf16_operand(x):
    local = jnp.sum(x, axis=1).astype(jnp.bfloat16).astype(jnp.float32)  # BUG
    return lax.psum(local, "tp")


def _cancelling():
    """Chosen inputs: block sums 1000.5 and -1000 (bf16 rounds the first to 1000)."""
    def make():
        x = np.zeros((8, 16), np.float32)
        x[:, 0], x[:, 4] = 1000.5, -1000.0
        return [[x]]
    return make


def positive_ref(x):
    return (x > 0).astype(jnp.float32)


def positive(x):
    return jnp.where(x > 0, 1.0, 0.0)


def positive_tolerance(x):
    return jnp.where(x > jnp.float32(1e-6), 1.0, 0.0)  # BUG


def positive_below_zero(x):
    return jnp.where(x > jnp.float32(-1e-30), 1.0, 0.0)  # BUG


def _tiny():
    def make():
        return [[np.tile(np.array([5e-7, -1e-31, 1e-12, -5e-7], np.float32), (8, 4))]]
    return make


def halves_ref(x):
    return jnp.where(jnp.arange(8)[:, None] < 4, x * 2.0, x + 1.0)


def _halves(first, second, cut=lambda i: i < 2):
    def body(x):
        return lax.cond(cut(lax.axis_index("tp")), first, second, x)
    return body


def halves(x):
    return _halves(lambda v: v * 2.0, lambda v: v + 1.0)(x)


def halves_branches_swapped(x):
    return _halves(lambda v: v + 1.0, lambda v: v * 2.0)(x)  # BUG


def halves_cut_le(x):
    return _halves(lambda v: v * 2.0, lambda v: v + 1.0, lambda i: i <= 2)(x)  # BUG


def row_max_ref(x):
    return jnp.max(x, axis=1)


def _row_reduce(pick):
    def body(x):
        return lax.pmax(lax.reduce(x, -jnp.inf, pick, (1,)), "tp")
    return body


def row_max(x):
    return _row_reduce(lambda a, b: jnp.where(a >= b, a, b))(x)


def row_max_other_operand(x):
    return _row_reduce(lambda a, b: jnp.where(a >= b, b, a))(x)  # BUG


def prefix_ref(x):
    return jnp.where(jnp.arange(512)[None, :] < 100, x, 0.0)


def _scaled_positions(scale: int):
    def body(x):
        pos = (lax.axis_index("tp") * 128 + jnp.arange(128, dtype=jnp.int32)) * scale
        return jnp.where(pos[None, :] < 100 * scale, x, 0.0)
    return body


def prefix_scaled(x):
    return _scaled_positions(2 ** 22)(x)


def prefix_scaled_wrapping(x):
    return _scaled_positions(2 ** 23)(x)  # BUG


def prefix_offset_wrapping(x):
    pos = lax.axis_index("tp") * 2 ** 30 * 2 + jnp.arange(128, dtype=jnp.int32) * 2 ** 24
    return jnp.where(pos[None, :] < 100 * 2 ** 24, x, 0.0)  # BUG


def value_programs() -> list[Example]:
    cols, rows = P(None, "tp"), P("tp", None)
    x = [f32((8, 16), cols)]
    xr = [f32((8, 16), rows)]
    wide = [f32((2, 512), cols)]
    return [
        _p("col_sum", TP4, col_sum_ref, col_sum, x, P(), "a row sum over a column-split x"),
        _p("col_sum", TP4, col_sum_ref, col_sum_bf16_psum, x, P(), "a row sum",
           bug="bf16_psum", chosen=_cancelling()),
        _p("col_sum", TP4, col_sum_ref, col_sum_bf16_operand, x, P(), "a row sum",
           bug="bf16_operand", chosen=_cancelling()),
        _p("positive", TP4, positive_ref, positive, x, cols, "an indicator of x > 0"),
        _p("positive", TP4, positive_ref, positive_tolerance, x, cols, "x > 0",
           bug="tolerance", chosen=_tiny()),
        _p("positive", TP4, positive_ref, positive_below_zero, x, cols, "x > 0",
           bug="below_zero", chosen=_tiny()),
        _p("halves", TP4, halves_ref, halves, xr, rows, "a branch per device (lax.cond)"),
        _p("halves", TP4, halves_ref, halves_branches_swapped, xr, rows, "lax.cond",
           bug="branches_swapped"),
        _p("halves", TP4, halves_ref, halves_cut_le, xr, rows, "lax.cond", bug="cut_le"),
        _p("row_max", TP4, row_max_ref, row_max, x, P(), "a max by a select region"),
        _p("row_max", TP4, row_max_ref, row_max_other_operand, x, P(), "a select region",
           bug="other_operand"),
        _p("prefix", TP4, prefix_ref, prefix_scaled, wide, cols,
           "a prefix mask on int32 positions times 2^22"),
        _p("prefix", TP4, prefix_ref, prefix_scaled_wrapping, wide, cols,
           "positions times 2^23 wrap", bug="scaled_wrapping"),
        _p("prefix", TP4, prefix_ref, prefix_offset_wrapping, wide, cols,
           "the device offset times 2^24 wraps", bug="offset_wrapping"),
    ]


def programs() -> list[Example]:
    return moe_programs() + div_programs() + dot_programs() + value_programs()
