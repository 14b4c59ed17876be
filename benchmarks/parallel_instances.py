"""The Z3 rule-instance stage, serial and in worker processes, measured in one run (issue 21).

    python benchmarks/parallel_instances.py                  # ring attention training, cp 4
    python benchmarks/parallel_instances.py --jobs 2 --repeat 3
    python benchmarks/parallel_instances.py REF SHARDED [REF SHARDED ...]

Without files, the programs are the ring attention training steps of examples/real (GPT-2 and
Llama-3 layers, cp 4: thousands of rule instances, a few hundred distinct Z3 queries), lowered
here. For each program, in this process: the normalization and both walks once, then the rule
checks (`entangle-verify-rules`) from an empty checker, serial (`jobs=1`) and with `--jobs`
workers, alternately, `--repeat` times; the least wall time of each is kept (the machine is
shared: other jobs only ever add time). Columns: rule instances, distinct Z3 queries (the rest
are the proof cache's hits), serial and parallel wall seconds and their ratio, CPU seconds of
each (the parallel one counts its workers), and the load average before and after. The two
must give the same verdict, counts and diagnostics (exit 1 otherwise).
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

DEFAULT_PROGRAMS = ("gpt2_stack_sgd_ring_cp4", "llama3_stack_sgd_ring_cp4")


def lowered(names: tuple[str, ...], directory: Path) -> list[tuple[str, Path, Path]]:
    """The named examples/real programs, lowered to `directory` (imports jax)."""
    from examples.real.catalog import by_name, lower_pair

    out = []
    for name in names:
        ref_text, sharded_text = lower_pair(by_name(name))
        ref, sharded = directory / f"{name}.ref.mlir", directory / f"{name}.sharded.mlir"
        ref.write_text(ref_text)
        sharded.write_text(sharded_text)
        out.append((name, ref, sharded))
    return out


def walked(ref: Path, sharded: Path):
    """The pass state after both walks and the comparison (what the rule checks start from)."""
    from entangle_mlir.driver import load_program
    from entangle_mlir.mlir.ir import context
    from entangle_mlir.passes import PASSES
    from entangle_mlir.passes.pipeline import PassState, parse_pipeline, run_pipeline

    program = load_program(str(ref), str(sharded))
    state = PassState(program.sharded_module, program.sharded_file, program=program)
    with context():
        run_pipeline(parse_pipeline(
            "entangle-normalize,entangle-import-shardings,entangle-infer-relations"
            "{annotate=false reuse-layers=true},entangle-check-refinement", PASSES), state)
    return state


def rule_checks(state, jobs: int) -> dict:
    """One run of the rule checks with `jobs` workers, from an empty checker."""
    import copy

    from entangle_mlir.analysis.instance.checker import DEFAULT_CHECKER
    from entangle_mlir.analysis.verify import verify_walks

    DEFAULT_CHECKER.clear()
    report = copy.copy(state.report)
    report.diagnostics, report.unchecked, report.stats = list(report.diagnostics), [], {}
    report.outputs = [copy.copy(o) for o in report.outputs]
    walks = {k: state.walks[k] for k in ("reference", "sharded") if k in state.walks}
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu, start = time.process_time(), time.perf_counter()
    verify_walks(walks, report, jobs=jobs)
    wall = time.perf_counter() - start
    cpu = time.process_time() - cpu
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu += (after.ru_utime + after.ru_stime) - (children.ru_utime + children.ru_stime)
    queries = sum(s.checks - s.cache_hits for s in DEFAULT_CHECKER.stats.values())
    return {"wall": wall, "cpu": cpu, "queries": queries,
            "same": (report.verdict, report.mode, report.stats["rule_instances"],
                     [d.message for d in report.diagnostics],
                     [(u.op_name, u.reason) for u in report.unchecked])}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="*", help="REF SHARDED pairs (default: ring attention)")
    parser.add_argument("--jobs", type=int, default=2, help="workers of the parallel runs")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--keep", metavar="DIR", help="write the lowered programs here")
    args = parser.parse_args(argv)
    if len(args.files) % 2:
        parser.error("give REF SHARDED pairs")
    if args.files:
        programs = [(Path(r).name.split(".")[0], Path(r), Path(s))
                    for r, s in zip(args.files[::2], args.files[1::2])]
    else:
        import tempfile

        directory = Path(args.keep or tempfile.mkdtemp(prefix="entangle-parallel-"))
        directory.mkdir(parents=True, exist_ok=True)
        programs = lowered(DEFAULT_PROGRAMS, directory)
    print(f"load average {os.getloadavg()[0]:.2f} on {len(os.sched_getaffinity(0))} cores; "
          f"parallel: {args.jobs} workers; least of {args.repeat} runs each")
    print("| program | instances | Z3 queries | serial s | parallel s | ratio | serial CPU s "
          "| parallel CPU s | load before / after |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
    failures = 0
    for name, ref, sharded in programs:
        state = walked(ref, sharded)
        load = os.getloadavg()[0]
        runs: dict[int, list[dict]] = {1: [], args.jobs: []}
        for repeat in range(args.repeat):
            for jobs in ((1, args.jobs) if repeat % 2 == 0 else (args.jobs, 1)):
                runs[jobs].append(rule_checks(state, jobs))
        serial = min(runs[1], key=lambda r: r["wall"])
        parallel = min(runs[args.jobs], key=lambda r: r["wall"])
        if any(r["same"] != serial["same"] for r in runs[1] + runs[args.jobs]):
            failures += 1
            print(f"{name}: the parallel checks disagree with the serial ones", file=sys.stderr)
        instances = sum(serial["same"][2].values())
        print(f"| {name} | {instances} | {serial['queries']} | {serial['wall']:.2f} | "
              f"{parallel['wall']:.2f} | {serial['wall'] / parallel['wall']:.2f}x | "
              f"{serial['cpu']:.2f} | {parallel['cpu']:.2f} | "
              f"{load:.2f} / {os.getloadavg()[0]:.2f} |", flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
