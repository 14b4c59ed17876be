"""Frontier-model scale (issue 21): Llama-3-70B / 405B widths and a DeepSeek-V3-like MoE.

    python benchmarks/frontier.py            # the full rows (80 / 126 / 61 layers)
    python benchmarks/frontier.py --quick    # the same programs with 4 layers (pp rows: 8)
    python benchmarks/frontier.py --only 70b twin --repeat 1

Rows (programs in examples/frontier.py, lowered with abstract shapes: jax.ShapeDtypeStruct,
no weight is allocated):

* `70b dp2 tp8 adamw L<l>`: Llama-3-70B widths (hidden 8192, 64 q / 8 kv heads of 128, FFN
  28672, vocab 128256), the whole model with the vocab-parallel embedding, LM head and
  cross-entropy, forward + backward + AdamW, dp 2 x tp 8 (one sequence of 128 a dp rank).
* `405b dp2 tp8 adamw L<l>`: the same at Llama-3-405B widths (hidden 16384, 128 q / 8 kv heads,
  FFN 53248).
* `405b twin layer<k>`: the 405B-wide program with layer k (the middle one) multiplying by
  w_gate where w_up belongs; must be flagged (not proven) at that line (`frontier.py:<line>`).
* `70b / 405b dp2 pp4 tp8 1f1b L<l>`: the layer stack (no embedding / loss head) trained by
  the 1F1B pipeline of examples/pipelines.py on dp 2 x pp 4 x tp 8 (64 devices), 4
  micro-batches, Adam-like update; proven by the general tier (per-device expansion).
  `... 1f1b mlp L<l>`: the same with the layers' MLP blocks only (no attention), the rows the
  general tier's renaming argument on dp and tp (`analysis/general/symmetry.py`) is measured on
  (`--pp-layers 8 16 32 80 --pp-mlp-only`).
* `70b pp twin layer<k> mlp L<l>` (`--only pptwin`): the MLP pipeline row whose layer k = l // 2
  (and only it) multiplies by w_gate where w_up belongs (`pipeline_step`'s
  `middle_layer_up_from_gate`); must not be proven.
* `deepseek ep64 L<l>`: DeepSeek-V3-like MoE stack (hidden 7168, MLA with q rank 1536 / kv rank
  512 / 128 heads, 256 routed experts of FFN 2048 top-8 plus one shared expert, ep 64 with
  all_to_all dispatch), forward + backward + SGD.

Each check is its own `entangle check` process (benchmarks/scaling.py's `run_check`): wall and
CPU seconds, peak RSS of that process, ops of the sharded program, rule instances proved by
Z3 (`+Ns`: N not checked, too large even at a reduced shape), verdict;
the least of `--repeat` runs is kept. The load average (2 shared cores) is printed.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.scaling import Case, run_check

TARGETS = {"70b": (15.0, 1024), "405b": (30.0, 2048), "deepseek": (30.0, None)}
"""Per model: (seconds, MiB) of the issue's targets."""


def _real(ex):
    from examples.real.catalog import _avals, lower_pair, sharded_fn

    ref, sharded = lower_pair(ex)
    return ref, sharded, sharded_fn(ex), _avals(ex, True)


def _corpus(ex):
    from examples.heldout.corpus import avals, lower_pair, sharded_fn

    ref, sharded = lower_pair(ex)
    return ref, sharded, sharded_fn(ex), avals(ex, True)


def cases(args) -> list[Case]:
    from examples import frontier as F

    dense_layers = {"70b": 4 if args.quick else F.LLAMA_70B.n_layers,
                    "405b": 4 if args.quick else F.LLAMA_405B.n_layers}
    widths = {"70b": F.LLAMA_70B, "405b": F.LLAMA_405B}
    out: list[Case] = []
    for model in ("70b", "405b"):
        if model not in args.only:
            continue
        cfg = replace(widths[model], n_layers=dense_layers[model])
        out.append(Case(f"{model} dp2 tp8 adamw L{cfg.n_layers}", model,
                        lambda cfg=cfg: _real(F.dense_step(cfg, 2, 8))))
    if "twin" in args.only:
        cfg = replace(F.LLAMA_405B, n_layers=dense_layers["405b"])
        k = cfg.n_layers // 2
        out.append(Case(f"405b twin layer{k} L{cfg.n_layers}", "twin",
                        lambda cfg=cfg, k=k: _real(F.dense_step(cfg, 2, 8, changed_layer=k))))
    if "pp" in args.only:
        for model in ("70b", "405b"):
            for layers in args.pp_layers:
                cfg = replace(widths[model], n_layers=layers)
                if not args.pp_mlp_only:
                    out.append(Case(f"{model} dp2 pp4 tp8 1f1b L{layers}", "pp",
                                    lambda cfg=cfg: _corpus(F.pipeline_step(cfg, 2, 4, 8))))
                out.append(Case(f"{model} dp2 pp4 tp8 1f1b mlp L{layers}", "pp",
                                lambda cfg=cfg: _corpus(F.pipeline_step(cfg, 2, 4, 8,
                                                                        attention=False))))
    if "pptwin" in args.only:
        layers = args.pp_layers[-1]
        cfg = replace(F.LLAMA_70B, n_layers=layers)
        out.append(Case(f"70b pp twin layer{layers // 2} mlp L{layers}", "pptwin",
                        lambda cfg=cfg: _corpus(F.pipeline_step(
                            cfg, 2, 4, 8, attention=False, bug="middle_layer_up_from_gate"))))
    if "deepseek" in args.only:
        cfg = replace(F.DEEPSEEK_V3, n_layers=4 if args.quick else F.DEEPSEEK_V3.n_layers)
        out.append(Case(f"deepseek ep64 L{cfg.n_layers}", "deepseek",
                        lambda cfg=cfg: _real(F.deepseek_step(cfg, F.DEEPSEEK_V3_MLA, 64))))
    return out


HEADER = (f"{'case':<28} {'wall s':>7} {'cpu s':>6} {'RSS MiB':>7} {'ops':>7} {'rules':>10} "
          f"{'verdict':<12} {'lower s':>7}")


def format_row(case: Case) -> str:
    r = case.row
    skipped = f"+{r['skipped']}s" if r.get("skipped") else ""
    return (f"{case.name:<28} {r['wall_s']:7.2f} {r['cpu_s']:6.2f} {r['rss_mib']:7.0f} "
            f"{r['ops']:>7} {str(r['proved']) + skipped:>10} {r['verdict']:<12} "
            f"{r['lower_s']:7.1f}")


def measure(case: Case, directory: Path, repeat: int, budget: int = 30,
            layer_templates: bool = True) -> dict:
    start = time.perf_counter()
    ref_text, sharded, _, _ = case.build()
    lower_s = time.perf_counter() - start
    stem = case.name.replace(" ", "_")
    ref_path = directory / f"{stem}.ref.mlir"
    ref_path.write_text(ref_text)
    sharded_path = directory / f"{stem}.sharded.mlir"
    sharded_path.write_text(sharded)
    options = ("--general-budget", str(budget)) + (
        () if layer_templates else ("--no-layer-templates",))
    runs = [run_check(ref_path, sharded_path, options) for _ in range(max(1, repeat))]
    row = min(runs, key=lambda r: r["cpu_s"])
    row["wall_s"] = min(r["wall_s"] for r in runs)
    row["lower_s"] = lower_s
    row["first_error"] = row["first_error"].replace(str(REPO) + "/", "")[:160]
    return row


def bug_line() -> str:
    """`examples/frontier.py:<line>` of the `# BUG` line of the changed layer's MLP."""
    import inspect

    from examples import frontier

    lines, start = inspect.getsourcelines(frontier.changed_mlp)
    found = next(start + i for i, text in enumerate(lines) if text.rstrip().endswith("# BUG"))
    return f"examples/frontier.py:{found}:"


def targets(rows: dict[str, dict]) -> list[str]:
    lines = []
    for name, row in rows.items():
        model = name.split()[0]
        if model not in TARGETS or " twin " in name:
            continue
        seconds, mib = TARGETS[model]
        ok = row["verdict"] == "proven" and row["wall_s"] < seconds
        cpu_ok = row["verdict"] == "proven" and row["cpu_s"] < seconds
        text = (f"{name}: {row['verdict']}, {row['wall_s']:.2f} s wall / {row['cpu_s']:.2f} s "
                f"CPU (target < {seconds:.0f} s): "
                f"{'ok' if ok else 'ok on CPU time' if cpu_ok else 'MISSED'}")
        if mib is not None:
            text += (f"; {row['rss_mib']:.0f} MiB (target < {mib} MiB): "
                     f"{'ok' if row['rss_mib'] < mib else 'MISSED'}")
        lines.append(text)
    line = bug_line()
    for name, row in rows.items():
        if " pp twin " in name:
            lines.append(f"{name}: {row['verdict']}, not proven: "
                         f"{'yes' if row['verdict'] != 'proven' else 'NO'}")
        elif " twin " in name:
            flagged = row["verdict"] != "proven" and line in row["first_error"]
            lines.append(f"{name}: {row['verdict']}, flagged at the changed layer's line "
                         f"({line}): {'yes' if flagged else 'NO'}")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="4 layers (pp rows: 8)")
    parser.add_argument("--only", nargs="+", default=["70b", "405b", "twin", "pp", "deepseek"],
                        choices=["70b", "405b", "twin", "pp", "pptwin", "deepseek"])
    parser.add_argument("--pp-layers", type=int, nargs="+", default=None,
                        help="layers of the pipeline rows (default 8; --quick: 8); pptwin: "
                             "the last")
    parser.add_argument("--pp-mlp-only", action="store_true",
                        help="only the pipeline rows of MLP blocks")
    parser.add_argument("--general-budget", type=int, default=30, metavar="SECONDS",
                        help="each check's general-tier budget (wall; entangle check's "
                             "--general-budget)")
    parser.add_argument("--no-layer-templates", action="store_true",
                        help="each check: entangle check's --no-layer-templates")
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--keep", metavar="DIR", help="keep the lowered programs in DIR")
    args = parser.parse_args(argv)
    args.pp_layers = args.pp_layers or [8]
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())} (2 cores); "
          f"each check run {args.repeat} time(s), least time kept", flush=True)
    directory = Path(args.keep or tempfile.mkdtemp(prefix="entangle-frontier-"))
    directory.mkdir(parents=True, exist_ok=True)
    print(HEADER, flush=True)
    rows: dict[str, dict] = {}
    for case in cases(args):
        case.row = measure(case, directory, args.repeat, args.general_budget,
                           not args.no_layer_templates)
        rows[case.name] = case.row
        print(format_row(case), flush=True)
        if case.row["first_error"]:
            print(f"    {case.row['first_error']}", flush=True)
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print("\n".join(targets(rows)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
