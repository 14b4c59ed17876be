"""Loops proven by invariant (`analysis/general/loops.py`, issue 19): a counted loop's body is
expanded once at a symbolic step and its exit values are the invariant read at the trip
count, not the trips run one by one. The ring loops here are kept loops (entangle-normalize
would unroll those of at most 16 trips for the layout tier), so the general tier reads them.

Every label is grounded by execution on simulated CPU devices. Proven by invariant: a GPipe
forward of 4 stages x 6 micro-batches, the same writing its outputs at every step (the
bubble's junk lands in slots written again later: correct), the same on a dp 2 x stages 4
mesh (the rows split over dp), the pipeline's loss accumulated over the micro-batches with
the bubble masked, gradient accumulation over 8 micro-batches (data parallel), an all-gather
collective matmul whose left operand rotates around a ring of 8 devices, and a loop over
micro-batches holding a scan over layers (nested: each body expanded once, whatever the trip
counts). Not proven, the nearest wrong programs, each computing other numbers: the
activations handed to the previous stage, the outputs written one step late, the bubble's
loss not masked, the loss divided by the steps instead of the micro-batches, the accumulated
gradients summed instead of averaged, the ring rotated the other way, the inner scan reading
the next layer's weights.
"""

from __future__ import annotations

import os

if "--xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
    ).strip()

import re
from dataclasses import dataclass
from fractions import Fraction
from unittest import mock

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

from benchmarks import pipeline
from entangle_mlir.analysis.general.loops import BASE_TRIPS, written
from entangle_mlir.core.normal_form import update_slice
from entangle_mlir.core.terms import make_arg
from entangle_mlir.driver import check_texts
from entangle_mlir.jax import lower_pair
from entangle_mlir.normalize import unroll
from entangle_mlir.semantics.evaluate import evaluate_term

RNG = np.random.default_rng(19)
STAGES, MICRO, WIDTH, ROWS = 4, 6, 8, 2


@dataclass(frozen=True)
class Program:
    name: str
    mesh: tuple[tuple[str, int], ...]
    reference: object
    body: object
    args: tuple[tuple[tuple[int, ...], object], ...]
    """(shape, PartitionSpec) of each argument (all float32)."""
    out_specs: object = P()
    keep_loops: bool = True
    """Keep ring loops of at most 16 trips loops (entangle-normalize unrolls them: the layout
    tier's online softmax needs straight-line code), so the general tier reads them."""


def _run(program: Program):
    """(reference outputs, sharded outputs, (reference text, sharded text))."""
    names, sizes = zip(*program.mesh)
    mesh = jax.make_mesh(sizes, names, axis_types=(AxisType.Explicit,) * len(names))
    specs = tuple(spec for _, spec in program.args)
    sharded = jax.jit(jax.shard_map(program.body, mesh=mesh, in_specs=specs,
                                    out_specs=program.out_specs, check_vma=False))
    values = [(0.25 * RNG.standard_normal(shape)).astype(np.float32)
              for shape, _ in program.args]  # small weights: stacked blocks stay O(1)
    avals = [jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=NamedSharding(mesh, s))
             for v, s in zip(values, specs)]
    placed = [jax.device_put(v, NamedSharding(mesh, s)) for v, s in zip(values, specs)]
    want = jax.tree.map(np.asarray, jax.jit(program.reference)(*values))
    got = jax.tree.map(np.asarray, sharded(*placed))
    return want, got, lower_pair(program.reference, sharded, *avals)


def _same(got, want) -> bool:
    return all(np.allclose(g, w, rtol=1e-4, atol=1e-4)
               for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)))


_CHECKED: dict[str, tuple] = {}


def _check(program: Program):
    """(reference outputs, sharded outputs, report), once per program (module cache)."""
    if program.name not in _CHECKED:
        want, got, (ref_text, sharded_text) = _run(program)
        with mock.patch.object(unroll, "MAX_TRIPS", 0 if program.keep_loops
                               else unroll.MAX_TRIPS):
            _CHECKED[program.name] = want, got, check_texts(ref_text, sharded_text)
    return _CHECKED[program.name]


# ----- GPipe --------------------------------------------------------------------------------

PIPE_MESH = (("stages", STAGES),)
PIPE_ARGS = tuple(zip(pipeline.shapes(STAGES, MICRO, WIDTH, ROWS), pipeline.SPECS))


def pipeline_loss_reference(w1, b1, w2, b2, xs, ys):
    return jnp.sum((pipeline.reference(w1, b1, w2, b2, xs) - ys) ** 2) / xs.shape[0]


def pipeline_loss(masked: bool = True, divide_by_steps: bool = False):
    """The GPipe forward accumulating the squared error of each micro-batch on the last
    stage: at step i, micro-batch i - (n - 1), masked during the bubble."""
    def body(w1, b1, w2, b2, xs, ys):
        n, stage, m = lax.axis_size("stages"), lax.axis_index("stages"), xs.shape[0]

        def step(i, carry):
            state, loss = carry
            feed = lax.dynamic_index_in_dim(xs, jnp.minimum(i, m - 1), keepdims=False)
            state = pipeline.block(jnp.where(stage == 0, feed, state), w1[0], b1[0], w2[0],
                                   b2[0])
            done = i - (n - 1)
            target = lax.dynamic_index_in_dim(ys, jnp.clip(done, 0, m - 1), keepdims=False)
            valid = (stage == n - 1) & (done >= 0) if masked else stage == n - 1
            loss = loss + jnp.where(valid, jnp.sum((state - target) ** 2), 0.0)
            state = lax.ppermute(state, "stages", [(k, (k + 1) % n) for k in range(n)])
            return state, loss

        steps = m + n - 1
        _, loss = lax.fori_loop(0, steps, step, (jnp.zeros(xs.shape[1:], xs.dtype),
                                                 jnp.float32(0.0)))
        return lax.psum(loss, "stages") / (steps if divide_by_steps else m)
    return body


LOSS_ARGS = PIPE_ARGS + (((MICRO, ROWS, WIDTH), P()),)


def _pipe(name: str, body) -> Program:
    return Program(name, PIPE_MESH, pipeline.reference, body, PIPE_ARGS)


DP_PP_ARGS = tuple(zip(pipeline.shapes(STAGES, MICRO, WIDTH, 2 * ROWS),
                       pipeline.SPECS[:-1] + (P(None, "dp"),)))
"""The micro-batches' rows split over a data-parallel axis too (dp 2 x stages 4)."""


def _loss(name: str, body) -> Program:
    return Program(name, PIPE_MESH, pipeline_loss_reference, body, LOSS_ARGS)


# ----- gradient accumulation (data parallel) --------------------------------------------------

ACCUM = 8
DATA_MESH = (("data", 4),)


def _mse(w1, w2, x, y):
    return jnp.mean((jnp.tanh(x @ w1) @ w2 - y) ** 2)


def sgd_reference(w1, w2, x, y):
    g1, g2 = jax.grad(_mse, argnums=(0, 1))(w1, w2, x, y)
    return w1 - 0.1 * g1, w2 - 0.1 * g2


def accumulated(average: bool = True):
    """Each device's gradient summed over `ACCUM` micro-batches in a scan, averaged (or not),
    then pmean over the data axis."""
    def body(w1, w2, x, y):
        xs = x.reshape(ACCUM, -1, x.shape[-1])
        ys = y.reshape(ACCUM, -1, y.shape[-1])

        def add(acc, batch):
            g = jax.grad(_mse, argnums=(0, 1))(w1, w2, *batch)
            return (acc[0] + g[0], acc[1] + g[1]), None

        (g1, g2), _ = lax.scan(add, (jnp.zeros_like(w1), jnp.zeros_like(w2)), (xs, ys))
        if average:
            g1, g2 = g1 / ACCUM, g2 / ACCUM
        g1, g2 = lax.pmean(g1, "data"), lax.pmean(g2, "data")
        return w1 - 0.1 * g1, w2 - 0.1 * g2
    return body


ACCUM_ARGS = (((8, 16), P()), ((16, 4), P()), ((64, 8), P("data")), ((64, 4), P("data")))


def _accum(name: str, body) -> Program:
    return Program(name, DATA_MESH, sgd_reference, body, ACCUM_ARGS, (P(), P()))


# ----- a ring: the all-gather collective matmul, rolled ----------------------------------------

RING = 8


def matmul_reference(a, w):
    return a @ w


def ring_matmul(to: int = -1):
    """A[B, D_ring] @ W[D, F]: multiply the local chunk of A by the matching rows of W while
    A's chunks travel around the ring (scaling book, part 10), one chunk a step."""
    def body(a, w):
        n, me, chunk = lax.axis_size("ring"), lax.axis_index("ring"), a.shape[1]

        def step(i, carry):
            acc, a = carry
            rows = lax.dynamic_slice_in_dim(w, (me + i) % n * chunk, chunk)
            a_next = lax.ppermute(a, "ring", [(j, (j + to) % n) for j in range(n)])
            return acc + a @ rows, a_next

        acc, _ = lax.fori_loop(0, n, step, (jnp.zeros((a.shape[0], w.shape[1]), a.dtype), a))
        return acc
    return body


RING_ARGS = (((4, 2 * RING), P(None, "ring")), ((2 * RING, 4), P()))


def _ring(name: str, body) -> Program:
    return Program(name, (("ring", RING),), matmul_reference, body, RING_ARGS)


# ----- nested: a loop over micro-batches holding a scan over layers ---------------------------

LAYERS = 3


def layers_reference(ws, x):
    for layer in range(LAYERS):
        x = jnp.tanh(x @ ws[layer])
    return jnp.sum(x, axis=0)


def nested(layer_shift: int = 0, micro: int = ACCUM):
    """Each device sums its micro-batches' outputs of a stack of layers run by a scan, the
    micro-batches in a fori_loop; psum over the devices."""
    def body(ws, x):
        xs = x.reshape(micro, -1, x.shape[-1])

        def step(i, acc):
            h = lax.dynamic_index_in_dim(xs, i, keepdims=False)

            def layer(h, k):
                w = lax.dynamic_index_in_dim(ws, jnp.minimum(k + layer_shift, LAYERS - 1),
                                             keepdims=False)
                return jnp.tanh(h @ w), None

            h, _ = lax.scan(layer, h, jnp.arange(LAYERS))
            return acc + jnp.sum(h, axis=0)

        acc = lax.fori_loop(0, micro, step, jnp.zeros((x.shape[-1],), x.dtype))
        return lax.psum(acc, "data")
    return body


NESTED_ARGS = (((LAYERS, 8, 8), P()), ((64, 8), P("data")))


def _nested(name: str, body) -> Program:
    return Program(name, DATA_MESH, layers_reference, body, NESTED_ARGS)


CORRECT = [
    _pipe("gpipe_forward", pipeline.gpipe()),
    _pipe("gpipe_forward_writes_every_step", pipeline.gpipe(masked=False)),
    Program("gpipe_forward_dp2", (("dp", 2),) + PIPE_MESH, pipeline.reference,
            pipeline.gpipe(), DP_PP_ARGS, P(None, "dp")),
    _loss("gpipe_loss_bubble_masked", pipeline_loss()),
    _accum("grad_accumulation_8_micro_batches", accumulated()),
    _ring("ring_collective_matmul", ring_matmul()),
    _nested("micro_batch_loop_over_layer_scan", nested()),
]
TWINS = [
    _pipe("gpipe_activations_to_previous_stage", pipeline.gpipe(direction=-1)),
    _pipe("gpipe_outputs_one_step_late", pipeline.gpipe(slot_offset=-1)),
    _loss("gpipe_loss_bubble_not_masked", pipeline_loss(masked=False)),
    _loss("gpipe_loss_divided_by_steps", pipeline_loss(divide_by_steps=True)),
    _accum("grad_accumulation_summed_not_averaged", accumulated(average=False)),
    _ring("ring_rotated_the_other_way", ring_matmul(to=+1)),
    _nested("layer_scan_reads_the_next_layer", nested(layer_shift=1)),
]


@pytest.mark.parametrize("program", CORRECT, ids=lambda p: p.name)
def test_correct_loops_are_proven_by_invariant(program: Program) -> None:
    want, got, report = _check(program)
    assert _same(got, want)  # grounded: the same numbers
    assert report.proven, report.stats.get("general_tier", {}).get("reason")
    loops = report.stats["general_tier"]["loops"]
    assert loops["by_invariant"] >= 1 and not loops["not_by_invariant"], loops
    assert report.stats["general_tier"]["rule_instances"]["refuted"] == 0


@pytest.mark.parametrize("program", TWINS, ids=lambda p: p.name)
def test_wrong_loops_are_not_proven(program: Program) -> None:
    want, got, report = _check(program)
    assert not _same(got, want)  # grounded: other numbers
    assert not report.proven, report.render_text()
    general = report.stats["general_tier"]
    assert not general["proven"] and general["reason"]


def test_the_pipeline_invariant_names_each_carry() -> None:
    """The state a stage holds is a function of the previous stage's a step earlier, the
    outputs a buffer on the last stage only, the micro-batches loop-invariant."""
    _, _, report = _check(CORRECT[0])
    (text,) = set(report.stats["general_tier"]["loops"]["invariants"])
    assert f"step index i in [0, {MICRO + STAGES - 1})" in text
    state = re.search(r"#(\d+): a function of i and #(\d+)@stages-1 on devices 0, 2, 3", text)
    assert state is not None and state[1] == state[2], text
    assert "a counter: += 1 each step" in text
    assert f"unchanged on devices 0..{STAGES - 2}; buffer updated" in text
    assert "loop-invariant" in text


def test_nested_loops_cost_does_not_grow_with_the_trips() -> None:
    """Twice the micro-batches, the same ops expanded: the inner scan is solved within the
    outer loop's symbolic step (and its base trips), never trip by trip."""
    ops = []
    for micro in (ACCUM, 2 * ACCUM):
        program = Program(f"nested_{micro}", DATA_MESH, layers_reference, nested(micro=micro),
                          (NESTED_ARGS[0], ((8 * micro, 8), P("data"))))
        want, got, report = _check(program)
        assert _same(got, want) and report.proven, report.render_text()
        general = report.stats["general_tier"]
        assert general["loops"]["by_invariant"] == 2 + BASE_TRIPS
        ops.append(general["ops"])
    assert ops[0] == ops[1]


# ----- the conclusion's buffer writes --------------------------------------------------------

@pytest.mark.parametrize("starts", [[0, 0], [3, 0], [4, 1], [2, 1]])
def test_a_buffer_written_piece_by_piece_holds_what_update_slice_says(starts) -> None:
    """`written` (pieces of one flat concatenation) computes `dynamic_update_slice` exactly:
    three writes in a row, evaluated against the plain `update_slice`, on random values."""
    x = make_arg(0, (6, 3), "f32")
    updates = [make_arg(k, (1, 3), "f32") for k in (1, 2, 3)]
    small = make_arg(4, (2, 2), "f32")
    env = {k: np.array(RNG.standard_normal(t.shape), dtype=object)
           for k, t in enumerate([x, *updates, small])}
    env = {k: np.vectorize(Fraction, otypes=[object])(v.astype(float)) for k, v in env.items()}
    flat, plain = x, x
    for k, u in enumerate(updates):
        at = [(starts[0] + 2 * k) % 6, 0]
        flat, plain = written(flat, u, at), update_slice(plain, u, at, joined=False)
    flat, plain = written(flat, small, starts), update_slice(plain, small, starts,
                                                             joined=False)
    assert np.array_equal(evaluate_term(flat, env), evaluate_term(plain, env))
