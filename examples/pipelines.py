"""Pipeline-parallel programs (issue 19) written as people write them in JAX, with their
unsharded references and their nearest wrong twins.

Stage weights are stacked layer params split over a `pp` mesh axis (`P('pp')`, one or two
layers a stage; `P(None, 'pp')` for a circular schedule's repeats), the micro-batches flow
through a `lax.fori_loop` over clock steps, `ppermute` hands activations to the next stage (and
gradients back to the previous one), bubble steps are masked by the step index and the outputs
are collected on the last stage. Schedules: GPipe (forward; training step with a hand-written
backward loop, `jax.vjp` per stage, and with `jax.grad` of the pipelined loss), 1F1B (one
forward and one backward per clock step), circular (each device holds two non-adjacent
stages); blocks: GPT-2 style (LayerNorm, GELU MLP, residual) and Llama style (RMSNorm,
SwiGLU); meshes pp, pp x tp (Megatron MLP inside a stage) and dp x pp x tp.

Each program is an `examples.heldout.corpus.Example` (source "pipelines"; not part of the
held-out corpus, which holds programs written by others), grounded like the corpus's by
`grounded_correct`. A buggy twin swaps one piece of its schedule for a wrong one, and the
piece it swaps in holds the `# BUG` line: a shift in the wrong direction or past a stage, an
off-by-one micro-batch slot, an unmasked bubble, the outputs taken from the wrong stage,
gradients not accumulated over micro-batches or summed where the reference averages.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

from examples.heldout.corpus import Example, f32, program
from examples.real.models.layers import gelu, layer_norm, rms_norm, silu

SOURCE = "pipelines"
PP4 = (("pp", 4),)
PP2 = (("pp", 2),)
PP4_TP2 = (("pp", 4), ("tp", 2))
DP_PP_TP = (("dp", 2), ("pp", 2), ("tp", 2))
D, F = 8, 16  # hidden and MLP widths
M, B = 4, 2  # micro-batches, rows of a micro-batch
LR = 0.125
B1, B2, EPS = 0.875, 0.9375, 1e-3  # Adam-like moments' decays, and its epsilon


# ----- blocks: one layer, `p` its params ----------------------------------------------------------

def gpt2_block(p, x, tp: str | None = None):
    """Pre-LN GELU MLP with a residual; the Megatron MLP (column- then row-parallel, psum)
    over `tp`."""
    ln_g, ln_b, w1, b1, w2, b2 = p
    h = gelu(layer_norm(x, ln_g, ln_b) @ w1 + b1)
    out = h @ w2
    if tp is not None:
        out = lax.psum(out, tp)
    return x + out + b2


def llama_block(p, x):
    """RMSNorm and SwiGLU MLP with a residual."""
    g, w_gate, w_up, w_down = p
    h = rms_norm(x, g)
    return x + (silu(h @ w_gate) * (h @ w_up)) @ w_down


def layer(params, i):
    return [w[i] for w in params]


def run_layers(block, params, x):
    """The layers stacked in `params` in order: the whole stack (the reference) or one stage's
    own layers."""
    for i in range(params[0].shape[0]):
        x = block(layer(params, i), x)
    return x


def gpt2_params(layers: int, tp: bool = False) -> list:
    rows, cols = (P("pp", "tp", None), P("pp", None, "tp")) if tp else (P("pp"), P("pp"))
    return [f32((layers, D), P("pp"), "weight"), f32((layers, D), P("pp")),
            f32((layers, D, F), cols, "weight"), f32((layers, F), P("pp", "tp") if tp else
                                                     P("pp")),
            f32((layers, F, D), rows, "weight"), f32((layers, D), P("pp"))]


def llama_params(layers: int) -> list:
    return [f32((layers, D), P("pp"), "weight"), f32((layers, D, F), P("pp"), "weight"),
            f32((layers, D, F), P("pp"), "weight"), f32((layers, F, D), P("pp"), "weight")]


def mse(out, y):
    return jnp.mean(jnp.square(out - y))


def sgd(w, g):
    return w - LR * g


def adam(w, g, mom, var):
    mom = B1 * mom + (1 - B1) * g
    var = B2 * var + (1 - B2) * g * g
    return w - LR * mom / (jnp.sqrt(var) + EPS), mom, var


def varying(tree, axes):
    """`tree`'s arrays typed as varying over `axes` (loop carries that will differ by
    device), where they are not yet."""
    def cast(x):
        new = tuple(a for a in axes if a not in jax.typeof(x).manual_axis_type.varying)
        return lax.pcast(x, new, to="varying") if new else x
    return jax.tree.map(cast, tree)


# ----- the schedule's pieces, correct and wrong -------------------------------------------------

def shift_next(x, axis="pp"):
    """Every stage hands its activations to the next (the last one's to stage 0)."""
    n = lax.axis_size(axis)
    return lax.ppermute(x, axis, [(k, (k + 1) % n) for k in range(n)])


def shift_prev(x, axis="pp"):
    """Every stage hands its gradient to the previous one."""
    n = lax.axis_size(axis)
    return lax.ppermute(x, axis, [(k, (k - 1) % n) for k in range(n)])


def shift_backwards(x, axis="pp"):
    n = lax.axis_size(axis)
    return lax.ppermute(x, axis, [(k, (k - 1) % n) for k in range(n)])  # BUG


def shift_skipping_a_stage(x, axis="pp"):
    n = lax.axis_size(axis)
    return lax.ppermute(x, axis, [(k, (k + 2) % n) for k in range(n)])  # BUG


def shift_gradients_forward(x, axis="pp"):
    n = lax.axis_size(axis)
    return lax.ppermute(x, axis, [(k, (k + 1) % n) for k in range(n)])  # BUG


def output_slot(t, n):
    """The micro-batch the last stage finishes at step t."""
    return t - (n - 1)


def output_slot_off_by_one(t, n):
    return t - n  # BUG


def backward_slot(t, stage, n):
    """The micro-batch stage `stage` of n runs backward at 1F1B's step t."""
    return t - 2 * (n - 1) + stage


def backward_slot_off_by_one(t, stage, n):
    return t - 2 * (n - 1) + stage - 1  # BUG


def last_stage(stage, n):
    return stage == n - 1


def first_stage(stage, n):
    return stage == 0  # BUG


def masked(valid, value):
    """A bubble step's contribution: zero."""
    return jnp.where(valid, value, 0.0)


def unmasked(valid, value):
    return value  # BUG


def accumulate(total, new):
    return total + new


def keep_last(total, new):
    return new  # BUG


def mean_over_microbatches(total, m):
    return total / m


def sum_over_microbatches(total, m):
    return total  # BUG


# ----- GPipe forward ------------------------------------------------------------------------------

def gpipe_forward(block, params, x, *, shift=shift_next, slot=output_slot, collect=last_stage,
                  axes=("pp",)):
    """GPipe: at step t stage s applies its layers to micro-batch t - s; stage 0 feeds the
    micro-batches in, the last stage writes each finished one into its slot (the bubble steps'
    writes masked out by the step index); the outputs leave from the last stage (psum of the
    masked buffer). `axes`: the pipeline axis first, then the axes the data varies over."""
    axis = axes[0]
    stage, n = lax.axis_index(axis), lax.axis_size(axis)
    m = x.shape[0]

    def step(t, carry):
        state, outputs = carry
        state = jnp.where(stage == 0, x[jnp.minimum(t, m - 1)], state)
        state = run_layers(block, params, state)
        done = slot(t, n)
        written = lax.dynamic_update_index_in_dim(outputs, state, jnp.maximum(done, 0), 0)
        outputs = jnp.where(done >= 0, written, outputs)
        return shift(state, axis), outputs

    carry = varying((jnp.zeros_like(x[0]), jnp.zeros_like(x)), (axis,))
    _, outputs = lax.fori_loop(0, m + n - 1, step, carry)
    return lax.psum(jnp.where(collect(stage, n), outputs, 0.0), axis)


def forward_fn(block, **kw):
    def forward(*args):
        *params, x = args
        return gpipe_forward(block, params, x, **kw)
    return forward


def reference_fn(block):
    def reference(*args):
        *params, x = args
        return run_layers(block, params, x)
    return reference


# ----- circular (interleaved) forward: each device holds two non-adjacent stages ------------------

def circular_forward(block, params, x, *, shift=shift_next, axis="pp"):
    """A circular schedule over n devices and R repeats (the stacked params are (R, n, ...),
    split over n: device s holds layers s, n + s, ...; M = n micro-batches). At step t
    device s runs repeat r = (t - s) // n of micro-batch (t - s) % n; stage 0 takes a new
    micro-batch in the first repeat and the one coming round the ring from the last device
    after; the last device writes a micro-batch out in the last repeat."""
    stage, n = lax.axis_index(axis), lax.axis_size(axis)
    repeats, m = params[0].shape[0], x.shape[0]

    def step(t, carry):
        state, outputs = carry
        k = t - stage
        r, i = k // n, k % n
        valid = (k >= 0) & (r < repeats)
        state = jnp.where((stage == 0) & (r == 0), x[jnp.clip(i, 0, m - 1)], state)
        weights = [lax.dynamic_index_in_dim(w, jnp.clip(r, 0, repeats - 1), 0, False)[0]
                   for w in params]
        state = block(weights, state)
        done = valid & (stage == n - 1) & (r == repeats - 1)
        outputs = jnp.where(done, lax.dynamic_update_index_in_dim(
            outputs, state, jnp.clip(i, 0, m - 1), 0), outputs)
        return shift(state, axis), outputs

    carry = varying((jnp.zeros_like(x[0]), jnp.zeros_like(x)), (axis,))
    _, outputs = lax.fori_loop(0, repeats * n + m - 1, step, carry)
    return lax.psum(jnp.where(stage == n - 1, outputs, 0.0), axis)


def circular_fn(block, **kw):
    def forward(*args):
        *params, x = args
        return circular_forward(block, params, x, **kw)
    return forward


def circular_reference_fn(block):
    def reference(*args):
        *params, x = args
        flat = [w.reshape((-1,) + w.shape[2:]) for w in params]
        return run_layers(block, flat, x)
    return reference


# ----- GPipe loss, trained by jax.grad -------------------------------------------------------------

def gpipe_loss(block, params, x, y, *, bubble=masked, axes=("pp",)):
    """The mean over micro-batches of each one's mean squared error, accumulated on the last
    stage as the micro-batches finish (bubble steps add nothing); averaged over the data axes
    (`axes` after the pipeline axis)."""
    axis = axes[0]
    stage, n = lax.axis_index(axis), lax.axis_size(axis)
    m = x.shape[0]

    def step(t, carry):
        state, total = carry
        state = jnp.where(stage == 0, x[jnp.minimum(t, m - 1)], state)
        state = run_layers(block, params, state)
        done = t - (n - 1)
        loss = mse(state, y[jnp.clip(done, 0, m - 1)])
        total = total + bubble((stage == n - 1) & (done >= 0), loss)
        return shift_next(state, axis), total

    carry = (varying(jnp.zeros_like(x[0]), (axis,)), varying(jnp.float32(0), axes))
    _, total = lax.fori_loop(0, m + n - 1, step, carry)
    loss = lax.psum(total, axis) / m
    for data in axes[1:]:
        loss = lax.pmean(loss, data)
    return loss


def loss_fn(block, **kw):
    def loss(*args):
        *params, x, y = args
        return gpipe_loss(block, params, x, y, **kw)
    return loss


def reference_loss_fn(block):
    def loss(*args):
        *params, x, y = args
        return mse(run_layers(block, params, x), y)
    return loss


def sgd_step(loss, n_params: int):
    """A training step: the loss and every parameter moved against its gradient (`jax.grad`
    of `loss`, the pipelined one or the reference)."""
    def train_step(*args):
        value, grads = jax.value_and_grad(loss, argnums=tuple(range(n_params)))(*args)
        return value, tuple(sgd(w, g) for w, g in zip(args, grads))
    return train_step


# ----- training steps with a hand-written backward -------------------------------------------------

def _split(args, moments: bool):
    """(params, moments, variances, x, y) of a flat argument list."""
    *rest, x, y = args
    k = len(rest) // 3 if moments else len(rest)
    if not moments:
        return list(rest), [], [], x, y
    return list(rest[:k]), list(rest[k:2 * k]), list(rest[2 * k:]), x, y


def _update(params, grads, moments, variances):
    """SGD, or an Adam-like step where moments are given; the tuple of results."""
    if not moments:
        return (tuple(sgd(w, g) for w, g in zip(params, grads)),)
    new = [adam(*wgmv) for wgmv in zip(params, grads, moments, variances)]
    return tuple(tuple(part[j] for part in new) for j in range(3))


def gpipe_train(block, params, moments, variances, x, y, *, back=shift_prev, bubble=masked,
                acc=accumulate, scale=mean_over_microbatches, axes=("pp",)):
    """GPipe: a forward loop (stage s runs micro-batch t - s, stashing its input; the last
    stage keeps d loss / d output of each), then a backward loop (stage s runs micro-batch
    t - (n - 1 - s): it pulls its cotangent through `jax.vjp` of its layers and hands d input
    to the previous stage); the weight gradients are accumulated over micro-batches (bubble
    steps masked) and averaged; then SGD, or an Adam-like update where moments are given."""
    axis = axes[0]
    stage, n = lax.axis_index(axis), lax.axis_size(axis)
    m = x.shape[0]
    last = stage == n - 1
    stage_fn = functools.partial(run_layers, block)

    def forward(t, carry):
        state, stash, douts, total = carry
        i = t - stage
        valid, k = (i >= 0) & (i < m), jnp.clip(i, 0, m - 1)
        state = jnp.where(stage == 0, x[k], state)
        stash = jnp.where(valid, lax.dynamic_update_index_in_dim(stash, state, k, 0), stash)
        out = stage_fn(params, state)
        loss, dout = jax.value_and_grad(mse)(out, y[k])
        douts = jnp.where(valid & last, lax.dynamic_update_index_in_dim(douts, dout, k, 0),
                          douts)
        total = total + jnp.where(valid & last, loss, 0.0)
        return shift_next(out, axis), stash, douts, total

    def backward(t, carry):
        cot, grads = carry
        i = t - (n - 1 - stage)
        valid, k = (i >= 0) & (i < m), jnp.clip(i, 0, m - 1)
        cot = jnp.where(last, douts[k], cot)
        _, vjp = jax.vjp(stage_fn, params, stash[k])
        dparams, dx = vjp(cot)
        grads = [acc(g, bubble(valid, d)) for g, d in zip(grads, dparams)]
        return back(dx, axis), grads

    zeros = jnp.zeros_like(x[0])
    carry = varying((zeros, jnp.zeros_like(x), jnp.zeros_like(x), jnp.float32(0)), axes)
    _, stash, douts, total = lax.fori_loop(0, m + n - 1, forward, carry)
    carry = (varying(zeros, axes), [jnp.zeros_like(w) for w in params])
    _, grads = lax.fori_loop(0, m + n - 1, backward, carry)
    grads = [scale(g, m) for g in grads]
    loss = lax.psum(total, axis) / m
    for data in axes[1:]:
        loss = lax.pmean(loss, data)
        grads = [lax.pmean(g, data) for g in grads]
    return (loss, *_update(params, grads, moments, variances))


def onef1b_train(block, params, moments, variances, x, y, *, back=shift_prev, bubble=masked,
                 acc=accumulate, scale=mean_over_microbatches, bslot=backward_slot,
                 layers=run_layers, axes=("pp",)):
    """1F1B: one loop of m + 2(n - 1) clock steps; at step t stage s runs the forward of
    micro-batch t - s and the backward of micro-batch t - 2(n - 1) + s (the last stage the
    backward of the micro-batch it has just run forward, from d loss / d output), activations
    handed to the next stage and gradients to the previous one in the same step; weight
    gradients accumulated over micro-batches (bubble steps masked) and averaged, then SGD or
    an Adam-like update. `layers(block, params, x)`: how a stage applies its layers."""
    axis = axes[0]
    stage, n = lax.axis_index(axis), lax.axis_size(axis)
    m = x.shape[0]
    last = stage == n - 1
    stage_fn = functools.partial(layers, block)
    replicas = 1
    for data in axes[1:]:
        replicas *= lax.axis_size(data)

    def step(t, carry):
        state, cot, stash, grads, total = carry
        f = t - stage
        f_valid, fk = (f >= 0) & (f < m), jnp.clip(f, 0, m - 1)
        state = jnp.where(stage == 0, x[fk], state)
        stash = jnp.where(f_valid, lax.dynamic_update_index_in_dim(stash, state, fk, 0), stash)
        out = stage_fn(params, state)
        loss, dout = jax.value_and_grad(mse)(out, y[fk])
        total = total + jnp.where(f_valid & last, loss, 0.0)
        dout = dout / replicas  # d mean loss / d output: the data axes' means
        b = bslot(t, stage, n)
        b_valid, bk = (b >= 0) & (b < m), jnp.clip(b, 0, m - 1)
        cot = jnp.where(last, dout, cot)
        _, vjp = jax.vjp(stage_fn, params, stash[bk])
        dparams, dx = vjp(cot)
        grads = [acc(g, bubble(b_valid, d)) for g, d in zip(grads, dparams)]
        return shift_next(out, axis), back(dx, axis), stash, grads, total

    zeros = jnp.zeros_like(x[0])
    carry = (*varying((zeros, zeros, jnp.zeros_like(x)), axes),
             [jnp.zeros_like(w) for w in params], varying(jnp.float32(0), axes))
    *_, grads, total = lax.fori_loop(0, m + 2 * (n - 1), step, carry)
    grads = [scale(g, m) for g in grads]  # summed over the data axes by jax.vjp
    loss = lax.psum(total, axis) / m
    for data in axes[1:]:
        loss = lax.pmean(loss, data)
    return (loss, *_update(params, grads, moments, variances))


def train_fn(schedule, block, moments: bool, **kw):
    def train(*args):
        params, mo, va, x, y = _split(args, moments)
        return schedule(block, params, mo, va, x, y, **kw)
    return train


def train_reference_fn(block, moments: bool):
    def train(*args):
        params, mo, va, x, y = _split(args, moments)

        def loss(ps):
            return mse(run_layers(block, ps, x), y)

        value, grads = jax.value_and_grad(loss)(params)
        return (value, *_update(params, grads, mo, va))
    return train


# ----- the programs -------------------------------------------------------------------------------

def _p(prog: str, mesh, reference, body, args, out, what: str, **kw) -> Example:
    return program(SOURCE, prog, mesh, reference, body, args, out, what, **kw)


REPLICATED, STAGES = P(), P("pp")


def _x(spec=REPLICATED, rows: int = B, micro: int = M):
    return f32((micro, rows, D), spec)


def _outs(n_params: int, spec=STAGES, moments: bool = False, specs=None) -> tuple:
    """The out_specs of a training step: the loss, then the updated params (and moments)."""
    group = tuple(specs) if specs is not None else (spec,) * n_params
    return (P(),) + (group,) * (3 if moments else 1)


def _grad_step(n_params: int):
    return lambda f: sgd_step(f, n_params)


GPT2, LLAMA = gpt2_block, llama_block
GPT2_TP = functools.partial(gpt2_block, tp="tp")


def programs() -> list[Example]:
    """Every pipeline program and its buggy twins."""
    gpt2, llama, llama_2 = gpt2_params(4), llama_params(4), llama_params(8)
    gpt2_tp = gpt2_params(4, tp=True)
    ex: list[Example] = []
    # forward: GPipe, circular, pp x tp
    fwd = "GPipe forward: fori_loop over clock steps, ppermute to the next stage"
    ex += [
        _p("gpipe_fwd_gpt2", PP4, reference_fn(GPT2), forward_fn(GPT2), [*gpt2, _x()], P(),
           f"{fwd}; GPT-2 MLP blocks, one layer a stage"),
        _p("gpipe_fwd_gpt2", PP4, reference_fn(GPT2), forward_fn(GPT2, shift=shift_backwards),
           [*gpt2, _x()], P(), fwd, bug="shift_backwards", bug_fn=shift_backwards),
        _p("gpipe_fwd_gpt2", PP4, reference_fn(GPT2),
           forward_fn(GPT2, slot=output_slot_off_by_one), [*gpt2, _x()], P(), fwd,
           bug="slot_off_by_one", bug_fn=output_slot_off_by_one),
        _p("gpipe_fwd_llama", PP4, reference_fn(LLAMA), forward_fn(LLAMA), [*llama_2, _x()],
           P(), f"{fwd}; Llama blocks, two layers a stage"),
        _p("gpipe_fwd_llama", PP4, reference_fn(LLAMA),
           forward_fn(LLAMA, shift=shift_skipping_a_stage), [*llama_2, _x()], P(), fwd,
           bug="shift_skips_a_stage", bug_fn=shift_skipping_a_stage),
        _p("circular_fwd_gpt2", PP4, circular_reference_fn(GPT2), circular_fn(GPT2),
           [*(f32((2, 4) + a.shape[1:], P(None, "pp"), a.kind) for a in gpt2), _x()], P(),
           "circular schedule: two repeats, device s holds layers s and 4 + s"),
        _p("gpipe_fwd_gpt2", PP4_TP2, reference_fn(GPT2), forward_fn(GPT2_TP),
           [*gpt2_tp, _x()], P(), f"{fwd}; Megatron MLP over tp inside each stage"),
        _p("gpipe_fwd_gpt2", PP4_TP2, reference_fn(GPT2),
           forward_fn(GPT2_TP, collect=first_stage), [*gpt2_tp, _x()], P(), fwd,
           bug="outputs_from_first_stage", bug_fn=first_stage),
    ]
    # training steps with a hand-written backward
    gpipe_train_fn = functools.partial(train_fn, gpipe_train)
    onef1b_fn = functools.partial(train_fn, onef1b_train)
    adam_args = [*llama] * 3 + [_x(micro=2), _x(micro=2)]
    adam_outs = _outs(4, moments=True)
    what = "GPipe training step: forward loop, backward loop with jax.vjp per stage, Adam"
    ex += [
        _p("gpipe_train_llama", PP4, train_reference_fn(LLAMA, True),
           gpipe_train_fn(LLAMA, True), adam_args, adam_outs, what),
        _p("gpipe_train_llama", PP4, train_reference_fn(LLAMA, True),
           gpipe_train_fn(LLAMA, True, bubble=unmasked), adam_args, adam_outs, what,
           bug="bubble_unmasked", bug_fn=unmasked),
        _p("gpipe_train_llama", PP4, train_reference_fn(LLAMA, True),
           gpipe_train_fn(LLAMA, True, acc=keep_last), adam_args, adam_outs, what,
           bug="grads_not_accumulated", bug_fn=keep_last),
        _p("gpipe_train_llama", PP4, train_reference_fn(LLAMA, True),
           gpipe_train_fn(LLAMA, True, scale=sum_over_microbatches), adam_args, adam_outs,
           what, bug="grads_summed_not_averaged", bug_fn=sum_over_microbatches),
    ]
    what = "1F1B training step: one forward and one backward a clock step, SGD"
    sgd_args, sgd_outs = [*gpt2, _x(micro=2), _x(micro=2)], _outs(6)
    ex += [
        _p("onef1b_train_gpt2", PP2, train_reference_fn(GPT2, False), onef1b_fn(GPT2, False),
           [*gpt2_params(2), _x(micro=2), _x(micro=2)], _outs(6), what),
        # on two stages the next and the previous stage are one: the twin needs four
        _p("onef1b_train_gpt2", PP4, train_reference_fn(GPT2, False),
           onef1b_fn(GPT2, False, back=shift_gradients_forward), sgd_args, sgd_outs, what,
           bug="gradients_sent_forward", bug_fn=shift_gradients_forward),
    ]
    # dp x pp x tp: 1F1B with Megatron MLP stages, batch split over dp
    dpt = gpt2_params(4, tp=True)
    ex += [
        _p("onef1b_train_gpt2", DP_PP_TP, train_reference_fn(GPT2, False),
           onef1b_fn(GPT2_TP, False, axes=("pp", "dp")),
           [*dpt, _x(P(None, "dp"), 2 * B, 2), _x(P(None, "dp"), 2 * B, 2)],
           _outs(6, specs=[a.spec for a in dpt]),
           "1F1B training step on dp x pp x tp: Megatron MLP stages, gradients pmean'd over "
           "dp"),
    ]
    # training by jax.grad of the pipelined loss
    what = "GPipe training step: jax.grad of the pipelined loss (bubbles masked), SGD"
    ex += [
        _p("gpipe_grad_gpt2", PP4, sgd_step(reference_loss_fn(GPT2), 6), loss_fn(GPT2),
           [*gpt2, _x(), _x()], P(), what, wrap=_grad_step(6)),
    ]
    return ex
