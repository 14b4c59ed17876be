"""Catalogue of sharded programs (correct and buggy) with lowering and execution helpers."""

from __future__ import annotations

import os

if "--xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
    ).strip()

import functools
import inspect
from collections.abc import Callable
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from examples import models as m

BUG_MARKER = "# BUG"


@dataclass(frozen=True)
class Example:
    """One sharded program with its unsharded reference."""

    name: str
    mesh_axes: tuple[tuple[str, int], ...]
    reference: Callable
    body: Callable
    in_specs: tuple
    out_specs: object
    arg_shapes: tuple[tuple[int, ...], ...]
    bug: str | None
    description: str
    check_vma: bool = True


# Small widths, all divisible by 8.
B, S, D, F = 4, 8, 32, 64

_MLP_SHAPES = ((B, S, D), (D, F), (F,), (F, D), (D,))
_MLP_SPECS = (P(), P(None, "tp"), P("tp"), P("tp", None), P())
# Sequence-parallel MLP: seq 16 so that every tp <= 8 shard holds more than one token.
_SP_MLP_SHAPES = ((B, 2 * S, D),) + _MLP_SHAPES[1:]
_ATTN_SHAPES = ((B, S, D), (D, D), (D, D), (D, D), (D, D), (D,))
_ATTN_SPECS = (P(), P(None, "tp"), P(None, "tp"), P(None, "tp"), P("tp", None), P())
_LN_SHAPES = ((B, S, D), (D,), (D,))
_RMS_SHAPES = ((B, S, D), (D,))
_SEQ = P(None, "tp", None)
_HID = P(None, None, "tp")
_GPT_SHAPES = (
    (B, S, D),  # x
    (D,), (D,),  # ln1
    (D, D), (D, D), (D, D), (D, D), (D,),  # wq wk wv wo bo
    (D,), (D,),  # ln2
    (D, F), (F,), (F, D), (D,),  # w1 b1 w2 b2
)  # fmt: skip
_GPT_SPECS = (
    P("dp", None, None),
    P(), P(),
    P(None, "tp"), P(None, "tp"), P(None, "tp"), P("tp", None), P(),
    P(), P(),
    P(None, "tp"), P("tp"), P("tp", None), P(),
)  # fmt: skip


def _tp(
    prog: str,
    n: int,
    reference: Callable,
    body: Callable,
    in_specs: tuple,
    out_specs: object,
    shapes: tuple[tuple[int, ...], ...],
    description: str,
    bug: str | None = None,
    check_vma: bool = True,
) -> Example:
    name = f"{prog}_{bug}_tp{n}" if bug else f"{prog}_tp{n}"
    return Example(
        name, (("tp", n),), reference, body, in_specs, out_specs, shapes, bug, description,
        check_vma,
    )  # fmt: skip


def _build() -> tuple[Example, ...]:
    ex: list[Example] = []
    for n in (2, 4, 8):
        ex += [
            _tp("megatron_mlp", n, m.mlp_ref, m.mlp_body, _MLP_SPECS, P(), _MLP_SHAPES,
                "Megatron MLP: column-parallel W1/b1, row-parallel W2, psum, then b2."),
            _tp("row_linear_gelu", n, m.row_linear_gelu_ref, m.row_linear_gelu_body,
                (P(None, None, "tp"), P("tp", None)), P(), ((B, S, F), (F, D)),
                "Row-parallel linear on a hidden-split input, psum, then GELU."),
            _tp("attention", n, m.attention_ref, m.attention_body, _ATTN_SPECS, P(),
                _ATTN_SHAPES, "Causal MHA, heads over tp, row-parallel output proj + psum."),
            _tp("layernorm_hidden", n, m.layernorm_ref, m.layernorm_hidden_body,
                (_HID, P("tp"), P("tp")), _HID, _LN_SHAPES,
                "LayerNorm with hidden split; mean/var via psum of local sums."),
            _tp("rmsnorm_hidden", n, m.rmsnorm_ref, m.rmsnorm_hidden_body,
                (_HID, P("tp")), _HID, _RMS_SHAPES,
                "RMSNorm with hidden split; psum of local sum of squares."),
            _tp("layernorm_seq", n, m.layernorm_ref, m.layernorm_seq_body,
                (_SEQ, P(), P()), _SEQ, _LN_SHAPES,
                "LayerNorm with the sequence split; no collective."),
            _tp("rmsnorm_seq", n, m.rmsnorm_ref, m.rmsnorm_seq_body,
                (_SEQ, P()), _SEQ, _RMS_SHAPES,
                "RMSNorm with the sequence split; no collective."),
            _tp("seqpar_mlp", n, m.mlp_ref, m.seqpar_mlp_body,
                (_SEQ,) + _MLP_SPECS[1:], _SEQ, _SP_MLP_SHAPES,
                "Megatron sequence-parallel MLP: all_gather(seq), MLP, psum_scatter(seq)."),
            # Buggy twins.
            _tp("megatron_mlp", n, m.mlp_ref, m.mlp_missing_psum_body, _MLP_SPECS, P(),
                _MLP_SHAPES, "Megatron MLP without the psum after the row-parallel matmul.",
                bug="missing_psum", check_vma=False),
            _tp("megatron_mlp", n, m.mlp_ref, m.mlp_pmean_body, _MLP_SPECS, P(), _MLP_SHAPES,
                "Megatron MLP reducing with pmean instead of psum.", bug="pmean"),
            _tp("megatron_mlp", n, m.mlp_ref, m.mlp_bias_before_psum_body, _MLP_SPECS, P(),
                _MLP_SHAPES, "Megatron MLP adding b2 inside the psum (added tp times).",
                bug="bias_before_psum"),
            _tp("row_linear_gelu", n, m.row_linear_gelu_ref,
                m.row_linear_gelu_before_psum_body,
                (P(None, None, "tp"), P("tp", None)), P(), ((B, S, F), (F, D)),
                "Row-parallel linear applying GELU to partial sums before the psum.",
                bug="gelu_before_psum"),
            _tp("seqpar_mlp", n, m.mlp_ref, m.seqpar_mlp_gather_hidden_body,
                (_SEQ,) + _MLP_SPECS[1:], _SEQ, _SP_MLP_SHAPES,
                "Sequence-parallel MLP gathering along hidden instead of sequence.",
                bug="all_gather_wrong_dim"),
            _tp("layernorm_hidden", n, m.layernorm_ref, m.layernorm_hidden_local_stats_body,
                (_HID, P("tp"), P("tp")), _HID, _LN_SHAPES,
                "LayerNorm with hidden split using per-shard mean/var.",
                bug="local_stats", check_vma=False),
        ]  # fmt: skip
    for dp, tp in ((2, 2), (2, 4)):
        axes = (("dp", dp), ("tp", tp))
        ex.append(Example(
            f"gpt2_block_dp{dp}_tp{tp}", axes, m.gpt2_block_ref, m.gpt2_block_body,
            _GPT_SPECS, P("dp", None, None), _GPT_SHAPES, None,
            "GPT-2 block (LN, causal MHA, residual, LN, GELU MLP): batch over dp, TP over tp.",
        ))  # fmt: skip
        ex.append(Example(
            f"gpt2_block_psum_wrong_axis_dp{dp}_tp{tp}", axes, m.gpt2_block_ref,
            m.gpt2_block_psum_wrong_axis_body, _GPT_SPECS, P("dp", None, None), _GPT_SHAPES,
            "psum_wrong_axis", "GPT-2 block reducing the MLP partial sums over dp, not tp.",
            check_vma=False,
        ))  # fmt: skip
    names = [e.name for e in ex]
    assert len(names) == len(set(names)), "duplicate example names"
    return tuple(ex)


EXAMPLES: tuple[Example, ...] = _build()
_BY_NAME = {e.name: e for e in EXAMPLES}


def by_name(name: str) -> Example:
    """Look an example up by its unique name."""
    try:
        return _BY_NAME[name]
    except KeyError:
        raise KeyError(f"unknown example {name!r}") from None


@functools.cache
def _mesh(mesh_axes: tuple[tuple[str, int], ...]) -> Mesh:
    names = tuple(a for a, _ in mesh_axes)
    sizes = tuple(s for _, s in mesh_axes)
    return jax.make_mesh(sizes, names, axis_types=(AxisType.Auto,) * len(names))


def make_mesh(ex: Example) -> Mesh:
    """Mesh with Auto axes for an example (cached per axis layout)."""
    return _mesh(ex.mesh_axes)


@functools.cache
def sharded_fn(ex: Example) -> Callable:
    """The jitted shard_map program of an example."""
    return jax.jit(
        jax.shard_map(
            ex.body, mesh=make_mesh(ex), in_specs=ex.in_specs, out_specs=ex.out_specs,
            check_vma=ex.check_vma,
        )
    )  # fmt: skip


@functools.cache
def reference_fn(ex: Example) -> Callable:
    """The jitted unsharded reference of an example."""
    return jax.jit(ex.reference)


def _avals(ex: Example, sharded: bool) -> list[jax.ShapeDtypeStruct]:
    if not sharded:
        return [jax.ShapeDtypeStruct(s, jnp.float32) for s in ex.arg_shapes]
    mesh = make_mesh(ex)
    return [
        jax.ShapeDtypeStruct(s, jnp.float32, sharding=NamedSharding(mesh, spec))
        for s, spec in zip(ex.arg_shapes, ex.in_specs, strict=True)
    ]


def lower_pair(ex: Example) -> tuple[str, str]:
    """(reference MLIR, sharded MLIR), both with debug-info locations."""
    ref = reference_fn(ex).lower(*_avals(ex, False)).as_text(debug_info=True)
    shd = sharded_fn(ex).lower(*_avals(ex, True)).as_text(debug_info=True)
    return ref, shd


def random_inputs(ex: Example, seed: int = 0) -> list[np.ndarray]:
    """Normal float32 global inputs: std 1, except matrices (weights) get std 1/sqrt(fan_in)."""
    rng = np.random.default_rng(seed)
    out = []
    for s in ex.arg_shapes:
        a = rng.standard_normal(s, dtype=np.float32)
        out.append(a / np.float32(np.sqrt(s[0])) if len(s) == 2 else a)
    return out


def run_pair(ex: Example, seed: int = 0) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Run reference and sharded program on the same random inputs; return their outputs."""
    args = random_inputs(ex, seed)
    ref_out = reference_fn(ex)(*args)
    mesh = make_mesh(ex)
    placed = [
        jax.device_put(a, NamedSharding(mesh, spec))
        for a, spec in zip(args, ex.in_specs, strict=True)
    ]
    shd_out = sharded_fn(ex)(*placed)
    as_np = [np.asarray(o) for o in jax.tree.leaves(ref_out)]
    return as_np, [np.asarray(o) for o in jax.tree.leaves(shd_out)]


def bug_line(ex: Example) -> tuple[str, int]:
    """(source file, line number) of the line in ex.body ending with ``# BUG``."""
    if ex.bug is None:
        raise ValueError(f"{ex.name} is a correct program")
    lines, start = inspect.getsourcelines(ex.body)
    hits = [start + i for i, ln in enumerate(lines) if ln.rstrip().endswith(BUG_MARKER)]
    if len(hits) != 1:
        raise ValueError(f"{ex.name}: expected one {BUG_MARKER!r} line, found {len(hits)}")
    path = inspect.getsourcefile(ex.body)
    assert path is not None
    return os.path.abspath(path), hits[0]
