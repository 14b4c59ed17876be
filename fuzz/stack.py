"""Repeated layer stacks for fuzzing whole-layer reuse (`entangle_mlir/analysis/layer_reuse.py`).

A *stack* repeats one random chain (`gen.step` factories, fixed up back to the input's shape
and layout) K = 3..6 times over the running value, as a Python loop would: `x = chain(x)` or
the residual `x = x + chain(x)` (either operand order), each copy with its own parameters,
all copies sharing one set, or each copy slicing its part `w[i]` of stacked parameters.

A correct stack has every copy correct. A mutant changes exactly one copy on the sharded side:
one of gen's layer mutations inside that copy (a dropped or retargeted collective, a scale
factor, a constant, ...), the copy reading another copy's parameters or the input of an
earlier copy, or another sharding of one of its own parameters. Whole-layer reuse must never
prove such a mutant when its numbers differ.

Nothing here imports jax; `run_case` (which does) lowers, executes and checks a stack.
"""

from __future__ import annotations

import copy as _copy
import math
from dataclasses import dataclass, replace

from fuzz.gen import (
    AXIS_NAMES_1D,
    AXIS_NAMES_2D,
    MESH_SHAPES,
    WEIGHTS,
    Arg,
    Chooser,
    Gen,
    GenOptions,
    Layer,
    MeshSpec,
    Program,
    State,
    _tame,
    fixup,
    layer_mutations,
    num,
    spec_str,
    step,
)

SHAPE_CHANGING = ("reshape", "transpose", "slice", "concat", "pad", "gram", "reduce", "take")
"""Constructs that change the running value's shape: left out of a stack's chain (a chain
must map the state to itself); einsum stays in and chains that end in another shape are
drawn again."""

CHAIN_WEIGHTS: dict[str, float] = {k: (0 if k in SHAPE_CHANGING else w)
                                   for k, w in WEIGHTS.items()}

PARAM_MODES = ("own", "shared", "stacked")


@dataclass
class Copy(Layer):
    """One copy of the chain. `p`: index (the copy's number), residual, order ("xy": x + y,
    "yx": y + x), halve (x * 0.5 after a residual add), prologue (the lines that bind this
    copy's parameters). `m` (sharded side only): src (read the input of copy `src` instead
    of the running value), prologue (other parameters)."""

    def emit(self, side: str, v: str, depth: int = 0) -> list[str]:
        p = self.params(side)
        lines = [f"# copy {p['index']}", f"x_in{p['index']} = {v}"] + list(p["prologue"])
        src = v if p.get("src") is None else f"x_in{p['src']}"
        if not p["residual"]:
            if src != v:
                lines.append(f"{v} = {src}")
            for layer in self.sub:
                lines += layer.emit(side, v, depth + 1)
            return lines
        y = "y"
        lines.append(f"{y} = {src}")
        for layer in self.sub:
            lines += layer.emit(side, y, depth + 1)
        lines.append(f"{v} = {v} + {y}" if p["order"] == "xy" else f"{v} = {y} + {v}")
        if p.get("halve"):
            lines.append(f"{v} = {v} * {num(0.5)}")
        return lines


@dataclass
class Stack(Program):
    """A Program whose layers are `Copy` layers; stacked parameters are named `w{j}` in the
    function's signature and bound to `a{j} = w{j}[i]` in copy i's prologue."""

    param_mode: str = "own"
    stacked: tuple[int, ...] = ()
    chain_args: int = 0
    """Parameters one copy reads (a{1}..a{chain_args} in the chain as generated)."""
    copies: int = 0
    residual: bool = False

    def function_source(self, side: str) -> str:
        name = "reference" if side == "ref" else "body"
        params = ", ".join(f"w{i}" if i in self.stacked else f"a{i}"
                           for i in range(len(self.args)))
        lines = [f"def {name}({params}):", "    x = a0"]
        for layer in self.layers:
            lines += ["    " + ln for ln in layer.emit(side, "x")]
        lines.append("    return x")
        return "\n".join(lines)

    def copy_args(self, c: int) -> list[int]:
        """The program arguments copy c reads (its own, in the `own` mode)."""
        if self.param_mode == "own":
            return list(range(1 + c * self.chain_args, 1 + (c + 1) * self.chain_args))
        return list(range(1, 1 + self.chain_args))


def _remap(layers: list[Layer], mapping: dict[int, int]) -> list[Layer]:
    out = []
    for layer in layers:
        layer = _copy.deepcopy(layer)
        if "arg" in layer.p:
            layer.p["arg"] = mapping[layer.p["arg"]]
        if layer.sub:
            layer.sub = _remap(layer.sub, mapping)
        out.append(layer)
    return out


def _chain(ch: Chooser, mesh: MeshSpec, shape, spec, opts: GenOptions, tries: int = 20):
    """(gen, chain layers) mapping a clean value of `shape`/`spec` to itself, or None."""
    for _ in range(tries):
        g = Gen(ch, mesh, opts)
        g.new_arg(shape, spec)
        s0 = State(tuple(shape), tuple(spec), mag=4.0)
        s = s0
        layers: list[Layer] = []
        for _ in range(ch.randint(2, opts.max_layers)):
            out = step(g, s)
            if out:
                layers += out[0]
                s = out[1]
            tame, s = _tame(g, s)
            layers += tame
        if s.shape != s0.shape:
            continue
        fix, s = fixup(g, s, s0.spec)
        layers += fix
        tame, s = _tame(g, s)
        layers += tame
        if s.shape == s0.shape and s.spec == s0.spec and s.clean() and len(layers) >= 2:
            return g, layers
    return None


def generate_stack(ch: Chooser, seed=None, max_layers: int = 5,
                   param_mode: str | None = None, residual: bool | None = None,
                   copies: int | None = None) -> Stack | None:
    """A random correct stack (None when no chain maps the drawn state to itself)."""
    opts = GenOptions(max_layers=max_layers, weights=dict(CHAIN_WEIGHTS))
    sizes = ch.choice(MESH_SHAPES)
    names = (ch.choice(AXIS_NAMES_1D),) if len(sizes) == 1 else ch.choice(AXIS_NAMES_2D)
    mesh = MeshSpec(tuple(names), tuple(sizes))
    rank = ch.weighted([1, 2, 3], [1, 4, 3])
    shape = tuple(ch.weighted([2, 4, 8, 16], [1, 2, 4, 4]) for _ in range(rank))
    while math.prod(shape) > 512:
        shape = shape[:-1]
    spec = Gen(ch, mesh, opts).random_spec(shape, mesh.names, p=0.75)
    found = _chain(ch, mesh, shape, spec, opts)
    if found is None:
        return None
    g, chain = found
    k = copies or ch.randint(3, 6)
    mode = param_mode or ch.choice(PARAM_MODES)
    res = ch.chance(0.5) if residual is None else residual
    order = ch.choice(["xy", "yx"])
    m = len(g.args) - 1
    if m == 0 and mode != "shared":
        mode = "shared"
    args: list[Arg] = [g.args[0]]
    if mode == "own":
        for _ in range(k):
            args += g.args[1:]
    elif mode == "shared":
        args += g.args[1:]
    else:
        args += [Arg((k,) + a.shape, ((),) + a.spec, a.init, a.fan) for a in g.args[1:]]
    layers: list[Layer] = []
    for c in range(k):
        if mode == "own":
            sub = _remap(chain, {j: j + c * m for j in range(1, m + 1)})
        else:
            sub = _copy.deepcopy(chain)
        prologue = [f"a{j} = w{j}[{c}]" for j in range(1, m + 1)] if mode == "stacked" else []
        layers.append(Copy("copy", {"index": c, "residual": res, "order": order,
                                    "halve": res, "prologue": prologue}, sub=sub))
    constructs = tuple(g.constructs) + (f"params:{mode}", "residual" if res else "chain",
                                        f"K={k}")
    return Stack(mesh, args, layers, tuple(spec), tuple(shape), seed=seed,
                 constructs=constructs, param_mode=mode,
                 stacked=tuple(range(1, m + 1)) if mode == "stacked" else (),
                 chain_args=m, copies=k, residual=res)


Mutation = tuple[str, object]


def copy_mutations(stack: Stack, c: int) -> list[Mutation]:
    """Mutations of copy c alone (sharded side)."""
    out: list[Mutation] = []
    for path, layer in stack.all_layers():
        if path[0] != c or len(path) < 2:
            continue
        for desc, apply in layer_mutations(stack, path, layer):
            out.append((f"copy {c}: {desc}", apply))
    copy_layer = stack.layers[c]
    for src in (c - 1, c - 2):
        if src >= 0:
            out.append((f"copy {c} reads the input of copy {src}",
                        _copy_override(c, copy_layer, src=src)))
    m = stack.chain_args
    if m and stack.param_mode != "shared" and c >= 1:
        other = c - 1
        if stack.param_mode == "stacked":
            prologue = [f"a{j} = w{j}[{other}]" for j in range(1, m + 1)]
        else:
            mine, theirs = stack.copy_args(c), stack.copy_args(other)
            prologue = [f"a{a} = a{b}" for a, b in zip(mine, theirs)]
        out.append((f"copy {c} reads copy {other}'s parameters",
                    _copy_override(c, copy_layer, prologue=prologue)))
    if stack.param_mode == "own":
        for i in stack.copy_args(c):
            spec = stack.args[i].spec
            for d, axes in enumerate(spec):
                if axes:
                    v = list(spec)
                    v[d] = ()
                    desc = (f"copy {c}: in_specs[{i}] {spec_str(tuple(v))} instead of "
                            f"{spec_str(spec)}")
                    out.append((desc, _spec_override(i, tuple(v))))
    return out


def _copy_override(c: int, layer: Copy, **changes):
    def apply(stack: Stack) -> Stack:
        layers = list(stack.layers)
        layers[c] = replace(layer, m={**layer.m, **changes})
        return replace(stack, layers=layers)
    return apply


def _spec_override(i: int, spec):
    def apply(stack: Stack) -> Stack:
        return replace(stack, shard_in_specs={**stack.shard_in_specs, i: spec})
    return apply


def mutate_stack(stack: Stack, ch: Chooser) -> Stack | None:
    """A mutant changing one random copy of `stack` on the sharded side."""
    c = ch.randint(0, stack.copies - 1)
    muts = copy_mutations(stack, c)
    if not muts:
        return None
    special = [mu for mu in muts if "reads" in mu[0] or "in_specs" in mu[0]]
    pool = special if special and ch.chance(0.3) else muts
    desc, apply = ch.choice(pool)
    return replace(apply(stack), mutation=desc)


# ----------------------------------------------------------------------------------------------
# Running (imports jax)
# ----------------------------------------------------------------------------------------------


@dataclass
class Case:
    """One checked stack: the grounded verdict and whether whole-layer reuse fired."""

    seed: object
    mutation: str | None
    status: str
    """proven | false_proof | caught | incomplete | rejected | input_error | crash | timeout
    | invalid | nonfinite | flaky (as in `fuzz.run`)."""
    reused: str = ""
    """report.stats["layers reused"] (only present when proven with reuse)."""
    error: float = 0.0
    message: str = ""
    seconds: float = 0.0
    constructs: tuple = ()
    source: str = ""
    fired: tuple[int, int] = (0, 0)
    """Regions the reference and the sharded walk summarized in the reuse walk (whatever its
    verdict; `reused` is only set when that walk proved the pair)."""


def reuse_fired(ref_text: str, shd_text: str) -> tuple[int, int]:
    """(reference, sharded) regions summarized by a walk with whole-layer reuse on."""
    from entangle_mlir.mlir.ir import context, parse_module
    from entangle_mlir.mlir.program import from_two_modules
    from entangle_mlir.passes import PASSES
    from entangle_mlir.passes.pipeline import PassState, parse_pipeline, run_pipeline

    try:
        program = from_two_modules(parse_module(ref_text), parse_module(shd_text),
                                   "reference.mlir", "sharded.mlir")
        state = PassState(program.sharded_module, program.sharded_file, program=program)
        with context():
            run_pipeline(parse_pipeline("entangle-normalize,entangle-import-shardings,"
                                        "entangle-infer-relations{annotate=false "
                                        "reuse-layers=true}", PASSES), state)
    except Exception:  # noqa: BLE001 - the check proper reports it
        return (0, 0)
    return (state.layers_reused.get("reference", 0), state.layers_reused.get("sharded", 0))


def run_case(prog: Program, ref_cache: dict | None = None, verify_rules: bool = True,
             timeout: int = 120) -> Case:
    """Lower, execute on 8 simulated CPU devices, and check one stack; classify it."""
    import time

    import jax
    import numpy as np

    from fuzz import run as R

    start = time.perf_counter()
    case = Case(prog.seed, prog.mutation, "", constructs=prog.constructs, source=prog.source())
    try:
        ref_fn, sharded = R.build(prog)
        key = (prog.seed, prog.function_source("ref"))
        cache = ref_cache if ref_cache is not None else {}
        if key not in cache:
            cache[key] = (R.lower_reference(ref_fn, prog), {})
        ref_text, outs = cache[key]
        lowered = sharded.lower(*R.sharded_avals(prog))
        shd_text = lowered.as_text(debug_info=True)

        def ref_out(k: int):
            if k not in outs:
                outs[k] = np.asarray(jax.jit(ref_fn)(*R.inputs(prog, k)))
            return outs[k]

        ref = ref_out(0)
        shd = R.run_sharded(sharded, prog, R.inputs(prog, 0))
    except Exception as err:  # noqa: BLE001 - jax rejects the program: not a checker problem
        case.status = "invalid" if not prog.correct else "gen_error"
        case.message = f"{type(err).__name__}: {str(err)[:300]}"
        case.seconds = time.perf_counter() - start
        return case
    finite = bool(np.all(np.isfinite(ref))) and bool(np.all(np.isfinite(shd)))
    match, err = R.compare(ref, shd) if finite else (None, 0.0)
    case.error = err

    def recheck() -> list[bool]:
        return [R.compare(ref_out(k), R.run_sharded(sharded, prog, R.inputs(prog, k)))[0]
                for k in (1, 2)]

    classify(case, ref_text, shd_text, match, recheck, verify_rules, timeout,
             mutant=not prog.correct)
    case.seconds = time.perf_counter() - start
    return case


def run_partitioned_stack(stack: Stack, mutants: int = 3, verify_rules: bool = True,
                          timeout: int = 120) -> list[Case]:
    """The per-device path: the stack's reference jitted with its shardings and partitioned
    by XLA (every copy lowered the same way), then `mutants` single-op text mutants of that
    program (`mlir_mutate.mutants`: a dropped or duplicated collective, other replica groups,
    another constant, ...), each in one place, so in one copy at most. Each is executed per
    device and checked like `run_case`."""
    import random
    import time

    import jax
    import numpy as np
    from jax.sharding import NamedSharding

    from entangle_mlir.jax import lower_partitioned
    from entangle_mlir.mlir.ir import context, parse_module
    from fuzz import run as R
    from fuzz.mlir_mutate import mutants as text_mutants
    from fuzz.partitioned import _per_device_match

    start = time.perf_counter()
    base = Case(stack.seed, None, "", constructs=stack.constructs + ("per-device",),
                source=stack.source())
    try:
        ref_fn, _ = R.build(stack)
        mesh = R.jax_mesh(stack.mesh)
        with jax.set_mesh(mesh):
            ref_text, shd = lower_partitioned(
                ref_fn, *R.sharded_avals(stack),
                out_shardings=NamedSharding(mesh, R.pspec(stack.out_spec)))
        with context():
            text = parse_module(shd).operation.get_asm(enable_debug_info=True)
        args = R.inputs(stack, 0)
        ref_out = np.asarray(jax.jit(ref_fn)(*args))
        match, base.error = _per_device_match(text, args, ref_out)
    except Exception as err:  # noqa: BLE001 - jax / XLA / the executor, not entangle
        base.status = "gen_error"
        base.message = f"{type(err).__name__}: {str(err)[:300]}"
        return [base]

    def judge(case: Case, program_text: str, match) -> None:
        def recheck() -> list[bool]:
            return [bool(_per_device_match(program_text, a, np.asarray(jax.jit(ref_fn)(*a)))[0])
                    for a in (R.inputs(stack, k) for k in (1, 2))]

        classify(case, ref_text, program_text, match, recheck, verify_rules, timeout)

    judge(base, text, match)
    base.seconds = time.perf_counter() - start
    results = [base]
    rng = random.Random(hash(("per-device", stack.seed)) & 0xFFFFFFFF)
    pool = list(text_mutants(text))
    rng.shuffle(pool)
    pool.sort(key=lambda m: not any(w in m[0] for w in (
        "all_reduce", "all_gather", "reduce_scatter", "all_to_all", "collective_permute",
        "partition_id", "dynamic_slice", "constant")) or rng.random() < 0.3)
    for desc, mtext in pool:
        if len(results) > mutants:
            break
        case = Case(stack.seed, f"per-device: {desc}", "", constructs=base.constructs)
        t = time.perf_counter()
        try:
            m_match, case.error = _per_device_match(mtext, args, ref_out)
        except Exception:  # noqa: BLE001, S112 - the mutant does not verify or compile
            continue
        judge(case, mtext, m_match)
        if case.status in ("false_proof", "crash", "timeout", "flaky"):
            case.source = stack.source() + "\n# --- mutated per-device program:\n" + mtext
        case.seconds = time.perf_counter() - t
        results.append(case)
    return results


def classify(case: Case, ref_text: str, program_text: str, match, recheck,
             verify_rules: bool, timeout: int, mutant: bool = False) -> None:
    """Check `program_text` against `ref_text` and set the case's status. `match`: whether the
    numbers agree (None: not finite); `recheck()`: the agreement on two more inputs, asked
    only for a proof whose numbers differ (all agreeing: flaky, else a false proof); a
    `mutant` whose signature lost parameters it no longer reads is invalid, not rejected."""
    from fuzz import run as R

    case.fired = reuse_fired(ref_text, program_text)
    report, kind, msg = R.timed_check(ref_text, program_text, verify_rules=verify_rules,
                                      timeout=timeout)
    proven = report is not None and report.proven
    if report is not None:
        case.reused = str(report.stats.get("layers reused", ""))
        case.message = report.diagnostics[0].message if report.diagnostics else ""
    else:
        case.message = msg
    if kind in ("crash", "timeout"):
        case.status = kind
    elif match is None:
        case.status = "nonfinite"
    elif kind == "input_error" and mutant and "arguments but" in msg:
        case.status = "invalid"  # jit dropped the parameters a mutant no longer reads
    elif kind == "input_error":
        case.status = "rejected" if not match else "input_error"
    elif proven and not match:
        case.status = "flaky" if all(recheck()) else "false_proof"
    elif proven:
        case.status = "proven"
    else:
        case.status = "incomplete" if match else "caught"
