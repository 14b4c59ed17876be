"""Grounded fuzzing of whole-layer reuse: repeated layer stacks, executed and checked.

    python benchmarks/fuzz_layers.py --n 200 --seed 0 [--mutants 2] [--jobs 2] [--json out.json]

For each of N seeds: one correct stack (`fuzz.stack`: a random chain repeated
K = 3..6 times, plain or residual, with its own, shared or stacked parameters per copy) and
`--mutants` mutants changing exactly one copy on the sharded side. Each is lowered, executed
on 8 simulated CPU devices and checked by `check_texts` (whole-layer reuse first, as
`entangle check` does; Z3 rule-instance checks on unless --no-verify-rules). Then the hand-
written near misses of `fuzz.layer_cases` (unless --no-near-misses). Prints
programs, proven, flagged, reuse fired, false proofs and crashes, then every false proof,
crash and timeout in full. Exit status 1 when there is a false proof or a crash.
"""

from __future__ import annotations

import argparse
import collections
import json
import multiprocessing as mp
import os
import sys
import time
from dataclasses import asdict

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

BAD = ("false_proof", "crash", "timeout", "input_error", "gen_error")


def _work(task) -> list[dict]:
    seeds, mutants, verify_rules, max_layers = task
    from fuzz.gen import RandomChooser
    from fuzz.stack import generate_stack, mutate_stack, run_case

    out = []
    for seed in seeds:
        stack = generate_stack(RandomChooser(seed), seed=seed, max_layers=max_layers)
        if stack is None:
            continue
        cache: dict = {}
        out.append(asdict(run_case(stack, cache, verify_rules)))
        ch = RandomChooser(seed * 7919 + 17)
        made = 0
        for _ in range(4 * mutants):
            if made >= mutants:
                break
            mutant = mutate_stack(stack, ch)
            if mutant is None:
                break
            case = run_case(mutant, cache, verify_rules)
            if case.status == "invalid":
                continue
            out.append(asdict(case))
            made += 1
    return out


def _work_partitioned(task) -> list[dict]:
    seeds, mutants, verify_rules, max_layers = task
    from fuzz.gen import RandomChooser
    from fuzz.stack import generate_stack, run_partitioned_stack

    out = []
    for seed in seeds:
        stack = generate_stack(RandomChooser(seed), seed=seed, max_layers=max_layers)
        if stack is not None:
            out += [asdict(c) for c in run_partitioned_stack(stack, mutants, verify_rules)]
    return out


def _near_misses(verify_rules: bool) -> list[dict]:
    from fuzz.layer_cases import CASES, run_near_miss

    return [asdict(run_near_miss(name, verify_rules)) for name in CASES]


def run(n: int, seed: int, mutants: int, jobs: int, verify_rules: bool, max_layers: int = 5,
        chunk: int = 5, partitioned: bool = False) -> list[dict]:
    seeds = list(range(seed, seed + n))
    tasks = [(seeds[i:i + chunk], mutants, verify_rules, max_layers)
             for i in range(0, len(seeds), chunk)]
    work = _work_partitioned if partitioned else _work
    results: list[dict] = []
    if jobs <= 1:
        for t in tasks:
            results += work(t)
            print(f"  {len(results)} programs", file=sys.stderr, flush=True)
        return results
    with mp.get_context("spawn").Pool(jobs) as pool:
        for part in pool.imap_unordered(work, tasks):
            results += part
            print(f"  {len(results)} programs", file=sys.stderr, flush=True)
    return results


def summarize(results: list[dict]) -> dict:
    count = collections.Counter(r["status"] for r in results)
    correct = [r for r in results if r["mutation"] is None]
    proven_correct = [r for r in correct if r["status"] in ("proven", "flaky")]
    judged = [r for r in correct if r["status"] != "nonfinite"]
    differing = [r for r in results if r["mutation"] is not None
                 and r["status"] in ("caught", "rejected", "false_proof")]
    return {
        "programs": len(results),
        "correct": len(correct),
        "mutants": len(results) - len(correct),
        "proven": sum(1 for r in results if r["status"] in ("proven", "flaky", "false_proof")),
        "flagged": sum(1 for r in results if r["status"] in ("caught", "incomplete",
                                                             "rejected")),
        "reuse_fired": sum(1 for r in results if r["fired"][0]),
        "sharded_reuse_fired": sum(1 for r in results if r["fired"][1]),
        "proven_with_reuse": sum(1 for r in results if r["reused"]),
        "false_proofs": count["false_proof"],
        "crashes": count["crash"] + count["timeout"],
        "input_errors": count["input_error"],
        "generator_errors": count["gen_error"],
        "nonfinite": count["nonfinite"],
        "flaky": count["flaky"],
        "correct_proven_pct": 100.0 * len(proven_correct) / max(1, len(judged)),
        "correct_proven_with_reuse": sum(1 for r in correct if r["reused"]),
        "mutants_differing": len(differing),
        "mutants_caught": sum(1 for r in differing if r["status"] != "false_proof"),
    }


def print_table(s: dict, title: str) -> None:
    print(title)
    width = max(len(k) for k in s)
    for k, v in s.items():
        print(f"  {k:<{width}}  {v:>8.1f}" if isinstance(v, float) else f"  {k:<{width}}  {v:>8}")


def print_details(results: list[dict]) -> None:
    for r in results:
        if r["status"] in BAD or r["status"] == "flaky":
            print(f"\n=== {r['status'].upper()} seed={r['seed']} mutation={r['mutation']} "
                  f"error={r['error']:.3g} reused={r['reused']!r}")
            print(r["message"][:3000])
            print(r["source"])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=100, help="correct stacks (seeds)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--mutants", type=int, default=2, help="mutants per stack")
    ap.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1))
    ap.add_argument("--max-layers", type=int, default=5,
                    help="most constructs in one copy's chain (longer chains repeat more ops)")
    ap.add_argument("--no-verify-rules", action="store_true",
                    help="skip the Z3 rule-instance checks (faster; reuse still fires)")
    ap.add_argument("--no-near-misses", action="store_true")
    ap.add_argument("--partitioned", type=int, default=0, metavar="N",
                    help="also N stacks on the per-device path (jit with shardings, "
                         "partitioned by XLA), each with --mutants single-op text mutants")
    ap.add_argument("--json", help="write every outcome to this JSON file")
    args = ap.parse_args(argv)
    verify = not args.no_verify_rules
    start = time.perf_counter()
    results = run(args.n, args.seed, args.mutants, args.jobs, verify, args.max_layers)
    results.sort(key=lambda r: (r["seed"], r["mutation"] is not None))
    summary = summarize(results)
    summary["seconds"] = round(time.perf_counter() - start, 1)
    print_table(summary, "Random layer stacks:")
    print_details(results)
    doc = {"summary": summary, "results": results}
    bad = summary["false_proofs"] + summary["crashes"]
    if args.partitioned:
        start = time.perf_counter()
        part = run(args.partitioned, args.seed, args.mutants, args.jobs, verify,
                   args.max_layers, partitioned=True)
        part.sort(key=lambda r: (r["seed"], r["mutation"] is not None))
        ps = summarize(part)
        ps["seconds"] = round(time.perf_counter() - start, 1)
        print_table(ps, "\nPer-device stacks (partitioned by XLA; single-op text mutants):")
        print_details(part)
        doc.update(partitioned=part, partitioned_summary=ps)
        bad += ps["false_proofs"] + ps["crashes"]
    if not args.no_near_misses:
        near = _near_misses(verify)
        ns = summarize(near)
        print_table(ns, "\nHand-written near misses:")
        for r in near:
            print(f"  {r['seed']:<40} {r['status']:<12} error={r['error']:.3g} "
                  f"fired={r['fired']} reused={r['reused']!r}")
        print_details(near)
        doc.update(near_misses=near, near_summary=ns)
        bad += ns["false_proofs"] + ns["crashes"]
    if args.json:
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=1, default=str)
    return 0 if bad == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
