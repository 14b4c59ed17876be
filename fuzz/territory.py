"""Random shard_map programs in the general tier's territory, and their mutants (issue 18).

The chain generator (`fuzz.gen`) builds programs whose every value keeps a layout the layout
tier knows. The programs here are the ones people write that leave it: device-dependent
slicing (`dynamic_slice` / `dynamic_update_slice` at offsets computed from `axis_index`,
`(i +- k) % n`, offset tables, reversed blocks), masks from compares on device offsets (the
vocab-parallel embedding `local = ids - start; mask; clip; take; where; psum`, causal-like
iota masks), rotating loop carries (`fori_loop` or a Python loop with `ppermute`: ring
all-gather, ring all-reduce, all-gather and reduce-scatter collective matmuls),
`all_to_all` with any split/concat dims and over several axes (and Ulysses-style round
trips), `all_gather(tiled=False)` + reshape (FSDP), psum / pmax / psum_scatter of tiled values
(block sums), and per-device results by design (a per-shard cumsum, block means).

Each program is one *template* with random parameters; it renders twice, as the reference
(`reference(a0, ...)`, on global arrays) and as the shard_map body (`body(a0, ...)`). A
*mutant* overrides parameters of the body only (`TProgram.m`): value mutations (a constant
off by one or by one ulp, another offset or rotation, a narrower dtype, integers near 2^31
that wrap, a select's branches swapped, a compare's strictness) and collective mutations
(dropped, over other axes, other dims, another direction, another reduction). Whether a
program is correct is NOT decided here: `fuzz.territory_run` executes it and its reference on
simulated CPU devices and labels it from the numbers (a mutant may be equivalent).

Nothing here imports jax; randomness comes from a `fuzz.gen.Chooser`.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from fuzz.gen import Chooser, MeshSpec, RandomChooser, Spec, spec_str

MESHES: tuple[tuple[tuple[str, ...], tuple[int, ...]], ...] = (
    (("i",), (2,)), (("i",), (4,)), (("x",), (8,)), (("a", "b"), (2, 2)),
    (("dp", "tp"), (2, 4)), (("a", "b"), (4, 2)))

NEAR_2_31 = 2 ** 31
"""Integer constants near 2^31 make int32 arithmetic wrap (the semantics policy: integers are
two's complement, overflow is never presumed away)."""

EPI_SCALES = (0.1, 0.3, 1.7, -0.7, 2.5, 0.75)
EPI_SHIFTS = (0.0, 1.0, -2.0, 0.5)


def f32_next(c: float) -> float:
    """The next float32 above float32(c), as the exact double (one ulp up)."""
    bits = struct.unpack("<I", struct.pack("<f", c))[0]
    bits += 1 if c >= 0 else -1
    return struct.unpack("<f", struct.pack("<I", bits))[0]


def ax(axes) -> str:
    """An axis name (or a tuple of them) as Python source."""
    axes = tuple(axes)
    return repr(axes[0]) if len(axes) == 1 else repr(axes)


def perm(n: int, d: int) -> str:
    """The ring permutation sending block s to (s + d) % n, as source."""
    return "[" + ", ".join(f"({s}, {(s + d) % n})" for s in range(n)) + "]"


# ----------------------------------------------------------------------------------------------
# Programs
# ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TArg:
    """One argument: its global shape, in_spec, dtype, and how values are drawn
    (`data`, `weight`, or `index`: integers in [0, high))."""

    shape: tuple[int, ...]
    spec: Spec
    dtype: str = "float32"
    role: str = "data"
    high: int = 0


@dataclass
class TProgram:
    """A template instance: `p` its parameters, `m` overrides of the sharded side (a
    mutation). Rendered by `TEMPLATES[kind]`."""

    kind: str
    mesh: MeshSpec
    args: list[TArg]
    out_spec: Spec
    out_dtype: str
    p: dict
    m: dict = field(default_factory=dict)
    seed: object = None
    mutation: str | None = None
    mutation_kind: str | None = None   # "value" | "collective"
    constructs: tuple[str, ...] = ()

    def params(self, side: str) -> dict:
        return {**self.p, **self.m} if side == "shard" else dict(self.p)

    def function_source(self, side: str) -> str:
        name = "reference" if side == "ref" else "body"
        params = ", ".join(f"a{i}" for i in range(len(self.args)))
        p = self.params(side)
        lines = TEMPLATES[self.kind].render(p, side, self)
        lines += _epilogue(p, side, self.out_dtype)
        return "\n".join([f"def {name}({params}):"] + ["    " + ln for ln in lines]
                         + ["    return x"])

    def source(self) -> str:
        """A self-contained jax program: reference, shard_map body, mesh, specs, shapes."""
        head = [f"# entangle territory fuzz program seed={self.seed!r} kind={self.kind}"
                + (f" mutation ({self.mutation_kind}): {self.mutation}" if self.mutation
                   else ""),
                "import jax, jax.numpy as jnp",
                "from jax import lax",
                "from jax.sharding import PartitionSpec as P", ""]
        tail = ["", f"MESH = {self.mesh.axes!r}",
                "ARGS = (" + "".join(f"({a.shape!r}, {a.dtype!r}), " for a in self.args) + ")",
                "IN_SPECS = (" + "".join(spec_str(a.spec) + ", " for a in self.args) + ")",
                f"OUT_SPECS = {spec_str(self.out_spec)}"]
        return "\n".join(head + [self.function_source("ref"), "",
                                 self.function_source("shard")] + tail) + "\n"

    def describe(self) -> str:
        return f"seed={self.seed} {self.kind} on {self.mesh.describe()}"


def _epilogue(p: dict, side: str, dtype: str) -> list[str]:
    """The program's last lines (both sides): an optional narrowing round trip (a dtype
    mutation) and `x * C + D`."""
    lines = []
    if side == "shard" and p.get("narrow"):
        lines.append(f"x = x.astype(jnp.{p['narrow']}).astype(jnp.{dtype})")
    if p.get("epi") is not None:
        c, d = p["epi"]
        if dtype == "float32":
            lines.append(f"x = x * jnp.float32({c!r}) + jnp.float32({d!r})")
        else:
            lines.append(f"x = x * {int(c)} + {int(d)}")
    return lines


@dataclass(frozen=True)
class Template:
    """How to make, render and mutate one kind of program. `make(g)` draws parameters and
    returns the program (or None when the mesh does not fit); `render(p, side, prog)` gives
    the function's lines computing `x`; `mutations(prog)` lists (description, kind,
    overrides) of the sharded side."""

    name: str
    make: Callable[[Gen], TProgram | None]
    render: Callable[[dict, str, TProgram], list[str]]
    mutations: Callable[[TProgram], list[tuple[str, str, dict]]]
    weight: float = 1.0


class Gen:
    """The random choices of one program."""

    def __init__(self, ch: Chooser):
        self.ch = ch
        names, sizes = ch.choice(MESHES)
        self.mesh = MeshSpec(names, sizes)

    def axes(self, allow_two: bool = True) -> tuple[str, ...]:
        """One mesh axis, or (on a 2-d mesh) both in either order."""
        names = self.mesh.names
        if len(names) == 2 and allow_two and self.ch.chance(0.4):
            return tuple(self.ch.permutation(names))
        return (self.ch.choice(names),)

    def n(self, axes) -> int:
        return self.mesh.size(axes)

    def epi(self, dtype: str):
        if not self.ch.chance(0.6):
            return None
        if dtype == "float32":
            return (self.ch.choice(EPI_SCALES), self.ch.choice(EPI_SHIFTS))
        return (self.ch.choice((3, -2, 5)), self.ch.choice((0, 7, -1)))


def other_axes(mesh: MeshSpec, axes) -> list[tuple[str, ...]]:
    """Axis tuples of the same size as `axes`, other than it."""
    names = mesh.names
    cands = [(a,) for a in names] + ([tuple(names), tuple(reversed(names))]
                                     if len(names) == 2 else [])
    return [c for c in cands if c != tuple(axes) and mesh.size(c) == mesh.size(axes)]


def _spec(rank: int, tiled: dict[int, tuple[str, ...]]) -> Spec:
    return tuple(tuple(tiled.get(d, ())) for d in range(rank))


def _shape_with(ch: Chooser, rank: int, dim: int, size: int, others=(2, 4, 8)) -> tuple:
    return tuple(size if d == dim else ch.choice(others) for d in range(rank))


def generic_mutations(prog: TProgram) -> list[tuple[str, str, dict]]:
    """Value mutations of the epilogue every template may carry."""
    out = []
    p = prog.p
    if p.get("epi") is not None:
        c, d = p["epi"]
        if prog.out_dtype == "float32":
            out.append((f"constant {c} one ulp up (epilogue)", "value",
                        {"epi": (f32_next(c), d)}))
            out.append((f"constant {d} off by one (epilogue)", "value", {"epi": (c, d + 1.0)}))
        else:
            out.append((f"constant {c} off by one (epilogue)", "value", {"epi": (c + 1, d)}))
            out.append((f"constant {d} off by one (epilogue)", "value", {"epi": (c, d + 1)}))
    if prog.out_dtype == "float32":
        out.append(("result narrowed to bfloat16 and back (dtype)", "value",
                    {"narrow": "bfloat16"}))
    else:
        out.append(("result narrowed to int16 and back (dtype)", "value", {"narrow": "int16"}))
    return out


# ----------------------------------------------------------------------------------------------
# dynamic_slice at a device-dependent offset
# ----------------------------------------------------------------------------------------------

def make_dynslice(g: Gen) -> TProgram:
    ch = g.ch
    axes = g.axes()
    n = g.n(axes)
    rank = ch.choice((1, 2, 2, 3))
    dim = ch.randint(0, rank - 1)
    bs = ch.choice((1, 2, 4))
    shape = _shape_with(ch, rank, dim, n * bs)
    dtype = ch.choice(("float32", "float32", "int32"))
    src = ch.choice(("replicated", "gathered"))
    form = ch.choice(("mod", "mod", "table", "reverse"))
    p = {"axes": axes, "n": n, "dim": dim, "bs": bs, "src": src, "form": form,
         "k": ch.randint(0, n - 1), "sign": ch.choice((1, -1)), "K": 0, "plus": 0,
         "table": None, "rev": n - 1, "idx_axes": axes, "epi": g.epi(dtype),
         "ref_flip": ch.chance(0.5)}
    if form == "table":
        s = p["sign"] * p["k"]
        p["table"] = [((d + s) % n) * bs for d in range(n)]
    in_spec = _spec(rank, {dim: axes} if src == "gathered" else {})
    return TProgram("dynslice", g.mesh, [TArg(shape, in_spec, dtype)],
                    _spec(rank, {dim: axes}), dtype, p,
                    constructs=("dynamic_slice", f"offset_{form}") +
                    (("all_gather",) if src == "gathered" else ()))


def _dynslice_offset(p: dict) -> str:
    n, bs = p["n"], p["bs"]
    i = "i"
    if p["form"] == "table":
        off = f"jnp.array({p['table']!r}, jnp.int32)[{i}]"
    elif p["form"] == "reverse":
        off = f"({p['rev']} - {i}) * {bs}"
    else:
        op = "+" if p["sign"] > 0 else "-"
        wrap = f" + {p['K']}" if p["K"] else ""
        if p.get("unsigned"):
            off = (f"(({i} {op} {p['k']}{wrap}).astype(jnp.uint32) % {n}).astype(jnp.int32)"
                   f" * {bs}")
        else:
            off = f"(({i} {op} {p['k']}{wrap}) % {n}) * {bs}"
    return off + (f" + {p['plus']}" if p["plus"] else "")


def render_dynslice(p: dict, side: str, prog: TProgram) -> list[str]:
    n, bs, dim = p["n"], p["bs"], p["dim"]
    shape = prog.args[0].shape
    if side == "ref":
        if p["form"] == "reverse" and p["ref_flip"]:
            split = shape[:dim] + (n, bs) + shape[dim + 1:]
            return [f"x = jnp.flip(a0.reshape({split!r}), axis={dim}).reshape({shape!r})"]
        if p["form"] == "reverse":
            blocks = ", ".join(f"lax.slice_in_dim(a0, {j * bs}, {(j + 1) * bs}, axis={dim})"
                               for j in reversed(range(n)))
            return [f"x = jnp.concatenate([{blocks}], axis={dim})"]
        s = p["sign"] * p["k"]
        return [f"x = jnp.roll(a0, {-s * bs}, axis={dim})"]
    lines = ["x = a0"]
    if p["src"] == "gathered" and not p.get("drop_gather"):
        lines.append(f"x = lax.all_gather(x, {ax(p.get('gather_axes', p['axes']))}, "
                     f"axis={dim}, tiled=True)")
    lines.append(f"i = lax.axis_index({ax(p['idx_axes'])})")
    lines.append(f"x = lax.dynamic_slice_in_dim(x, {_dynslice_offset(p)}, {bs}, "
                 f"axis={p.get('slice_dim', dim)})")
    return lines


def mutations_dynslice(prog: TProgram) -> list[tuple[str, str, dict]]:
    p, n = prog.p, prog.p["n"]
    out = []
    if p["form"] == "table":
        t = list(p["table"])
        t[0] += 1
        out.append(("offset table entry 0 off by one", "value", {"table": t}))
        if n > 2:
            t = list(p["table"])
            t[0], t[1] = t[1], t[0]
            out.append(("offset table entries 0 and 1 swapped", "value", {"table": t}))
    elif p["form"] == "reverse":
        out.append(("reversed offset n - i instead of n - 1 - i", "value", {"rev": n}))
    else:
        out.append(("other rotation (k + 1)", "value", {"k": p["k"] + 1}))
        out.append(("rotation direction flipped", "value", {"sign": -p["sign"]}))
        out.append((f"index wraps: k + 2^31 - {n} (a multiple of n: equivalent)", "value",
                    {"K": NEAR_2_31 - n}))
        out.append(("index wraps: k + 2^31 - 1", "value", {"K": NEAR_2_31 - 1}))
        out.append(("index taken modulo n as uint32 (n divides 2^32: equivalent)", "value",
                    {"unsigned": True}))
    out.append(("offset off by one (+1)", "value", {"plus": 1}))
    for other in other_axes(prog.mesh, p["axes"]):
        out.append((f"axis_index over {other} instead of {p['axes']}", "collective",
                    {"idx_axes": other}))
    if p["src"] == "gathered":
        out.append(("all_gather dropped", "collective", {"drop_gather": True}))
        for other in other_axes(prog.mesh, p["axes"]):
            out.append((f"all_gather over {other}", "collective", {"gather_axes": other}))
    rank = len(prog.args[0].shape)
    for d in range(rank):
        if d != p["dim"] and prog.args[0].shape[d] >= p["bs"]:
            out.append((f"dynamic_slice on dim {d}", "value", {"slice_dim": d}))
    return out


# ----------------------------------------------------------------------------------------------
# dynamic_update_slice into a zero buffer at a device-dependent offset, then psum
# ----------------------------------------------------------------------------------------------

def make_dus(g: Gen) -> TProgram:
    ch = g.ch
    axes = g.axes()
    n = g.n(axes)
    rank = ch.choice((1, 2, 2, 3))
    dim = ch.randint(0, rank - 1)
    finish = ch.choice(("psum", "psum_scatter"))
    bs = ch.choice((2, 4)) if finish == "psum_scatter" else ch.choice((1, 2, 4))
    if finish == "psum_scatter" and n * bs % n:
        finish = "psum"
    shape = _shape_with(ch, rank, dim, n * bs)
    dtype = ch.choice(("float32", "float32", "int32"))
    p = {"axes": axes, "n": n, "dim": dim, "bs": bs, "k": ch.randint(0, n - 1), "plus": 0,
         "fill": "zeros", "finish": finish, "coll_axes": axes, "epi": g.epi(dtype)}
    out = _spec(rank, {dim: axes} if finish == "psum_scatter" else {})
    return TProgram("dus", g.mesh, [TArg(shape, _spec(rank, {dim: axes}), dtype)], out, dtype,
                    p, constructs=("dynamic_update_slice", finish))


def render_dus(p: dict, side: str, prog: TProgram) -> list[str]:
    n, bs, dim = p["n"], p["bs"], p["dim"]
    if side == "ref":
        return [f"x = jnp.roll(a0, {p['k'] * bs}, axis={dim})"]
    lines = ["x = a0", f"i = lax.axis_index({ax(p['axes'])})",
             (f"buf = jnp.{p['fill']}(x.shape[:{dim}] + ({n * bs},) + x.shape[{dim + 1}:], "
             "x.dtype)"),
             f"x = lax.dynamic_update_slice_in_dim(buf, x, ((i + {p['k']}) % {n}) * {bs}"
             + (f" + {p['plus']}" if p["plus"] else "") + f", axis={dim})"]
    finish = p["finish"]
    if finish in ("psum", "pmax"):
        lines.append(f"x = lax.{finish}(x, {ax(p['coll_axes'])})")
    elif finish == "psum_scatter":
        lines.append(f"x = lax.psum_scatter(x, {ax(p['coll_axes'])}, "
                     f"scatter_dimension={p.get('scatter_dim', dim)}, tiled=True)")
    return lines


def mutations_dus(prog: TProgram) -> list[tuple[str, str, dict]]:
    p = prog.p
    out = [("other rotation (k + 1)", "value", {"k": p["k"] + 1}),
           ("offset off by one (+1)", "value", {"plus": 1}),
           ("buffer filled with ones", "value", {"fill": "ones"}),
           (f"{p['finish']} dropped", "collective", {"finish": "none"})]
    if p["finish"] == "psum":
        out.append(("pmax instead of psum", "collective", {"finish": "pmax"}))
    else:
        rank = len(prog.args[0].shape)
        for d in range(rank):
            if d != p["dim"] and prog.args[0].shape[d] % p["n"] == 0:
                out.append((f"psum_scatter on dim {d}", "collective", {"scatter_dim": d}))
    for other in other_axes(prog.mesh, p["axes"]):
        out.append((f"{p['finish']} over {other}", "collective", {"coll_axes": other}))
    return out


# ----------------------------------------------------------------------------------------------
# A mask from compares on device offsets (iota + axis_index * block)
# ----------------------------------------------------------------------------------------------

def make_mask(g: Gen) -> TProgram:
    ch = g.ch
    axes = g.axes()
    n = g.n(axes)
    t = ch.randint(0, 1)
    shape = [ch.choice((4, 8)), ch.choice((4, 8))]
    shape[t] = n * ch.choice((1, 2, 4))
    shape = tuple(shape)
    p = {"axes": axes, "n": n, "t": t, "cmp": ch.choice(("<=", "<", ">=", ">")),
         "q": ch.choice((1, 2)), "c": ch.choice((-1, 0, 1)), "plus": 0,
         "fill": ch.choice(("zero", "big", "half")), "swap": False, "K": 0, "Kdiff": 0,
         "idx_axes": axes, "epi": g.epi("float32")}
    return TProgram("mask", g.mesh, [TArg(shape, _spec(2, {t: axes}))],
                    _spec(2, {t: axes}), "float32", p, constructs=("compare_mask", "iota"))


_FILL = {"zero": "jnp.float32(0.0)", "big": "jnp.float32(-1e9)", "half": "x * jnp.float32(0.5)"}
_STRICT = {"<=": "<", "<": "<=", ">=": ">", ">": ">="}


def render_mask(p: dict, side: str, prog: TProgram) -> list[str]:
    t = p["t"]
    lines = ["x = a0"]
    offs = ["", ""]
    if side == "shard":
        lines.append(f"i = lax.axis_index({ax(p['idx_axes'])})")
        offs[t] = f" + i * x.shape[{t}]" + (f" + {p['plus']}" if p["plus"] else "")
    lines.append(f"rows = lax.broadcasted_iota(jnp.int32, x.shape, 0){offs[0]}")
    lines.append(f"cols = lax.broadcasted_iota(jnp.int32, x.shape, 1){offs[1]}")
    rhs = f"rows * {p['q']} + {p['c']}"
    if p["K"]:
        lines.append(f"mask = (cols + {p['K']}) {p['cmp']} ({rhs} + {p['K']})")
    elif p["Kdiff"]:
        lines.append(f"mask = ((cols + {p['Kdiff']}) - ({rhs} + {p['Kdiff']})) {p['cmp']} 0")
    elif p.get("unsigned"):
        lines.append(f"mask = cols.astype(jnp.uint32) {p['cmp']} ({rhs}).astype(jnp.uint32)")
    else:
        lines.append(f"mask = cols {p['cmp']} {rhs}")
    a, b = "x", _FILL[p["fill"]]
    if p["swap"]:
        a, b = b, a
    lines.append(f"x = jnp.where(mask, {a}, {b})")
    return lines


def mutations_mask(prog: TProgram) -> list[tuple[str, str, dict]]:
    p = prog.p
    size = prog.args[0].shape[1] + prog.args[0].shape[0] * p["q"]
    out = [(f"compare {_STRICT[p['cmp']]} instead of {p['cmp']}", "value",
            {"cmp": _STRICT[p["cmp"]]}),
           (f"compare constant {p['c']} off by one", "value", {"c": p["c"] + 1}),
           ("select branches swapped", "value", {"swap": True}),
           ("compare as uint32 (negative bounds wrap)", "value", {"unsigned": True}),
           ("device offset off by one (+1)", "value", {"plus": 1}),
           ("compare operands shifted by 2^31 - 1 - 2 (wraps)", "value",
            {"K": NEAR_2_31 - 1 - 2}),
           (f"compare as a difference shifted by 2^31 - {size} (wraps and cancels)", "value",
            {"Kdiff": NEAR_2_31 - size})]
    for other in other_axes(prog.mesh, p["axes"]):
        out.append((f"axis_index over {other}", "collective", {"idx_axes": other}))
    return out


# ----------------------------------------------------------------------------------------------
# The vocab-parallel embedding, spelled the common way
# ----------------------------------------------------------------------------------------------

def make_embed(g: Gen) -> TProgram:
    ch = g.ch
    axes = g.axes()
    n = g.n(axes)
    free = [a for a in g.mesh.names if a not in axes]
    m = ch.choice((2, 4, 8))
    v, d, t = n * m, ch.choice((4, 8)), ch.choice((4, 6, 8))
    ids_axes: tuple[str, ...] = ()
    if free and t % g.n(free) == 0 and ch.chance(0.5):
        ids_axes = (free[0],)
    p = {"axes": axes, "n": n, "m": m, "lo": ">=", "hi": "<", "start_plus": 0, "clip": m - 1,
         "swap": False, "spell": ch.choice(("where", "mul")), "index": ch.choice(("take", "[]")),
         "reduce": "psum", "coll_axes": axes, "Kmask": 0, "Klocal": 0, "narrow_rows": False,
         "epi": g.epi("float32")}
    args = [TArg((v, d), _spec(2, {0: axes}), "float32", "weight"),
            TArg((t,), _spec(1, {0: ids_axes}), "int32", "index", v)]
    return TProgram("embed", g.mesh, args, _spec(2, {0: ids_axes}), "float32", p,
                    constructs=("vocab_embed", "compare_mask", "psum"))


def render_embed(p: dict, side: str, prog: TProgram) -> list[str]:
    if side == "ref":
        return ["x = jnp.take(a0, a1, axis=0)"]
    m = p["m"]
    lines = [f"start = lax.axis_index({ax(p['axes'])}) * {m}" +
             (f" + {p['start_plus']}" if p["start_plus"] else "")]
    if p["Klocal"]:
        lines.append(f"local = (a1 + {p['Klocal']}) - (start + {p['Klocal']})")
    else:
        lines.append("local = a1 - start")
    hi = (f"(local + {p['Kmask']}) {p['hi']} ({m} + {p['Kmask']})" if p["Kmask"]
          else f"local {p['hi']} {m}")
    lines.append(f"mask = (local {p['lo']} 0) & ({hi})")
    idx = f"jnp.clip(local, {p.get('clip_lo', 0)}, {p['clip']})"
    lines.append(f"rows = jnp.take(a0, {idx}, axis=0)" if p["index"] == "take"
                 else f"rows = a0[{idx}]")
    if p["narrow_rows"]:
        lines.append("rows = rows.astype(jnp.bfloat16).astype(jnp.float32)")
    if p["spell"] == "where":
        a, b = "rows", "0.0"
        if p["swap"]:
            a, b = b, a
        lines.append(f"x = jnp.where(mask[:, None], {a}, {b})")
    else:
        keep = "(~mask)" if p["swap"] else "mask"
        lines.append(f"x = rows * {keep}[:, None].astype(rows.dtype)")
    if p["reduce"] != "none":
        lines.append(f"x = lax.{p['reduce']}(x, {ax(p['coll_axes'])})")
    return lines


def mutations_embed(prog: TProgram) -> list[tuple[str, str, dict]]:
    p, m = prog.p, prog.p["m"]
    out = [("mask upper bound <= instead of <", "value", {"hi": "<="}),
           ("mask lower bound > instead of >=", "value", {"lo": ">"}),
           ("vocabulary start off by one (+1)", "value", {"start_plus": 1}),
           (f"clip bound {m - 2} instead of {m - 1}", "value", {"clip": m - 2}),
           ("clip lower bound 1 instead of 0", "value", {"clip_lo": 1}),
           ("select branches swapped" if p["spell"] == "where" else "mask inverted", "value",
            {"swap": True}),
           ("mask bound shifted by 2^31 - 1 - m (wraps)", "value",
            {"Kmask": NEAR_2_31 - 1 - m}),
           ("local ids through 2^31 - 1 (wraps and cancels)", "value",
            {"Klocal": NEAR_2_31 - 1}),
           ("rows narrowed to bfloat16 (dtype)", "value", {"narrow_rows": True}),
           ("psum dropped", "collective", {"reduce": "none"}),
           ("pmax instead of psum", "collective", {"reduce": "pmax"})]
    for other in other_axes(prog.mesh, p["axes"]):
        out.append((f"psum over {other}", "collective", {"coll_axes": other}))
    return out


# ----------------------------------------------------------------------------------------------
# Rotating loop carries: rings of ppermutes (fori_loop or a Python loop)
# ----------------------------------------------------------------------------------------------

RING_VARIANTS = ("allgather", "allreduce", "ag_matmul", "rs_matmul")


def make_ring(g: Gen) -> TProgram:
    ch = g.ch
    axes = g.axes(allow_two=ch.chance(0.5))
    n = g.n(axes)
    variant = ch.choice(RING_VARIANTS)
    b = ch.choice((1, 2, 4))
    dtype = "float32"
    if variant == "allgather":
        args = [TArg((n * b, ch.choice((2, 4))), _spec(2, {0: axes}), dtype)]
        out = _spec(2, {})
    elif variant == "allreduce":
        dtype = ch.choice(("float32", "int32"))
        args = [TArg((n * b, ch.choice((2, 4))), _spec(2, {0: axes}), dtype)]
        out = _spec(2, {})
    elif variant == "ag_matmul":
        mm, kk, nn = ch.choice((2, 4)) * n, n * ch.choice((1, 2)), ch.choice((2, 4))
        args = [TArg((mm, kk), _spec(2, {0: axes}), dtype, "weight"),
                TArg((kk, nn), _spec(2, {0: axes}), dtype, "weight")]
        out = _spec(2, {0: axes})
    else:
        mm, kk, nn = n * ch.choice((1, 2)), n * ch.choice((1, 2)), ch.choice((2, 4))
        args = [TArg((mm, kk), _spec(2, {1: axes}), dtype, "weight"),
                TArg((kk, nn), _spec(2, {0: axes}), dtype, "weight")]
        out = _spec(2, {0: axes})
    p = {"axes": axes, "n": n, "variant": variant, "d": ch.choice((1, -1)), "idx_sign": 1,
         "perm_d": None, "loop": ch.choice(("fori", "fori", "python")), "lo": None,
         "hi": None, "drop_perm": False, "perm_axes": axes, "drop_pair": False,
         "epi": g.epi(dtype)}
    return TProgram("ring", g.mesh, args, out, dtype, p,
                    constructs=("rotating_carry", f"ring_{variant}", f"loop_{p['loop']}"))


def _perm_expr(p: dict) -> str:
    n = p["n"]
    d = p["perm_d"] if p["perm_d"] is not None else p["d"]
    if p["variant"] == "rs_matmul" and p["perm_d"] is None:
        d = -p["d"]
    pairs = [(s, (s + d) % n) for s in range(n)]
    if p["drop_pair"]:
        pairs = [(s, t) for s, t in pairs if not (t == 0 and s == n - 1) and
                 not (t == n - 1 and s == 0)] if n > 2 else pairs[:-1]
    return "[" + ", ".join(f"({s}, {t})" for s, t in pairs) + "]"


def _loop(p: dict, lo: int, hi: int, carry: str) -> list[str]:
    lo = p["lo"] if p["lo"] is not None else lo
    hi = hi + p["hi"] if p["hi"] is not None else hi
    if p["loop"] == "fori":
        return [f"{carry} = lax.fori_loop({lo}, {hi}, step, {carry})"]
    return [f"for k in range({lo}, {hi}):", f"    {carry} = step(k, {carry})"]


def render_ring(p: dict, side: str, prog: TProgram) -> list[str]:
    n, v = p["n"], p["variant"]
    if side == "ref":
        if v in ("allgather",):
            return ["x = a0"]
        if v == "allreduce":
            shape = prog.args[0].shape
            return [f"x = a0.reshape(({n}, {shape[0] // n}, {shape[1]})).sum(0)"]
        return ["x = a0 @ a1"]
    d = p["d"]
    s = p["idx_sign"]
    send = ("blk" if p["drop_perm"] else
            f"lax.ppermute(blk, {ax(p['perm_axes'])}, {_perm_expr(p)})")
    lines = [f"i = lax.axis_index({ax(p['axes'])})"]
    if v == "allgather":
        lines += ["x = a0", "b = x.shape[0]",
                  f"buf = jnp.zeros(({n} * b,) + x.shape[1:], x.dtype)",
                  "def step(k, carry):",
                  "    buf, blk = carry",
                  (f"    buf = lax.dynamic_update_slice_in_dim(buf, blk, "
                  f"((i - {s * d} * k) % {n}) * b, 0)"),
                  f"    blk = {send}",
                  "    return buf, blk",
                  "carry = (buf, x)"]
        lines += _loop(p, 0, n, "carry")
        lines.append("x = carry[0]")
    elif v == "allreduce":
        lines += ["x = a0",
                  "def step(k, carry):",
                  "    acc, blk = carry",
                  f"    blk = {send}",
                  "    return acc + blk, blk",
                  "carry = (x, x)"]
        lines += _loop(p, 1, n, "carry")
        lines.append("x = carry[0]")
    elif v == "ag_matmul":
        lines += [f"w = a0.shape[1] // {n}",
                  "def step(k, carry):",
                  "    acc, blk = carry",
                  f"    j = (i - {s * d} * k) % {n}",
                  "    acc = acc + lax.dynamic_slice_in_dim(a0, j * w, w, 1) @ blk",
                  f"    blk = {send}",
                  "    return acc, blk",
                  "carry = (jnp.zeros((a0.shape[0], a1.shape[1]), a0.dtype), a1)"]
        lines += _loop(p, 0, n, "carry")
        lines.append("x = carry[0]")
    else:
        lines += ["part = a0 @ a1",
                  f"rows = part.shape[0] // {n}",
                  "def chunk(j):",
                  "    return lax.dynamic_slice_in_dim(part, j * rows, rows, 0)",
                  "def step(k, blk):",
                  f"    blk = {send}",
                  f"    return blk + chunk((i + {s * d} * (k + 1)) % {n})",
                  f"x = chunk((i + {s * d}) % {n})"]
        lines += _loop(p, 1, n, "x")
    return lines


def mutations_ring(prog: TProgram) -> list[tuple[str, str, dict]]:
    p, n = prog.p, prog.p["n"]
    base_d = -p["d"] if p["variant"] == "rs_matmul" else p["d"]
    out = [("ppermute direction reversed", "collective", {"perm_d": -base_d}),
           ("chunk index rotates the other way", "value", {"idx_sign": -1}),
           ("trip count one short (constant off by one)", "value", {"hi": -1}),
           ("ppermute dropped", "collective", {"drop_perm": True}),
           ("ring without its wrap-around pair", "collective", {"drop_pair": True})]
    if p["variant"] in ("allgather", "ag_matmul"):
        out.append(("loop starts at 1 (constant off by one)", "value", {"lo": 1}))
    if n > 2:
        out.append(("ppermute by 2 steps", "collective", {"perm_d": 2 * base_d}))
    for other in other_axes(prog.mesh, p["axes"]):
        out.append((f"ppermute over {other}", "collective", {"perm_axes": other}))
    return out


# ----------------------------------------------------------------------------------------------
# all_to_all: any split / concat dims, one or several axes, Ulysses-style round trips
# ----------------------------------------------------------------------------------------------

def make_a2a(g: Gen) -> TProgram:
    ch = g.ch
    axes = g.axes()
    n = g.n(axes)
    rank = ch.choice((2, 2, 3))
    form = ch.choice(("move", "move", "block_transpose", "roundtrip"))
    split = ch.randint(0, rank - 1)
    concat = ch.choice([d for d in range(rank) if d != split]) if form != "block_transpose" \
        else split
    shape = [ch.choice((2, 4)) for _ in range(rank)]
    if form == "block_transpose":
        shape[split] = n * n * ch.choice((1, 2))
    else:
        shape[split] = n * ch.choice((1, 2))
        shape[concat] = n * ch.choice((1, 2))
    shape = tuple(shape)
    dtype = ch.choice(("float32", "float32", "int32"))
    if form == "roundtrip" and dtype == "int32":
        dtype = "float32"
    p = {"axes": axes, "n": n, "form": form, "split": split, "concat": concat,
         "coll_axes": axes, "back": (concat, split), "drop": False, "epi": g.epi(dtype)}
    out = _spec(rank, {concat: axes} if form == "roundtrip" else {split: axes})
    return TProgram("a2a", g.mesh, [TArg(shape, _spec(rank, {concat: axes}), dtype)], out,
                    dtype, p, constructs=("all_to_all", f"a2a_{form}") +
                    (("two_axes",) if len(axes) == 2 else ()))


def render_a2a(p: dict, side: str, prog: TProgram) -> list[str]:
    s, c, n = p["split"], p["concat"], p["n"]
    shape = prog.args[0].shape
    if side == "ref":
        if p["form"] == "block_transpose":
            split = shape[:s] + (n, n, shape[s] // (n * n)) + shape[s + 1:]
            return [(f"x = jnp.swapaxes(a0.reshape({split!r}), {s}, {s + 1})"
                    f".reshape({shape!r})")]
        if p["form"] == "roundtrip":
            return [f"x = jnp.cumsum(a0, axis={c})"]
        return ["x = a0"]
    lines = ["x = a0"]
    if not p["drop"]:
        lines.append(f"x = lax.all_to_all(x, {ax(p['coll_axes'])}, {s}, {c}, tiled=True)")
    if p["form"] == "roundtrip":
        back_s, back_c = p["back"]
        lines.append(f"x = jnp.cumsum(x, axis={c})")
        lines.append(f"x = lax.all_to_all(x, {ax(p['axes'])}, {back_s}, {back_c}, tiled=True)")
    return lines


def mutations_a2a(prog: TProgram) -> list[tuple[str, str, dict]]:
    p = prog.p
    rank = len(prog.args[0].shape)
    out = [("all_to_all dropped", "collective", {"drop": True})]
    if p["split"] != p["concat"]:
        out.append(("split and concat dims swapped", "collective",
                    {"split": p["concat"], "concat": p["split"]}))
    for other in other_axes(prog.mesh, p["axes"]):
        out.append((f"all_to_all over {other}", "collective", {"coll_axes": other}))
    shape = prog.args[0].shape
    n = p["n"]
    for d in range(rank):
        if d not in (p["split"], p["concat"]) and shape[d] % n == 0:
            out.append((f"all_to_all split dim {d}", "collective", {"split": d}))
    if p["form"] == "roundtrip":
        out.append(("round trip back with split and concat swapped", "collective",
                    {"back": (p["split"], p["concat"])}))
    return out


# ----------------------------------------------------------------------------------------------
# all_gather(tiled=False) + reshape (stacked gathers; FSDP)
# ----------------------------------------------------------------------------------------------

def make_untiled(g: Gen) -> TProgram:
    ch = g.ch
    axes = g.axes()
    n = g.n(axes)
    form = ch.choice(("same", "front", "fsdp"))
    if form == "fsdp":
        kk, nn, bb = n * ch.choice((1, 2)), ch.choice((2, 4)), ch.choice((2, 4))
        args = [TArg((bb, kk), _spec(2, {}), "float32"),
                TArg((kk, nn), _spec(2, {0: axes}), "float32", "weight")]
        p = {"axes": axes, "n": n, "form": form, "k": 0, "gather_axis": 0, "move": True,
             "coll_axes": axes, "epi": g.epi("float32")}
        return TProgram("untiled", g.mesh, args, _spec(2, {}), "float32", p,
                        constructs=("all_gather_untiled", "fsdp"))
    rank = ch.choice((1, 2, 3))
    k = ch.randint(0, rank - 1)
    shape = _shape_with(ch, rank, k, n * ch.choice((1, 2, 4)))
    dtype = ch.choice(("float32", "int32"))
    p = {"axes": axes, "n": n, "form": form, "k": k, "gather_axis": k if form == "same" else 0,
         "move": True, "coll_axes": axes, "epi": g.epi(dtype)}
    return TProgram("untiled", g.mesh, [TArg(shape, _spec(rank, {k: axes}), dtype)],
                    _spec(rank, {}), dtype, p,
                    constructs=("all_gather_untiled", f"stack_{form}"))


def render_untiled(p: dict, side: str, prog: TProgram) -> list[str]:
    if side == "ref":
        return ["x = a0 @ a1"] if p["form"] == "fsdp" else ["x = a0"]
    k, a = p["k"], p["gather_axis"]
    src = "a1" if p["form"] == "fsdp" else "a0"
    lines = [f"g = lax.all_gather({src}, {ax(p['coll_axes'])}, axis={a}, tiled=False)"]
    if p["move"] and a != k:
        lines.append(f"g = jnp.moveaxis(g, {a}, {k})")
    lines.append(f"w = g.reshape({src}.shape[:{k}] + (-1,) + {src}.shape[{k + 1}:])")
    lines.append("x = a0 @ w" if p["form"] == "fsdp" else "x = w")
    return lines


def mutations_untiled(prog: TProgram) -> list[tuple[str, str, dict]]:
    p = prog.p
    rank = len(prog.args[-1].shape)
    out = []
    for a in range(rank + 1):
        if a != p["gather_axis"]:
            out.append((f"stacked on axis {a} instead of {p['gather_axis']}", "collective",
                        {"gather_axis": a, "move": False}))
    if p["gather_axis"] != p["k"]:
        out.append(("moveaxis omitted before the reshape", "value", {"move": False}))
    for other in other_axes(prog.mesh, p["axes"]):
        out.append((f"all_gather over {other}", "collective", {"coll_axes": other}))
    return out


# ----------------------------------------------------------------------------------------------
# Reductions of tiled values: block sums / maxima (psum, pmax, pmin, pmean, psum_scatter)
# ----------------------------------------------------------------------------------------------

_BLOCK_REF = {"psum": "sum", "pmax": "max", "pmin": "min", "pmean": "mean",
              "psum_scatter": "sum"}


def make_blocks(g: Gen) -> TProgram:
    ch = g.ch
    axes = g.axes()
    n = g.n(axes)
    rank = ch.choice((1, 2, 2, 3))
    k = ch.randint(0, rank - 1)
    dtype = ch.choice(("float32", "float32", "int32"))
    ops = ["psum", "pmax", "pmin", "psum_scatter"] + (["pmean"] if dtype == "float32" else [])
    op = ch.choice(ops)
    b = ch.choice((1, 2, 4))
    shape = _shape_with(ch, rank, k, n * b)
    scatter = None
    if op == "psum_scatter":
        dims = [d for d in range(rank) if (shape[d] // (n if d == k else 1)) % n == 0]
        if not dims:
            op = "psum"
        else:
            scatter = ch.choice(dims)
    p = {"axes": axes, "n": n, "k": k, "op": op, "scatter": scatter, "coll_axes": axes,
         "epi": g.epi(dtype)}
    out = _spec(rank, {scatter: axes} if op == "psum_scatter" else {})
    return TProgram("blocks", g.mesh, [TArg(shape, _spec(rank, {k: axes}), dtype)], out, dtype,
                    p, constructs=("block_reduce", op))


def render_blocks(p: dict, side: str, prog: TProgram) -> list[str]:
    n, k = p["n"], p["k"]
    shape = prog.args[0].shape
    if side == "ref":
        split = shape[:k] + (n, shape[k] // n) + shape[k + 1:]
        return [f"x = a0.reshape({split!r}).{_BLOCK_REF[p['op']]}(axis={k})"
                + (".astype(a0.dtype)" if p["op"] == "pmean" else "")]
    op = p["op"]
    if op == "none":
        return ["x = a0"]
    if op == "psum_scatter":
        return [(f"x = lax.psum_scatter(a0, {ax(p['coll_axes'])}, "
                f"scatter_dimension={p['scatter']}, tiled=True)")]
    return [f"x = lax.{op}(a0, {ax(p['coll_axes'])})"]


def mutations_blocks(prog: TProgram) -> list[tuple[str, str, dict]]:
    p = prog.p
    out = [(f"{p['op']} dropped", "collective", {"op": "none"})]
    if p["op"] != "psum_scatter":
        for op in ("psum", "pmax", "pmin") + (("pmean",) if prog.out_dtype == "float32"
                                              else ()):
            if op != p["op"]:
                out.append((f"{op} instead of {p['op']}", "collective", {"op": op}))
    else:
        shape = prog.args[0].shape
        for d in range(len(shape)):
            local = shape[d] // (p["n"] if d == p["k"] else 1)
            if d != p["scatter"] and local % p["n"] == 0:
                out.append((f"psum_scatter on dim {d}", "collective", {"scatter": d}))
    for other in other_axes(prog.mesh, p["axes"]):
        out.append((f"{p['op']} over {other}", "collective", {"coll_axes": other}))
    return out


# ----------------------------------------------------------------------------------------------
# Per-device results by design
# ----------------------------------------------------------------------------------------------

PER_DEVICE = ("cumsum", "index_scale", "block_mean", "first_row")


def make_perdev(g: Gen) -> TProgram:
    ch = g.ch
    axes = g.axes()
    n = g.n(axes)
    form = ch.choice(PER_DEVICE)
    rank = ch.choice((1, 2, 2))
    k = ch.randint(0, rank - 1)
    b = ch.choice((2, 4))
    shape = _shape_with(ch, rank, k, n * b)
    dtype = "float32" if form == "block_mean" else ch.choice(("float32", "int32"))
    p = {"axes": axes, "n": n, "k": k, "form": form, "c": ch.choice((0, 1, 2)), "row": 0,
         "idx_axes": axes, "psum": False, "epi": g.epi(dtype)}
    return TProgram("perdev", g.mesh, [TArg(shape, _spec(rank, {k: axes}), dtype)],
                    _spec(rank, {k: axes}), dtype, p, constructs=("per_device", form))


def render_perdev(p: dict, side: str, prog: TProgram) -> list[str]:
    n, k, form = p["n"], p["k"], p["form"]
    shape = prog.args[0].shape
    rank = len(shape)
    b = shape[k] // n
    split = shape[:k] + (n, b) + shape[k + 1:]
    if side == "ref":
        if form == "cumsum":
            return [f"x = jnp.cumsum(a0.reshape({split!r}), axis={k + 1}).reshape({shape!r})"]
        if form == "index_scale":
            bshape = tuple(shape[k] if d == k else 1 for d in range(rank))
            return [f"f = jnp.repeat(jnp.arange({n}) + {p['c']}, {b}).astype(a0.dtype)",
                    f"x = a0 * f.reshape({bshape!r})"]
        if form == "block_mean":
            return [f"x = a0.reshape({split!r}).mean(axis={k + 1})"]
        return [f"x = lax.slice_in_dim(a0, 0, None, stride={b}, axis={k})"]
    lines = ["x = a0"]
    if form == "cumsum":
        lines.append(f"x = jnp.cumsum(x, axis={k})")
    elif form == "index_scale":
        lines.append(f"x = x * (lax.axis_index({ax(p['idx_axes'])}) + {p['c']}).astype(x.dtype)")
    elif form == "block_mean":
        lines.append(f"x = jnp.mean(x, axis={k}, keepdims=True)")
    else:
        lines.append(f"x = lax.slice_in_dim(x, {p['row']}, {p['row'] + 1}, axis={k})")
    if p["psum"]:
        lines.append(f"x = lax.psum(x, {ax(p['axes'])})")
    return lines


def mutations_perdev(prog: TProgram) -> list[tuple[str, str, dict]]:
    p = prog.p
    out = [("psum added", "collective", {"psum": True})]
    if p["form"] == "index_scale":
        out.append((f"index offset {p['c']} off by one", "value", {"c": p["c"] + 1}))
        for other in other_axes(prog.mesh, p["axes"]):
            out.append((f"axis_index over {other}", "collective", {"idx_axes": other}))
    if p["form"] == "first_row":
        out.append(("row 1 of each block instead of row 0", "value", {"row": 1}))
    return out


# ----------------------------------------------------------------------------------------------
# The table, the generator, the mutations
# ----------------------------------------------------------------------------------------------

TEMPLATES: dict[str, Template] = {t.name: t for t in (
    Template("dynslice", make_dynslice, render_dynslice, mutations_dynslice, 1.5),
    Template("dus", make_dus, render_dus, mutations_dus, 1.0),
    Template("mask", make_mask, render_mask, mutations_mask, 1.0),
    Template("embed", make_embed, render_embed, mutations_embed, 1.5),
    Template("ring", make_ring, render_ring, mutations_ring, 2.0),
    Template("a2a", make_a2a, render_a2a, mutations_a2a, 1.5),
    Template("untiled", make_untiled, render_untiled, mutations_untiled, 1.0),
    Template("blocks", make_blocks, render_blocks, mutations_blocks, 1.0),
    Template("perdev", make_perdev, render_perdev, mutations_perdev, 1.0),
)}


def generate(ch: Chooser, seed=None, kinds: tuple[str, ...] | None = None) -> TProgram:
    """A random program of one of `kinds` (default: every template, by weight)."""
    names = list(kinds or TEMPLATES)
    kind = ch.weighted(names, [TEMPLATES[k].weight for k in names])
    prog = TEMPLATES[kind].make(Gen(ch))
    return replace(prog, seed=seed)


def generate_seed(seed: int, kinds: tuple[str, ...] | None = None) -> TProgram:
    return generate(RandomChooser(seed), seed, kinds)


def program_mutations(prog: TProgram) -> list[tuple[str, str, dict]]:
    """Every (description, kind, overrides) of the program's sharded side."""
    return TEMPLATES[prog.kind].mutations(prog) + generic_mutations(prog)


def apply_mutation(prog: TProgram, mutation: tuple[str, str, dict]) -> TProgram:
    desc, kind, overrides = mutation
    return replace(prog, m={**prog.m, **overrides}, mutation=desc, mutation_kind=kind)


def mutants(prog: TProgram, ch: Chooser, count: int) -> list[TProgram]:
    """Up to `count` distinct mutants, value and collective mutations alternating where both
    exist."""
    muts = program_mutations(prog)
    by_kind = {k: [m for m in muts if m[1] == k] for k in ("value", "collective")}
    out: list[TProgram] = []
    order = ["value", "collective"] if ch.chance(0.5) else ["collective", "value"]
    taken: set[str] = set()
    for j in range(count * 3):
        pool = [m for m in by_kind[order[j % 2]] if m[0] not in taken] or \
               [m for m in muts if m[0] not in taken]
        if not pool or len(out) >= count:
            break
        m = ch.choice(pool)
        taken.add(m[0])
        out.append(apply_mutation(prog, m))
    return out


def total_size(prog: TProgram) -> int:
    return sum(math.prod(a.shape) for a in prog.args)
