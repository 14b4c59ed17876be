"""Random shard_map programs, correct by construction, and their mutants.

A program is a chain of *layers* over one running value ``x``. The generator tracks the value's
layout (which mesh axes split which dim, which axes it is still a pending partial sum/max/min
over, and a pending scale factor) and only emits a layer whose sharded spelling keeps the value
equal to the reference's; the *fixup* layers (collectives, dynamic slices, a scale) then bring the
value to the declared output layout. Every layer renders itself twice: the reference spelling on
global arrays and the per-device spelling inside ``shard_map``. A *mutant* overrides parameters
of the sharded spelling only (drop/duplicate/retarget a collective, change a dim, an axis, a
constant, an offset, a permutation, an input/output spec), so the reference stays the same.

Nothing here imports jax: a program is plain data that renders to Python source
(`Program.source()`); `fuzz.run` executes and checks it.

Randomness comes from a `Chooser`: `RandomChooser(random.Random(seed))` for plain seeds, or
`fuzz.strategies` for hypothesis (which can then shrink programs).

Constructs the generator can emit, each with a weight (`WEIGHTS`; set one to 0 to leave it out;
`EXCLUDED` documents what is left out by default and why).
"""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from fractions import Fraction

# ----------------------------------------------------------------------------------------------
# Randomness
# ----------------------------------------------------------------------------------------------


class Chooser:
    """The only source of randomness of the generator."""

    def randint(self, lo: int, hi: int) -> int:  # inclusive
        raise NotImplementedError

    def choice(self, seq: Sequence):
        seq = list(seq)
        return seq[self.randint(0, len(seq) - 1)]

    def chance(self, p: float) -> bool:
        return self.randint(0, 999) < int(p * 1000)

    def weighted(self, items: Sequence, weights: Sequence[float]):
        total = sum(weights)
        r = self.randint(0, max(int(total * 100) - 1, 0)) / 100
        acc = 0.0
        for item, w in zip(items, weights):
            acc += w
            if r < acc:
                return item
        return items[-1]

    def subset(self, seq: Sequence, min_size: int = 1) -> list:
        seq = list(seq)
        while True:
            out = [s for s in seq if self.chance(0.5)]
            if len(out) >= min_size:
                return out
            if len(seq) < min_size:
                return []
            out = [self.choice(seq)] if min_size == 1 else out
            if len(out) >= min_size:
                return out

    def permutation(self, seq: Sequence) -> list:
        rest = list(seq)
        out = []
        while rest:
            out.append(rest.pop(self.randint(0, len(rest) - 1)))
        return out


class RandomChooser(Chooser):
    def __init__(self, rng: random.Random | int):
        self.rng = rng if isinstance(rng, random.Random) else random.Random(rng)

    def randint(self, lo: int, hi: int) -> int:
        return self.rng.randint(lo, hi)


# ----------------------------------------------------------------------------------------------
# Meshes, layouts
# ----------------------------------------------------------------------------------------------

MESH_SHAPES: tuple[tuple[int, ...], ...] = ((2,), (4,), (8,), (2, 2), (2, 4))
AXIS_NAMES_1D = ("x", "tp", "i")
AXIS_NAMES_2D = (("dp", "tp"), ("a", "b"))

Spec = tuple[tuple[str, ...], ...]


@dataclass(frozen=True)
class MeshSpec:
    names: tuple[str, ...]
    sizes: tuple[int, ...]

    def size(self, axes: Sequence[str]) -> int:
        d = dict(zip(self.names, self.sizes))
        return math.prod(d[a] for a in axes)

    def order(self, axes) -> tuple[str, ...]:
        return tuple(a for a in self.names if a in set(axes))

    @property
    def axes(self) -> tuple[tuple[str, int], ...]:
        return tuple(zip(self.names, self.sizes))

    def describe(self) -> str:
        return " x ".join(f"{n}={s}" for n, s in self.axes)


@dataclass(frozen=True)
class State:
    """The layout of the running value: true value = coef * reduce_{partial}(local) (blocks)."""

    shape: tuple[int, ...]
    spec: Spec
    partial: tuple[str, ...] = ()
    kind: str | None = None          # 'sum' | 'max' | 'min' while partial is non-empty
    coef: Fraction = Fraction(1)     # pending scale (sum kind or no partial)
    mag: float = 1.0                 # rough magnitude of the values (keeps exp finite)

    @property
    def rank(self) -> int:
        return len(self.shape)

    def used(self) -> set[str]:
        return {a for axes in self.spec for a in axes} | set(self.partial)

    def free(self, mesh: MeshSpec) -> list[str]:
        used = self.used()
        return [a for a in mesh.names if a not in used]

    def local(self, mesh: MeshSpec, d: int) -> int:
        return self.shape[d] // mesh.size(self.spec[d])

    def clean(self) -> bool:
        """No pending reduction and no pending scale: nonlinear ops may apply."""
        return not self.partial and self.coef == 1

    def size(self) -> int:
        return math.prod(self.shape)


def spec_str(spec: Spec) -> str:
    parts = []
    for axes in spec:
        if not axes:
            parts.append("None")
        elif len(axes) == 1:
            parts.append(repr(axes[0]))
        else:
            parts.append(repr(tuple(axes)))
    return f"P({', '.join(parts)})"


def ax(axes: Sequence[str]) -> str:
    axes = tuple(axes)
    return repr(axes[0]) if len(axes) == 1 else repr(axes)


def num(c) -> str:
    return repr(float(c))


# ----------------------------------------------------------------------------------------------
# Layers and programs
# ----------------------------------------------------------------------------------------------

COLLECTIVES = ("psum", "pmax", "pmin", "all_gather", "psum_scatter", "all_to_all", "ppermute",
               "ppermute_pair", "roll", "dynslice", "shard_scale", "dus_gather")


@dataclass
class Layer:
    """One step of the chain. `p` are its parameters; `m` overrides them on the sharded side
    only (a mutation). `sub` is the inner chain of a `combine` layer."""

    op: str
    p: dict
    m: dict = field(default_factory=dict)
    sub: list[Layer] | None = None

    def params(self, side: str) -> dict:
        return {**self.p, **self.m} if side == "shard" else self.p

    def emit(self, side: str, v: str, depth: int = 0) -> list[str]:
        return EMIT[self.op](self, self.params(side), side, v, depth)

    @property
    def is_collective(self) -> bool:
        return self.op in COLLECTIVES


@dataclass(frozen=True)
class Arg:
    shape: tuple[int, ...]
    spec: Spec
    init: str = "normal"   # normal | weight (std 1/sqrt(fan)) | positive (uniform [0.5, 1.5])
    fan: int = 1


@dataclass
class Program:
    mesh: MeshSpec
    args: list[Arg]
    layers: list[Layer]
    out_spec: Spec
    out_shape: tuple[int, ...]
    seed: object = None
    mutation: str | None = None
    shard_in_specs: dict[int, Spec] = field(default_factory=dict)   # mutation of in_specs
    shard_out_spec: Spec | None = None                               # mutation of out_specs
    constructs: tuple[str, ...] = ()

    @property
    def correct(self) -> bool:
        return self.mutation is None

    def in_specs(self, side: str = "shard") -> list[Spec]:
        return [self.shard_in_specs.get(i, a.spec) if side == "shard" else a.spec
                for i, a in enumerate(self.args)]

    def out(self, side: str = "shard") -> Spec:
        return self.shard_out_spec if (side == "shard" and self.shard_out_spec is not None) \
            else self.out_spec

    def function_source(self, side: str) -> str:
        name = "reference" if side == "ref" else "body"
        params = ", ".join(f"a{i}" for i in range(len(self.args)))
        lines = [f"def {name}({params}):", "    x = a0"]
        for layer in self.layers:
            lines += ["    " + ln for ln in layer.emit(side, "x")]
        lines.append("    return x")
        return "\n".join(lines)

    def source(self) -> str:
        """A self-contained jax program: reference, shard_map body, mesh, specs, shapes."""
        head = [
            f"# entangle fuzz program seed={self.seed!r}"
            + (f" mutation: {self.mutation}" if self.mutation else " (correct by construction)"),
            "import jax, jax.numpy as jnp",
            "from jax import lax",
            "from jax.sharding import PartitionSpec as P",
            "",
        ]
        tail = [
            "",
            f"MESH = {self.mesh.axes!r}",
            f"SHAPES = {tuple(a.shape for a in self.args)!r}",
            "IN_SPECS = (" + "".join(spec_str(s) + ", " for s in self.in_specs("shard")) + ")",
            f"OUT_SPECS = {spec_str(self.out('shard'))}",
        ]
        if self.shard_in_specs or self.shard_out_spec is not None:
            tail.append("# reference layout: IN_SPECS = ("
                        + "".join(spec_str(s) + ", " for s in self.in_specs("ref"))
                        + f"), OUT_SPECS = {spec_str(self.out_spec)}")
        return "\n".join(head + [self.function_source("ref"), "", self.function_source("shard")]
                         + tail) + "\n"

    def all_layers(self) -> list[tuple[tuple[int, ...], Layer]]:
        """Every layer with its path (index into layers, then into `sub` chains)."""
        out: list[tuple[tuple[int, ...], Layer]] = []

        def walk(layers, prefix):
            for i, layer in enumerate(layers):
                out.append((prefix + (i,), layer))
                if layer.sub:
                    walk(layer.sub, prefix + (i,))

        walk(self.layers, ())
        return out

    def replace_layer(self, path: tuple[int, ...], new: Layer | None) -> Program:
        """A copy with the layer at `path` replaced (None: removed)."""

        def rebuild(layers, path):
            layers = list(layers)
            i = path[0]
            if len(path) == 1:
                if new is None:
                    del layers[i]
                else:
                    layers[i] = new
            else:
                layers[i] = replace(layers[i], sub=rebuild(layers[i].sub, path[1:]))
            return layers

        return replace(self, layers=rebuild(self.layers, path))


# ----------------------------------------------------------------------------------------------
# Emission (reference and sharded spellings)
# ----------------------------------------------------------------------------------------------

def _perm_str(perm) -> str:
    return "[" + ", ".join(f"({a}, {b})" for a, b in perm) + "]"


def _emit_unary(layer, p, side, v, depth):
    fn = p["fn"]
    expr = {
        "tanh": f"jnp.tanh({v})", "exp": f"jnp.exp({v})", "relu": f"jnp.maximum({v}, 0.0)",
        "neg": f"-{v}", "abs": f"jnp.abs({v})", "sigmoid": f"jax.nn.sigmoid({v})",
        "square": f"{v} * {v}", "sin": f"jnp.sin({v})", "floor": f"jnp.floor({v})",
        "trunc": f"{v}.astype(jnp.int32).astype(jnp.float32)",
    }[fn]
    return [f"{v} = {expr}"]


def _emit_scale(layer, p, side, v, depth):
    c = p["c"] * (p.get("k", 1) if side == "shard" else 1)
    sym = {"mul": "*", "div": "/", "add": "+", "sub": "-"}[p["kind"]]
    return [f"{v} = {v} {sym} {num(c)}"]


def _emit_clip(layer, p, side, v, depth):
    return [f"{v} = jnp.{p['fn']}({v}, {num(p['c'])})"]


def _emit_where(layer, p, side, v, depth):
    return [f"{v} = jnp.where({v} {p['cmp']} {num(p['c'])}, {v}, {v} * {num(p['d'])})"]


def _arg_expr(p, side):
    name = f"a{p['arg']}"
    if p.get("bdim") is not None:
        r, d = p["rank"], p["bdim"]
        shape = ", ".join("-1" if i == d else "1" for i in range(r))
        name = f"{name}.reshape(({shape}{',' if r == 1 else ''}))"
    k = p.get("k", 1) if side == "shard" else 1
    if k != 1:
        name = f"{name} * {num(k)}"
    return name


def _emit_binarg(layer, p, side, v, depth):
    a = _arg_expr(p, side)
    kind = p["kind"]
    if kind in ("add", "sub", "mul", "div"):
        sym = {"add": "+", "sub": "-", "mul": "*", "div": "/"}[kind]
        return [f"{v} = {v} {sym} {a if ' ' not in a else '(' + a + ')'}"]
    if kind in ("maximum", "minimum"):
        return [f"{v} = jnp.{kind}({v}, {a})"]
    if kind == "where":
        return [f"{v} = jnp.where({v} > {a}, {v}, {a})"]
    raise AssertionError(kind)


def _emit_reshape(layer, p, side, v, depth):
    d = p["dim"]
    if p["how"] == "split":
        return [f"{v} = {v}.reshape({v}.shape[:{d}] + (-1, {p['b']}) + {v}.shape[{d + 1}:])"]
    if p["how"] == "merge":
        return [f"{v} = {v}.reshape({v}.shape[:{d}] + (-1,) + {v}.shape[{d + 2}:])"]
    if p["how"] == "expand":
        return [f"{v} = jnp.expand_dims({v}, {d})"]
    if p["how"] == "squeeze":
        return [f"{v} = jnp.squeeze({v}, {d})"]
    raise AssertionError(p["how"])


def _emit_transpose(layer, p, side, v, depth):
    return [f"{v} = jnp.transpose({v}, {tuple(p['perm'])!r})"]


def _emit_slice(layer, p, side, v, depth):
    return [f"{v} = lax.slice_in_dim({v}, {p['start']}, {p['stop']}, axis={p['dim']})"]


def _emit_concat(layer, p, side, v, depth):
    parts = [v, f"{v} * {num(p['c'])}"]
    if p.get("swap"):
        parts.reverse()
    return [f"{v} = jnp.concatenate([{', '.join(parts)}], axis={p['dim']})"]


def _emit_pad(layer, p, side, v, depth):
    cfg = [(p["lo"], p["hi"], 0) if i == p["dim"] else (0, 0, 0) for i in range(p["rank"])]
    return [f"{v} = lax.pad({v}, jnp.float32({num(p['val'])}), {cfg!r})"]


def _emit_einsum(layer, p, side, v, depth):
    other = v if p.get("gram") else f"a{p['arg']}"
    return [f"{v} = jnp.einsum({p['subs']!r}, {v}, {other})"]


def _emit_reduce(layer, p, side, v, depth):
    return [f"{v} = jnp.{p['fn']}({v}, axis={tuple(p['dims'])!r}, keepdims={p['keepdims']})"]


def _emit_psum(layer, p, side, v, depth):
    if side == "ref":
        return []
    return [f"{v} = lax.{p['fn']}({v}, {ax(p['axes'])})"] * p.get("times", 1)


def _emit_all_gather(layer, p, side, v, depth):
    if side == "ref":
        return []
    return [f"{v} = lax.all_gather({v}, {ax(p['axes'])}, axis={p['dim']}, tiled=True)"] \
        * p.get("times", 1)


def _emit_psum_scatter(layer, p, side, v, depth):
    if side == "ref":
        return []
    if p.get("as_psum"):
        return [f"{v} = lax.psum({v}, {ax(p['axes'])})"]
    return [(f"{v} = lax.psum_scatter({v}, {ax(p['axes'])}, scatter_dimension={p['dim']}, "
            f"tiled=True)")]


def _emit_all_to_all(layer, p, side, v, depth):
    if side == "ref":
        return []
    return [(f"{v} = lax.all_to_all({v}, {ax(p['axes'])}, {p['split']}, {p['concat']}, "
            f"tiled=True)")]


def _emit_ppermute(layer, p, side, v, depth):
    if side == "ref":
        return []
    return [f"{v} = lax.ppermute({v}, {p['axis']!r}, perm={_perm_str(perm)})"
            for perm in p["perms"]]


def _emit_roll(layer, p, side, v, depth):
    if side == "ref":
        return [f"{v} = jnp.roll({v}, {p['shift']}, axis={p['dim']})"]
    return [f"{v} = lax.ppermute({v}, {p['axis']!r}, perm={_perm_str(perm)})"
            for perm in p["perms"]]


def _emit_dynslice(layer, p, side, v, depth):
    if side == "ref":
        return []
    d, n = p["dim"], p["n"]
    i = f"lax.axis_index({ax(p['axes'])})"
    bs = f"({v}.shape[{d}] // {n})"
    offset = {"block": f"{i} * {bs}", "plus1": f"{i} * {bs} + 1", "noscale": i,
              "shift": f"(({i} + 1) % {n}) * {bs}", "reverse": f"({n - 1} - {i}) * {bs}"}
    return [(f"{v} = lax.dynamic_slice_in_dim({v}, {offset[p.get('offset', 'block')]}, {bs}, "
            f"axis={d})")]


def _idx(p) -> str:
    return "jnp.array(" + repr(list(p["idx"])) + ")"


def _emit_take(layer, p, side, v, depth):
    return [f"{v} = jnp.take({v}, {_idx(p)}, axis={p['dim']}, mode='clip')"]


def _emit_scatter(layer, p, side, v, depth):
    where = ":, " * p["dim"] + _idx(p)
    upd = _arg_expr(p, side)
    return [f"{v} = {v}.at[{where}].{p['how']}({upd}, mode='promise_in_bounds')"]


def _emit_dus_gather(layer, p, side, v, depth):
    if side == "ref":
        return []
    d, n = p["dim"], p["n"]
    i = f"lax.axis_index({ax(p['axes'])})"
    offset = {"block": f"{i} * {v}.shape[{d}]", "plus1": f"{i} * {v}.shape[{d}] + 1",
              "noscale": i, "shift": f"(({i} + 1) % {n}) * {v}.shape[{d}]"}
    fill = "zeros" if p.get("fill", 0.0) == 0.0 else "ones"
    return [(f"buf = jnp.{fill}({v}.shape[:{d}] + ({v}.shape[{d}] * {n},) + {v}.shape[{d + 1}:], "
            f"{v}.dtype)"),
            (f"{v} = lax.dynamic_update_slice_in_dim(buf, {v}, {offset[p.get('offset', 'block')]}, "
            f"axis={d})")]


def _emit_shard_scale(layer, p, side, v, depth):
    if side == "ref":
        return []
    return [f"{v} = {v} * {num(p['c'])}"]


def _emit_combine(layer, p, side, v, depth):
    y = f"y{depth}"
    lines = [f"{y} = {v}"]
    for sub in layer.sub:
        lines += sub.emit(side, y, depth + 1)
    sym = {"add": "+", "sub": "-", "mul": "*"}[p["kind"]]
    lines.append(f"{v} = {v} {sym} {y}")
    return lines


def _emit_swap(layer, p, side, v, depth):
    """Two layers; the sharded side runs them in the opposite order (a mutation)."""
    first, second = layer.sub
    if side == "ref":
        return first.emit(side, v, depth) + second.emit(side, v, depth)
    return second.emit(side, v, depth) + first.emit(side, v, depth)


def _emit_nop(layer, p, side, v, depth):
    return []


EMIT: dict[str, Callable] = {
    "unary": _emit_unary, "scale": _emit_scale, "clip": _emit_clip, "where": _emit_where,
    "binarg": _emit_binarg, "reshape": _emit_reshape, "transpose": _emit_transpose,
    "slice": _emit_slice, "concat": _emit_concat, "pad": _emit_pad, "einsum": _emit_einsum,
    "reduce": _emit_reduce, "psum": _emit_psum, "pmax": _emit_psum, "pmin": _emit_psum,
    "all_gather": _emit_all_gather, "psum_scatter": _emit_psum_scatter,
    "all_to_all": _emit_all_to_all, "ppermute": _emit_ppermute,
    "ppermute_pair": _emit_ppermute, "roll": _emit_roll, "dynslice": _emit_dynslice,
    "shard_scale": _emit_shard_scale, "combine": _emit_combine, "nop": _emit_nop,
    "swap": _emit_swap, "take": _emit_take, "scatter": _emit_scatter,
    "dus_gather": _emit_dus_gather,
}


# ----------------------------------------------------------------------------------------------
# The generator
# ----------------------------------------------------------------------------------------------

# Relative frequency of each construct. The fixups (psum/pmean/pmax/pmin, psum_scatter,
# all_gather, all_to_all, dynamic_slice, the pending scale) are emitted whenever a layout must
# be restored, in addition to the explicit collective constructs below.
WEIGHTS: dict[str, float] = {
    "unary": 3, "scale": 2, "clip": 1, "where": 1, "binarg": 3, "bias": 2,
    "reshape": 2, "transpose": 1.5, "slice": 1, "concat": 1, "pad": 1,
    "einsum": 3, "gram": 1, "reduce": 3, "combine": 1.5,
    "resolve": 2, "all_gather": 1.5, "psum_scatter": 1, "all_to_all": 1.5, "dynslice": 1.5,
    "ppermute": 0.5, "ppermute_pair": 0.5, "roll": 0.5, "relayout": 1, "redundant": 0.7,
    "take": 1, "scatter": 1, "dus_gather": 1,
}

# Constructs left out of the default generator, with the reason. (Empty: nothing is excluded;
# see the benchmark's per-construct table for the ones that are not proven.)
EXCLUDED: dict[str, str] = {}

MAX_SIZE = 4096      # elements of the running value
MAX_RANK = 4
CONSTS = (0.5, 2.0, -1.5, 3.0, 0.25, 1.25, -0.75, 1.5)


@dataclass
class GenOptions:
    max_layers: int = 5
    weights: dict[str, float] = field(default_factory=lambda: dict(WEIGHTS))
    meshes: tuple[tuple[int, ...], ...] = MESH_SHAPES
    combine_depth: int = 1


class Gen:
    def __init__(self, ch: Chooser, mesh: MeshSpec, opts: GenOptions):
        self.ch, self.mesh, self.opts = ch, mesh, opts
        self.args: list[Arg] = []
        self.constructs: list[str] = []

    def new_arg(self, shape, spec, init="normal", fan=1) -> int:
        self.args.append(Arg(tuple(shape), tuple(tuple(a) for a in spec), init, fan))
        return len(self.args) - 1

    # -- helpers --------------------------------------------------------------------------------

    def n(self, axes) -> int:
        return self.mesh.size(axes)

    def random_spec(self, shape, axes_pool, p=0.5) -> Spec:
        spec = [[] for _ in shape]
        for a in self.ch.permutation(axes_pool):
            if not self.ch.chance(p):
                continue
            dims = [d for d in range(len(shape))
                    if shape[d] % (self.n(spec[d]) * self.n([a])) == 0]
            if dims:
                spec[self.ch.choice(dims)].append(a)
        return tuple(tuple(s) for s in spec)

    def sizes(self, lo=2, hi=16) -> int:
        return self.ch.choice([s for s in (2, 4, 8, 16) if lo <= s <= hi])


# Each factory: (gen, state) -> (list of layers, new state) or None when it does not apply.

def _k_for_add(g: Gen, s: State) -> Fraction:
    """Factor on a value added on the sharded side so that the result means `x + y`."""
    if s.kind == "sum" or (not s.partial and s.coef != 1):
        return 1 / (s.coef * g.n(s.partial))
    return Fraction(1)


def f_unary(g: Gen, s: State):
    if s.partial:
        if s.kind == "sum":
            return [Layer("unary", {"fn": "neg"})], s
        if s.coef != 1:
            return None
        return [Layer("unary", {"fn": "neg"})], replace(s, kind={"max": "min", "min": "max"}[
            s.kind])
    if s.coef != 1:
        return [Layer("unary", {"fn": "neg"})], s
    fns = ["tanh", "relu", "neg", "abs", "sigmoid", "sin", "floor", "trunc"]
    if s.mag <= 2:
        fns += ["exp", "square"]
    fn = g.ch.choice(fns)
    mag = {"tanh": 1.0, "sigmoid": 1.0, "sin": 1.0, "exp": math.exp(s.mag),
           "square": s.mag ** 2}.get(fn, s.mag)
    return [Layer("unary", {"fn": fn})], replace(s, mag=mag)


def f_scale(g: Gen, s: State):
    kind = g.ch.choice(["mul", "div", "add", "sub"])
    c = g.ch.choice(CONSTS)
    new = s
    p = {"kind": kind, "c": c}
    if kind in ("mul", "div"):
        if s.kind in ("max", "min") and c < 0:
            new = replace(s, kind={"max": "min", "min": "max"}[s.kind])
        mag = s.mag * abs(c) if kind == "mul" else s.mag / abs(c)
    else:
        k = _k_for_add(g, s)
        if k != 1:
            p["k"] = k
        mag = s.mag + abs(c)
    return [Layer("scale", p)], replace(new, mag=mag)


def f_clip(g: Gen, s: State):
    if s.partial and s.kind == "sum" or s.coef != 1:
        return None
    fn = {"max": "maximum", "min": "minimum"}.get(s.kind) or g.ch.choice(["maximum", "minimum"])
    return [Layer("clip", {"fn": fn, "c": g.ch.choice((0.0, 0.5, -0.5, 1.0))})], s


def f_where(g: Gen, s: State):
    if not s.clean():
        return None
    p = {"cmp": g.ch.choice([">", "<", ">="]), "c": g.ch.choice((0.0, 0.5, -0.25)),
         "d": g.ch.choice((0.5, -2.0, 0.1))}
    return [Layer("where", p)], replace(s, mag=s.mag * 2)


def _binarg(g: Gen, s: State, bdim: int | None):
    """x op arg. A partial max/min is never multiplied by an argument: max(a) * w equals
    max(a * w) only for w >= 0, a fact about the inputs the programs must not rely on."""
    if s.kind == "sum" or (not s.partial and s.coef != 1):
        kinds = ["add", "sub", "mul"]
    elif s.kind == "max":
        kinds = ["add", "sub", "maximum"]
    elif s.kind == "min":
        kinds = ["add", "sub", "minimum"]
    else:
        kinds = ["add", "sub", "mul", "maximum", "minimum", "where", "div+"]
    kind = g.ch.choice(kinds)
    positive = kind.endswith("+")
    kind = kind.rstrip("+")
    if bdim is None:
        arg = g.new_arg(s.shape, s.spec, "positive" if positive else "normal")
        p = {"kind": kind, "arg": arg}
    else:
        arg = g.new_arg((s.shape[bdim],), (s.spec[bdim],), "positive" if positive else "normal")
        p = {"kind": kind, "arg": arg, "bdim": bdim, "rank": s.rank}
    if kind in ("add", "sub"):
        k = _k_for_add(g, s)
        if k != 1:
            p["k"] = k
        mag = s.mag + 1
    elif kind in ("mul",):
        mag = s.mag * (1.5 if positive else 2)
    elif kind == "div":
        mag = s.mag * 2
    else:
        mag = max(s.mag, 2)
    return [Layer("binarg", p)], replace(s, mag=mag)


def f_binarg(g: Gen, s: State):
    return _binarg(g, s, None)


def f_bias(g: Gen, s: State):
    if s.rank < 2:
        return None
    return _binarg(g, s, g.ch.randint(0, s.rank - 1))


def f_reshape(g: Gen, s: State):
    options = []
    for d in range(s.rank):
        if s.rank < MAX_RANK:
            for b in (2, 4):
                a = s.shape[d] // b
                if s.shape[d] % b == 0 and a >= 1 and a % g.n(s.spec[d]) == 0:
                    options.append(("split", d, b))
            options.append(("expand", d, None))
        if d + 1 < s.rank and not s.spec[d + 1] and s.shape[d] * s.shape[d + 1] <= 64:
            options.append(("merge", d, None))
        if s.shape[d] == 1 and s.rank > 1:
            options.append(("squeeze", d, None))
    if s.rank < MAX_RANK:
        options.append(("expand", s.rank, None))
    how, d, b = g.ch.choice(options)
    shape, spec = list(s.shape), list(s.spec)
    if how == "split":
        shape[d:d + 1] = [s.shape[d] // b, b]
        spec[d:d + 1] = [s.spec[d], ()]
    elif how == "merge":
        shape[d:d + 2] = [s.shape[d] * s.shape[d + 1]]
        spec[d:d + 2] = [s.spec[d]]
    elif how == "expand":
        shape.insert(d, 1)
        spec.insert(d, ())
    else:
        del shape[d], spec[d]
    p = {"how": how, "dim": d}
    if b:
        p["b"] = b
    return [Layer("reshape", p)], replace(s, shape=tuple(shape), spec=tuple(spec))


def f_transpose(g: Gen, s: State):
    if s.rank < 2:
        return None
    perm = g.ch.permutation(range(s.rank))
    if perm == sorted(perm):
        perm = perm[1:] + perm[:1]
    return [Layer("transpose", {"perm": perm})], replace(
        s, shape=tuple(s.shape[i] for i in perm), spec=tuple(s.spec[i] for i in perm))


def _untiled_dims(s: State, min_size=1):
    return [d for d in range(s.rank) if not s.spec[d] and s.shape[d] >= min_size]


def f_slice(g: Gen, s: State):
    dims = _untiled_dims(s, 2)
    if not dims:
        return None
    d = g.ch.choice(dims)
    size = s.shape[d]
    length = g.ch.choice([x for x in (1, 2, 4, 8, size - 1) if 1 <= x < size])
    start = g.ch.randint(0, size - length)
    shape = list(s.shape)
    shape[d] = length
    return ([Layer("slice", {"dim": d, "start": start, "stop": start + length})],
            replace(s, shape=tuple(shape)))


def f_concat(g: Gen, s: State):
    dims = [d for d in _untiled_dims(s) if s.shape[d] <= 16]
    if not dims or s.size() * 2 > MAX_SIZE:
        return None
    d = g.ch.choice(dims)
    consts = [c for c in CONSTS if c > 0] if s.kind in ("max", "min") else CONSTS
    c = g.ch.choice(consts)
    shape = list(s.shape)
    shape[d] *= 2
    return ([Layer("concat", {"dim": d, "c": c, "swap": g.ch.chance(0.3)})],
            replace(s, shape=tuple(shape), mag=s.mag * max(1, abs(c))))


def f_pad(g: Gen, s: State):
    dims = _untiled_dims(s)
    if not dims:
        return None
    d = g.ch.choice(dims)
    lo, hi = g.ch.choice([(0, 1), (1, 0), (1, 1), (2, 1), (0, 2)])
    if s.kind == "sum" or (not s.partial and s.coef != 1):
        val = 0.0
    else:
        val = g.ch.choice((0.0, 1.0, -0.5))
    shape = list(s.shape)
    shape[d] += lo + hi
    if math.prod(shape) > MAX_SIZE:
        return None
    return ([Layer("pad", {"dim": d, "lo": lo, "hi": hi, "val": val, "rank": s.rank})],
            replace(s, shape=tuple(shape)))


LETTERS = "abcdefghijklmnopqrstuvwxyz"


def f_einsum(g: Gen, s: State):
    if s.kind in ("max", "min"):
        return None
    roles = [g.ch.choice("bcf") for _ in range(s.rank)]
    n_new = g.ch.choice([0, 1, 1, 2])
    new_sizes = [g.sizes(2, 16) for _ in range(n_new)]
    letters = LETTERS[:s.rank]
    new_letters = LETTERS[s.rank:s.rank + n_new]
    batch = [i for i, r in enumerate(roles) if r == "b"]
    contract = [i for i, r in enumerate(roles) if r == "c"]
    free = [i for i, r in enumerate(roles) if r == "f"]
    out_rank = len(batch) + len(free) + n_new
    if out_rank == 0 or out_rank > MAX_RANK:
        return None
    # W: batch + contract dims (their x specs) and new free dims (split by unused axes).
    w_items = [(letters[i], s.shape[i], s.spec[i]) for i in batch + contract]
    free_axes = s.free(g.mesh)
    new_specs = []
    for size in new_sizes:
        spec = ()
        cand = [a for a in free_axes if size % g.n([a]) == 0]
        if cand and g.ch.chance(0.4):
            a = g.ch.choice(cand)
            free_axes.remove(a)
            spec = (a,)
        new_specs.append(spec)
    w_items += list(zip(new_letters, new_sizes, new_specs))
    w_items = g.ch.permutation(w_items)
    w_shape = tuple(size for _, size, _ in w_items)
    if math.prod(w_shape) > 2 * MAX_SIZE:
        return None
    fan = math.prod(s.shape[i] for i in contract) if contract else 1
    arg = g.new_arg(w_shape, tuple(sp for _, _, sp in w_items), "weight", fan)
    out_items = ([(letters[i], s.shape[i], s.spec[i]) for i in batch + free]
                 + list(zip(new_letters, new_sizes, new_specs)))
    if g.ch.chance(0.3):
        out_items = g.ch.permutation(out_items)
    shape = tuple(size for _, size, _ in out_items)
    if math.prod(shape) > MAX_SIZE:
        return None
    w_letters = "".join(le for le, _, _ in w_items)
    subs = f"{letters},{w_letters}->{''.join(le for le, _, _ in out_items)}"
    new_partial = {a for i in contract for a in s.spec[i]}
    partial = g.mesh.order(set(s.partial) | new_partial)
    kind = "sum" if partial else None
    return ([Layer("einsum", {"subs": subs, "arg": arg})],
            replace(s, shape=shape, spec=tuple(sp for _, _, sp in out_items), partial=partial,
                    kind=kind))


def f_gram(g: Gen, s: State):
    if not s.clean() or s.rank < 2:
        return None
    roles = []
    for d in range(s.rank):
        opts = "bc" if s.spec[d] else "bcf"
        roles.append(g.ch.choice(opts))
    if "f" not in roles:
        untiled = [d for d in range(s.rank) if not s.spec[d]]
        if not untiled:
            return None
        roles[g.ch.choice(untiled)] = "f"
    if "c" not in roles:
        cands = [d for d in range(s.rank) if roles[d] != "f" or roles.count("f") > 1]
        if not cands:
            return None
        roles[g.ch.choice(cands)] = "c"
    letters = LETTERS[:s.rank]
    other = "".join(LETTERS[s.rank + i] if r == "f" else letters[i] for i, r in enumerate(roles))
    batch = [i for i, r in enumerate(roles) if r == "b"]
    free = [i for i, r in enumerate(roles) if r == "f"]
    contract = [i for i, r in enumerate(roles) if r == "c"]
    out = ("".join(letters[i] for i in batch) + "".join(letters[i] for i in free)
           + "".join(other[i] for i in free))
    shape = tuple([s.shape[i] for i in batch] + [s.shape[i] for i in free] * 2)
    if len(shape) > MAX_RANK or math.prod(shape) > MAX_SIZE:
        return None
    spec = tuple([s.spec[i] for i in batch] + [()] * (2 * len(free)))
    partial = g.mesh.order({a for i in contract for a in s.spec[i]})
    k = math.prod(s.shape[i] for i in contract)
    return ([Layer("einsum", {"subs": f"{letters},{other}->{out}", "gram": True})],
            replace(s, shape=shape, spec=spec, partial=partial, kind="sum" if partial else None,
                    mag=s.mag ** 2 * math.sqrt(k)))


def f_reduce(g: Gen, s: State, keepdims: bool | None = None):
    if s.rank < 1:
        return None
    if s.kind == "sum" or (not s.partial and s.coef != 1):
        fns = ["sum", "mean"]
    elif s.kind == "max":
        fns = ["max"]
    elif s.kind == "min":
        fns = ["min"]
    else:
        fns = ["sum", "mean", "max", "min"]
    fn = g.ch.choice(fns)
    dims = sorted(g.ch.subset(range(s.rank)))
    if keepdims is None:
        keepdims = g.ch.chance(0.4) or len(dims) == s.rank
    new_axes = [a for d in dims for a in s.spec[d]]
    if fn in ("max", "min") and s.coef != 1:
        return None
    if fn in ("max", "min") and s.partial and s.kind != fn:
        return None
    partial = g.mesh.order(set(s.partial) | set(new_axes))
    kind = s.kind
    coef = s.coef
    if new_axes:
        kind = {"sum": "sum", "mean": "sum", "max": "max", "min": "min"}[fn]
        if fn == "mean":
            coef = coef / g.n(new_axes)
    count = math.prod(s.shape[d] for d in dims)
    mag = s.mag * math.sqrt(count) * 2 if fn == "sum" else s.mag
    if keepdims:
        shape = tuple(1 if d in dims else n for d, n in enumerate(s.shape))
        spec = tuple(() if d in dims else sp for d, sp in enumerate(s.spec))
    else:
        shape = tuple(n for d, n in enumerate(s.shape) if d not in dims)
        spec = tuple(sp for d, sp in enumerate(s.spec) if d not in dims)
    return ([Layer("reduce", {"fn": fn, "dims": dims, "keepdims": keepdims})],
            replace(s, shape=shape, spec=spec, partial=partial, kind=kind if partial else None,
                    coef=coef, mag=mag))


# -- collectives -------------------------------------------------------------------------------

def resolve(g: Gen, s: State, target: Spec | None = None, scatter: bool = True):
    """Layers that end the pending reduction (and the pending scale)."""
    layers: list[Layer] = []
    if s.partial and s.kind == "sum" and scatter and g.ch.chance(0.5):
        out = _scatter(g, s, target)
        if out:
            layers += out[0]
            s = out[1]
    while s.partial:
        rest = list(s.partial)
        if len(rest) > 1 and g.ch.chance(0.3):
            axes = g.ch.subset(rest)
        else:
            axes = rest
        axes = tuple(g.ch.permutation(axes)) if g.ch.chance(0.2) else g.mesh.order(axes)
        if s.kind == "sum":
            use_mean = s.coef * g.n(axes) <= 1 and g.ch.chance(0.8) or g.ch.chance(0.1)
            fn = "pmean" if use_mean else "psum"
            coef = s.coef * g.n(axes) if use_mean else s.coef
        else:
            fn = {"max": "pmax", "min": "pmin"}[s.kind]
            coef = s.coef
        partial = tuple(a for a in s.partial if a not in axes)
        layers.append(Layer("psum" if fn in ("psum", "pmean") else fn, {"fn": fn, "axes": axes}))
        s = replace(s, partial=partial, kind=s.kind if partial else None, coef=coef)
    if s.coef != 1:
        layers.append(Layer("shard_scale", {"c": s.coef}))
        s = replace(s, coef=Fraction(1))
    return layers, s


def _scatter(g: Gen, s: State, target: Spec | None):
    """psum_scatter over some partial axes onto a dim (the target's, when there is one)."""
    options = []
    for d in range(s.rank):
        if target is not None:
            t = target[d]
            if t[:len(s.spec[d])] != s.spec[d]:
                continue
            extra = t[len(s.spec[d]):]
            for k in range(1, len(extra) + 1):
                axes = extra[:k]
                if set(axes) <= set(s.partial):
                    options.append((d, axes))
        else:
            for axes in itertools.permutations(s.partial, 1):
                options.append((d, axes))
            if len(s.partial) > 1:
                options.append((d, tuple(g.ch.permutation(s.partial))))
    options = [(d, axes) for d, axes in options if s.local(g.mesh, d) % g.n(axes) == 0]
    if not options:
        return None
    d, axes = g.ch.choice(options)
    spec = list(s.spec)
    spec[d] = spec[d] + tuple(axes)
    partial = tuple(a for a in s.partial if a not in axes)
    return ([Layer("psum_scatter", {"axes": tuple(axes), "dim": d})],
            replace(s, spec=tuple(spec), partial=partial, kind=s.kind if partial else None))


def f_resolve(g: Gen, s: State):
    if not s.partial and s.coef == 1:
        return None
    return resolve(g, s)


def f_redundant(g: Gen, s: State):
    """A collective over axes the value is replicated on: psum multiplies by the group size
    (a pending scale of 1/n), pmean/pmax/pmin change nothing."""
    free = s.free(g.mesh)
    if not free:
        return None
    axes = g.mesh.order(g.ch.subset(free))
    if s.kind in (None, "sum"):
        fn = g.ch.choice(["psum", "psum", "pmean"] + ([] if s.partial else ["pmax", "pmin"]))
    else:
        return None
    coef = s.coef / g.n(axes) if fn == "psum" else s.coef
    return ([Layer("psum" if fn in ("psum", "pmean") else fn, {"fn": fn, "axes": axes})],
            replace(s, coef=coef))


def f_psum_scatter(g: Gen, s: State):
    if s.kind != "sum":
        return None
    return _scatter(g, s, None)


def _gathered(g: Gen, s: State):
    """(dim, axes, spec after): a split dim and the minor-most axes of it to gather, or None."""
    dims = [d for d in range(s.rank) if s.spec[d]]
    if not dims:
        return None
    d = g.ch.choice(dims)
    k = g.ch.randint(1, len(s.spec[d]))
    spec = list(s.spec)
    spec[d] = s.spec[d][:-k]
    return d, s.spec[d][-k:], tuple(spec)


def f_all_gather(g: Gen, s: State):
    found = _gathered(g, s)
    if found is None:
        return None
    d, axes, spec = found
    return [Layer("all_gather", {"axes": axes, "dim": d})], replace(s, spec=spec)


def f_all_to_all(g: Gen, s: State):
    options = []
    for c in range(s.rank):
        for k in range(1, len(s.spec[c]) + 1):
            axes = s.spec[c][-k:]
            for sd in range(s.rank):
                if sd != c and s.local(g.mesh, sd) % g.n(axes) == 0:
                    options.append((c, axes, sd))
    if not options:
        return None
    c, axes, sd = g.ch.choice(options)
    spec = list(s.spec)
    spec[c] = s.spec[c][:-len(axes)]
    spec[sd] = s.spec[sd] + axes
    return ([Layer("all_to_all", {"axes": axes, "split": sd, "concat": c})],
            replace(s, spec=tuple(spec)))


def f_dynslice(g: Gen, s: State):
    free = s.free(g.mesh)
    if not free:
        return None
    axes = tuple(g.ch.permutation(g.ch.subset(free)))
    dims = [d for d in range(s.rank) if s.local(g.mesh, d) % g.n(axes) == 0]
    if not dims:
        return None
    d = g.ch.choice(dims)
    spec = list(s.spec)
    spec[d] = s.spec[d] + axes
    return ([Layer("dynslice", {"axes": axes, "dim": d, "n": g.n(axes)})],
            replace(s, spec=tuple(spec)))


def _cyclic(n: int, k: int) -> list[tuple[int, int]]:
    return [(i, (i + k) % n) for i in range(n)]


def f_ppermute(g: Gen, s: State):
    """A single ppermute that changes nothing: over an axis the value is replicated on, or
    over an axis it is a partial sum/max/min on (the pieces are only reordered)."""
    axes = s.free(g.mesh) + list(s.partial)
    if not axes:
        return None
    a = g.ch.choice(axes)
    n = g.n([a])
    perm = _cyclic(n, g.ch.randint(1, n - 1)) if g.ch.chance(0.7) else \
        list(zip(range(n), g.ch.permutation(range(n))))
    return [Layer("ppermute", {"axis": a, "perms": [perm], "n": n})], s


def f_ppermute_pair(g: Gen, s: State):
    a = g.ch.choice(g.mesh.names)
    n = g.n([a])
    if g.ch.chance(0.6):
        k = g.ch.randint(1, n - 1)
        perm = _cyclic(n, k)
    else:
        perm = list(zip(range(n), g.ch.permutation(range(n))))
    inverse = [(b, c) for c, b in perm]
    return [Layer("ppermute_pair", {"axis": a, "perms": [perm, inverse], "n": n})], s


def f_roll(g: Gen, s: State):
    dims = [d for d in range(s.rank) if len(s.spec[d]) == 1]
    if not dims:
        return None
    d = g.ch.choice(dims)
    a = s.spec[d][0]
    n = g.n([a])
    k = g.ch.randint(1, n - 1)
    local = s.local(g.mesh, d)
    return ([Layer("roll", {"axis": a, "dim": d, "shift": k * local, "perms": [_cyclic(n, k)],
                            "n": n})], s)


def f_take(g: Gen, s: State):
    """Gather along an unsplit dim with constant indices (repeats allowed)."""
    dims = _untiled_dims(s, 2)
    if not dims:
        return None
    d = g.ch.choice(dims)
    n = g.ch.randint(1, min(s.shape[d] + 2, 12))
    idx = [g.ch.randint(0, s.shape[d] - 1) for _ in range(n)]
    shape = list(s.shape)
    shape[d] = n
    return [Layer("take", {"dim": d, "idx": idx})], replace(s, shape=tuple(shape))


def f_scatter(g: Gen, s: State):
    """x.at[..., idx].add/set(u) along an unsplit dim (u laid out like x there)."""
    if s.partial and s.kind != "sum":
        return None
    dims = _untiled_dims(s, 2)
    if not dims:
        return None
    d = g.ch.choice(dims)
    how = g.ch.choice(["add", "add", "set"])
    n = g.ch.randint(1, min(s.shape[d], 6))
    if how == "set":   # distinct indices: a repeated index makes the winner unspecified
        idx = g.ch.permutation(range(s.shape[d]))[:n]
    else:
        idx = [g.ch.randint(0, s.shape[d] - 1) for _ in range(n)]
    ushape = list(s.shape)
    ushape[d] = n
    arg = g.new_arg(tuple(ushape), s.spec)
    p = {"dim": d, "idx": idx, "how": how, "arg": arg}
    k = _k_for_add(g, s)
    if k != 1:
        p["k"] = k
    return [Layer("scatter", p)], replace(s, mag=s.mag + 1)


def f_dus_gather(g: Gen, s: State):
    """An all_gather spelled as dynamic_update_slice into zeros: a partial sum over the axes."""
    if s.kind not in (None, "sum"):
        return None
    found = _gathered(g, s)
    if found is None:
        return None
    d, axes, spec = found
    partial = g.mesh.order(set(s.partial) | set(axes))
    return ([Layer("dus_gather", {"axes": axes, "dim": d, "n": g.n(axes)})],
            replace(s, spec=spec, partial=partial, kind="sum"))


def random_target(g: Gen, s: State) -> Spec:
    return g.random_spec(s.shape, g.mesh.names)


def relayout(g: Gen, s: State, target: Spec) -> tuple[list[Layer], State]:
    """all_to_all / all_gather / dynamic_slice layers taking a clean value to `target`."""
    layers: list[Layer] = []
    spec = list(s.spec)
    mesh = g.mesh

    def local(d):
        return s.shape[d] // mesh.size(spec[d])

    def common(d):
        k = 0
        while k < min(len(spec[d]), len(target[d])) and spec[d][k] == target[d][k]:
            k += 1
        return k

    # all_to_all where a removed suffix is exactly what another dim needs next.
    if g.ch.chance(0.6):
        for c in range(s.rank):
            k = common(c)
            suffix = tuple(spec[c][k:])
            if not suffix:
                continue
            for sd in range(s.rank):
                if sd == c:
                    continue
                ks = common(sd)
                if ks != len(spec[sd]):
                    continue
                want = tuple(target[sd][ks:ks + len(suffix)])
                if want == suffix and local(sd) % mesh.size(suffix) == 0:
                    layers.append(Layer("all_to_all", {"axes": suffix, "split": sd,
                                                       "concat": c}))
                    spec[c] = spec[c][:k]
                    spec[sd] = spec[sd] + suffix
                    break
    for d in range(s.rank):
        k = common(d)
        if k < len(spec[d]):
            rest = tuple(spec[d][k:])
            if len(rest) > 1 and g.ch.chance(0.4):   # gather minor first, one axis at a time
                for a in reversed(rest):
                    layers.append(Layer("all_gather", {"axes": (a,), "dim": d}))
            else:
                layers.append(Layer("all_gather", {"axes": rest, "dim": d}))
            spec[d] = spec[d][:k]
    for d in range(s.rank):
        k = len(spec[d])
        assert tuple(target[d][:k]) == tuple(spec[d]), (target, spec)
        rest = tuple(target[d][k:])
        if rest:
            layers.append(Layer("dynslice", {"axes": rest, "dim": d, "n": mesh.size(rest)}))
            spec[d] = spec[d] + rest
    return layers, replace(s, spec=tuple(tuple(x) for x in spec))


def f_relayout(g: Gen, s: State):
    if s.partial and s.kind != "sum":
        return None
    target = random_target(g, s)
    # Data movement is linear: it may run on a partial sum when the target avoids its axes.
    if s.partial and g.ch.chance(0.7):
        target = tuple(tuple(a for a in t if a not in s.partial) for t in target)
    if set(s.partial) & {a for t in target for a in t}:
        return None
    layers, s2 = relayout(g, s, target)
    return layers or None, s2


def fixup(g: Gen, s: State, target: Spec) -> tuple[list[Layer], State]:
    layers, s = resolve(g, s, target)
    more, s = relayout(g, s, target)
    return layers + more, s


SUB_FACTORIES = ("unary", "scale", "clip", "where", "binarg", "bias", "resolve", "dynslice",
                 "all_gather", "all_to_all", "ppermute")


def f_combine(g: Gen, s: State, depth: int = 0):
    if not s.clean() or depth >= g.opts.combine_depth:
        return None
    sub: list[Layer] = []
    t = s
    for _ in range(g.ch.randint(1, 3)):
        out = step(g, t, SUB_FACTORIES)
        if out:
            sub += out[0]
            t = out[1]
    if g.ch.chance(0.5) and t.rank > 0:
        out = f_reduce(g, t, keepdims=True)
        if out:
            sub += out[0]
            t = out[1]
    target = tuple(() if n == 1 else sp for n, sp in zip(t.shape, s.spec))
    fix, t = fixup(g, t, target)
    sub += fix
    if not sub:
        return None
    kind = g.ch.choice(["add", "sub", "mul"])
    mag = s.mag * t.mag if kind == "mul" else s.mag + t.mag
    return [Layer("combine", {"kind": kind}, sub=sub)], replace(s, mag=mag)


FACTORIES: dict[str, Callable] = {
    "unary": f_unary, "scale": f_scale, "clip": f_clip, "where": f_where,
    "binarg": f_binarg, "bias": f_bias, "reshape": f_reshape, "transpose": f_transpose,
    "slice": f_slice, "concat": f_concat, "pad": f_pad, "einsum": f_einsum, "gram": f_gram,
    "reduce": f_reduce, "combine": f_combine, "resolve": f_resolve,
    "all_gather": f_all_gather, "psum_scatter": f_psum_scatter, "all_to_all": f_all_to_all,
    "dynslice": f_dynslice, "ppermute": f_ppermute, "ppermute_pair": f_ppermute_pair,
    "roll": f_roll, "relayout": f_relayout, "redundant": f_redundant,
    "take": f_take, "scatter": f_scatter, "dus_gather": f_dus_gather,
}


def step(g: Gen, s: State, names: Sequence[str] | None = None):
    """One random applicable construct: (layers, new state, its name) or None."""
    names = list(names or FACTORIES)
    weights = [g.opts.weights.get(n, 0) for n in names]
    for _ in range(8):
        if not any(weights):
            return None
        name = g.ch.weighted(names, weights)
        # Keep values O(1): a big magnitude gets a tanh or a scale first.
        out = FACTORIES[name](g, s)
        if out and out[0]:
            layers, new = out
            if new.size() > MAX_SIZE or new.rank > MAX_RANK:
                continue
            g.constructs.append(name)
            return layers, new
        weights[names.index(name)] = 0
    return None


def _tame(g: Gen, s: State):
    """A value grown large is scaled back (linear, so it works on partial values too)."""
    if s.mag <= 4:
        return [], s
    c = 2.0 ** -math.ceil(math.log2(s.mag))
    return [Layer("scale", {"kind": "mul", "c": c})], replace(s, mag=s.mag * c)


def generate(ch: Chooser, opts: GenOptions | None = None, seed=None) -> Program:
    """A random correct-by-construction program."""
    opts = opts or GenOptions()
    sizes = ch.choice(opts.meshes)
    names = (ch.choice(AXIS_NAMES_1D),) if len(sizes) == 1 else ch.choice(AXIS_NAMES_2D)
    mesh = MeshSpec(tuple(names), tuple(sizes))
    g = Gen(ch, mesh, opts)
    rank = ch.weighted([1, 2, 3], [1, 4, 3])
    shape = tuple(ch.weighted([2, 4, 8, 16], [1, 2, 4, 4]) for _ in range(rank))
    while math.prod(shape) > 1024:
        shape = shape[:-1]
    spec = g.random_spec(shape, mesh.names, p=0.75)
    g.new_arg(shape, spec)
    s = State(shape, spec)
    layers: list[Layer] = []
    for _ in range(ch.randint(1, opts.max_layers)):
        tame, s = _tame(g, s)
        layers += tame
        out = step(g, s)
        if out:
            layers += out[0]
            s = out[1]
    tame, s = _tame(g, s)
    layers += tame
    if ch.chance(0.5):
        # keep the current tiling (the axes still partial are reduced instead)
        target = tuple(tuple(a for a in t if a not in s.partial) for t in s.spec)
    else:
        target = random_target(g, s)
    fix, s = fixup(g, s, target)
    layers += fix
    assert s.clean() and s.spec == target, (s, target)
    return Program(mesh, g.args, layers, s.spec, s.shape, seed=seed,
                   constructs=tuple(g.constructs))


def generate_seed(seed: int, opts: GenOptions | None = None) -> Program:
    return generate(RandomChooser(seed), opts, seed=seed)


# ----------------------------------------------------------------------------------------------
# Mutations (sharded side only)
# ----------------------------------------------------------------------------------------------

Mutation = tuple[str, Callable[[Program], Program]]


def _override(path, layer: Layer, desc: str, **changes) -> Mutation:
    def apply(prog: Program) -> Program:
        return prog.replace_layer(path, replace(layer, m={**layer.m, **changes}))
    return desc, apply


def _drop(path, layer: Layer, desc: str | None = None) -> Mutation:
    def apply(prog: Program) -> Program:
        return prog.replace_layer(path, replace(layer, op="nop_" + layer.op))
    return desc or f"drop {layer.op}", apply


def _other_axes(mesh: MeshSpec, axes: tuple[str, ...]) -> list[tuple[str, ...]]:
    out = []
    for k in (1, 2):
        for combo in itertools.permutations(mesh.names, k):
            if tuple(combo) != tuple(axes) and (len(combo) == 1 or True):
                out.append(tuple(combo))
    return out


def layer_mutations(prog: Program, path, layer: Layer) -> list[Mutation]:
    p = layer.params("shard")
    mesh = prog.mesh
    out: list[Mutation] = []
    op = layer.op
    where = f"layer {'.'.join(map(str, path))} ({op})"
    if op in ("psum", "pmax", "pmin"):
        out.append(_drop(path, layer, f"drop {p['fn']} {where}"))
        out.append(_override(path, layer, f"duplicate {p['fn']} {where}", times=2))
        for axes in _other_axes(mesh, p["axes"]):
            out.append(_override(path, layer, f"{p['fn']} over {axes} instead of {p['axes']} "
                                               f"{where}", axes=axes))
        for fn in ("psum", "pmean", "pmax", "pmin"):
            if fn != p["fn"]:
                out.append(_override(path, layer, f"{fn} instead of {p['fn']} {where}", fn=fn))
    elif op == "all_gather":
        out.append(_drop(path, layer, f"drop all_gather {where}"))
        out.append(_override(path, layer, f"duplicate all_gather {where}", times=2))
        for axes in _other_axes(mesh, p["axes"]):
            out.append(_override(path, layer, f"all_gather over {axes} {where}", axes=axes))
        for d in range(8):
            if d != p["dim"]:
                out.append(_override(path, layer, f"all_gather dim {d} {where}", dim=d))
    elif op == "psum_scatter":
        out.append(_drop(path, layer, f"drop psum_scatter {where}"))
        out.append(_override(path, layer, f"psum instead of psum_scatter {where}",
                             as_psum=True))
        for axes in _other_axes(mesh, p["axes"]):
            out.append(_override(path, layer, f"psum_scatter over {axes} {where}", axes=axes))
        for d in range(8):
            if d != p["dim"]:
                out.append(_override(path, layer, f"psum_scatter dim {d} {where}", dim=d))
    elif op == "all_to_all":
        out.append(_drop(path, layer, f"drop all_to_all {where}"))
        out.append(_override(path, layer, f"all_to_all split/concat swapped {where}",
                             split=p["concat"], concat=p["split"]))
        for axes in _other_axes(mesh, p["axes"]):
            out.append(_override(path, layer, f"all_to_all over {axes} {where}", axes=axes))
        for d in range(6):
            if d not in (p["split"], p["concat"]):
                out.append(_override(path, layer, f"all_to_all split dim {d} {where}", split=d))
                out.append(_override(path, layer, f"all_to_all concat dim {d} {where}",
                                     concat=d))
    elif op == "dynslice":
        out.append(_drop(path, layer, f"drop dynamic_slice {where}"))
        for off in ("plus1", "noscale", "shift", "reverse"):
            out.append(_override(path, layer, f"dynamic_slice offset {off} {where}",
                                 offset=off))
        for axes in _other_axes(mesh, p["axes"]):
            if mesh.size(axes) == p["n"]:
                out.append(_override(path, layer, f"dynamic_slice index over {axes} {where}",
                                     axes=axes))
        for d in range(6):
            if d != p["dim"]:
                out.append(_override(path, layer, f"dynamic_slice dim {d} {where}", dim=d))
    elif op in ("ppermute", "ppermute_pair", "roll"):
        perms = p["perms"]
        n = p["n"]
        if len(perms) > 1:
            out.append(_override(path, layer, f"ppermute not inverted {where}",
                                 perms=[perms[0], perms[0]]))
            out.append(_override(path, layer, f"one ppermute dropped {where}",
                                 perms=[perms[0]]))
        else:
            out.append(_drop(path, layer, f"drop ppermute {where}"))
        first = list(perms[0])
        if n > 2:
            swapped = list(first)
            swapped[0], swapped[1] = (swapped[0][0], swapped[1][1]), (swapped[1][0],
                                                                      swapped[0][1])
            out.append(_override(path, layer, f"ppermute pairs swapped {where}",
                                 perms=[swapped] + list(perms[1:])))
        out.append(_override(path, layer, f"ppermute pair {first[-1]} dropped {where}",
                             perms=[first[:-1]] + list(perms[1:])))
        out.append(_override(path, layer, f"ppermute reversed {where}",
                             perms=[[(b, a) for a, b in first]] + list(perms[1:])))
        for other in mesh.names:
            if other != p["axis"] and mesh.size([other]) == n:
                out.append(_override(path, layer, f"ppermute over {other!r} {where}",
                                     axis=other))
    elif op == "dus_gather":
        out.append(_drop(path, layer, f"drop dynamic_update_slice gather {where}"))
        out.append(_override(path, layer, f"dynamic_update_slice into ones {where}", fill=1.0))
        for off in ("plus1", "noscale", "shift"):
            out.append(_override(path, layer, f"dynamic_update_slice offset {off} {where}",
                                 offset=off))
        for axes in _other_axes(mesh, p["axes"]):
            if mesh.size(axes) == p["n"]:
                out.append(_override(path, layer, f"dynamic_update_slice index over {axes} "
                                                  f"{where}", axes=axes))
    elif op in ("take", "scatter"):
        idx = list(p["idx"])
        idx[0] = idx[0] + 1 if idx[0] == 0 else idx[0] - 1
        out.append(_override(path, layer, f"{op} index changed {where}", idx=idx))
        if op == "scatter":
            if p.get("k", 1) != 1:
                out.append(_override(path, layer, f"scattered value not divided {where}", k=1))
            out.append(_override(path, layer, f"scatter {'set' if p['how'] == 'add' else 'add'} "
                                              f"instead of {p['how']} {where}",
                                 how="set" if p["how"] == "add" else "add"))
    elif op == "shard_scale":
        out.append(_drop(path, layer, f"drop the scale {p['c']} {where}"))
        out.append(_override(path, layer, f"scale {p['c']} x 2 {where}", c=p["c"] * 2))
    elif op == "scale":
        for c in CONSTS:
            if c != p["c"]:
                out.append(_override(path, layer, f"constant {c} instead of {p['c']} {where}",
                                     c=c))
        if p.get("k", 1) != 1:
            out.append(_override(path, layer, f"constant not divided {where}", k=1))
    elif op == "unary":
        for fn in ("tanh", "relu", "neg", "abs", "sigmoid", "sin", "trunc"):
            if fn != p["fn"]:
                out.append(_override(path, layer, f"{fn} instead of {p['fn']} {where}", fn=fn))
    elif op == "clip":
        out.append(_override(path, layer, f"clip constant {where}", c=p["c"] + 0.25))
        out.append(_override(path, layer, f"clip fn {where}",
                             fn="minimum" if p["fn"] == "maximum" else "maximum"))
    elif op == "where":
        out.append(_override(path, layer, f"where threshold {where}", c=p["c"] + 0.5))
        out.append(_override(path, layer, f"where factor {where}", d=p["d"] * 2))
    elif op == "binarg":
        if p.get("k", 1) != 1:
            out.append(_override(path, layer, f"added value not divided {where}", k=1))
            out.append(_override(path, layer, f"added value divided twice {where}",
                                 k=p["k"] * p["k"]))
        for kind in ("add", "sub", "mul"):
            if kind != p["kind"]:
                out.append(_override(path, layer, f"{kind} instead of {p['kind']} {where}",
                                     kind=kind))
    elif op == "slice":
        size = p["stop"] - p["start"]
        for start in (p["start"] + 1, p["start"] - 1):
            if start >= 0:
                out.append(_override(path, layer, f"slice start {start} {where}", start=start,
                                     stop=start + size))
    elif op == "concat":
        out.append(_override(path, layer, f"concat constant {where}", c=p["c"] * 2))
        out.append(_override(path, layer, f"concat order {where}", swap=not p.get("swap")))
        for d in range(p.get("rank", 4)):
            if d != p["dim"]:
                out.append(_override(path, layer, f"concat dim {d} {where}", dim=d))
    elif op == "pad":
        out.append(_override(path, layer, f"pad value {where}", val=p["val"] + 1.0))
        if p["lo"] != p["hi"]:
            out.append(_override(path, layer, f"pad lo/hi swapped {where}", lo=p["hi"],
                                 hi=p["lo"]))
    elif op == "reduce":
        for fn in ("sum", "mean", "max", "min"):
            if fn != p["fn"]:
                out.append(_override(path, layer, f"{fn} instead of {p['fn']} {where}", fn=fn))
    elif op == "einsum":
        subs = p["subs"]
        lhs, res = subs.split("->")
        if len(res) > 1:
            out.append(_override(path, layer, f"einsum output transposed {where}",
                                 subs=f"{lhs}->{res[1]}{res[0]}{res[2:]}"))
    elif op == "combine":
        for kind in ("add", "sub", "mul"):
            if kind != p["kind"]:
                out.append(_override(path, layer, f"combine {kind} {where}", kind=kind))
    elif op == "transpose":
        perm = list(p["perm"])
        if len(perm) > 1:
            perm[0], perm[1] = perm[1], perm[0]
            out.append(_override(path, layer, f"transpose perm {perm} {where}", perm=perm))
    return out


def _silent(layer: Layer) -> bool:
    """A layer with no reference spelling (a collective, a dynamic slice, a pending scale)."""
    return not layer.emit("ref", "x")


def swap_mutations(prog: Program) -> list[Mutation]:
    """Run a collective one layer earlier or later on the sharded side (e.g. a nonlinear op
    moved before the psum that should precede it)."""
    out: list[Mutation] = []

    def walk(layers, prefix):
        for i in range(len(layers) - 1):
            a, b = layers[i], layers[i + 1]
            if _silent(a) != _silent(b) and a.op != "combine" and b.op != "combine":
                moved = b if _silent(a) else a
                coll = a if _silent(a) else b
                desc = (f"{moved.op} {moved.p.get('fn', moved.p.get('kind', ''))} moved "
                        f"{'before' if _silent(a) else 'after'} {coll.op} "
                        f"{coll.p.get('fn', '')} at layer {'.'.join(map(str, prefix + (i,)))}")

                def apply(prog, prefix=prefix, i=i):
                    return _swap_at(prog, prefix, i)
                out.append((desc, apply))
        for i, layer in enumerate(layers):
            if layer.sub and layer.op == "combine":
                walk(layer.sub, prefix + (i,))

    walk(prog.layers, ())
    return out


def _swap_at(prog: Program, prefix: tuple[int, ...], i: int) -> Program:
    def rebuild(layers, prefix):
        layers = list(layers)
        if not prefix:
            layers[i:i + 2] = [Layer("swap", {}, sub=[layers[i], layers[i + 1]])]
            return layers
        j = prefix[0]
        layers[j] = replace(layers[j], sub=rebuild(layers[j].sub, prefix[1:]))
        return layers

    return replace(prog, layers=rebuild(prog.layers, prefix))


def program_mutations(prog: Program) -> list[Mutation]:
    out: list[Mutation] = swap_mutations(prog)
    for path, layer in prog.all_layers():
        out += layer_mutations(prog, path, layer)
    mesh = prog.mesh
    for i, arg in enumerate(prog.args):
        spec = arg.spec
        variants = set()
        for d in range(len(spec)):
            if spec[d]:
                s = list(spec)
                s[d] = ()
                variants.add(tuple(s))
                for e in range(len(spec)):
                    if e != d and not spec[e]:
                        s = list(spec)
                        s[e], s[d] = spec[d], ()
                        variants.add(tuple(s))
                if len(spec[d]) > 1:
                    s = list(spec)
                    s[d] = tuple(reversed(spec[d]))
                    variants.add(tuple(s))
                for other in mesh.names:
                    if other not in {a for t in spec for a in t} and \
                            mesh.size([other]) == mesh.size(spec[d][-1:]):
                        s = list(spec)
                        s[d] = spec[d][:-1] + (other,)
                        variants.add(tuple(s))
        for v in sorted(variants):
            out.append((f"in_specs[{i}] {spec_str(v)} instead of {spec_str(spec)}",
                        lambda prog, i=i, v=v: replace(prog, shard_in_specs={
                            **prog.shard_in_specs, i: v})))
    spec = prog.out_spec
    variants = set()
    for d in range(len(spec)):
        if spec[d]:
            s = list(spec)
            s[d] = ()
            variants.add(tuple(s))
            if len(spec[d]) > 1:
                s = list(spec)
                s[d] = tuple(reversed(spec[d]))
                variants.add(tuple(s))
        else:
            for a in mesh.names:
                if a not in {x for t in spec for x in t}:
                    s = list(spec)
                    s[d] = (a,)
                    variants.add(tuple(s))
    for v in sorted(variants):
        out.append((f"out_specs {spec_str(v)} instead of {spec_str(spec)}",
                    lambda prog, v=v: replace(prog, shard_out_spec=v)))
    return out


def mutate(prog: Program, ch: Chooser, prefer_collectives: float = 0.6) -> Program | None:
    """A random mutant of `prog` (one mutation), or None when there is none."""
    muts = program_mutations(prog)
    if not muts:
        return None
    coll = [m for m in muts if any(w in m[0] for w in (
        "psum", "pmean", "pmax", "pmin", "all_gather", "all_to_all", "dynamic_slice",
        "ppermute", "scale", "moved"))]
    pool = coll if coll and ch.chance(prefer_collectives) else muts
    desc, apply = ch.choice(pool)
    new = apply(prog)
    return replace(new, mutation=desc)


# A dropped layer renders as nothing on the sharded side (and as itself on the reference).
for _op in list(EMIT):
    def _dropped(layer, p, side, v, depth, _op=_op):
        if side == "shard":
            return []
        return EMIT[_op](layer, p, side, v, depth)
    EMIT["nop_" + _op] = _dropped
