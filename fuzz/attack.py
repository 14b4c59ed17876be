"""The semantic attacker: value mutants of sharded programs, grounded on chosen inputs.

`mlir_mutate.value_sites(text)` lists mutations of what the values ARE (dtypes narrowed by
convert round trips, constants moved by an ulp or 2^-20 / 2^-10, integer widths, compare types
and directions, what a reducer region returns, the reducer's op, the precision of a collective).
Here each mutant of a *subject* (a correct sharded program with its reference: a catalogue
example, a real-model corpus program, an XLA-partitioned program, or one of the integer/compare
programs of `attack_programs()`) is compiled and executed on 8 simulated CPU devices on several
input sets -- two random ones and chosen ones (ties with +-0, many +-0, large values, integers
near 2^24 and near 2^31) -- and checked by entangle.

Whether a mutant computes different numbers is decided against both the reference R and the
unmutated sharded program S, on every input set where S reproduces R (finite, within 1e-4):
* integer / bool outputs: any element differs from S -> `differ`;
* float outputs: beyond 1e-4 of R -> `differ`; otherwise bitwise different from both S and R
  -> `ulp` (a 1-ulp constant change, a narrowed intermediate that rounding mostly absorbs:
  real changes of the exact semantics, smaller than reassociation noise could hide);
* else `same` (an equivalent mutant on these inputs).
A `differ` or `ulp` mutant must never be proven. A proof with `verify_rules=False` is re-checked
with the rule instances verified by Z3 (the CLI's default); only a proof that survives both is a
`false_proof` (`false_proof_ulp` for the `ulp` ones).

Importing this module imports jax with 8 simulated CPU devices.
"""

from __future__ import annotations

import os

if "--xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                               + " --xla_force_host_platform_device_count=8").strip()

import random
import time
from collections import Counter
from dataclasses import asdict, dataclass

import jax
import numpy as np

from entangle_mlir.evidence import FAST_COMPILE
from fuzz.mlir_mutate import VALUE_KINDS, value_sites
from fuzz.run import CHECK_TIMEOUT, compare, timed_check

# ----- input sets ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class Arg:
    """How to draw one argument: `role` is data / weight / gain / bias / moment / second_moment
    (floats or free integers: chosen values apply), mask (0/1), tokens / index (kept in range)."""

    shape: tuple[int, ...]
    dtype: str
    role: str = "data"
    high: int = 0
    fan_in: int = 1


INPUT_SETS = ("random0", "random1", "ties", "zeros", "large", "near2^24", "near2^31")


def _signed_zeros(x: np.ndarray, rng) -> np.ndarray:
    zeros = x == 0
    x = x.copy()
    x[zeros] = np.where(rng.random(int(zeros.sum())) < 0.5, -0.0, 0.0)
    return x


def _draw(a: Arg, label: str, rng) -> np.ndarray:
    dtype = np.dtype(a.dtype)
    shape = a.shape
    if a.role in ("tokens", "index"):
        lo = 0
        if label == "ties":
            return np.full(shape, rng.integers(lo, max(a.high, 1)), dtype=dtype)
        return rng.integers(lo, max(a.high, 1), shape).astype(dtype)
    if a.role == "mask":
        return (rng.random(shape) < 0.6).astype(dtype)
    sign = np.where(rng.random(shape) < 0.5, -1, 1)
    if np.issubdtype(dtype, np.integer):
        info = np.iinfo(dtype)
        if label.startswith("random"):
            x = rng.integers(-1000, 1000, shape)
        elif label == "ties":
            x = rng.integers(-2, 3, shape)
        elif label == "zeros":
            x = rng.integers(-1, 2, shape) * (rng.random(shape) < 0.3)
        elif label == "large":
            x = rng.integers(-(1 << 30), 1 << 30, shape)
        elif label == "near2^24":
            x = sign * ((1 << 24) + rng.integers(-3, 4, shape))
        else:
            x = np.where(sign > 0, info.max - rng.integers(0, 8, shape),
                         info.min + rng.integers(0, 8, shape))
        return np.clip(x, info.min, info.max).astype(dtype)
    if label.startswith("random"):
        x = rng.standard_normal(shape)
        x = {"weight": x / np.sqrt(max(a.fan_in, 1)), "gain": 1 + 0.1 * x, "bias": 0.1 * x,
             "moment": 0.1 * x, "second_moment": 0.01 * np.abs(x)}.get(a.role, x)
    elif label == "ties":
        x = rng.integers(-2, 3, shape).astype(np.float64)
    elif label == "zeros":
        x = rng.standard_normal(shape) * (rng.random(shape) < 0.5)
    elif label == "large":
        x = rng.standard_normal(shape) * 2.0 ** 20
    elif label == "near2^24":
        x = sign * (2.0 ** 24 + rng.integers(-3, 4, shape))
    else:
        x = sign * (2.0 ** 31 + 256.0 * rng.integers(-2, 3, shape))
    if a.role == "second_moment":
        x = np.abs(x)
    return _signed_zeros(np.asarray(x, dtype=dtype), rng)


def input_sets(args: list[Arg], labels=INPUT_SETS) -> list[tuple[str, list[np.ndarray]]]:
    out = []
    for k, label in enumerate(labels):
        rng = np.random.default_rng(1000 + k)
        out.append((label, [_draw(a, label, rng) for a in args]))
    return out


# ----- subjects: a correct sharded program, its reference, and how to run mutants of it -------------

class ShardMapSubject:
    """A shard_map program of `examples.catalog` or `examples.real.catalog` (same interface)."""

    kind = "shard_map"

    def __init__(self, ex, cat, args: list[Arg]):
        self.ex, self.cat, self.args = ex, cat, args
        self.name = ex.name
        self.lowered = cat.sharded_fn(ex).lower(*cat._avals(ex, True))
        self.text = self.lowered.as_text(debug_info=True)
        ref_lowered = cat.reference_fn(ex).lower(*cat._avals(ex, False))
        self.ref_text = ref_lowered.as_text(debug_info=True)
        self.ref_lowered = ref_lowered
        self._ref = ref_lowered.compile(compiler_options=FAST_COMPILE)

    def reference(self, inputs) -> list[np.ndarray]:
        return [np.asarray(o) for o in jax.tree.leaves(self._ref(*inputs))]

    def compile_ref(self, text: str):
        """A mutated reference, compiled with the reference lowering's signature."""
        return self.compile(text, self.ref_lowered)

    def run_ref(self, compiled, inputs) -> list[np.ndarray]:
        return [np.asarray(o) for o in jax.tree.leaves(compiled(*inputs))]

    def compile(self, text: str, lowered=None):
        from jax._src.interpreters import mlir as jmlir
        from jax._src.lib.mlir import ir

        lowered = lowered or self.lowered
        comp = lowered._lowering
        saved = comp._hlo
        try:
            with jmlir.make_ir_context():
                comp._hlo = ir.Module.parse(text)
            comp._executable = None
            return lowered.compile(compiler_options=FAST_COMPILE)
        finally:
            comp._hlo = saved
            comp._executable = None

    def run(self, compiled, inputs) -> list[np.ndarray]:
        from jax.sharding import NamedSharding

        mesh = self.cat.make_mesh(self.ex)
        placed = [jax.device_put(x, NamedSharding(mesh, spec))
                  for x, spec in zip(inputs, self.ex.in_specs, strict=True)]
        return [np.asarray(o) for o in jax.tree.leaves(compiled(*placed))]


class PartitionedSubject:
    """An `examples.partitioned` case: XLA's per-device program, run as replicas."""

    kind = "partitioned"

    def __init__(self, case):
        from entangle_mlir.mlir.ir import context, parse_module
        from examples import partitioned as part

        self.case, self.part = case, part
        self.name = "partitioned:" + case.name
        ref, sharded = part.lower(case)
        self.ref_text = ref
        with context():
            self.text = str(parse_module(sharded))
        self.args = [Arg(tuple(a.shape), str(a.dtype),
                         "index" if np.issubdtype(a.dtype, np.integer) else "data", high=6)
                     for a in case.avals()]

    def reference(self, inputs) -> list[np.ndarray]:
        from entangle_mlir.jax import expected_per_device

        with jax.set_mesh(self.part.mesh(self.case.mesh)):
            want = jax.jit(self.case.fn)(*inputs)
        want = [np.asarray(w) for w in jax.tree.leaves(want)]
        return [v for row in expected_per_device(self.text, want) for v in row]

    def compile(self, text: str):
        from entangle_mlir.evidence import as_replicas, compile_replicas
        from entangle_mlir.mlir.ir import context, parse_module
        from entangle_mlir.mlir.per_device import device_count, parameter_shardings
        from entangle_mlir.mlir.program import public_main

        module = parse_module(text)
        with context():
            main = public_main(module, "-")
            shardings = parameter_shardings(module, main)
            n = device_count(module, shardings)
            local = [tuple(a.type.shape) for a in main.regions[0].blocks[0].arguments]
            replicas = as_replicas(module, n)
        exe, devices = compile_replicas(replicas, n)
        return exe, devices, shardings, local

    def run(self, compiled, inputs) -> list[np.ndarray]:
        from entangle_mlir.evidence import device_blocks, local_block

        exe, devices, shardings, local = compiled
        n = len(devices)
        replicated = jax.sharding.NamedSharding(jax.sharding.Mesh(np.array(devices), ("r",)),
                                                jax.sharding.PartitionSpec())
        arrays = []
        for arg, sharding, shape in zip(inputs, shardings, local, strict=True):
            blocks = device_blocks(sharding, arg.shape, shape, n)
            shards = [jax.device_put(local_block(arg, blocks[d], shape), devices[d])
                      for d in range(n)]
            arrays.append(jax.make_array_from_single_device_arrays(shape, replicated, shards))
        outs = exe.execute_sharded(arrays).disassemble_into_single_device_arrays()
        return [np.asarray(outs[r][d]) for d in range(n) for r in range(len(outs))]


def catalog_subject(ex) -> ShardMapSubject:
    from examples import catalog

    args = [Arg(tuple(s), "float32", "weight" if len(s) == 2 else "data", fan_in=s[0])
            for s in ex.arg_shapes]
    return ShardMapSubject(ex, catalog, args)


def real_subject(ex) -> ShardMapSubject:
    from examples.real import catalog

    args = [Arg(tuple(a.shape), a.dtype, a.kind, a.high, a.fan_in) for a in ex.args]
    return ShardMapSubject(ex, catalog, args)


# ----- small programs whose values are the point: integers, compares, reducers, precision -----------

def attack_programs() -> list:
    """shard_map programs (examples.real.catalog Examples) with integer arithmetic, compare
    types, ties, reducers with regions and constants that a value mutation can break."""
    import jax.numpy as jnp
    from jax import lax
    from jax.sharding import PartitionSpec as P

    from examples.real.catalog import custom
    from examples.real.programs import ArgDef

    four = (("tp", 4),)

    def arg(name, shape, dtype, spec, kind="data", high=0):
        return ArgDef(name, shape, dtype, kind, spec, high)

    xi_cols = arg("x", (8, 16), "int32", P(None, "tp"))
    xi_rows = arg("x", (8, 16), "int32", P("tp", None))
    xf_cols = arg("x", (8, 16), "float32", P(None, "tp"))
    xf_rows = arg("x", (8, 16), "float32", P("tp", None))
    yf_rows = arg("y", (8, 16), "float32", P("tp", None))

    def int_sum_ref(x):
        return jnp.sum(x, axis=1)

    def int_sum(x):
        return lax.psum(jnp.sum(x, axis=1), "tp")

    def int_range_ref(x):
        return jnp.max(x, axis=1) - jnp.min(x, axis=1)

    def int_range(x):
        return lax.pmax(jnp.max(x, axis=1), "tp") - lax.pmin(jnp.min(x, axis=1), "tp")

    def count_pos_ref(x):
        return jnp.sum(x > 0, axis=1, dtype=jnp.int32)

    def count_pos(x):
        return lax.psum(jnp.sum(x > 0, axis=1, dtype=jnp.int32), "tp")

    def affine_ref(x):
        return x * 1000003 + 2147483000

    def floordiv_ref(x):
        return x // 7 + x % 5

    def select_ref(x, y):
        return jnp.where(x >= y, x, -y)

    def relu_ref(x):
        return jnp.where(x > 0, x, 0.0) + jnp.maximum(x, 0.0)

    def where_zero_ref(x):
        return jnp.where(x > 0, x, 0.0)

    def cumsum_ref(x):
        return lax.cumsum(x, axis=1)

    def fmax_ref(x):
        return jnp.max(x, axis=1)

    def fmax(x):
        return lax.pmax(jnp.max(x, axis=1), "tp")

    def mean_ref(x):
        return jnp.mean(x, axis=1)

    def mean(x):
        return lax.psum(jnp.sum(x, axis=1), "tp") / 16.0

    def iota_add_ref(x):
        return x + jnp.arange(16, dtype=jnp.int32)[None, :] * 3

    def iota_add(x):
        cols = lax.axis_index("tp") * 4 + jnp.arange(4, dtype=jnp.int32)
        return x + cols[None, :] * 3

    def causal_ref(x):
        i = jnp.arange(8)[:, None]
        j = jnp.arange(16)[None, :]
        return jnp.where(j <= 2 * i, x, jnp.float32(-1e9))

    def causal(x):
        i = jnp.arange(8)[:, None]
        j = lax.axis_index("tp") * 4 + jnp.arange(4)[None, :]
        return jnp.where(j <= 2 * i, x, jnp.float32(-1e9))

    def int_to_float_ref(x):
        return jnp.sum(x.astype(jnp.float32), axis=1)

    def int_to_float(x):
        return lax.psum(jnp.sum(x.astype(jnp.float32), axis=1), "tp")

    def argmax_ref(x):
        return jnp.argmax(x, axis=1).astype(jnp.int32)

    def unsigned_ref(x):
        u = x.astype(jnp.uint32)
        return (u >> 3).astype(jnp.int32) + (u < jnp.uint32(7)).astype(jnp.int32)

    def prod_ref(x):
        return jnp.prod(jnp.clip(x, -2, 2), axis=1)

    def prod(x):
        local = jnp.prod(jnp.clip(x, -2, 2), axis=1)
        return jnp.prod(lax.all_gather(local, "tp"), axis=0)

    def rounding_ref(x):
        return jnp.floor(x * 2.5) + jnp.round(x) + jnp.ceil(x)

    def shifts_ref(x):
        return (x >> 2) + (x.astype(jnp.uint32) >> 3).astype(jnp.int32)

    def log_exp_ref(x):
        return jnp.log1p(jnp.abs(x)) + jnp.expm1(jnp.minimum(x, 3.0)) + jnp.log(1 + x * x)

    def lse_ref(x):
        m = jnp.max(x, axis=1)
        return jnp.log(jnp.sum(jnp.exp(x - m[:, None]), axis=1)) + m

    def lse(x):
        m = lax.pmax(jnp.max(x, axis=1), "tp")
        return jnp.log(lax.psum(jnp.sum(jnp.exp(x - m[:, None]), axis=1), "tp")) + m

    def same(fn):
        return fn

    return [
        custom("atk_int_psum", four, int_sum_ref, int_sum, [xi_cols], P(), "int32 sum by psum"),
        custom("atk_int_range", four, int_range_ref, int_range, [xi_cols], P(),
               "int32 max - min by pmax / pmin"),
        custom("atk_count_pos", four, count_pos_ref, count_pos, [xf_cols], P(),
               "count of x > 0 (compare FLOAT, +-0) by psum"),
        custom("atk_int_affine", four, affine_ref, same(affine_ref), [xi_rows], P("tp", None),
               "int32 x * 1000003 + 2147483000 (wraps)"),
        custom("atk_int_floordiv", four, floordiv_ref, same(floordiv_ref), [xi_rows],
               P("tp", None), "int32 floor division and remainder"),
        custom("atk_select_ties", four, select_ref, same(select_ref), [xf_rows, yf_rows],
               P("tp", None), "where(x >= y, x, -y): ties"),
        custom("atk_relu_zero", four, relu_ref, same(relu_ref), [xf_rows], P("tp", None),
               "where(x > 0, x, 0) + max(x, 0): signed zeros"),
        custom("atk_where_zero", four, where_zero_ref, same(where_zero_ref), [xf_rows],
               P("tp", None), "where(x > 0, x, 0): the zero constant's sign reaches the output"),
        custom("atk_int_cumsum", four, cumsum_ref, same(cumsum_ref), [xi_rows], P("tp", None),
               "int32 cumsum on the unsharded dim (reduce_window)"),
        custom("atk_float_max", four, fmax_ref, fmax, [xf_cols], P(), "max by pmax"),
        custom("atk_mean", four, mean_ref, mean, [xf_cols], P(), "mean by psum / 16"),
        custom("atk_iota_offset", four, iota_add_ref, iota_add, [xi_cols], P(None, "tp"),
               "x + 3 * column index (iota + axis_index offset)"),
        custom("atk_causal_mask", four, causal_ref, causal, [xf_cols], P(None, "tp"),
               "a causal-like mask from iotas with the shard's column offset"),
        custom("atk_int_to_float", four, int_to_float_ref, int_to_float, [xi_cols], P(),
               "int32 -> f32 then summed (precision above 2^24)"),
        custom("atk_argmax_rows", four, argmax_ref, same(argmax_ref), [xf_rows], P("tp"),
               "argmax over the unsharded dim (a 2-operand reduce with compares)"),
        custom("atk_unsigned", four, unsigned_ref, same(unsigned_ref), [xi_rows], P("tp", None),
               "uint32 shift and unsigned compare"),
        custom("atk_rounding", four, rounding_ref, same(rounding_ref), [xf_rows], P("tp", None),
               "floor, round (half to even) and ceil: ties at .5"),
        custom("atk_shifts", four, shifts_ref, same(shifts_ref), [xi_rows], P("tp", None),
               "arithmetic and logical right shifts of int32 / uint32"),
        custom("atk_log_exp", four, log_exp_ref, same(log_exp_ref), [xf_rows], P("tp", None),
               "log1p / expm1 / log / exp elementwise"),
        custom("atk_logsumexp", four, lse_ref, lse, [xf_cols], P(),
               "max-shifted log-sum-exp by pmax and psum"),
        custom("atk_int_prod", four, prod_ref, prod, [xi_cols], P(),
               "int32 product (reduce multiply) over an all_gather"),
    ]


def subjects(sources=("attack", "catalog", "partitioned", "real"), only: str = "") -> list:
    """(source, name, factory) of every subject: factories build (lower) on demand."""
    out = []
    if "attack" in sources:
        for ex in attack_programs():
            out.append(("attack", ex.name, lambda ex=ex: real_subject(ex)))
    if "catalog" in sources:
        from examples.catalog import EXAMPLES

        for ex in EXAMPLES:
            if ex.bug is None:
                out.append(("catalog", ex.name, lambda ex=ex: catalog_subject(ex)))
    if "partitioned" in sources:
        from examples.partitioned import CASES

        for case in CASES:
            out.append(("partitioned", "partitioned:" + case.name,
                        lambda case=case: PartitionedSubject(case)))
    if "real" in sources:
        from examples.real.catalog import correct_examples

        for ex in correct_examples():
            out.append(("real", ex.name, lambda ex=ex: real_subject(ex)))
    return [s for s in out if only in s[1]]


def subject_by_name(name: str):
    for _, n, make in subjects():
        if n == name:
            return make()
    raise KeyError(name)


def subject_of(source: str, name: str):
    """The subject `name` of `source` (`subjects`' sources, or `twins`: `fuzz.twins`), built:
    how a child process rebuilds the subject whose mutants it executes (`Executor`)."""
    if source == "twins":
        from fuzz import twins  # (imports this module)

        found = twins.subjects(name)
    else:
        found = subjects((source,), name)
    for _, n, make in found:
        if n == name:
            return make()
    raise KeyError(f"{source}:{name}")


# ----- grounding and checking one mutant ----------------------------------------------------------

@dataclass
class AttackOutcome:
    subject: str
    kind: str
    mutation: str
    status: str
    numbers: str = ""        # differ / ulp / same / invalid
    inputs: str = ""         # the input sets on which the numbers differ
    message: str = ""
    seconds: float = 0.0
    text: str = ""

    def to_json(self) -> dict:
        return asdict(self)


def _bits(a: np.ndarray) -> np.ndarray:
    a = np.ascontiguousarray(a)
    return a.view(np.dtype(f"u{a.dtype.itemsize}")) if a.dtype.itemsize in (1, 2, 4, 8) else a


def numbers_differ(ref: list, base: list, got: list) -> str:
    """`differ`, `ulp` or `same`: the mutant's outputs `got` against the reference's and the
    unmutated sharded program's (see the module docstring)."""
    if len(got) != len(ref):
        return "differ"
    verdict = "same"
    for r, b, g in zip(ref, base, got, strict=True):
        r, b, g = np.asarray(r), np.asarray(b), np.asarray(g)
        if g.shape != r.shape:
            g = g[tuple(slice(0, n) for n in r.shape)] if g.ndim == r.ndim and all(
                x >= y for x, y in zip(g.shape, r.shape, strict=True)) else None
            if g is None:
                return "differ"
            b = b[tuple(slice(0, n) for n in r.shape)]
        if not np.issubdtype(g.dtype, np.floating) and g.dtype.name != "bfloat16":
            if not np.array_equal(g, b):
                return "differ"
            continue
        g32, r32 = g.astype(np.float64), r.astype(np.float64)
        if not np.all(np.isfinite(g32)) or not compare(r32, g32)[0]:
            return "differ"
        if not np.array_equal(_bits(g), _bits(b)) and not np.array_equal(_bits(g), _bits(r)):
            verdict = "ulp"
    return verdict


def _usable(ref: list, got: list) -> bool:
    """The unmutated program reproduces the reference on this input set (finite, exact ints)."""
    if len(ref) != len(got):
        return False
    for r, g in zip(ref, got, strict=True):
        r, g = np.asarray(r), np.asarray(g)
        if g.shape != r.shape:
            g = g[tuple(slice(0, n) for n in r.shape)]
        if np.issubdtype(r.dtype, np.floating) or r.dtype.name == "bfloat16":
            r64, g64 = r.astype(np.float64), g.astype(np.float64)
            if not (np.all(np.isfinite(r64)) and np.all(np.isfinite(g64))
                    and compare(r64, g64)[0]):
                return False
        elif not np.array_equal(r, g):
            return False
    return True


RUN_TIMEOUT = 120
"""Seconds a mutant's compilation and execution on every input set may take (`Executor`); a
mutant past it is `skipped` (a constant mutant of a loop's trip count, 3 -> 2^31 - 1, runs
for hours)."""


def _executor_main(conn, recipe: tuple[str, str], sets: list) -> None:
    """A child process's loop (`Executor`): rebuild the subject, then answer each (text,
    side) with `Grounded.numbers` of that mutant on `sets`, until None comes."""
    g = Grounded.__new__(Grounded)
    g.subject, g.sets, g.executor = subject_of(*recipe), sets, None
    conn.send("ready")
    while True:
        request = conn.recv()
        if request is None:
            return
        conn.send(g.numbers(*request))


class Executor:
    """Compiles and executes a subject's mutants in a child process with a time limit (a
    mutant may loop for hours; a call into XLA cannot be interrupted in this process). The
    child (spawned: jax's threads do not survive a fork) rebuilds the subject from `recipe`
    (`subject_of`) and takes the grounded input sets from this process; a mutant that does
    not finish within `timeout` seconds, or kills the child, is `skipped` and the child is
    killed (it is this object's own process) and started again for the next mutant."""

    def __init__(self, recipe: tuple[str, str], sets: list, timeout: float = RUN_TIMEOUT):
        self.recipe, self.sets, self.timeout = recipe, sets, timeout
        self.process = self.conn = None

    def _start(self) -> None:
        import multiprocessing

        context = multiprocessing.get_context("spawn")
        self.conn, child = context.Pipe()
        self.process = context.Process(target=_executor_main,
                                       args=(child, self.recipe, self.sets), daemon=True)
        self.process.start()
        child.close()
        if not self.conn.poll(self.timeout * 4) or self.conn.recv() != "ready":
            self.close()
            raise RuntimeError(f"the executor of {self.recipe} did not start")

    def numbers(self, text: str, side: str) -> tuple[str, str, str]:
        """`Grounded.numbers` of a mutant, run in the child; ("skipped", "", why) when it
        times out or the child dies."""
        if self.process is None:
            self._start()
        try:
            self.conn.send((text, side))
            if self.conn.poll(self.timeout):
                return self.conn.recv()
            why = f"execution timed out ({self.timeout:g} s)"
        except (EOFError, OSError) as err:
            why = f"the executing process died ({type(err).__name__})"
        self.close()
        return "skipped", "", why

    def close(self) -> None:
        """Stop the child: asked to end, killed if it does not."""
        if self.process is None:
            return
        try:
            self.conn.send(None)
        except (OSError, ValueError):
            pass
        self.process.join(2)
        if self.process.is_alive():
            self.process.kill()
            self.process.join()
        self.conn.close()
        self.process = self.conn = None


class Grounded:
    """A subject with its usable input sets, reference and unmutated outputs. With a `recipe`
    ((source, name): `subject_of`), mutants are compiled and executed by an `Executor` in a
    child process under `run_timeout` seconds; without, in this process, unlimited."""

    def __init__(self, subject, labels=INPUT_SETS, recipe: tuple[str, str] | None = None,
                 run_timeout: float = RUN_TIMEOUT):
        self.subject = subject
        base = subject.compile(subject.text)
        self.sets = []
        for label, inputs in input_sets(subject.args, labels):
            ref = subject.reference(inputs)
            got = subject.run(base, inputs)
            if _usable(ref, got):
                self.sets.append((label, inputs, ref, got))
        self.baseline, _, self.baseline_msg = timed_check(subject.ref_text, subject.text,
                                                          verify_rules=False)
        self.executor = None if recipe is None else Executor(recipe, self.sets, run_timeout)

    @property
    def proven(self) -> bool:
        return self.baseline is not None and self.baseline.proven

    def numbers(self, text: str, side: str = "sharded") -> tuple[str, str, str]:
        """(differ / ulp / same / invalid, the input sets that show it, error message) of a
        mutated sharded program, or (`side="reference"`) of a mutated reference; `skipped`
        when its `Executor` ran out of time."""
        if self.executor is not None:
            return self.executor.numbers(text, side)
        compile_, run = ((self.subject.compile, self.subject.run) if side == "sharded" else
                         (self.subject.compile_ref, self.subject.run_ref))
        try:
            compiled = compile_(text)
        except Exception as err:  # noqa: BLE001 - the mutant does not verify or compile
            return "invalid", "", f"{type(err).__name__}: {str(err)[:300]}"
        worst, where = "same", []
        rank = {"same": 0, "ulp": 1, "differ": 2}
        for label, inputs, ref, base in self.sets:
            try:
                got = run(compiled, inputs)
            except Exception as err:  # noqa: BLE001 - e.g. a result of another shape
                return "invalid", "", f"{type(err).__name__}: {str(err)[:300]}"
            v = numbers_differ(ref, base, got)
            if v != "same":
                where.append(f"{label}:{v}")
            if rank[v] > rank[worst]:
                worst = v
        return worst, ",".join(where), ""


def judge(g: Grounded, kind: str, desc: str, text: str, timeout: int = CHECK_TIMEOUT,
          keep_text: bool = False, side: str = "sharded") -> AttackOutcome:
    """Execute and check one mutant (of the sharded program, or of the reference when
    `side="reference"`: the reference must not be trusted unchecked); classify it."""
    start = time.perf_counter()
    out = AttackOutcome(g.subject.name, kind, desc, "", text=text if keep_text else "")
    ref_text, shd_text = ((g.subject.ref_text, text) if side == "sharded" else
                          (text, g.subject.text))
    out.numbers, out.inputs, msg = g.numbers(text, side)
    if out.numbers in ("invalid", "skipped"):
        out.status, out.message = out.numbers, msg
        out.seconds = time.perf_counter() - start
        return out
    differing = out.numbers in ("differ", "ulp")
    report, err, msg = timed_check(ref_text, shd_text, verify_rules=False, timeout=timeout)
    if report is not None and report.diagnostics:
        out.message = report.diagnostics[0].message[:400]
    elif err:
        out.message = msg[-1500:]
    if err in ("crash", "timeout"):
        out.status = err
    elif err == "input_error":
        out.status = "rejected" if differing else "input_error"
    elif report.proven and differing:
        again, err2, msg2 = timed_check(ref_text, shd_text, verify_rules=True, timeout=timeout)
        text2 = " ".join(d.message for d in again.diagnostics) if again is not None else msg2
        if again is not None and again.proven:
            out.status = "false_proof" if out.numbers == "differ" else "false_proof_ulp"
        elif err2 in ("crash", "timeout") or "_Timeout" in text2:
            # (`_Timeout`: the alarm of timed_check went off inside the Z3 instance check)
            out.status = "timeout" if err2 != "crash" else "crash"
            out.message = "the check with verify_rules=True: " + text2[-1500:]
        else:
            out.status = "caught_by_z3"
            out.message = (again.diagnostics[0].message[:400] if again is not None and
                           again.diagnostics else msg2[-400:])
    elif report.proven:
        out.status = "proven"
    elif differing:
        out.status = "caught"
    else:
        out.status = "incomplete"
    if out.status in ("false_proof", "false_proof_ulp", "crash", "timeout"):
        out.text = text
    out.seconds = time.perf_counter() - start
    return out


def sample_sites(text: str, per_kind: int | None, seed: int = 0, kinds=None, select=None):
    """The value mutation sites of `text` (those `select(site)` keeps), at most `per_kind` of
    each kind (a seeded sample)."""
    sites = [s for s in value_sites(text, kinds) if select is None or select(s)]
    if per_kind is None:
        return sites
    by_kind: dict[str, list] = {}
    for s in sites:
        by_kind.setdefault(s.kind, []).append(s)
    rng = random.Random(seed)
    out = []
    for kind in VALUE_KINDS:
        group = by_kind.get(kind, [])
        out += group if len(group) <= per_kind else rng.sample(group, per_kind)
    return out


def attack(subject, per_kind: int | None = None, kinds=None, timeout: int = CHECK_TIMEOUT,
           seed: int = 0, labels=INPUT_SETS, keep_text: bool = False,
           select=None, sides=("sharded",), recipe: tuple[str, str] | None = None,
           run_timeout: float = RUN_TIMEOUT) -> tuple[Grounded, list[AttackOutcome]]:
    """Ground a subject and judge (a sample of) its value mutants: of the sharded program,
    and with `"reference" in sides` of the reference (kinds `ref:<kind>`; shard_map subjects).
    With a `recipe` (the subject's (source, name)) each mutant runs under `run_timeout`
    seconds in a child process (`Executor`)."""
    g = Grounded(subject, labels, recipe, run_timeout)
    results = []
    try:
        for side in sides:
            if side == "reference" and not hasattr(subject, "compile_ref"):
                continue
            text0 = subject.text if side == "sharded" else subject.ref_text
            prefix = "" if side == "sharded" else "ref:"
            for site in sample_sites(text0, per_kind, seed, kinds, select):
                text = site.text()
                if text is not None:
                    results.append(judge(g, prefix + site.kind, site.desc, text, timeout,
                                         keep_text, side))
    finally:
        if g.executor is not None:
            g.executor.close()
    return g, results


STATUSES = ("invalid", "skipped", "caught", "rejected", "caught_by_z3", "false_proof", "false_proof_ulp",
            "proven", "incomplete", "input_error", "crash", "timeout")


def score(outcomes) -> dict:
    """Counts per status, and the derived columns of the attack table."""
    c = Counter(o.status if isinstance(o, AttackOutcome) else o["status"] for o in outcomes)
    numbers = Counter(o.numbers if isinstance(o, AttackOutcome) else o["numbers"]
                      for o in outcomes)
    return {
        "mutants": sum(c.values()),
        "invalid": c["invalid"] + c["skipped"],
        "skipped": c["skipped"],
        "differing": numbers["differ"] + numbers["ulp"],
        "differing_ulp": numbers["ulp"],
        "caught": c["caught"] + c["rejected"] + c["caught_by_z3"],
        "caught_by_z3": c["caught_by_z3"],
        "false_proofs": c["false_proof"] + c["false_proof_ulp"],
        "false_proofs_ulp": c["false_proof_ulp"],
        "equivalent_proven": c["proven"],
        "equivalent_not_proven": c["incomplete"] + c["input_error"],
        "crashes": c["crash"] + c["timeout"],
        "differing_crashed": sum(1 for o in outcomes if (
            o.status if isinstance(o, AttackOutcome) else o["status"]) in ("crash", "timeout")
            and (o.numbers if isinstance(o, AttackOutcome) else o["numbers"]) != "same"),
    }
