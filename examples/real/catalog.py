"""The corpus of real-model programs: correct ones and buggy twins, with lowering and execution.

Same interface as `examples/catalog.py` (`Example`, `EXAMPLES`, `by_name`, `lower_pair`,
`run_pair`, `bug_line`), extended with argument dtypes/kinds (token ids, masks, AdamW moments)
and the model / parallelism / task of each program for the results table.
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

from .models.par import Par
from .programs import ArgDef, Built, build

BUG_MARKER = "# BUG"


@dataclass(frozen=True)
class Example:
    """One sharded program with its unsharded reference."""

    name: str
    mesh_axes: tuple[tuple[str, int], ...]
    reference: Callable
    body: Callable
    args: tuple[ArgDef, ...]
    out_specs: object
    bug: str | None
    description: str
    check_vma: bool = False
    model: str = ""
    style: str = ""  # parallelism, e.g. "tp", "dp x tp", "sp", "fsdp", "ep", "cp"
    task: str = ""  # stack / fwd / loss / sgd / adamw
    scan: bool = False
    bug_fn: Callable | None = field(default=None, compare=False)  # holds the `# BUG` line
    tricky: bool = False  # a correct program written in an unusual but equivalent way

    @property
    def in_specs(self) -> tuple:
        return tuple(a.spec for a in self.args)

    @property
    def arg_shapes(self) -> tuple[tuple[int, ...], ...]:
        return tuple(a.shape for a in self.args)

    @property
    def mesh_text(self) -> str:
        return " x ".join(f"{a}{n}" for a, n in self.mesh_axes)


def mesh_name(mesh_axes) -> str:
    return "_".join(f"{a}{n}" for a, n in mesh_axes)


def program(model: str, task: str, par: Par, mesh_axes, style: str, description: str = "",
            *, scan: bool = False, clip: bool = False, suffix: str = "", cfg=None,
            mod=None) -> Example:
    built: Built = build(model, task, par, scan=scan, clip=clip, cfg=cfg, mod=mod)
    tag = task + ("_scan" if scan else "") + ("_clip" if clip else "") + suffix
    if par.sp:
        tag += "_sp"
    if par.tp and not par.vocab and not task.startswith("stack"):
        tag += "_replhead"
    if not par.megatron:
        tag += "_native"
    name = f"{model}_{tag}_{mesh_name(mesh_axes)}"
    return Example(name, tuple(mesh_axes), built.reference, built.body, built.args,
                   built.out_specs, None, description or f"{model} {task} under {style}",
                   built.check_vma, model, style, task, scan)


def custom(name: str, mesh_axes, reference: Callable, body: Callable, args, out_specs,
           description: str, *, model: str = "", style: str = "", task: str = "",
           bug: str | None = None, bug_fn: Callable | None = None, check_vma: bool = False,
           tricky: bool = False) -> Example:
    """An Example from an explicit (reference, body) pair; the name gets the mesh appended."""
    return Example(f"{name}_{mesh_name(mesh_axes)}", tuple(mesh_axes), reference, body,
                   tuple(args), out_specs, bug, description, check_vma, model, style, task,
                   False, bug_fn, tricky)


def twin(ex: Example, bug: str, mod, description: str, bug_fn: Callable,
         par: Par | None = None) -> Example:
    """The buggy twin of a model program: the same program with `mod` (a `Variant`)."""
    built = build(ex.model, ex.task, par or _par_of(ex), scan=ex.scan, mod=mod,
                  clip="_clip" in ex.name, cfg=_cfg_of(ex))
    name = ex.name.replace(f"_{mesh_name(ex.mesh_axes)}", f"_{bug}_{mesh_name(ex.mesh_axes)}")
    assert built.args == ex.args and built.out_specs == ex.out_specs
    return Example(name, ex.mesh_axes, ex.reference, built.body, built.args, built.out_specs,
                   bug, description, built.check_vma, ex.model, ex.style, ex.task, ex.scan,
                   bug_fn)


def _par_of(ex: Example) -> Par:
    return ex.body.par  # set by programs.program_fn


def _cfg_of(ex: Example):
    return ex.body.cfg


def _corpus() -> list[Example]:
    from .corpus import correct_programs

    return correct_programs()


def _bugs() -> list[Example]:
    from .bugs import buggy_programs

    return buggy_programs()


@functools.cache
def correct_examples() -> tuple[Example, ...]:
    return tuple(_corpus())


def correct_by_name(name: str) -> Example:
    for e in correct_examples():
        if e.name == name:
            return e
    raise KeyError(f"unknown correct example {name!r}")


@functools.cache
def examples() -> tuple[Example, ...]:
    ex = list(correct_examples()) + _bugs()
    names = [e.name for e in ex]
    dup = {n for n in names if names.count(n) > 1}
    assert not dup, f"duplicate example names: {dup}"
    return tuple(ex)


def by_name(name: str) -> Example:
    for e in examples():
        if e.name == name:
            return e
    raise KeyError(f"unknown example {name!r}")


@functools.cache
def _mesh(mesh_axes: tuple[tuple[str, int], ...]) -> Mesh:
    names = tuple(a for a, _ in mesh_axes)
    sizes = tuple(s for _, s in mesh_axes)
    return jax.make_mesh(sizes, names, axis_types=(AxisType.Auto,) * len(names))


def make_mesh(ex: Example) -> Mesh:
    return _mesh(ex.mesh_axes)


@functools.cache
def sharded_fn(ex: Example) -> Callable:
    return jax.jit(jax.shard_map(ex.body, mesh=make_mesh(ex), in_specs=ex.in_specs,
                                 out_specs=ex.out_specs, check_vma=ex.check_vma))


@functools.cache
def reference_fn(ex: Example) -> Callable:
    return jax.jit(ex.reference)


def _avals(ex: Example, sharded: bool) -> list[jax.ShapeDtypeStruct]:
    if not sharded:
        return [jax.ShapeDtypeStruct(a.shape, jnp.dtype(a.dtype)) for a in ex.args]
    mesh = make_mesh(ex)
    return [jax.ShapeDtypeStruct(a.shape, jnp.dtype(a.dtype), sharding=NamedSharding(mesh, a.spec))
            for a in ex.args]


@functools.cache
def lower_pair(ex: Example) -> tuple[str, str]:
    """(reference MLIR, sharded MLIR), both with debug-info locations."""
    ref = reference_fn(ex).lower(*_avals(ex, False)).as_text(debug_info=True)
    shd = sharded_fn(ex).lower(*_avals(ex, True)).as_text(debug_info=True)
    return ref, shd


def random_arg(a: ArgDef, rng: np.random.Generator) -> np.ndarray:
    if a.kind == "tokens":
        return rng.integers(0, a.high, a.shape, dtype=np.int32)
    if a.kind == "mask":
        return (rng.random(a.shape) < 0.6).astype(np.float32)
    x = rng.standard_normal(a.shape, dtype=np.float32)
    if a.kind == "weight":
        return x / np.float32(np.sqrt(a.fan_in))
    if a.kind == "large":  # exp overflows in float32 above ~88
        return np.float32(100) * x
    if a.kind == "gain":
        return np.float32(1) + np.float32(0.1) * x
    if a.kind in ("bias", "moment"):
        return np.float32(0.1) * x
    if a.kind == "second_moment":
        return np.float32(0.01) * np.abs(x)
    return x


def random_inputs(ex: Example, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [random_arg(a, rng) for a in ex.args]


# XLA's CPU backend spends seconds optimising these small programs; grounding needs none of it.
FAST_COMPILE = {
    "xla_backend_optimization_level": 0,
    "xla_llvm_disable_expensive_passes": True,
    "xla_cpu_use_fusion_emitters": False,
}


@functools.cache
def _compiled(fn: Callable, avals: tuple) -> Callable:
    return fn.lower(*avals).compile(compiler_options=FAST_COMPILE)


@functools.cache
def _reference_outputs(reference: Callable, avals: tuple, seed: int,
                       args_key: tuple) -> tuple[np.ndarray, ...]:
    rng = np.random.default_rng(seed)
    inputs = [random_arg(a, rng) for a in args_key]
    out = _compiled(jax.jit(reference), avals)(*inputs)
    return tuple(np.asarray(o) for o in jax.tree.leaves(out))


def _data_key(ex: Example) -> tuple:
    """What the random inputs depend on (not the layouts), so references can share outputs."""
    return tuple(ArgDef(a.name, a.shape, a.dtype, a.kind, None, a.high, a.fan_in)
                 for a in ex.args)


def run_reference(ex: Example, seed: int = 0) -> list[np.ndarray]:
    return list(_reference_outputs(ex.reference, tuple(_avals(ex, False)), seed, _data_key(ex)))


def run_sharded(ex: Example, seed: int = 0) -> list[np.ndarray]:
    args = random_inputs(ex, seed)
    mesh = make_mesh(ex)
    placed = [jax.device_put(x, NamedSharding(mesh, a.spec)) for x, a in zip(args, ex.args)]
    out = _compiled(sharded_fn(ex), tuple(_avals(ex, True)))(*placed)
    return [np.asarray(o) for o in jax.tree.leaves(out)]


def run_pair(ex: Example, seed: int = 0) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Run reference and sharded program on the same random inputs; return their outputs."""
    return run_reference(ex, seed), run_sharded(ex, seed)


def run_pair_on(ex: Example, inputs: list[np.ndarray]) -> tuple[list[np.ndarray],
                                                               list[np.ndarray]]:
    """Run reference and sharded program on the given (global) inputs; return their outputs.
    For grounding on chosen inputs (values near the dtype's limits) rather than random ones."""
    ref = _compiled(jax.jit(ex.reference), tuple(_avals(ex, False)))(*inputs)
    mesh = make_mesh(ex)
    placed = [jax.device_put(x, NamedSharding(mesh, a.spec)) for x, a in zip(inputs, ex.args)]
    out = _compiled(sharded_fn(ex), tuple(_avals(ex, True)))(*placed)
    return ([np.asarray(o) for o in jax.tree.leaves(ref)],
            [np.asarray(o) for o in jax.tree.leaves(out)])


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
