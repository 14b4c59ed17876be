"""Mutation testing over every correct example of examples/catalog.py.

    python benchmarks/mutation.py [--only NAME_SUBSTRING] [--limit K] [--jobs 2] [--json out.json]

Every single-site mutant of each example's sharded StableHLO (a collective dropped, duplicated,
regrouped or given another dim/reducer/permutation; an elementwise op, constant, comparison,
reducer, slice window or dynamic_slice offset changed; partition_id replaced by 0) is compiled
and executed on 8 simulated CPU devices and checked. A mutant whose numbers differ must not be
proven; one whose numbers match and is not proven must not claim a bug once `entangle check`'s
confirmation ran (a false bug report). Prints one row per example and the mutation score =
caught / differing mutants; lists every false proof, false bug report, crash and timeout in
full.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _work(task):
    name, limit = task
    from examples.catalog import by_name
    from fuzz.mutation import run_example

    start = time.perf_counter()
    res = run_example(by_name(name), limit=limit)
    return name, [o.to_json() for o in res], time.perf_counter() - start


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default="", help="examples whose name contains this")
    ap.add_argument("--limit", type=int, default=None, help="mutants per example")
    ap.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1))
    ap.add_argument("--json", help="write every outcome to this JSON file")
    args = ap.parse_args(argv)

    from examples.catalog import EXAMPLES

    names = [e.name for e in EXAMPLES if e.bug is None and args.only in e.name]
    # the biggest first, so the pool stays busy
    names.sort(key=lambda n: ("gpt2" not in n, n))
    start = time.perf_counter()
    tasks = [(n, args.limit) for n in names]
    done = []
    if args.jobs <= 1:
        done = [_work(t) for t in tasks]
    else:
        with mp.get_context("spawn").Pool(args.jobs) as pool:
            for item in pool.imap_unordered(_work, tasks):
                done.append(item)
                print(f"  {item[0]}: {len(item[1])} mutants", file=sys.stderr, flush=True)
    from fuzz.mutation import score

    done.sort(key=lambda t: names.index(t[0]))
    header = (f"{'example':<28} {'mutants':>7} {'invalid':>7} {'differ':>6} {'caught':>6} "
              f"{'FALSE':>5} {'eq.prv':>6} {'eq.np':>5} {'crash':>5} {'score%':>7} {'s':>6}")
    print(header)
    print("-" * len(header))
    everything = []
    for name, res, secs in done:
        s = score(res)
        everything += res
        print(f"{name:<28} {s['mutants']:>7} {s['invalid']:>7} {s['differing']:>6} "
              f"{s['caught']:>6} {s['false_proofs']:>5} {s['equivalent_proven']:>6} "
              f"{s['equivalent_not_proven']:>5} {s['crashes']:>5} {s['score_pct']:>7.1f} "
              f"{secs:>6.1f}")
    total = score(everything)
    print("-" * len(header))
    print(f"{'TOTAL':<28} {total['mutants']:>7} {total['invalid']:>7} {total['differing']:>6} "
          f"{total['caught']:>6} {total['false_proofs']:>5} {total['equivalent_proven']:>6} "
          f"{total['equivalent_not_proven']:>5} {total['crashes']:>5} "
          f"{total['score_pct']:>7.1f} {time.perf_counter() - start:>6.1f}")
    print(f"\nmutation score: {total['caught']}/{total['differing']} differing mutants caught "
          f"({total['score_pct']:.1f}%); false proofs: {total['false_proofs']}; crashes: "
          f"{total['crashes']}; input errors on valid mutants: {total['input_errors']}; "
          f"flaky: {total['flaky']}; false bug reports (equivalent mutants whose bug claim "
          f"survives confirmation unshown): {total['false_bug_reports']} "
          f"({total['claims_withdrawn']} claims withdrawn, {total['shown_different']} "
          "'equivalent' mutants shown to differ on other inputs)")
    print("(eq.prv / eq.np: mutants whose numbers match the reference, proven / not proven)")
    for r in everything:
        if r["status"] in ("false_proof", "crash", "timeout", "input_error", "flaky"):
            print(f"\n=== {r['status'].upper()} {r['example']}: {r['mutation']} "
                  f"(error {r['error']:.3g})\n{r['message']}\n{r['text']}")
        elif r.get("claim") == "stands":
            print(f"\n=== FALSE BUG REPORT {r['example']}: {r['mutation']} (numbers match)\n"
                  f"{r['message']}\n{r['text']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"summary": total, "results": everything}, f, indent=1)
    return 0 if total["false_proofs"] == total["crashes"] == total["false_bug_reports"] == 0 \
        else 1


if __name__ == "__main__":
    sys.exit(main())
