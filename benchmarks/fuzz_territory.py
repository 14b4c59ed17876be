"""Fuzzing the general tier's territory (issue 18): programs with device-dependent slicing,
masks on device offsets, rotating loop carries, all_to_all, untiled gathers, block sums and
per-device results (`fuzz.territory`), each with mutants, labelled by EXECUTION on 8
simulated CPU devices and checked by entangle (`fuzz.territory_run`).

    python benchmarks/fuzz_territory.py --n 200 --seed 0 [--mutants 2] [--jobs 2] [--json out.json]

Prints the table: correct programs by the tier that proved them (layout / general / not
proven, with the reasons), buggy programs flagged, false proofs (must be 0), false bug
reports (a bug claim that survives confirmation on a program whose numbers match), then
every problem with its program. Exit code 1 on a false proof, a false bug report or a crash.
Reproduce one program: `python -m fuzz.territory_run SEED [--mutation DESC]`.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _work(task: tuple[list[int], int]) -> list[dict]:
    from fuzz.territory_run import run_seed  # lazy: imports jax with 8 simulated devices

    seeds, mutants = task
    return [o.to_json() for seed in seeds for o in run_seed(seed, mutants)]


def run(n: int, seed: int, mutants: int, jobs: int, chunk: int = 5,
        progress: bool = True) -> list[dict]:
    seeds = list(range(seed, seed + n))
    tasks = [(seeds[i:i + chunk], mutants) for i in range(0, len(seeds), chunk)]
    results: list[dict] = []
    if jobs <= 1:
        parts = map(_work, tasks)
        pool = None
    else:
        pool = mp.get_context("spawn").Pool(jobs)
        parts = pool.imap_unordered(_work, tasks)
    try:
        for part in parts:
            results += part
            if progress:
                print(f"  {len(results)} programs", file=sys.stderr, flush=True)
    finally:
        if pool is not None:
            pool.close()
            pool.join()
    results.sort(key=lambda r: (r["seed"], r["mutation"] is not None, r["mutation"] or ""))
    return results


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=100, help="base programs (seeds)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--mutants", type=int, default=2, help="mutants per program")
    ap.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1))
    ap.add_argument("--json", help="write every outcome to this JSON file")
    ap.add_argument("--quiet", action="store_true", help="no progress, no per-program details")
    args = ap.parse_args(argv)
    from fuzz.territory_run import problems, summarize, table  # lazy: imports jax

    start = time.perf_counter()
    results = run(args.n, args.seed, args.mutants, args.jobs, progress=not args.quiet)
    seconds = time.perf_counter() - start
    s = summarize(results)
    print(table(s, f"seed {args.seed}, {args.n} programs + {args.mutants} mutants each, "
                   f"{seconds:.0f} s with {args.jobs} jobs\n"))
    bad = [r for r in results if problems(r)]
    if not args.quiet:
        for r in bad:
            print(f"\n=== {'; '.join(problems(r))}\nseed={r['seed']} mutation={r['mutation']}")
            print(r["source"])
        for r in results:
            if r["status"] in ("timeout", "gen_error"):
                print(f"\n--- {r['status']} seed={r['seed']} {r['kind']} "
                      f"mutation={r['mutation']}: {r['message'][:300]}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"summary": s, "seconds": seconds, "results": results}, f, indent=1)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
