"""How `entangle check` scales: one command, one table, the targets' ratios from the same run.

    python benchmarks/scaling.py            # everything (about 10 minutes here, mostly XLA)
    python benchmarks/scaling.py --quick    # a subset: GPT-2 1/8 layers at tp 2/8, meshes 8/64
    python benchmarks/scaling.py --only gpt2 mesh --no-xla
    python benchmarks/scaling.py --spelling megatron --quick   # vocab-parallel embedding rows

Rows (GPT-2 widths: hidden 768, seq 128, 16 heads of 48 since tp 8 must split the heads;
Llama-3-8B widths: hidden 4096, 32 q heads, 8 kv heads of 128, FFN 14336, vocab 128256):

* `trivial`: one elementwise op under shard_map (startup cost);
* `gpt2 L<l> tp<t>`: GPT-2 forward, l layers, Megatron tp t (shard_map), l in 1/2/4/8/32;
* `gpt2 L8 tp8 xla`: the same program partitioned by XLA (jit with shardings), per device;
* `mesh <n>`: GPT-2 forward, 4 layers, on a dp x tp mesh of n = 8/64/512 devices (tp 8);
* `llama8b ...`: Llama-3-8B widths, 32 layers, dp 2 x tp 8, a training step (forward,
  backward, optimizer): `stack_sgd` (the layers, SGD) and `adamw` (the whole model, AdamW).

`--spelling megatron` (issue 18): the whole models of examples/real (token ids in, logits out:
the `fwd` task) with the vocab-parallel embedding and LM head spelled the common Megatron way,
`Par(vocab=True, vocab_clip=True)` (`local = ids - start; mask = (local >= 0) & (local < n);
take(w, clip(local, 0, n - 1)); where(mask, ., 0); psum`). The rows keep their names, so the
targets read the same: `gpt2 L<l> tp<t>` is GPT-2 (widths above, FFN 3072, vocab 50304),
`mesh <n>` GPT-2 4 layers on dp n/8 x tp 8 (one sequence a dp rank), and `llama3 L<l> tp<t>` /
`llama3 mesh <n>` the same for Llama-3 at 8B widths. Each row also in XLA's per-device form
(`... xla`, `--forms`): the same unsharded model jitted with Megatron's weight shardings, the
embedding that lookup as a shard_map library function, XLA partitioning the rest
(examples/real/xla_form.py).

Each check runs as its own process, `entangle check REF SHARDED` (what the console script runs,
plus a read of its own peak RSS at exit), so its wall time includes start-up, parsing, inference
and every run-time Z3 rule-instance check, and its peak RSS excludes the jax process that lowered
the programs. Columns: wall and CPU seconds, peak RSS, ops in the sharded program, rule instances
proved by Z3 (`+Ns`: N skipped as too large), the verdict, and XLA's time to compile the same
sharded program here (`jitted.lower(...).compile()`, in this process) with the ratio. The machine
is shared: each check runs `--repeat` times (3) and the least wall and least CPU time are kept
(other jobs only ever add time; one run per row varied 2x between runs), the load average is
printed, and targets are judged on wall time and, when the load inflates it, on CPU time (said
so).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

MAX_DEVICES = 512
os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                           f" --xla_force_host_platform_device_count={MAX_DEVICES}").strip()

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import jax
import jax.numpy as jnp
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

from benchmarks.gpt2_scaling import BATCH, HIDDEN, SEQ, SHAPES, SPECS, block, programs


@dataclass
class Case:
    """One benchmark row: `build()` returns (reference text, sharded program as text or
    bytecode, the jitted sharded function, its avals)."""

    name: str
    group: str
    build: Callable[[], tuple]
    row: dict = field(default_factory=dict)


# ----- programs -------------------------------------------------------------------------------

def _mesh(shape: tuple[int, ...], names: tuple[str, ...]):
    return jax.make_mesh(shape, names, axis_types=(AxisType.Auto,) * len(names),
                         devices=jax.devices()[:_prod(shape)])


def _prod(shape) -> int:
    out = 1
    for s in shape:
        out *= s
    return out


def gpt2_shard_map(layers: int, tp: int, dp: int = 0):
    """GPT-2 forward under Megatron tp (and dp over the batch when dp > 0), lowered."""
    from entangle_mlir.jax import lower_pair

    ref, sharded, avals = programs(layers, tp, dp)
    ref_text, sharded_text = lower_pair(ref, sharded, *avals)
    return ref_text, sharded_text, sharded, avals


def gpt2_partitioned(layers: int, tp: int):
    """The GPT-2 forward jitted with Megatron weight shardings: XLA's per-device program."""
    from entangle_mlir.jax import lower_partitioned

    mesh = _mesh((tp,), ("tp",))
    count = len(SHAPES)

    def model(x, *params):
        for i in range(layers):
            x = block(x, params[i * count:(i + 1) * count], lambda v: v)
        return x

    specs = (P(),) + tuple(SPECS) * layers
    shapes = [(BATCH, SEQ, HIDDEN)] + SHAPES * layers
    avals = [jax.ShapeDtypeStruct(s, jnp.float32, sharding=NamedSharding(mesh, spec))
             for s, spec in zip(shapes, specs)]
    jitted = jax.jit(model, out_shardings=NamedSharding(mesh, P()))
    ref_text, per_device = lower_partitioned(jitted, *avals)
    return ref_text, per_device, jitted, avals


GPT2_REAL = {"d_model": HIDDEN, "n_heads": 16, "n_kv_heads": 16, "head_dim": HIDDEN // 16,
             "d_ff": 4 * HIDDEN, "vocab": 50304, "seq": SEQ}


def real_model(model: str, layers: int, tp: int, dp: int = 0):
    """examples/real's GPT-2 or Llama-3 forward (ids to logits) with the vocab-parallel
    embedding and LM head in Megatron's clip-and-mask spelling, lowered."""
    from examples.real.catalog import _avals, program, sharded_fn
    from examples.real.catalog import lower_pair as real_lower_pair
    from examples.real.models.config import Config
    from examples.real.models.par import Par

    widths = GPT2_REAL if model == "gpt2" else {**LLAMA_8B, "seq": SEQ}
    cfg = Config(**{**widths, "batch": max(dp, 1), "n_layers": layers})
    axes = ((("dp", dp),) if dp else ()) + (("tp", tp),)
    par = Par(tp="tp", dp="dp" if dp else None, vocab=True, vocab_clip=True)
    ex = program(model, "fwd", par, axes, "tp + vocab (Megatron spelling)", cfg=cfg)
    ref_text, sharded_text = real_lower_pair(ex)
    return ref_text, sharded_text, sharded_fn(ex), _avals(ex, True)


def real_model_partitioned(model: str, layers: int, tp: int, dp: int = 0):
    """`real_model` in XLA's per-device form (examples/real/xla_form.py): the unsharded
    forward jitted with Megatron's weight shardings, the embedding the Megatron-spelled lookup
    as a shard_map library function; XLA partitions the rest."""
    from examples.real.models.config import Config
    from examples.real.xla_form import lower_xla_pair, xla_form

    widths = GPT2_REAL if model == "gpt2" else {**LLAMA_8B, "seq": SEQ}
    form = xla_form(model, Config(**{**widths, "batch": max(dp, 1), "n_layers": layers}), dp, tp)
    ref_text, per_device = lower_xla_pair(form)
    return ref_text, per_device, form.jitted(), form.avals


def trivial(tp: int = 8):
    from entangle_mlir.jax import lower_pair

    mesh = _mesh((tp,), ("tp",))
    sharded = jax.jit(jax.shard_map(lambda x: x * 2.0, mesh=mesh, in_specs=P("tp"),
                                    out_specs=P("tp")))
    avals = [jax.ShapeDtypeStruct((8 * tp, 4), jnp.float32,
                                  sharding=NamedSharding(mesh, P("tp")))]
    ref_text, sharded_text = lower_pair(lambda x: x * 2.0, sharded, *avals)
    return ref_text, sharded_text, sharded, avals


LLAMA_8B = {"d_model": 4096, "n_heads": 32, "n_kv_heads": 8, "head_dim": 128, "d_ff": 14336,
            "vocab": 128256, "n_layers": 32}


def llama8b(task: str, layers: int = 32, dp: int = 2, tp: int = 8):
    from examples.real.catalog import _avals, program, sharded_fn
    from examples.real.catalog import lower_pair as real_lower_pair
    from examples.real.models.config import Config
    from examples.real.models.par import Par

    cfg = Config(batch=dp, seq=128, **{**LLAMA_8B, "n_layers": layers})
    ex = program("llama3", task, Par(dp="dp", tp="tp", vocab=True), (("dp", dp), ("tp", tp)),
                 "dp x tp", cfg=cfg)
    ref_text, sharded_text = real_lower_pair(ex)
    return ref_text, sharded_text, sharded_fn(ex), _avals(ex, True)


# ----- measuring --------------------------------------------------------------------------------

def _child_env() -> dict:
    """The checker's environment: no jax device flags; bytecode cached outside the tree (as an
    installed package has it), so start-up is not recompiling sources on every run."""
    env = dict(os.environ)
    env.pop("XLA_FLAGS", None)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env.setdefault("PYTHONPYCACHEPREFIX", str(Path(tempfile.gettempdir()) / "entangle-pycache"))
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    return env


_LAUNCHER = """
import sys
from entangle_mlir.cli import exit_now, main
code = main(sys.argv[1:])
with open("/proc/self/status") as status:
    peak = next(line.split()[1] for line in status if line.startswith("VmHWM:"))
sys.stderr.write(f"\\nentangle-peak-rss-kib {peak}\\n")
exit_now(code)
"""
"""`entangle check` (what the console script runs, its exit included: `cli.entry`), then its
own peak RSS from VmHWM: wait4's ru_maxrss would include the forked copy of this (jax)
process before exec."""


def run_check(ref_path: Path, sharded_path: Path, options: Sequence[str] = ()) -> dict:
    """Run `entangle check [OPTIONS]` in a fresh process (the text report, as a user runs it):
    wall and CPU seconds, peak RSS, verdict (exit code) and rule instances (its "rule checks"
    line)."""
    command = [sys.executable, "-c", _LAUNCHER, "check", *options, str(ref_path),
               str(sharded_path)]
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        start = time.perf_counter()
        child = subprocess.Popen(command, stdout=out, stderr=err, env=_child_env())
        _, status, usage = os.wait4(child.pid, 0)  # this child's own rusage (CPU, peak RSS)
        wall = time.perf_counter() - start
        child.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        text, errors = out.read(), err.read()
    peak = [line.split()[1] for line in errors.decode().splitlines()
            if line.startswith("entangle-peak-rss-kib")]
    verdict = {0: "proven", 1: "not proven", 3: "inconclusive"}.get(child.returncode,
                                                                    "bad input")
    if child.returncode not in (0, 1, 3):
        print(f"entangle failed: {errors.decode()[-300:]}", file=sys.stderr)
    line = next((x for x in text.decode().splitlines() if x.startswith("rule checks:")), "")
    proved, skipped = re.search(r"(\d+) proved", line), re.search(r"(\d+) skipped", line)
    return {"wall_s": wall, "cpu_s": usage.ru_utime + usage.ru_stime,
            "rss_mib": int(peak[0]) / 1024 if peak else float("nan"),
            "ops": count_ops(sharded_path), "verdict": verdict,
            "proved": int(proved.group(1)) if proved else 0,
            "skipped": int(skipped.group(1)) if skipped else 0,
            "first_error": next((x for x in text.decode().splitlines() if ": error: " in x),
                                "")}


def count_ops(path: Path) -> int:
    """Operations in the sharded program (inside functions, the functions not counted)."""
    from jaxlib.mlir import ir

    from entangle_mlir.mlir.ir import context
    from entangle_mlir.mlir.load import load_file

    count = 0

    def visit(op):
        nonlocal count
        count += op.name not in ("builtin.module", "func.func")
        return ir.WalkResult.ADVANCE

    with context():
        load_file(str(path)).operation.walk(visit)
    return count


def xla_compile_seconds(jitted, avals) -> float:
    start = time.perf_counter()
    jitted.lower(*avals).compile()
    return time.perf_counter() - start


def measure(case: Case, directory: Path, with_xla: bool, repeat: int = 1) -> dict:
    """Lower the case, run its check `repeat` times (the least wall and least CPU time are
    kept: on a shared machine the other jobs only ever add time) and time XLA's compile."""
    start = time.perf_counter()
    built = case.build()
    lower_s = time.perf_counter() - start
    ref_text, sharded, jitted, avals = built
    ref_path = directory / f"{case.name.replace(' ', '_')}.ref.mlir"
    ref_path.write_text(ref_text)
    if isinstance(sharded, bytes):
        sharded_path = ref_path.with_suffix("").with_suffix(".sharded.mlirbc")
        sharded_path.write_bytes(sharded)
    else:
        sharded_path = ref_path.with_suffix("").with_suffix(".sharded.mlir")
        sharded_path.write_text(sharded)
    runs = [run_check(ref_path, sharded_path) for _ in range(max(1, repeat))]
    row = min(runs, key=lambda r: r["cpu_s"])
    row["wall_s"] = min(r["wall_s"] for r in runs)
    row["lower_s"] = lower_s
    if with_xla:
        row["xla_s"] = xla_compile_seconds(jitted, avals)
    return row


# ----- the table ----------------------------------------------------------------------------

def megatron_cases(args) -> list[Case]:
    """The `--spelling megatron` rows (same names as the plain rows, plus Llama-3's)."""
    out = [Case("trivial", "trivial", trivial)]
    models = [m for m in ("gpt2", "llama3") if m in args.only or
              (m == "llama3" and "llama" in args.only)]
    builders = {"shard_map": ("", real_model), "xla": (" xla", real_model_partitioned)}
    for model in models:
        for form in args.forms:
            suffix, build = builders[form]
            for layers in args.layers:
                for tp in args.tp:
                    out.append(Case(f"{model} L{layers} tp{tp}{suffix}", model,
                                    lambda build=build, model=model, layers=layers, tp=tp:
                                    build(model, layers, tp)))
            if "mesh" in args.only:
                for devices in args.meshes:
                    name = f"mesh {devices}" if model == "gpt2" else f"{model} mesh {devices}"
                    out.append(Case(name + suffix, "mesh",
                                    lambda build=build, model=model, devices=devices:
                                    build(model, 4, 8, dp=devices // 8)))
    return out


def cases(args) -> list[Case]:
    if args.spelling == "megatron":
        return megatron_cases(args)
    out = [Case("trivial", "trivial", trivial)]
    if "gpt2" in args.only:
        for layers in args.layers:
            for tp in args.tp:
                out.append(Case(f"gpt2 L{layers} tp{tp}", "gpt2",
                                lambda layers=layers, tp=tp: gpt2_shard_map(layers, tp)))
        if 8 in args.layers and 8 in args.tp:
            out.append(Case("gpt2 L8 tp8 xla", "gpt2", lambda: gpt2_partitioned(8, 8)))
    if "mesh" in args.only:
        for devices in args.meshes:
            out.append(Case(f"mesh {devices}", "mesh",
                            lambda devices=devices: gpt2_shard_map(4, 8, dp=devices // 8)))
    if "llama" in args.only:
        for task in args.llama_tasks:
            out.append(Case(f"llama8b {task}", "llama", lambda task=task: llama8b(task)))
    return out


HEADER = (f"{'case':<20} {'wall s':>7} {'cpu s':>6} {'RSS MiB':>7} {'ops':>6} {'rules':>9} "
          f"{'verdict':<11} {'xla s':>7} {'chk/xla':>7}")


def format_row(case: Case) -> str:
    r = case.row
    xla = f"{r['xla_s']:7.2f}" if r.get("xla_s") else "      -"
    ratio = f"{r['wall_s'] / r['xla_s']:7.2f}" if r.get("xla_s") else "      -"
    skipped = f"+{r['skipped']}s" if r.get("skipped") else ""
    return (f"{case.name:<20} {r['wall_s']:7.2f} {r['cpu_s']:6.2f} {r['rss_mib']:7.0f} "
            f"{r['ops']:>6} {str(r['proved']) + skipped:>9} {r['verdict']:<11} {xla} {ratio}")


def targets(rows: dict[str, dict]) -> list[str]:
    """The issue's targets, each with the numbers measured in this run."""
    lines = []

    def get(name: str, key: str = "wall_s"):
        return rows[name][key] if name in rows else None

    def status(wall: float, cpu: float, limit: float, inclusive: bool) -> str:
        def meets(x: float) -> bool:
            return x <= limit if inclusive else x < limit

        if meets(wall):
            return "ok"
        return "ok on CPU time (wall inflated by the load)" if meets(cpu) else "MISSED"

    def ratio_line(label: str, top: str, bottom: str, limit: float) -> None:
        a, b = get(top), get(bottom)
        if a is None or b is None:
            return
        ca, cb = get(top, "cpu_s"), get(bottom, "cpu_s")
        lines.append(f"{label}: {a / b:.2f} wall, {ca / cb:.2f} CPU (target <= {limit}): "
                     f"{status(a / b, ca / cb, limit, True)}")

    def below(label: str, name: str, limit: float) -> None:
        wall, cpu = get(name), get(name, "cpu_s")
        if wall is None:
            return
        caveat = ("" if rows[name]["verdict"] == "proven" else
                  f" [{rows[name]['verdict']}: the check stops short, not comparable]")
        if rows[name]["verdict"] == "proven" and rows[name].get("skipped"):
            caveat += (f" [{rows[name]['skipped']} rule instances skipped: not every instance "
                       "was checked]")
        lines.append(f"{label}: {wall:.2f} s wall, {cpu:.2f} s CPU (target < {limit} s): "
                     f"{status(wall, cpu, limit, False)}{caveat}")

    def memory(label: str, name: str, limit: float) -> None:
        value = get(name, "rss_mib")
        if value is not None:
            lines.append(f"{label}: {value:.0f} MiB (target < {limit:.0f} MiB): "
                         f"{'ok' if value < limit else 'MISSED'}")

    below("trivial pair, start to finish", "trivial", 0.5)
    below("GPT-2 8 layers tp 8 (shard_map)", "gpt2 L8 tp8", 2.0)
    below("GPT-2 8 layers tp 8 (XLA per-device)", "gpt2 L8 tp8 xla", 2.0)
    for form, x in (("", ""), (" (XLA per-device)", " xla")):
        ratio_line(f"t(32 layers) / t(8 layers) at tp 8{form}", f"gpt2 L32 tp8{x}",
                   f"gpt2 L8 tp8{x}", 2.0)
        for layers in (1, 2, 4, 8, 32):
            ratio_line(f"t(tp 8) / t(tp 2) at {layers} layers{form}", f"gpt2 L{layers} tp8{x}",
                       f"gpt2 L{layers} tp2{x}", 1.2)
        ratio_line(f"t(512 devices) / t(8 devices){form}", f"mesh 512{x}", f"mesh 8{x}", 1.3)
        ratio_line(f"Llama-3 t(32 layers) / t(8 layers) at tp 8{form}", f"llama3 L32 tp8{x}",
                   f"llama3 L8 tp8{x}", 2.0)
        for layers in (1, 2, 4, 8, 32):
            ratio_line(f"Llama-3 t(tp 8) / t(tp 2) at {layers} layers{form}",
                       f"llama3 L{layers} tp8{x}", f"llama3 L{layers} tp2{x}", 1.2)
        ratio_line(f"Llama-3 t(512 devices) / t(8 devices){form}", f"llama3 mesh 512{x}",
                   f"llama3 mesh 8{x}", 1.3)
    for task in ("stack_sgd", "adamw"):
        below(f"Llama-3-8B {task} 32 layers", f"llama8b {task}", 20.0)
        memory(f"Llama-3-8B {task} peak RSS", f"llama8b {task}", 1024)
    compiled = [(n, r) for n, r in rows.items() if r.get("xla_s")]
    if compiled:
        worst = max(compiled, key=lambda item: item[1]["wall_s"] / item[1]["xla_s"])
        wall = worst[1]["wall_s"] / worst[1]["xla_s"]
        cpu = worst[1]["cpu_s"] / worst[1]["xla_s"]
        lines.append(f"check / XLA compile, worst row ({worst[0]}): {wall:.2f} wall, {cpu:.2f} "
                     f"CPU over XLA's wall (target < 0.5): {status(wall, cpu, 0.5, False)}")
        met = [n for n, r in compiled if r["wall_s"] / r["xla_s"] < 0.5]
        lines.append(f"check < half of XLA's compile (wall) in {len(met)} of {len(compiled)} rows")
        for name in ("gpt2 L8 tp8", "gpt2 L8 tp8 xla", "gpt2 L32 tp8", "llama8b stack_sgd",
                     "llama8b adamw"):
            row = rows.get(name)
            if row and row.get("xla_s"):
                lines.append(f"check / XLA compile, {name}: {row['wall_s'] / row['xla_s']:.2f} "
                             f"wall, {row['cpu_s'] / row['xla_s']:.2f} CPU (target < 0.5): "
                             f"{status(row['wall_s'] / row['xla_s'], row['cpu_s'] / row['xla_s'], 0.5, False)}")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="GPT-2 1 and 8 layers at tp 2 and 8, meshes of 8 and 64, no Llama")
    parser.add_argument("--only", nargs="+", default=["gpt2", "mesh", "llama"],
                        choices=["gpt2", "mesh", "llama"])
    parser.add_argument("--layers", type=int, nargs="+", default=[1, 2, 4, 8, 32])
    parser.add_argument("--tp", type=int, nargs="+", default=[2, 4, 8])
    parser.add_argument("--meshes", type=int, nargs="+", default=[8, 64, 512])
    parser.add_argument("--llama-tasks", nargs="+", default=["stack_sgd", "adamw"])
    parser.add_argument("--spelling", choices=["plain", "megatron"], default="plain",
                        help="megatron: whole GPT-2 / Llama-3 models with the vocab-parallel "
                        "embedding spelled Megatron's way (layers 1/8/32, tp 2/8 by default)")
    parser.add_argument("--no-xla", action="store_true", help="do not time XLA's compile")
    parser.add_argument("--forms", nargs="+", default=["shard_map", "xla"],
                        choices=["shard_map", "xla"],
                        help="megatron spelling: the shard_map programs and/or the same models "
                        "jitted with shardings, XLA's per-device program (rows `... xla`)")
    parser.add_argument("--keep", metavar="DIR", help="keep the lowered programs in DIR")
    parser.add_argument("--repeat", type=int, default=3,
                        help="run each check N times and keep the least time (default 3)")
    args = parser.parse_args(argv)
    if args.spelling == "megatron" and "--layers" not in (argv or sys.argv):
        args.layers = [1, 8, 32]
    if args.spelling == "megatron" and "--tp" not in (argv or sys.argv):
        args.tp = [2, 8]
    if args.quick:
        args.layers, args.tp, args.meshes = [1, 8], [2, 8], [8, 64]
        args.only = [o for o in args.only if o != "llama"]
    print(f"load average before: {os.getloadavg()[0]:.2f} (2 cores); each check run "
          f"{args.repeat} times, least time kept", flush=True)
    directory = Path(args.keep or tempfile.mkdtemp(prefix="entangle-bench-"))
    directory.mkdir(parents=True, exist_ok=True)
    all_cases = cases(args)
    warm = Case("warm-up", "trivial", trivial)  # fills the bytecode cache
    measure(warm, directory, with_xla=False)
    print(HEADER, flush=True)
    rows: dict[str, dict] = {}
    for case in all_cases:
        case.row = measure(case, directory, with_xla=not args.no_xla, repeat=args.repeat)
        rows[case.name] = case.row
        print(format_row(case), flush=True)
    print(f"load average after: {os.getloadavg()[0]:.2f}")
    print("\n".join(targets(rows)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
