"""Hand-written near misses against whole-layer reuse (`entangle_mlir/analysis/layer_reuse.py`).

Each case is a stack of K identical transformer-like layers (RMS norm, a tensor-parallel MLP,
a residual add) in which the sharded program differs from a correct one in exactly what the
reuse argument leans on: one copy's collective, scale factor, parameters, input, wiring or
parameter layout; stacked parameters sliced `w[i]` per layer; an input shared by some layers
and not others; a partial sum carried across the layer boundary; integer positions read by
every layer. Every case is grounded by executing both programs on 8 simulated CPU devices:
`run_near_miss` classifies it like `fuzz.run` (a proof of differing numbers is a
`false_proof`).

    from fuzz.layer_cases import CASES, run_near_miss
    run_near_miss("missing_psum_in_copy_3").status   # "caught"

Importing this module imports jax with 8 simulated CPU devices.
"""

from __future__ import annotations

import os

if "--xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                               + " --xla_force_host_platform_device_count=8").strip()

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

from fuzz import run as R
from fuzz.stack import Case, classify

K, BUG = 5, 3
B, S, D, F = 2, 4, 8, 16


@dataclass
class Built:
    """Both programs of a case: `ref(*args)` on global arrays, `body(*args)` inside
    shard_map; one spec and shape (and "f32" or "i32") per argument."""

    ref: Callable
    body: Callable
    mesh: tuple[tuple[str, int], ...]
    shapes: list[tuple[int, ...]]
    specs: list[P]
    out_spec: P
    dtypes: list[str] = field(default_factory=list)


def _rms(x):
    return x * lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + 1e-6)


def _mlp(x, w1, b1, w2, reduce):
    """The layer's update (before the residual add)."""
    return reduce(jnp.tanh(_rms(x) @ w1 + b1) @ w2)


PARAM_SHAPES = [(D, F), (F,), (F, D)]
TP_SPECS = [P(None, "tp"), P("tp"), P("tp", None)]


def _stack(*, mode: str = "own", variant: Callable | None = None, mesh=(("tp", 2),),
           specs=None, bug_specs=None) -> Built:
    """K layers `x = x + mlp(x)`; `variant(i, x, params, inputs, psum)` returns the sharded
    layer i's new x, or None for the correct layer. `mode`: own parameters per layer, one
    shared set, or stacked (K, ...) parameters sliced `w[i]`. `bug_specs`: the in_specs of
    layer BUG's own parameters in the sharded program."""
    specs = specs or TP_SPECS
    axis = specs[0][1]

    def psum(v):
        return lax.psum(v, axis)

    def params_of(args, i):
        if mode == "own":
            return args[1 + 3 * i:4 + 3 * i]
        if mode == "shared":
            return args[1:4]
        return tuple(w[i] for w in args[1:4])

    def ref(*args):
        x = args[0]
        for i in range(K):
            x = x + _mlp(x, *params_of(args, i), lambda v: v)
        return x

    def body(*args):
        x, inputs = args[0], [args[0]]
        for i in range(K):
            p = params_of(args, i)
            new = variant(i, x, p, inputs, psum, args) if variant else None
            x = x + _mlp(x, *p, psum) if new is None else new
            inputs.append(x)
        return x

    if mode == "own":
        shapes = [(B, S, D)] + PARAM_SHAPES * K
        in_specs = [P()] + list(specs) * K
        if bug_specs:
            in_specs[1 + 3 * BUG:4 + 3 * BUG] = bug_specs
    elif mode == "shared":
        shapes, in_specs = [(B, S, D)] + PARAM_SHAPES, [P()] + list(specs)
    else:
        shapes = [(B, S, D)] + [(K,) + s for s in PARAM_SHAPES]
        in_specs = [P()] + [P(None, *s) for s in specs]
    return Built(ref, body, mesh, shapes, in_specs, P())


def _bug(fn: Callable) -> Callable:
    """A variant that changes layer BUG only."""
    return lambda i, x, p, inputs, psum, args: fn(x, p, inputs, psum, args) if i == BUG \
        else None


def _deferred(skip_psum: int | None = None, undivided: int | None = None) -> Built:
    """The sharded layers keep the residual stream a partial sum over 'tp' between layers:
    layer i computes the partial `x / n + h @ w2` and the next layer (or the end) sums it, so
    the layer's psum crosses the boundary. `skip_psum`: that layer's sum is left out;
    `undivided`: that layer adds x undivided (the residual counted n times)."""
    n = 2

    def ref(*args):
        x = args[0]
        for i in range(K):
            x = x + _mlp(x, *args[1 + 3 * i:4 + 3 * i], lambda v: v)
        return x

    def body(*args):
        x = args[0]
        for i in range(K):
            w1, b1, w2 = args[1 + 3 * i:4 + 3 * i]
            residual = x if i == undivided else x / n
            partial = residual + jnp.tanh(_rms(x) @ w1 + b1) @ w2
            x = partial if i == skip_psum else lax.psum(partial, "tp")
        return x

    return Built(ref, body, (("tp", n),), [(B, S, D)] + PARAM_SHAPES * K,
                 [P()] + TP_SPECS * K, P())


def _positions(bad: Callable | None = None, chained: bool = False) -> Built:
    """Sequence split over 'dp', the MLP over 'tp'; every layer adds sin(pos * f_i) for
    integer positions `pos` (an int32 argument, or with `chained` a position advanced by one
    in each layer: an integer crossing the layer boundary). `bad(i, pos)` changes the
    sharded layer i's positions."""

    def layer(x, pos, f, w1, b1, w2, reduce):
        x = x + jnp.sin(pos.astype(jnp.float32)[:, None] * f)
        return x + _mlp(x, w1, b1, w2, reduce)

    def run(args, reduce, sharded):
        x, pos = args[0], args[1]
        for i in range(K):
            f, w1, b1, w2 = args[2 + 4 * i:6 + 4 * i]
            if chained:
                pos = pos + 1
            use = bad(i, pos) if sharded and bad is not None else pos
            x = layer(x, use, f, w1, b1, w2, reduce)
        return x

    return Built(lambda *a: run(a, lambda v: v, False),
                 lambda *a: run(a, lambda v: lax.psum(v, "tp"), True),
                 (("dp", 2), ("tp", 2)),
                 [(B, S, D), (S,)] + [(D,)] + PARAM_SHAPES + ([(D,)] + PARAM_SHAPES) * (K - 1),
                 [P(None, "dp", None), P("dp")] + ([P()] + TP_SPECS) * K, P(None, "dp", None),
                 dtypes=["f32", "i32"] + ["f32"] * (4 * K))


def _computed_positions(restart_in: int | None = None) -> Built:
    """Sequence split over 'dp': every layer builds its positions from iotas (a hole-free,
    device-dependent term in the sharded program: the block offset plus a local iota) and
    adds sin(pos * f_i). `restart_in`: that sharded layer forgets the block offset."""

    def run(args, reduce, sharded):
        x = args[0]
        for i in range(K):
            f, w1, b1, w2 = args[1 + 4 * i:5 + 4 * i]
            if sharded:
                local = jnp.arange(S // 2)
                pos = local if i == restart_in else lax.axis_index("dp") * (S // 2) + local
            else:
                pos = jnp.arange(S)
            x = x + jnp.sin(pos.astype(jnp.float32)[:, None] * f)
            x = x + _mlp(x, w1, b1, w2, reduce)
        return x

    return Built(lambda *a: run(a, lambda v: v, False),
                 lambda *a: run(a, lambda v: lax.psum(v, "tp"), True),
                 (("dp", 2), ("tp", 2)), [(B, S, D)] + ([(D,)] + PARAM_SHAPES) * K,
                 [P(None, "dp", None)] + ([P()] + TP_SPECS) * K, P(None, "dp", None))


def _fixed_then_hole(sharded_stale: bool) -> Built:
    """Layers 0 and 1 share one parameter set, layers 2.. have their own: the set is a fixed
    input of the first two regions and a hole after that. With `sharded_stale`, the sharded
    layer 2 still reads the shared set."""

    def param(args, i, sharded):
        j = 0 if i < 2 or (sharded and i == 2) else i - 1
        return args[1 + 3 * j:4 + 3 * j]

    def run(args, reduce, sharded):
        x = args[0]
        for i in range(K):
            x = x + _mlp(x, *param(args, i, sharded and sharded_stale), reduce)
        return x

    return Built(lambda *a: run(a, lambda v: v, False),
                 lambda *a: run(a, lambda v: lax.psum(v, "tp"), True), (("tp", 2),),
                 [(B, S, D)] + PARAM_SHAPES * (K - 1), [P()] + TP_SPECS * (K - 1), P())


HEAD = 4
ATT_SHAPES = [(D, D), (D, D), (D, D), (D, D)]
ATT_SPECS = [P(None, "tp"), P(None, "tp"), P(None, "tp"), P("tp", None)]


def _attention(x, mask, wq, wk, wv, wo, reduce):
    """Causal attention over heads HEAD wide (a column shard of wq/wk/wv is a subset of the
    heads), `mask` (S, S) bool."""
    b, s, _ = x.shape
    q, k, v = ((x @ w).reshape(b, s, -1, HEAD) for w in (wq, wk, wv))
    scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) * (1 / HEAD ** 0.5)
    probs = jax.nn.softmax(jnp.where(mask, scores, -1e9), axis=-1)
    return reduce(jnp.einsum("bhqk,bkhd->bqhd", probs, v).reshape(b, s, -1) @ wo)


def _attention_stack(bad_mask: int | None = None, chained: bool = False) -> Built:
    """K layers `x = x + attention(rms(x))`, each building its causal mask from iotas (a
    term that reads no hole). `chained`: layer i uses the mask layer i-1 built (a hole-free
    value crossing the layer boundary). `bad_mask`: that sharded layer builds the mask one
    diagonal too wide."""

    def run(args, reduce, sharded):
        x, mask = args[0], None
        for i in range(K):
            made = jnp.tril(jnp.ones((S, S), dtype=bool),
                            1 if sharded and i == bad_mask else 0)
            use = mask if chained and mask is not None else made
            x = x + _attention(_rms(x), use, *args[1 + 4 * i:5 + 4 * i], reduce)
            mask = made
        return x

    return Built(lambda *a: run(a, lambda v: v, False),
                 lambda *a: run(a, lambda v: lax.psum(v, "tp"), True), (("tp", 2),),
                 [(B, S, D)] + ATT_SHAPES * K, [P()] + ATT_SPECS * K, P())


def _psum_then(fn):
    return lambda x, p, inputs, psum, args: x + fn(p, psum, x)


AB = (("a", 2), ("b", 2))
A_SPECS = [P(None, "a"), P("a"), P("a", None)]
B_SPECS = [P(None, "b"), P("b"), P("b", None)]


CASES: dict[str, tuple[Callable[[], Built], bool]] = {
    # name: (build, correct)
    "correct_own_params": (lambda: _stack(), True),
    "correct_shared_params": (lambda: _stack(mode="shared"), True),
    "correct_stacked_params": (lambda: _stack(mode="stacked"), True),
    "missing_psum_in_copy_3": (lambda: _stack(variant=_bug(_psum_then(
        lambda p, psum, x: _mlp(x, *p, lambda v: v)))), False),
    "missing_psum_in_copy_1": (lambda: _stack(variant=lambda i, x, p, inputs, psum, args:
                                              x + _mlp(x, *p, lambda v: v) if i == 1
                                              else None), False),
    "missing_psum_in_last_copy": (lambda: _stack(variant=lambda i, x, p, inputs, psum, args:
                                                 x + _mlp(x, *p, lambda v: v) if i == K - 1
                                                 else None), False),
    "pmean_instead_of_psum_in_copy_3": (lambda: _stack(variant=_bug(_psum_then(
        lambda p, psum, x: _mlp(x, *p, lambda v: lax.pmean(v, "tp"))))), False),
    "scale_2_in_copy_3": (lambda: _stack(variant=_bug(_psum_then(
        lambda p, psum, x: _mlp(x, *p, psum) * 2.0))), False),
    "copy_3_reads_copy_2s_params": (lambda: _stack(variant=_bug(
        lambda x, p, inputs, psum, args: x + _mlp(x, *args[1 + 3 * (BUG - 1):1 + 3 * BUG],
                                                  psum))), False),
    "stacked_copy_3_slices_w_2": (lambda: _stack(mode="stacked", variant=_bug(
        lambda x, p, inputs, psum, args: x + _mlp(x, *(w[BUG - 1] for w in args[1:4]),
                                                  psum))), False),
    "stacked_copy_3_slices_w2_of_layer_2": (lambda: _stack(mode="stacked", variant=_bug(
        lambda x, p, inputs, psum, args: x + _mlp(x, p[0], p[1], args[3][BUG - 1], psum))),
        False),
    "copy_3_reads_input_of_copy_1": (lambda: _stack(variant=_bug(
        lambda x, p, inputs, psum, args: inputs[BUG - 2] + _mlp(inputs[BUG - 2], *p, psum))),
        False),
    "copy_3_residual_from_copy_1": (lambda: _stack(variant=_bug(
        lambda x, p, inputs, psum, args: inputs[BUG - 2] + _mlp(x, *p, psum))), False),
    "copy_3_mlp_reads_copy_1_input": (lambda: _stack(variant=_bug(
        lambda x, p, inputs, psum, args: x + _mlp(inputs[BUG - 2], *p, psum))), False),
    "copy_3_subtracts_update": (lambda: _stack(variant=_bug(
        lambda x, p, inputs, psum, args: x - _mlp(x, *p, psum))), False),
    "copy_3_update_minus_x": (lambda: _stack(variant=_bug(
        lambda x, p, inputs, psum, args: _mlp(x, *p, psum) - x)), False),
    "copy_3_residual_of_normed_x": (lambda: _stack(variant=_bug(
        lambda x, p, inputs, psum, args: _rms(x) + _mlp(x, *p, psum))), False),
    "copy_3_params_split_over_b_psum_over_b": (lambda: _stack(
        mesh=AB, specs=A_SPECS, bug_specs=B_SPECS, variant=_bug(
            lambda x, p, inputs, psum, args: x + _mlp(x, *p, lambda v: lax.psum(v, "b")))),
        True),
    "copy_3_params_split_over_b_psum_over_a": (lambda: _stack(
        mesh=AB, specs=A_SPECS, bug_specs=B_SPECS), False),
    "copy_3_w1_split_over_b": (lambda: _stack(
        mesh=AB, specs=A_SPECS, bug_specs=[P(None, "b"), P("a"), P("a", None)]), False),
    "deferred_psum_correct": (lambda: _deferred(), True),
    "deferred_psum_missing_in_copy_3": (lambda: _deferred(skip_psum=BUG), False),
    "deferred_psum_residual_undivided_in_copy_3": (lambda: _deferred(undivided=BUG), False),
    "positions_correct": (lambda: _positions(), True),
    "positions_plus_1_in_copy_3": (lambda: _positions(
        lambda i, pos: pos + 1 if i == BUG else pos), False),
    "positions_chained_correct": (lambda: _positions(chained=True), True),
    "positions_chained_plus_2_in_copy_3": (lambda: _positions(
        lambda i, pos: pos + 1 if i == BUG else pos, chained=True), False),
    "attention_correct": (lambda: _attention_stack(), True),
    "attention_mask_wider_in_copy_3": (lambda: _attention_stack(bad_mask=BUG), False),
    "attention_chained_mask_correct": (lambda: _attention_stack(chained=True), True),
    "attention_chained_mask_wider_made_in_copy_2": (lambda: _attention_stack(
        bad_mask=BUG - 1, chained=True), False),
    "computed_positions_correct": (lambda: _computed_positions(), True),
    "computed_positions_restart_in_copy_3": (lambda: _computed_positions(restart_in=BUG),
                                             False),
    "fixed_then_hole_correct": (lambda: _fixed_then_hole(False), True),
    "fixed_then_hole_copy_2_stale": (lambda: _fixed_then_hole(True), False),
}
"""Every near miss, with whether its sharded program is meant to be correct (the verdict is
grounded by execution either way)."""


def _inputs(built: Built, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    out = []
    for shape, dtype in zip(built.shapes, built.dtypes or ["f32"] * len(built.shapes)):
        if dtype == "i32":
            out.append(np.arange(int(np.prod(shape)), dtype=np.int32).reshape(shape) * 3 + 1)
        else:
            scale = 1 / np.sqrt(shape[-2]) if len(shape) >= 2 and shape != (B, S, D) else 1
            out.append(np.asarray(rng.standard_normal(shape) * scale, dtype=np.float32))
    return out


def lower_case(built: Built):
    """(reference text, sharded text, reference fn, jitted sharded fn, mesh)."""
    names = tuple(n for n, _ in built.mesh)
    mesh = jax.make_mesh(tuple(s for _, s in built.mesh), names,
                         axis_types=(AxisType.Auto,) * len(names))
    dtypes = [jnp.int32 if d == "i32" else jnp.float32
              for d in built.dtypes or ["f32"] * len(built.shapes)]
    ref_text = jax.jit(built.ref, keep_unused=True).lower(
        *[jax.ShapeDtypeStruct(s, d) for s, d in zip(built.shapes, dtypes)]).as_text(
        debug_info=True)
    sharded = jax.jit(jax.shard_map(built.body, mesh=mesh, in_specs=tuple(built.specs),
                                    out_specs=built.out_spec, check_vma=False),
                      keep_unused=True)
    avals = [jax.ShapeDtypeStruct(s, d, sharding=NamedSharding(mesh, spec))
             for s, d, spec in zip(built.shapes, dtypes, built.specs)]
    return ref_text, sharded.lower(*avals).as_text(debug_info=True), sharded, mesh


def _execute(built: Built, sharded, mesh, seed: int) -> tuple[bool, float]:
    args = _inputs(built, seed)
    ref = np.asarray(jax.jit(built.ref)(*args))
    placed = [jax.device_put(a, NamedSharding(mesh, spec)) for a, spec in zip(args, built.specs)]
    return R.compare(ref, np.asarray(sharded(*placed)))


def run_near_miss(name: str, verify_rules: bool = True, timeout: int = 120) -> Case:
    """Build, execute, and check one near miss; classify it like `stack.run_case`."""
    build, correct = CASES[name]
    start = time.perf_counter()
    built = build()
    case = Case(name, None if correct else name, "")
    ref_text, shd_text, sharded, mesh = lower_case(built)
    match, err = _execute(built, sharded, mesh, 0)
    case.error = err
    classify(case, ref_text, shd_text, match,
             lambda: [_execute(built, sharded, mesh, k)[0] for k in (1, 2)], verify_rules,
             timeout)
    case.source = f"{name}\n--- sharded\n{shd_text}"
    case.seconds = time.perf_counter() - start
    return case
