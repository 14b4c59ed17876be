"""The held-out corpus: programs written the way other people write them, with lowering and
execution helpers.

Every program is an `Example`: an unsharded reference and a sharded program over the same global
arguments. A shard_map program is a per-device `body` with `in_specs` (the arguments' specs) and
`out_specs`, optionally transformed as a whole (`wrap`, e.g. `jax.grad` of the shard_map'd loss).
An XLA-partitioned program (`partitioned=True`) is a global function jitted with the arguments'
shardings and `out_specs` as out_shardings; what is checked is XLA's per-device program after
SPMD partitioning. `bug` is None for a correct program, else one line saying what is wrong, and
the line of the source holding the bug ends with `# BUG`.

Labels are grounded by execution (`run_pair`, `max_error`): on simulated CPU devices the correct
programs compute their reference's numbers and the buggy ones do not
(tests/examples/test_heldout_grounded.py).
"""

from __future__ import annotations

import os

if "--xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
    ).strip()

import functools
import inspect
from collections.abc import Callable
from dataclasses import dataclass, field

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from entangle_mlir.evidence import FAST_COMPILE

BUG_MARKER = "# BUG"

SOURCES = {
    "jax_docs": "JAX docs: the shard_map notebook (docs.jax.dev/en/latest/notebooks/shard_map.html)",
    "jax_tests": "JAX's tests/shard_map_test.py",
    "scaling_book": "How to Scale Your Model (jax-ml.github.io/scaling-book), parts 3 and 10",
    "flax_guide": "Flax's sharding guides (flax.readthedocs.io/en/latest/guides/flax_gspmd.html)",
    "maxtext_style": "MaxText / Levanter / Megatron-style layers written in JAX",
    "xla_partitioned": "jit with shardings: XLA's per-device program (check_partitioned's path)",
    "training_steps": ("ZeRO-1/2/3 Adam, optax global-norm clipping, Megatron sequence-parallel "
                       "norm grads, DP x TP SGD"),
    "parallel_layers": ("MaxText GQA, tensor-parallel norms and softmax, flash-decoding, sorted "
                        "MoE, Megatron MLP/LM head, rings, halos, prefix sums, lax docs' "
                        "collectives"),
    "newer_sources": ("JAX's newer sharding docs (shard_map 201, Distributed arrays), newer "
                      "cases of tests/shard_map_test.py (axis_index_groups, pbroadcast, "
                      "partial auto), the scaling book's parts 5 and 7 (FSDP+TP backward, "
                      "KV cache over batch and heads, 2D weight-stationary), MaxText's "
                      "ring-of-experts, interleaved rotary and Gemma RMSNorm"),
    "twelfth_sources": ("Levanter/Haliax's sharded logsumexp, Flax BatchNorm(axis_name), "
                        "cumprod/cummax/sort/argmax-with-ties over sharded axes, all_to_all "
                        "transposes, reduce-scatter + all-gather, bf16 FSDP with f32 "
                        "accumulation, Megatron's f/g as custom_vjp, remat policies, scan "
                        "over TP layers, vmap in shard_map, int32 expert counters and the "
                        "load-balancing loss, int8 quantization, EasyLM's loss and accuracy, "
                        "custom_partitioning, jit with shardings of logsumexp, cumsum, sort, "
                        "argmax, top_k, cross entropy and t5x-style attention"),
    "attacks13": ("session 13's attacks on its newest proofs: one entry of each device's block "
                  "(dense expert masks off by one, skipped, doubled, wrapping), a divisor's "
                  "power-of-two factor, transposed dot operands read in place, bf16 psums, "
                  "hidden tolerances, swapped branches, wrapping positions"),
}
"""The module of each source and what it follows (the README table's rows)."""


@dataclass(frozen=True)
class Arg:
    """One global argument: shape, layout, dtype and how to draw it."""

    shape: tuple[int, ...]
    spec: P
    dtype: str = "float32"
    kind: str = "data"  # data | weight | ids (in [0, high)) | positive
    high: int = 0


REPLICATED = P()


def f32(shape: tuple[int, ...], spec: P = REPLICATED, kind: str = "data") -> Arg:
    return Arg(tuple(shape), spec, "float32", kind)


def ids(shape: tuple[int, ...], spec: P, high: int) -> Arg:
    return Arg(tuple(shape), spec, "int32", "ids", high)


@dataclass(frozen=True)
class Example:
    """One sharded program with its unsharded reference."""

    name: str
    source: str
    mesh_axes: tuple[tuple[str, int], ...]
    reference: Callable
    body: Callable  # shard_map body; for `partitioned`, mesh -> the global function to jit
    args: tuple[Arg, ...]
    out_specs: object
    bug: str | None
    description: str  # what it is and the section of the source it follows
    check_vma: bool = True
    wrap: Callable | None = None  # applied to the shard_map'd function (grad, value_and_grad)
    partitioned: bool = False
    bug_fn: Callable | None = field(default=None, compare=False)  # holds the `# BUG` line
    chosen: Callable | None = field(default=None, compare=False)  # () -> [extra input sets]
    atol: float = 1e-4

    @property
    def in_specs(self) -> tuple:
        return tuple(a.spec for a in self.args)

    @property
    def mesh_text(self) -> str:
        return " x ".join(f"{a}{n}" for a, n in self.mesh_axes)

    @property
    def form(self) -> str:
        return "xla" if self.partitioned else "grad" if self.wrap else "shard_map"


def mesh_name(mesh_axes) -> str:
    return "_".join(f"{a}{n}" for a, n in mesh_axes)


def program(source: str, prog: str, mesh_axes, reference: Callable, body: Callable, args,
            out_specs, description: str, *, bug: str | None = None, **kw) -> Example:
    """An Example named `<prog>[_<bug>]_<mesh>`; buggy programs skip the vma check unless
    told otherwise (most bugs make the out_specs' replication claim false)."""
    mesh_axes = tuple(mesh_axes)
    name = f"{prog}_{bug}_{mesh_name(mesh_axes)}" if bug else f"{prog}_{mesh_name(mesh_axes)}"
    if bug is not None:
        kw.setdefault("check_vma", False)
    return Example(name, source, mesh_axes, reference, body, tuple(args), out_specs, bug,
                   description, **kw)


def examples() -> tuple[Example, ...]:
    """The whole corpus, by source."""
    return _examples()


@functools.cache
def _examples() -> tuple[Example, ...]:
    from . import (
        attacks13,
        flax_guide,
        jax_docs,
        jax_tests,
        maxtext_style,
        newer_sources,
        parallel_layers,
        scaling_book,
        training_steps,
        twelfth_sources,
        xla_partitioned,
    )

    out: list[Example] = []
    for module in (jax_docs, jax_tests, scaling_book, flax_guide, maxtext_style,
                   xla_partitioned, training_steps, parallel_layers, newer_sources,
                   twelfth_sources, attacks13):
        found = module.programs()
        assert all(e.source == module.__name__.rsplit(".", 1)[-1] for e in found), module
        out += found
    names = [e.name for e in out]
    dup = {n for n in names if names.count(n) > 1}
    assert not dup, f"duplicate example names: {dup}"
    return tuple(out)


def by_name(name: str) -> Example:
    for e in examples():
        if e.name == name:
            return e
    raise KeyError(f"unknown example {name!r}")


# ----- meshes, lowering ---------------------------------------------------------------------------

@functools.cache
def _mesh(mesh_axes: tuple[tuple[str, int], ...]) -> Mesh:
    names = tuple(a for a, _ in mesh_axes)
    sizes = tuple(s for _, s in mesh_axes)
    return jax.make_mesh(sizes, names, axis_types=(AxisType.Auto,) * len(names))


def make_mesh(ex: Example) -> Mesh:
    return _mesh(ex.mesh_axes)


def _out_shardings(ex: Example):
    if ex.out_specs is None:
        return None
    mesh = make_mesh(ex)
    if isinstance(ex.out_specs, tuple) and not isinstance(ex.out_specs, P):
        return tuple(NamedSharding(mesh, p) for p in ex.out_specs)
    return NamedSharding(mesh, ex.out_specs)


@functools.cache
def sharded_fn(ex: Example) -> Callable:
    """The jitted sharded program (shard_map forms only)."""
    assert not ex.partitioned
    f = jax.shard_map(ex.body, mesh=make_mesh(ex), in_specs=ex.in_specs,
                      out_specs=ex.out_specs, check_vma=ex.check_vma)
    if ex.wrap is not None:
        f = ex.wrap(f)
    return jax.jit(f)


@functools.cache
def partitioned_fn(ex: Example) -> Callable:
    """The global function of an XLA-partitioned program, jitted with its shardings."""
    assert ex.partitioned
    return jax.jit(ex.body(make_mesh(ex)), out_shardings=_out_shardings(ex))


def avals(ex: Example, sharded: bool) -> list[jax.ShapeDtypeStruct]:
    if not sharded:
        return [jax.ShapeDtypeStruct(a.shape, jnp.dtype(a.dtype)) for a in ex.args]
    mesh = make_mesh(ex)
    return [jax.ShapeDtypeStruct(a.shape, jnp.dtype(a.dtype), sharding=NamedSharding(mesh, a.spec))
            for a in ex.args]


@functools.cache
def lower_pair(ex: Example) -> tuple[str, str | bytes]:
    """(reference StableHLO, sharded program): the shard_map program's lowering with debug
    locations, or XLA's per-device program after SPMD partitioning (bytecode)."""
    ref = jax.jit(ex.reference).lower(*avals(ex, False)).as_text(debug_info=True)
    if not ex.partitioned:
        return ref, sharded_fn(ex).lower(*avals(ex, True)).as_text(debug_info=True)
    from entangle_mlir.mlir.xla import module_proto_to_stablehlo

    with jax.set_mesh(make_mesh(ex)):
        proto = _partitioned_proto(partitioned_fn(ex), avals(ex, True))
    return ref, module_proto_to_stablehlo(proto)


def _partitioned_proto(jitted, in_avals) -> bytes:
    """XLA's per-device program after SPMD partitioning (what `entangle_mlir.jax.partitioned_hlo`
    dumps), compiled with FAST_COMPILE: the dump is taken before any backend pass."""
    import glob
    import tempfile

    from entangle_mlir.mlir.compat import plain_replica_groups_options
    from entangle_mlir.mlir.xla import module_proto

    with tempfile.TemporaryDirectory(prefix="entangle-heldout-") as directory:
        options = {"xla_dump_to": directory, "xla_dump_hlo_pass_re": "spmd-partitioning",
                   "xla_dump_hlo_as_proto": True, **plain_replica_groups_options(),
                   **FAST_COMPILE}
        jitted.lower(*in_avals).compile(compiler_options=options)
        found = sorted(glob.glob(os.path.join(directory, "*after_spmd-partitioning*.hlo.pb")))
        assert found, "XLA wrote no after-spmd-partitioning dump"
        with open(found[-1], "rb") as handle:
            return module_proto(handle.read())


# ----- execution ----------------------------------------------------------------------------------

def random_arg(a: Arg, rng: np.random.Generator) -> np.ndarray:
    if a.kind == "ids":
        return rng.integers(0, a.high, a.shape).astype(a.dtype)
    x = rng.standard_normal(a.shape).astype(np.float32)
    if a.kind == "weight":
        return x / np.float32(np.sqrt(a.shape[-2] if len(a.shape) >= 2 else 1))
    if a.kind == "positive":
        return np.abs(x) + np.float32(0.5)
    return x


def input_sets(ex: Example) -> list[list[np.ndarray]]:
    """The inputs a label is grounded on: two random draws and the program's chosen ones."""
    sets = []
    for seed in (0, 1):
        rng = np.random.default_rng(seed)
        sets.append([random_arg(a, rng) for a in ex.args])
    if ex.chosen is not None:
        sets += [list(s) for s in ex.chosen()]
    return sets




@functools.cache
def _compiled_reference(ex: Example):
    return jax.jit(ex.reference).lower(*avals(ex, False)).compile(compiler_options=FAST_COMPILE)


@functools.cache
def _compiled_sharded(ex: Example):
    return sharded_fn(ex).lower(*avals(ex, True)).compile(compiler_options=FAST_COMPILE)


def run_reference(ex: Example, args) -> list[np.ndarray]:
    out = _compiled_reference(ex)(*args)
    return [np.asarray(o) for o in jax.tree.leaves(out)]


def run_sharded(ex: Example, args) -> list[np.ndarray]:
    mesh = make_mesh(ex)
    placed = [jax.device_put(x, NamedSharding(mesh, a.spec)) for x, a in zip(args, ex.args)]
    out = _compiled_sharded(ex)(*placed)
    return [np.asarray(o) for o in jax.tree.leaves(out)]


@functools.cache
def _per_device_program(ex: Example):
    """(executable, devices, parameter shardings, local parameter shapes) of XLA's per-device
    program run as replicas (`entangle_mlir.jax.run_per_device`, compiled once per program)."""
    from entangle_mlir.evidence import as_replicas, compile_replicas
    from entangle_mlir.mlir.ir import context, parse_module
    from entangle_mlir.mlir.per_device import parameter_shardings, program_device_count
    from entangle_mlir.mlir.program import public_main

    _, program = lower_pair(ex)
    module = parse_module(program)
    with context():
        main = public_main(module, "-")
        shardings = parameter_shardings(module, main)
        n = program_device_count(module, main)
        local = [tuple(a.type.shape) for a in main.regions[0].blocks[0].arguments]
        text = as_replicas(module, n)
    executable, devices = compile_replicas(text, n)
    return executable, devices, shardings, local


def run_per_device(ex: Example, args) -> list[list[np.ndarray]]:
    """Each device's results of XLA's per-device program on the global `args`."""
    from entangle_mlir.evidence import device_blocks, local_block

    executable, devices, shardings, local = _per_device_program(ex)
    n = len(devices)
    replicated = NamedSharding(Mesh(np.array(devices), ("replicas",)), P())
    arrays = []
    for arg, sharding, shape in zip(args, shardings, local):
        arg = np.asarray(arg)
        blocks = device_blocks(sharding, arg.shape, shape, n)
        shards = [jax.device_put(local_block(arg, blocks[d], shape), devices[d])
                  for d in range(n)]
        arrays.append(jax.make_array_from_single_device_arrays(shape, replicated, shards))
    outs = executable.execute_sharded(arrays).disassemble_into_single_device_arrays()
    return [[np.asarray(outs[r][d]) for r in range(len(outs))] for d in range(n)]


def max_error(ex: Example, args) -> float:
    """The largest difference between the sharded program's outputs and the reference's on
    `args` (inf when a shape differs), relative to the reference's magnitude where it exceeds 1;
    0 or inf for integer outputs."""
    want = run_reference(ex, args)
    if ex.partitioned:
        from entangle_mlir.jax import expected_per_device

        _, program = lower_pair(ex)
        pairs = [(g, e) for got, exp in zip(run_per_device(ex, args),
                                            expected_per_device(program, want))
                 for g, e in zip(got, exp, strict=True)]
    else:
        got = run_sharded(ex, args)
        if len(got) != len(want):
            return float("inf")
        pairs = list(zip(got, want))
    worst = 0.0
    for g, w in pairs:
        if g.shape != w.shape:
            return float("inf")
        if not np.issubdtype(w.dtype, np.floating):
            worst = max(worst, 0.0 if np.array_equal(g, w) else float("inf"))
            continue
        scale = max(1.0, float(np.max(np.abs(w), initial=0.0)))
        worst = max(worst, float(np.max(np.abs(g.astype(np.float64) - w), initial=0.0)) / scale)
    return worst


def grounded_correct(ex: Example) -> tuple[bool, list[float]]:
    """(does the program compute its reference on every input set, the errors per set)."""
    errors = [max_error(ex, args) for args in input_sets(ex)]
    return all(e <= 10 * ex.atol for e in errors), errors


# ----- the `# BUG` line ---------------------------------------------------------------------------

def bug_line(ex: Example) -> tuple[str, int]:
    """(source file, line number) of the line ending with ``# BUG`` in the buggy function."""
    if ex.bug is None:
        raise ValueError(f"{ex.name} is a correct program")
    fn = ex.bug_fn or ex.body
    lines, start = inspect.getsourcelines(fn)
    hits = [start + i for i, ln in enumerate(lines) if ln.rstrip().endswith(BUG_MARKER)]
    if len(hits) != 1:
        raise ValueError(f"{ex.name}: expected one {BUG_MARKER!r} line, found {len(hits)}")
    path = inspect.getsourcefile(fn)
    assert path is not None
    return os.path.abspath(path), hits[0]
