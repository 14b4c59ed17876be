"""Near misses of the patterns proven by the rules added for ring attention (online-softmax
fold, `Reordered` blocks, ring-loop unrolling) and micro-batch windows (row-wise windows,
summed windows, completed sums): small shard_map programs one edit away from a proven one.

Every case is grounded by execution on simulated CPU devices: a bug computes other numbers
than its reference (max difference > 1e-3), a correct variant the same ones (< 1e-4). A bug
must not be proven (by the walk alone, without the Z3 instance checks backing it); a correct
variant must be proven with every rule instance checked by Z3, or is a strict xfail naming the
rule it lacks.

False proofs found while writing these (fixed, kept as regressions):
* the online-sum fold (`idioms._online_sum`) is exact in real arithmetic but not where a row
  of the first block is -inf throughout (a causal ring started at another device's block):
  there the running max is -inf, exp(-inf - -inf) = NaN, and the program outputs NaN where the
  softmax over the concatenated blocks is finite. The fold now requires every row of the
  earlier blocks to hold an element above -inf on every device (`finite.rows_finite`).
* the same hazard in the older log-sum-exp rewrites (`idioms._rescaled_exp_sum`,
  `_shifted_lse`): a shard's own max over a causal row its keys all lie after is -inf, so
  `sum(exp(s - m)) * exp(m)` is NaN there, not `sum(exp(s))` = 0; a log-sum-exp over keys
  split this way was proven while computing NaN. The shift must now hold no infinity.
* `unroll.py` read a float loop counter's bounds with `int()`: `while i < 4.5` (5 trips) and
  `i += 1.5` with `i < 4` (3 trips) were unrolled 4 times, so a ring loop taking 5 or 3 steps
  over 4 devices was proven equal to the softmax over the 4 blocks.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.sharding import PartitionSpec as P

from entangle_mlir.driver import check_texts
from entangle_mlir.normalize.finite import NO_OVERFLOW
from examples.real.catalog import custom, lower_pair, run_pair
from examples.real.programs import ArgDef

CP = "cp"
BUG_GAP, SAME = 1e-3, 1e-4


@dataclass(frozen=True)
class Case:
    name: str
    reference: Callable
    body: Callable
    args: tuple[ArgDef, ...]
    out_specs: object
    mesh: tuple[tuple[str, int], ...]
    correct: bool
    missing: str = ""  # a correct variant not proven yet: the rule it lacks
    options: dict = field(default_factory=dict, compare=False)


def _f(name: str, shape: tuple[int, ...], spec=None, kind: str = "data") -> ArgDef:
    return ArgDef(name, shape, "float32", kind, P() if spec is None else spec)


def _max_error(ref: list[np.ndarray], shd: list[np.ndarray]) -> float:
    worst = 0.0
    for a, b in zip(ref, shd, strict=True):
        diff = np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64))
        worst = max(worst, float(np.nan_to_num(diff, nan=np.inf).max(initial=0.0)))
    return worst


def check_case(case: Case, online_softmax: bool = False) -> None:
    """Correct cases are proven with every rule instance proved by Z3; bug cases are not
    proven. `online_softmax`: a correct case may instead be refused only because a block of
    its scores may overflow (`normalize/finite.py`), and is then proven under
    `--assume-no-overflow`, which its report lists; a bug case is not proven even under it."""
    ex = custom(case.name, case.mesh, case.reference, case.body, case.args, case.out_specs,
                case.name)
    error = _max_error(*run_pair(ex))
    if case.correct:
        assert error < SAME, f"{case.name} is meant to be correct, differs by {error}"
        report = check_texts(*lower_pair(ex), verify_rules=True)
        if online_softmax and not report.proven:
            assert report.diagnostics[0].category == "overflow", report.render_text()
            report = check_texts(*lower_pair(ex), verify_rules=True, assume_no_overflow=True)
            assert NO_OVERFLOW in report.assumptions, report.assumptions
        assert report.proven, report.render_text()
        assert " 0 refuted, 0 inconclusive" in report.mode, report.mode
    else:
        assert error > BUG_GAP, f"{case.name} is meant to be a bug, differs by {error}"
        report = check_texts(*lower_pair(ex), verify_rules=False,
                             assume_no_overflow=online_softmax)
        assert not report.proven, f"FALSE PROOF of {case.name} (differs by {error})"


def params(cases: list[Case]) -> list:
    return [pytest.param(c, id=c.name, marks=[pytest.mark.xfail(strict=True, reason=c.missing)]
                         if c.missing else []) for c in cases]


# ---------------------------------------------------------------------------------------------
# Ring attention: K/V blocks passed around the cp ring, an online softmax over them.
# ---------------------------------------------------------------------------------------------

def rotation(n: int, hop: int) -> list[tuple[int, int]]:
    return [(j, (j + hop) % n) for j in range(n)]


SWAP_PAIRS = [(0, 1), (1, 0), (2, 3), (3, 2)]
CYCLE_0213 = [(0, 2), (2, 1), (1, 3), (3, 0)]
"""A ring that visits every device but is not a rotation by a block count."""


def causal_ref(q, k, v):
    s = q @ k.T
    s = jnp.where(jnp.arange(q.shape[0])[:, None] >= jnp.arange(k.shape[0])[None, :], s,
                  -jnp.inf)
    return jax.nn.softmax(s, axis=-1) @ v


def plain_ref(q, k, v):
    return jax.nn.softmax(q @ k.T, axis=-1) @ v


def squared_values_ref(q, k, v):
    return plain_ref(q, k, v * v)


def _cycle_source(me, i, n):
    """The device whose block a device holds after i hops of CYCLE_0213."""
    order = jnp.array([0, 2, 1, 3])
    position = jnp.array([0, 2, 1, 3])[me]
    return order[(position - i) % n]


def ring(q, k, v, *, causal: bool = True, kperm=None, vperm=None, source=None,
         rescale: str = "right", accumulate: str = "pv", shift_dim: str = "row",
         rescale_dim: str = "row", steps: int | None = None, skip: int | None = None,
         repeat: int | None = None, final: str = "div", mask_offset: int = 0,
         o_init: float = 0.0, d_init: float = 0.0, m_init: float = -np.inf,
         denom_rescaled: bool = True, denom_of: str = "p", max_axis: int = -1,
         stale_k_at: int | None = None, previous_v: bool = False, scale_at: int | None = None,
         compare: str = "ge", update_max: bool = True, pre_rotate: int = 0):
    """Ring attention over cp (rows of q, k and v split over it), one knob per near miss;
    the defaults are the correct program."""
    n, me, rows = lax.axis_size(CP), lax.axis_index(CP), q.shape[0]
    kperm = kperm or rotation(n, 1)
    vperm = vperm or kperm
    q_pos = me * rows + jnp.arange(rows)
    m = jnp.full((rows,), m_init, jnp.float32)
    denom = jnp.full((rows,), d_init, jnp.float32)
    o = jnp.full(q.shape[:1] + v.shape[1:], o_init, jnp.float32)
    for _ in range(pre_rotate):  # the ring starts `pre_rotate` blocks back (positions agree)
        k, v = lax.ppermute(k, CP, kperm), lax.ppermute(v, CP, vperm)
    k0, v_before = k, v

    def step(i, m, denom, o, k, v, v_before):
        src = source(me, i, n) if source else (me - i - pre_rotate + mask_offset) % n
        k_pos = src * rows + jnp.arange(rows)
        s = q @ (k0 if stale_k_at == i else k).T
        if scale_at == i:
            s = s * 2.0
        if causal:
            keep = (q_pos[:, None] >= k_pos[None, :]) if compare == "ge" else (
                q_pos[:, None] > k_pos[None, :])
            s = jnp.where(keep, s, -jnp.inf)
        m_new = jnp.maximum(m, jnp.max(s, axis=max_axis))
        shift = m_new[:, None] if shift_dim == "row" else m_new[None, :]
        p = jnp.exp(s - shift)
        corr = {"inverted": lambda: jnp.exp(m_new - m),
                "quotient": lambda: jnp.exp(m) / jnp.exp(m_new)}.get(
                    rescale, lambda: jnp.exp(m - m_new))()
        summed = {"p": lambda: jnp.sum(p, axis=-1), "doubled": lambda: jnp.sum(
            jnp.exp(2 * s - shift), axis=-1), "columns": lambda: jnp.sum(p, axis=0)}[denom_of]()
        denom = (denom * corr if denom_rescaled else denom) + summed
        values = v_before if previous_v else v
        block = {"pv": lambda: p @ values, "ppv": lambda: (p * p) @ values,
                 "affine": lambda: p @ values + 1.0, "pvv": lambda: p @ (values * values),
                 "pT": lambda: p.T @ values}[accumulate]()
        factor = corr[:, None] if rescale_dim == "row" else corr[None, :]
        o = (o if rescale == "stale" else o * factor) + block
        return (m_new if update_max else m), denom, o

    for i in range(n if steps is None else steps):
        if i != skip:
            m, denom, o = step(i, m, denom, o, k, v, v_before)
            if i == repeat:
                m, denom, o = step(i, m, denom, o, k, v, v_before)
        v_before = v
        k, v = lax.ppermute(k, CP, kperm), lax.ppermute(v, CP, vperm)
    if final == "none":
        return o
    if final == "reciprocal":
        return o * (1 / denom)[:, None]
    return o / (denom[:, None] if final == "div" else denom[None, :])


RING_ARGS = (_f("q", (16, 4), P(CP, None)), _f("k", (16, 4), P(CP, None)),
             _f("v", (16, 4), P(CP, None)))
"""4 rows per device: square score and output blocks, so a broadcast along the wrong dim
type-checks."""


def ring_case(name: str, correct: bool, missing: str = "", reference: Callable = causal_ref,
              **knobs) -> Case:
    return Case(f"nm_ring_{name}", reference, lambda q, k, v: ring(q, k, v, **knobs),
                RING_ARGS, P(CP, None), ((CP, 4),), correct, missing)


PLAIN = {"causal": False, "reference": plain_ref}
FOLD_ONLY_ZERO_INIT = ("the online-sum fold takes only a zero initial accumulator (the "
                       "first rescale exp(-inf - m) = 0 drops any other)")
RING_CASES = [
    ring_case("causal", True),
    ring_case("plain", True, **PLAIN),
    ring_case("plain_other_direction_consistent", True, kperm=rotation(4, -1), **PLAIN),
    ring_case("causal_other_direction_consistent", True, kperm=rotation(4, -1),
              source=lambda me, i, n: (me + i) % n),
    ring_case("plain_squared_values", True, accumulate="pvv", causal=False,
              reference=squared_values_ref),
    ring_case("reciprocal_final", True, "the final division is matched as a divide only "
              "(o * (1/denom) is not moved into the probabilities)", final="reciprocal"),
    ring_case("rescale_as_quotient", True, "the rescale is matched as exp(m_old - m_new) "
              "only, not exp(m_old) / exp(m_new)", rescale="quotient"),
    ring_case("max_over_query_dim", True, "any per-row shift cancels in exact arithmetic; "
              "the fold knows only the running max over the key dim", max_axis=0, **PLAIN),
    ring_case("max_from_zero", True, "the running max must start at -inf (max(0, .) is "
              "another valid shift)", m_init=0.0, **PLAIN),
    ring_case("output_init_one", True, FOLD_ONLY_ZERO_INIT, o_init=1.0, **PLAIN),
    ring_case("denominator_init_one", True, FOLD_ONLY_ZERO_INIT, d_init=1.0, **PLAIN),
    ring_case("cycle_0213", True, "collective_permute is related only as a rotation by a "
              "block count (0->2->1->3->0 is a ring, not a rotation)", kperm=CYCLE_0213,
              source=_cycle_source),
    ring_case("plain_cycle_0213", True, "collective_permute is related only as a rotation "
              "by a block count", kperm=CYCLE_0213, **PLAIN),
    ring_case("plain_started_one_block_back", True, pre_rotate=1, **PLAIN),
    # bugs
    # was a false proof: device 0's first block (keys 12..15) is masked for all its queries,
    # its running max is -inf, exp(-inf - -inf) = NaN, and the NaN stays in the output
    ring_case("started_one_block_back", False, pre_rotate=1),
    ring_case("started_two_blocks_back", False, pre_rotate=2),
    ring_case("inverted_rescale", False, rescale="inverted"),
    ring_case("unrescaled_output", False, rescale="stale"),
    ring_case("unrescaled_denominator", False, denom_rescaled=False),
    ring_case("max_not_updated", False, update_max=False),
    ring_case("three_steps", False, steps=3),
    ring_case("five_steps", False, steps=5),
    ring_case("plain_three_steps", False, steps=3, **PLAIN),
    ring_case("plain_five_steps", False, steps=5, **PLAIN),
    ring_case("step_skipped", False, skip=1),
    ring_case("step_repeated", False, repeat=1),
    ring_case("plain_step_skipped", False, skip=2, **PLAIN),
    ring_case("plain_step_repeated", False, repeat=2, **PLAIN),
    ring_case("no_final_division", False, final="none"),
    ring_case("final_division_transposed", False, final="transposed"),
    ring_case("plain_final_division_transposed", False, final="transposed", **PLAIN),
    ring_case("mask_one_block_off", False, mask_offset=1),
    ring_case("mask_strict", False, compare="gt"),
    ring_case("values_turn_back", False, vperm=rotation(4, -1)),
    ring_case("keys_turn_back", False, kperm=rotation(4, -1), vperm=rotation(4, 1)),
    ring_case("plain_values_turn_back", False, vperm=rotation(4, -1), **PLAIN),
    ring_case("plain_values_other_cycle", False, vperm=CYCLE_0213, **PLAIN),
    ring_case("plain_swapped_pairs", False, kperm=SWAP_PAIRS, **PLAIN),
    ring_case("plain_two_hops", False, kperm=rotation(4, 2), **PLAIN),
    ring_case("swapped_pairs", False, kperm=SWAP_PAIRS),
    ring_case("cycle_0213_rotation_positions", False, kperm=CYCLE_0213),
    ring_case("stale_keys_at_step_1", False, stale_k_at=1),
    ring_case("plain_stale_keys_at_step_2", False, stale_k_at=2, **PLAIN),
    ring_case("previous_step_values", False, previous_v=True),
    ring_case("plain_previous_step_values", False, previous_v=True, **PLAIN),
    ring_case("squared_probabilities", False, accumulate="ppv", **PLAIN),
    ring_case("affine_accumulation", False, accumulate="affine", **PLAIN),
    ring_case("squared_values", False, accumulate="pvv", **PLAIN),
    ring_case("transposed_probabilities", False, accumulate="pT", **PLAIN),
    ring_case("shift_along_columns", False, shift_dim="column"),
    ring_case("plain_shift_along_columns", False, shift_dim="column", **PLAIN),
    ring_case("rescale_along_columns", False, rescale_dim="column"),
    ring_case("plain_rescale_along_columns", False, rescale_dim="column", **PLAIN),
    ring_case("doubled_scores_in_denominator", False, denom_of="doubled", **PLAIN),
    ring_case("denominator_over_columns", False, denom_of="columns", **PLAIN),
    ring_case("scores_doubled_at_step_0", False, scale_at=0),
    ring_case("plain_scores_doubled_at_step_1", False, scale_at=1, **PLAIN),
    ring_case("causal_program_plain_reference", False, reference=plain_ref),
    ring_case("plain_program_causal_reference", False, causal=False),
]


@pytest.mark.parametrize("case", params(RING_CASES))
def test_ring_attention_near_miss(case: Case) -> None:
    check_case(case, online_softmax=True)


# Multi-head ring attention (b, s, h, d) with views between the accumulators: a reshape
# where a swapaxes belongs scrambles heads and rows (square when h == local rows).
def heads_ref(q, k, v):
    s = jnp.einsum("bqhd,bkhd->bhqk", q, k)
    rows = q.shape[1]
    s = jnp.where(jnp.arange(rows)[:, None] >= jnp.arange(rows)[None, :], s, -jnp.inf)
    return jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(s, axis=-1), v)


def heads_ring(q, k, v, *, rescale_view: str = "swap", final_view: str = "swap",
               shift_view: str = "row"):
    n, me = lax.axis_size(CP), lax.axis_index(CP)
    b, rows, h, _ = q.shape
    q_pos = me * rows + jnp.arange(rows)
    o = jnp.zeros(q.shape, jnp.float32)
    m = jnp.full((b, h, rows), -jnp.inf, jnp.float32)
    denom = jnp.zeros((b, h, rows), jnp.float32)

    def view(x, how):
        return jnp.swapaxes(x, 1, 2) if how == "swap" else x.reshape(b, rows, h)

    for i in range(n):
        k_pos = ((me - i) % n) * rows + jnp.arange(rows)
        s = jnp.einsum("bqhd,bkhd->bhqk", q, k)
        s = jnp.where(q_pos[:, None] >= k_pos[None, :], s, -jnp.inf)
        m_new = jnp.maximum(m, jnp.max(s, axis=-1))
        shift = m_new if shift_view == "row" else jnp.swapaxes(m_new, 1, 2)
        p = jnp.exp(s - shift[..., None])
        corr = jnp.exp(m - m_new)
        denom = denom * corr + jnp.sum(p, axis=-1)
        o = o * view(corr, rescale_view)[..., None] + jnp.einsum("bhqk,bkhd->bqhd", p, v)
        m = m_new
        k, v = (lax.ppermute(x, CP, rotation(n, 1)) for x in (k, v))
    return o / view(denom, final_view)[..., None]


HEADS_ARGS = tuple(_f(name, (2, 16, 4, 3), P(None, CP, None, None)) for name in "qkv")


def heads_case(name: str, correct: bool, **knobs) -> Case:
    return Case(f"nm_heads_{name}", heads_ref, lambda q, k, v: heads_ring(q, k, v, **knobs),
                HEADS_ARGS, P(None, CP, None, None), ((CP, 4),), correct)


HEADS_CASES = [
    heads_case("swapaxes", True),
    heads_case("rescale_reshaped", False, rescale_view="reshape"),
    heads_case("final_division_reshaped", False, final_view="reshape"),
    heads_case("shift_heads_and_rows_swapped", False, shift_view="swapped"),
]


@pytest.mark.parametrize("case", params(HEADS_CASES))
def test_multi_head_ring_attention_near_miss(case: Case) -> None:
    check_case(case, online_softmax=True)


# Ring attention over cp on a dp x cp mesh (batch split over dp): the ring, the values' ring
# and the key positions must all follow the cp axis.
def batched_causal_ref(q, k, v):
    s = jnp.einsum("bqd,bkd->bqk", q, k)
    rows = q.shape[1]
    s = jnp.where(jnp.arange(rows)[:, None] >= jnp.arange(rows)[None, :], s, -jnp.inf)
    return jnp.einsum("bqk,bkd->bqd", jax.nn.softmax(s, axis=-1), v)


def mesh_ring(q, k, v, *, position_axis: str = CP, key_axis: str = CP, value_axis: str = CP,
              position_slip_at: int | None = None):
    n, me = lax.axis_size(CP), lax.axis_index(position_axis)
    rows = q.shape[1]
    q_pos = lax.axis_index(CP) * rows + jnp.arange(rows)
    m = jnp.full(q.shape[:2], -jnp.inf, jnp.float32)
    denom = jnp.zeros(q.shape[:2], jnp.float32)
    o = jnp.zeros(q.shape, jnp.float32)
    for i in range(n):
        src = (me - i + (1 if i == position_slip_at else 0)) % n
        k_pos = src * rows + jnp.arange(rows)
        s = jnp.einsum("bqd,bkd->bqk", q, k)
        s = jnp.where(q_pos[:, None] >= k_pos[None, :], s, -jnp.inf)
        m_new = jnp.maximum(m, jnp.max(s, axis=-1))
        p = jnp.exp(s - m_new[..., None])
        corr = jnp.exp(m - m_new)
        denom = denom * corr + jnp.sum(p, axis=-1)
        o = o * corr[..., None] + jnp.einsum("bqk,bkd->bqd", p, v)
        m = m_new
        k = lax.ppermute(k, key_axis, rotation(lax.axis_size(key_axis), 1))
        v = lax.ppermute(v, value_axis, rotation(lax.axis_size(value_axis), 1))
    return o / denom[..., None]


MESH_SPEC = P("dp", CP, None)
MESH_ARGS = tuple(_f(name, (4, 16, 3), MESH_SPEC) for name in "qkv")


def mesh_case(name: str, correct: bool, **knobs) -> Case:
    return Case(f"nm_mesh_ring_{name}", batched_causal_ref,
                lambda q, k, v: mesh_ring(q, k, v, **knobs), MESH_ARGS, MESH_SPEC,
                (("dp", 2), (CP, 4)), correct)


MESH_CASES = [
    mesh_case("cp", True),
    mesh_case("positions_from_dp", False, position_axis="dp"),
    mesh_case("values_ring_over_dp", False, value_axis="dp"),
    mesh_case("ring_over_dp", False, key_axis="dp", value_axis="dp"),
    mesh_case("positions_slip_at_step_2", False, position_slip_at=2),
]


@pytest.mark.parametrize("case", params(MESH_CASES))
def test_ring_attention_on_a_2d_mesh_near_miss(case: Case) -> None:
    check_case(case, online_softmax=True)


# Ring loops (`unroll.py`): a while loop holding the collective_permutes, unrolled when its
# trip count is a constant.
def loop_ring(q, k, v, *, start=0, bound=4, step=1, dtype=jnp.int32, weak_init: bool = False):
    """Plain ring attention as `lax.while_loop(i < bound, i += step)`."""
    n, rows = lax.axis_size(CP), q.shape[0]
    if weak_init:  # jax converts the weakly typed carries f32 -> f32 inside the body
        m, denom = jnp.full((rows,), -jnp.inf), jnp.zeros((rows,))
        o = jnp.zeros((rows, v.shape[1]))
    else:
        m = jnp.full((rows,), -jnp.inf, jnp.float32)
        denom = jnp.zeros((rows,), jnp.float32)
        o = jnp.zeros((rows, v.shape[1]), jnp.float32)

    def body(carry):
        i, m, denom, o, k, v = carry
        s = q @ k.T
        m_new = jnp.maximum(m, jnp.max(s, axis=-1))
        p = jnp.exp(s - m_new[:, None])
        corr = jnp.exp(m - m_new)
        denom = denom * corr + jnp.sum(p, axis=-1)
        o = o * corr[:, None] + p @ v
        k, v = (lax.ppermute(x, CP, rotation(n, 1)) for x in (k, v))
        return i + jnp.asarray(step, dtype), m_new, denom, o, k, v

    carry = lax.while_loop(lambda c: c[0] < jnp.asarray(bound, dtype), body,
                           (jnp.asarray(start, dtype), m, denom, o, k, v))
    return carry[3] / carry[2][:, None]


def loop_case(name: str, correct: bool, missing: str = "", **knobs) -> Case:
    return Case(f"nm_loop_{name}", plain_ref, lambda q, k, v: loop_ring(q, k, v, **knobs),
                RING_ARGS, P(CP, None), ((CP, 4),), correct, missing)


FLOAT_COUNTER = "float loop counters are not unrolled (only integer counts of steps)"
LOOP_CASES = [
    loop_case("int_4_trips", True),
    loop_case("uint_4_trips", True, dtype=jnp.uint32),
    loop_case("from_2_to_6", True, start=2, bound=6),
    loop_case("weakly_typed_carries", True, weak_init=True),
    loop_case("float_4_trips", True, FLOAT_COUNTER, start=0.0, bound=4.0, step=1.0,
              dtype=jnp.float32),
    loop_case("int_3_trips", False, bound=3),
    loop_case("int_5_trips", False, bound=5),
    loop_case("from_1_to_4", False, start=1, bound=4),
    # were false proofs: int(4.5) == 4 bound, int(1.5) == 1 step
    loop_case("float_bound_4_5", False, start=0.0, bound=4.5, step=1.0, dtype=jnp.float32),
    loop_case("float_step_1_5", False, start=0.0, bound=4.0, step=1.5, dtype=jnp.float32),
    loop_case("float_step_0_9", False, start=0.0, bound=4.0, step=0.9, dtype=jnp.float32),
]


@pytest.mark.parametrize("case", params(LOOP_CASES))
def test_ring_loop_near_miss(case: Case) -> None:
    check_case(case, online_softmax=True)



@pytest.mark.parametrize("pre_rotate", [0, 1])
def test_online_softmax_fold_keeps_the_programs_nans(pre_rotate: int) -> None:
    """The normalize rewrites run on the partitioned program compute what it computes, NaNs
    included: started one block back, device 0's first block is masked throughout and its
    output is NaN, and it stays NaN (the fold is refused there)."""
    from entangle_mlir.mlir.ir import context, parse_module
    from entangle_mlir.mlir.program import inline_calls
    from entangle_mlir.normalize.rewrites import rewrite_idioms
    from tests.normalize.test_online_softmax import _run_partitioned

    case = ring_case(f"nan_{pre_rotate}", pre_rotate == 0, pre_rotate=pre_rotate)
    ex = custom(case.name, case.mesh, case.reference, case.body, case.args, case.out_specs,
                case.name)
    text = lower_pair(ex)[1]
    with context():
        module = parse_module(text)
        inline_calls(module, "ring.mlir")
        with module.context:
            assert rewrite_idioms(module) > 0
        rewritten = str(module)
    before, after = _run_partitioned(ex, text), _run_partitioned(ex, rewritten)
    assert np.isnan(np.concatenate(before)).any() == (pre_rotate > 0)
    for b, a in zip(before, after, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5, equal_nan=True)


# Log-sum-exp over keys split over tp (queries replicated, causal): a shard whose keys all lie
# after a query holds a row of -inf scores.
def causal_lse_ref(q, k):
    s = jnp.where(jnp.arange(q.shape[0])[:, None] >= jnp.arange(k.shape[0])[None, :],
                  q @ k.T, -jnp.inf)
    m = jnp.max(s, axis=-1)
    return jnp.log(jnp.sum(jnp.exp(s - m[:, None]), axis=-1)) + m


def causal_lse_split_keys(q, k, shift: str):
    me = lax.axis_index("tp")
    k_pos = me * k.shape[0] + jnp.arange(k.shape[0])
    s = jnp.where(jnp.arange(q.shape[0])[:, None] >= k_pos[None, :], q @ k.T, -jnp.inf)
    m = jnp.max(s, axis=-1)
    if shift == "shard_max":  # exp(-inf - -inf) = NaN on a shard that sees only masked keys
        return jnp.log(lax.psum(jnp.sum(jnp.exp(s - m[:, None]), axis=-1) * jnp.exp(m), "tp"))
    m = lax.pmax(m, "tp")
    return jnp.log(lax.psum(jnp.sum(jnp.exp(s - m[:, None]), axis=-1), "tp")) + m


LSE_ARGS = (_f("q", (8, 4)), _f("k", (8, 4), P("tp", None)))
LSE_CASES = [
    Case("nm_lse_global_max", causal_lse_ref,
         lambda q, k: causal_lse_split_keys(q, k, "global_max"), LSE_ARGS, P(), (("tp", 4),),
         True),
    # was a false proof: the rescaled exp-sum rewrite turned the shard's NaN into 0
    Case("nm_lse_shard_max", causal_lse_ref,
         lambda q, k: causal_lse_split_keys(q, k, "shard_max"), LSE_ARGS, P(), (("tp", 4),),
         False),
]


@pytest.mark.parametrize("case", params(LSE_CASES))
def test_log_sum_exp_near_miss(case: Case) -> None:
    check_case(case)


# ---------------------------------------------------------------------------------------------
# Micro-batch windows (`rules/kinds/window.py`): micro-batches are rows of the local batch (dp=4, 8
# rows per device); sums over them complete to the block's sum only when the windows tile it.
# ---------------------------------------------------------------------------------------------

DP = "dp"
HALVES = [(0, 4), (4, 8)]


def tanh_sum_ref(x):
    return jnp.sum(jnp.tanh(x))


def windowed_sums(x, windows, scales=None):
    parts = [jnp.sum(jnp.tanh(x[a:b])) for a, b in windows]
    total = parts[0] * (scales[0] if scales else 1.0)
    for j, part in enumerate(parts[1:], 1):
        total = total + part * (scales[j] if scales else 1.0)
    return lax.psum(total, DP)


def two_tensors_ref(x, y):
    return jnp.sum(jnp.tanh(x)) + jnp.sum(jnp.tanh(y))


def two_tensor_windows(x, y, pairs):
    """`pairs`: per micro-batch, (tensor, rows) of the two sums added for it."""
    source = {"x": x, "y": y}
    total = None
    for (t1, (a, b)), (t2, (c, d)) in pairs:
        step = jnp.sum(jnp.tanh(source[t1][a:b])) + jnp.sum(jnp.tanh(source[t2][c:d]))
        total = step if total is None else total + step
    return lax.psum(total, DP)


def masked_grad_ref(w, x, m):
    return jax.grad(lambda w: jnp.sum(jnp.tanh(x @ w) * m[:, None]) / jnp.sum(m))(w)


def accumulated_grad(w, x, m, windows, mask_windows=None, scales=None, per_window=False,
                     scale_all: float = 1.0, mean: bool = False):
    """Gradient accumulation over micro-batches of the local batch, masked loss over the
    global valid count (the correct program with the defaults)."""
    count = lax.psum(jnp.sum(m), DP)
    grads = jnp.zeros_like(w)
    for j, ((a, b), (c, d)) in enumerate(zip(windows, mask_windows or windows, strict=True)):
        xs, ms = x[a:b], m[c:d]
        divisor = jnp.sum(ms) * len(windows) if per_window else count
        g = jax.grad(lambda w, xs=xs, ms=ms, divisor=divisor:
                     jnp.sum(jnp.tanh(xs @ w) * ms[:, None]) / divisor)(w)
        grads = grads + g * (scales[j] if scales else 1.0)
    grads = grads * scale_all
    return lax.pmean(grads, DP) if mean else lax.psum(grads, DP)


def bias_grad_ref(b, x):
    return jax.grad(lambda b: jnp.sum(jnp.tanh(x + b) ** 2))(b)


def accumulated_bias_grad(b, x, windows, scales=None):
    grads = jnp.zeros_like(b)
    for j, (lo, hi) in enumerate(windows):
        g = jax.grad(lambda b, xs=x[lo:hi]: jnp.sum(jnp.tanh(xs + b) ** 2))(b)
        grads = grads + g * (scales[j] if scales else 1.0)
    return lax.psum(grads, DP)


def rows_ref(x):
    return jnp.tanh(x) * 2.0


def rows_rejoined(x, windows):
    return jnp.concatenate([jnp.tanh(x[a:b]) * 2.0 for a, b in windows], axis=0)


def tp_weight_grad_ref(w, x):
    return jax.grad(lambda w: jnp.sum(jnp.tanh(x @ w)))(w)


def tp_weight_grad(w, x, windows, axes=(DP,)):
    grads = jnp.zeros_like(w)
    for a, b in windows:
        grads = grads + jax.grad(lambda w, xs=x[a:b]: jnp.sum(jnp.tanh(xs @ w)))(w)
    return lax.psum(grads, axes)


X_ARGS = (_f("x", (32, 4), P(DP, None)),)
XY_ARGS = (_f("x", (32, 4), P(DP, None)), _f("y", (32, 4), P(DP, None)))
WXM_ARGS = (_f("w", (4, 3), kind="weight"), _f("x", (32, 4), P(DP, None)),
            ArgDef("m", (32,), "float32", "mask", P(DP)))
BX_ARGS = (_f("b", (4,), kind="bias"), _f("x", (32, 4), P(DP, None)))
TP_ARGS = (_f("w", (4, 6), P(None, "tp"), kind="weight"), _f("x", (16, 4), P(DP, None)))
DP4 = ((DP, 4),)


REPLICATED = P()


def window_case(name: str, correct: bool, reference, body, args=X_ARGS, out=REPLICATED,
                mesh=DP4, missing: str = "") -> Case:
    return Case(f"nm_window_{name}", reference, body, args, out, mesh, correct, missing)


WINDOW_CASES = [
    window_case("halves", True, tanh_sum_ref, lambda x: windowed_sums(x, HALVES)),
    window_case("quarters", True, tanh_sum_ref,
                lambda x: windowed_sums(x, [(0, 2), (2, 4), (4, 6), (6, 8)])),
    window_case("unequal_3_5", True, tanh_sum_ref, lambda x: windowed_sums(x, [(0, 3), (3, 8)])),
    window_case("reversed", True, tanh_sum_ref, lambda x: windowed_sums(x, [(4, 8), (0, 4)])),
    window_case("both_halved_then_doubled", True, tanh_sum_ref,
                lambda x: windowed_sums(x, HALVES, [0.5, 0.5]) * 2.0),
    window_case("overlapping", False, tanh_sum_ref, lambda x: windowed_sums(x, [(0, 5), (4, 8)])),
    window_case("gap", False, tanh_sum_ref, lambda x: windowed_sums(x, [(0, 3), (4, 8)])),
    window_case("second_counted_twice", False, tanh_sum_ref,
                lambda x: windowed_sums(x, [*HALVES, (4, 8)])),
    window_case("first_half_twice", False, tanh_sum_ref,
                lambda x: windowed_sums(x, [(0, 4), (0, 4)])),
    window_case("one_scaled", False, tanh_sum_ref, lambda x: windowed_sums(x, HALVES, [2.0, 1.0])),
    window_case("one_negated", False, tanh_sum_ref,
                lambda x: windowed_sums(x, HALVES, [-1.0, 1.0])),
    window_case("quarter_missing", False, tanh_sum_ref,
                lambda x: windowed_sums(x, [(0, 2), (2, 4), (4, 6)])),
    window_case("quarter_repeated", False, tanh_sum_ref,
                lambda x: windowed_sums(x, [(0, 2), (2, 4), (2, 4), (6, 8)])),
    window_case("two_tensors", True, two_tensors_ref,
                lambda x, y: two_tensor_windows(x, y, [(("x", (0, 4)), ("y", (0, 4))),
                                                       (("x", (4, 8)), ("y", (4, 8)))]), XY_ARGS),
    window_case("two_tensors_crossed", True, two_tensors_ref,
                lambda x, y: two_tensor_windows(x, y, [(("x", (0, 4)), ("y", (4, 8))),
                                                       (("x", (4, 8)), ("y", (0, 4)))]), XY_ARGS),
    # ^ the layout tier adds sums of windows of different tensors only over the same rows;
    # the general tier (per-device expansion) proves it
    window_case("two_tensors_mixed_halves", False, two_tensors_ref,
                lambda x, y: two_tensor_windows(x, y, [(("x", (0, 4)), ("y", (4, 8)))]), XY_ARGS),
    window_case("two_tensors_x_twice", False, two_tensors_ref,
                lambda x, y: two_tensor_windows(x, y, [(("x", (0, 4)), ("x", (0, 4))),
                                                       (("y", (4, 8)), ("y", (4, 8)))]), XY_ARGS),
    window_case("grad_halves", True, masked_grad_ref,
                lambda w, x, m: accumulated_grad(w, x, m, HALVES), WXM_ARGS),
    window_case("grad_unequal_3_5", True, masked_grad_ref,
                lambda w, x, m: accumulated_grad(w, x, m, [(0, 3), (3, 8)]), WXM_ARGS),
    window_case("grad_quarters", True, masked_grad_ref,
                lambda w, x, m: accumulated_grad(w, x, m, [(0, 2), (2, 4), (4, 6), (6, 8)]),
                WXM_ARGS),
    window_case("grad_overlapping", False, masked_grad_ref,
                lambda w, x, m: accumulated_grad(w, x, m, [(0, 5), (4, 8)]), WXM_ARGS),
    window_case("grad_gap", False, masked_grad_ref,
                lambda w, x, m: accumulated_grad(w, x, m, [(0, 3), (4, 8)]), WXM_ARGS),
    window_case("grad_second_counted_twice", False, masked_grad_ref,
                lambda w, x, m: accumulated_grad(w, x, m, [*HALVES, (4, 8)]), WXM_ARGS),
    window_case("grad_one_scaled", False, masked_grad_ref,
                lambda w, x, m: accumulated_grad(w, x, m, HALVES, scales=[1.0, 2.0]), WXM_ARGS),
    window_case("grad_masks_swapped", False, masked_grad_ref,
                lambda w, x, m: accumulated_grad(w, x, m, HALVES, [(4, 8), (0, 4)]), WXM_ARGS),
    window_case("grad_mask_one_row_off", False, masked_grad_ref,
                lambda w, x, m: accumulated_grad(w, x, m, HALVES, [(1, 5), (4, 8)]), WXM_ARGS),
    window_case("grad_per_micro_batch_mean", False, masked_grad_ref,
                lambda w, x, m: accumulated_grad(w, x, m, HALVES, per_window=True), WXM_ARGS),
    window_case("grad_averaged_over_micro_batches", False, masked_grad_ref,
                lambda w, x, m: accumulated_grad(w, x, m, HALVES, scale_all=0.5), WXM_ARGS),
    window_case("grad_pmean", False, masked_grad_ref,
                lambda w, x, m: accumulated_grad(w, x, m, HALVES, mean=True), WXM_ARGS),
    window_case("bias_grad_halves", True, bias_grad_ref,
                lambda b, x: accumulated_bias_grad(b, x, HALVES), BX_ARGS),
    window_case("bias_grad_unequal_3_5", True, bias_grad_ref,
                lambda b, x: accumulated_bias_grad(b, x, [(0, 3), (3, 8)]), BX_ARGS),
    window_case("bias_grad_overlapping", False, bias_grad_ref,
                lambda b, x: accumulated_bias_grad(b, x, [(0, 5), (4, 8)]), BX_ARGS),
    window_case("bias_grad_one_halved", False, bias_grad_ref,
                lambda b, x: accumulated_bias_grad(b, x, HALVES, [1.0, 0.5]), BX_ARGS),
    window_case("bias_grad_first_twice", False, bias_grad_ref,
                lambda b, x: accumulated_bias_grad(b, x, [*HALVES, (0, 4)]), BX_ARGS),
    window_case("rows_rejoined", True, rows_ref, lambda x: rows_rejoined(x, HALVES),
                out=P(DP, None)),
    window_case("rows_rejoined_3_5", True, rows_ref,
                lambda x: rows_rejoined(x, [(0, 3), (3, 8)]), out=P(DP, None)),
    window_case("rows_rejoined_swapped", False, rows_ref,
                lambda x: rows_rejoined(x, [(4, 8), (0, 4)]), out=P(DP, None)),
    window_case("rows_rejoined_first_twice", False, rows_ref,
                lambda x: rows_rejoined(x, [(0, 4), (0, 4)]), out=P(DP, None)),
    window_case("tp_weight_grad", True, tp_weight_grad_ref,
                lambda w, x: tp_weight_grad(w, x, [(0, 2), (2, 4)]), TP_ARGS, P(None, "tp"),
                ((DP, 4), ("tp", 2))),
    # ^ window_reduce refuses summed micro-batch windows whose other dims are split (a
    # tp-split weight's gradient); the general tier (per-device expansion) proves it
    window_case("tp_weight_grad_psum_over_tp_too", False, tp_weight_grad_ref,
                lambda w, x: tp_weight_grad(w, x, [(0, 2), (2, 4)], (DP, "tp")), TP_ARGS,
                P(None, "tp"), ((DP, 4), ("tp", 2))),
    window_case("tp_weight_grad_gap", False, tp_weight_grad_ref,
                lambda w, x: tp_weight_grad(w, x, [(0, 1), (2, 4)]), TP_ARGS, P(None, "tp"),
                ((DP, 4), ("tp", 2))),
]


@pytest.mark.parametrize("case", params(WINDOW_CASES))
def test_micro_batch_window_near_miss(case: Case) -> None:
    check_case(case)


@pytest.mark.parametrize("groups", ["dense<[[0, 1, 2, 3]]> : tensor<1x4xi64>",
                                    "dense<> : tensor<0x0xi64>"])
def test_a_pmax_of_rows_no_device_sees_may_be_minus_inf(groups: str) -> None:
    """The shift analysis (`finite.nonfinite_kinds`) of a pmax over tp of each shard's max of
    `q_pos > k_pos`-masked scores: query 0 sees no key on any device, so the pmax is -inf
    there, with the replica groups written out or left empty (one group of every device)."""
    import re

    from entangle_mlir.mlir.ir import context, parse_module
    from entangle_mlir.mlir.program import inline_calls
    from entangle_mlir.normalize import finite

    def strict(q, k):
        k_pos = lax.axis_index("tp") * k.shape[0] + jnp.arange(k.shape[0])
        s = jnp.where(jnp.arange(q.shape[0])[:, None] > k_pos[None, :], q @ k.T, -jnp.inf)
        return lax.pmax(jnp.max(s, axis=-1), "tp")

    ex = custom("strict_pmax", (("tp", 4),), lambda q, k: jnp.max(q @ k.T, axis=-1), strict,
                LSE_ARGS, P(), "pmax")
    text = re.sub(r"replica_groups = dense<[^>]*> : tensor<[0-9x]+xi64>",
                  f"replica_groups = {groups}", lower_pair(ex)[1])
    if "<>" in groups:  # empty groups are all partitions only without global device ids
        text = re.sub(r",? ?use_global_device_ids", "", text)
    with context():
        from jaxlib.mlir import ir

        module = parse_module(text)
        inline_calls(module, "pmax.mlir")
        found = []

        def collect(op):
            if op.name == "stablehlo.all_reduce":
                found.append(op)
            return ir.WalkResult.ADVANCE

        module.operation.walk(collect)
        (pmax,) = found
        assert finite.nonfinite_kinds(pmax.result, {}) & finite.NEG
