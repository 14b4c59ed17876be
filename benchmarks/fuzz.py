"""Differential fuzzing of entangle: random shard_map programs, executed and checked.

    python benchmarks/fuzz.py --n 2000 --seed 0 [--mutants 1] [--jobs 2] [--json out.json]

For each of N seeds: one correct-by-construction program (fuzz.gen) and `--mutants`
mutants of it, each lowered (reference + shard_map), executed on 8 simulated CPU devices and
checked with `check_texts(..., verify_rules=False)`; every `--verify-rules-every`-th seed is
also checked with the Z3 rule-instance checks on. A program whose numbers match but that is
not proven and claims a bug gets the confirmation `entangle check` runs (confirm.py): a claim
that survives it is a false bug report. Prints the summary table, then every false bug report,
false proof, crash, timeout and input error in full (with the program), then what keeps
correct-by-construction programs from being proven, grouped by diagnostic.

Reproduce one program: `python -m fuzz.run SEED [--mutation "DESCRIPTION"]`
prints its source (reference and shard_map body), whether the numbers match, and the report.
"""

from __future__ import annotations

import argparse
import collections
import json
import multiprocessing as mp
import os
import re
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

BAD = ("false_proof", "crash", "timeout", "input_error", "gen_error")


def false_bug_report(outcome: dict) -> bool:
    from fuzz.run import false_bug_report as judge  # lazy: fuzz.run imports jax

    return judge(outcome)


def _work(task):
    seeds, mutants, verify_every, max_layers, partitioned = task
    from fuzz.gen import GenOptions

    opts = GenOptions(max_layers=max_layers)
    out = []
    for seed in seeds:
        if partitioned:
            from fuzz.partitioned import run_partitioned_seed

            outcomes = run_partitioned_seed(seed, mutants, opts)
        else:
            from fuzz.run import run_seed

            outcomes = run_seed(seed, mutants, opts, verify_every)
        out += [o.to_json() for o in outcomes]
    return out


def run(n: int, seed: int, mutants: int, jobs: int, verify_every: int, max_layers: int,
        chunk: int = 10, progress: bool = True, partitioned: bool = False) -> list[dict]:
    seeds = list(range(seed, seed + n))
    tasks = [(seeds[i:i + chunk], mutants, verify_every, max_layers, partitioned)
             for i in range(0, len(seeds), chunk)]
    results: list[dict] = []
    if jobs <= 1:
        for t in tasks:
            results += _work(t)
            if progress:
                print(f"  {len(results)} programs", file=sys.stderr, flush=True)
        return results
    ctx = mp.get_context("spawn")
    with ctx.Pool(jobs) as pool:
        for part in pool.imap_unordered(_work, tasks):
            results += part
            if progress:
                print(f"  {len(results)} programs", file=sys.stderr, flush=True)
    return results


def _norm(msg: str) -> str:
    msg = re.sub(r"^\[numbers differ[^\]]*\] ", "", msg)
    msg = re.sub(r"'[^']*'", "'A'", msg)
    msg = re.sub(r"\d+", "N", msg)
    return msg[:140]


def _vr_verdict(r: dict) -> str:
    return r["verify_rules"].split(" (")[0]


def _vr_disagrees(r: dict) -> bool:
    """Proven without the Z3 rule checks but not with them (or the other way round)."""
    v = _vr_verdict(r)
    return v in ("proven", "not proven") and (v == "proven") != (
        r["status"] in ("proven", "flaky", "false_proof"))


def _vr_refuted(r: dict) -> bool:
    """Z3 refuted a rule instance the walk used (a wrong rule or a wrong semantics)."""
    m = re.search(r"(\d+) refuted", r["verify_rules"])
    return bool(m and int(m.group(1)) > 0)


def summarize(results: list[dict], seconds: float) -> dict:
    correct = [r for r in results if r["correct"]]
    muts = [r for r in results if not r["correct"]]
    count = collections.Counter(r["status"] for r in results)
    differing = [r for r in muts if r["status"] in ("caught", "rejected", "false_proof")]
    caught = [r for r in differing if r["status"] in ("caught", "rejected")]
    proven_correct = [r for r in correct if r["status"] in ("proven", "flaky")]
    judged = [r for r in correct if r["status"] not in ("nonfinite",)]
    return {
        "programs": len(results),
        "correct_by_construction": len(correct),
        "mutants": len(muts),
        "proven": sum(1 for r in results if r["status"] in ("proven", "flaky", "false_proof")),
        "flagged": sum(1 for r in results if r["status"] in ("caught", "incomplete",
                                                             "rejected")),
        "false_proofs": count["false_proof"],
        "crashes": count["crash"] + count["timeout"],
        "input_errors": count["input_error"],
        "generator_errors": count["gen_error"],
        "flaky": count["flaky"],
        "nonfinite": count["nonfinite"],
        "completeness_pct": 100.0 * len(proven_correct) / max(1, len(judged)),
        "mutants_differing": len(differing),
        "mutants_equivalent": sum(1 for r in muts if r["status"] in ("incomplete", "proven")),
        "mutants_caught_pct": 100.0 * len(caught) / max(1, len(differing)),
        "claims_withdrawn": sum(1 for r in results if r.get("claim") == "withdrawn"),
        "false_bug_reports": sum(1 for r in results if false_bug_report(r)),
        "mutants_shown_different": sum(1 for r in muts if r.get("claim") == "confirmed"),
        "verify_rules_sampled": sum(1 for r in results if r["verify_rules"]),
        "verify_rules_disagree": sum(1 for r in results if _vr_disagrees(r)),
        "verify_rules_refuted": sum(1 for r in results if _vr_refuted(r)),
        "seconds": round(seconds, 1),
    }


def print_table(s: dict) -> None:
    rows = [
        ("programs", s["programs"]),
        ("correct-by-construction", s["correct_by_construction"]),
        ("mutants", s["mutants"]),
        ("proven", s["proven"]),
        ("flagged (not proven)", s["flagged"]),
        ("FALSE PROOFS", s["false_proofs"]),
        ("crashes (+ timeouts)", s["crashes"]),
        ("input errors on valid programs", s["input_errors"]),
        ("generator errors", s["generator_errors"]),
        ("flaky float ties (listed below)", s["flaky"]),
        ("non-finite (not compared)", s["nonfinite"]),
        ("completeness %", f"{s['completeness_pct']:.1f}"),
        ("mutants differing / equivalent", (f"{s['mutants_differing']} / "
                                           f"{s['mutants_equivalent']}")),
        ("mutants caught %", f"{s['mutants_caught_pct']:.1f}"),
        ("FALSE BUG REPORTS (numbers match, a claim stands)", s["false_bug_reports"]),
        ("bug claims withdrawn by confirmation", s["claims_withdrawn"]),
        ("'equivalent' mutants confirmation shows differ", s["mutants_shown_different"]),
        ("Z3 rule checks: sampled / verdict differs / refuted",
         (f"{s['verify_rules_sampled']} / {s['verify_rules_disagree']} / "
         f"{s['verify_rules_refuted']}")),
        ("time (s)", s["seconds"]),
    ]
    width = max(len(k) for k, _ in rows)
    print("-" * (width + 14))
    for k, v in rows:
        print(f"{k:<{width}}  {v:>10}")
    print("-" * (width + 14))


def print_details(results: list[dict], max_incomplete_examples: int = 1) -> None:
    for r in results:
        if _vr_disagrees(r) or _vr_refuted(r):
            print(f"\n--- Z3 rule checks change the verdict: seed={r['seed']} "
                  f"mutation={r['mutation']}: without them {r['status']}, with them "
                  f"{r['verify_rules']}")
    for r in results:
        if false_bug_report(r):
            print(f"\n=== FALSE BUG REPORT seed={r['seed']} mutation={r['mutation']} "
                  f"mesh={r['mesh']}: the numbers match, the claim stands")
            print(r["message"])
            print(r["source"])
    for r in results:
        if r["status"] in BAD or r["status"] == "flaky":
            print(f"\n=== {r['status'].upper()} seed={r['seed']} mutation={r['mutation']} "
                  f"mesh={r['mesh']} error={r['error']:.3g}")
            print(r["message"])
            print(r["source"])
    incomplete = [r for r in results if r["correct"] and r["status"] == "incomplete"]
    if incomplete:
        groups = collections.defaultdict(list)
        for r in incomplete:
            groups[_norm(r["message"])].append(r)
        total = sum(1 for r in results if r["correct"])
        print(f"\nCorrect-by-construction programs not proven: {len(incomplete)} "
              f"({100.0 * len(incomplete) / max(1, total):.1f}%), by diagnostic:")
        for msg, rs in sorted(groups.items(), key=lambda kv: -len(kv[1])):
            seeds = ", ".join(str(r["seed"]) for r in rs[:8])
            print(f"  {len(rs):5d}  {msg}    (seeds {seeds}{', ...' if len(rs) > 8 else ''})")
        cons = collections.Counter()
        allc = collections.Counter()
        for r in results:
            if r["correct"]:
                allc.update(set(r["constructs"]))
        for r in incomplete:
            cons.update(set(r["constructs"]))
        print("\nConstructs of the unproven correct programs (unproven / all programs using it):")
        for c, k in cons.most_common():
            print(f"  {c:<14} {k:5d} / {allc[c]:5d}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=200, help="correct-by-construction programs")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--mutants", type=int, default=1, help="mutants per program")
    ap.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1))
    ap.add_argument("--verify-rules-every", type=int, default=10)
    ap.add_argument("--max-layers", type=int, default=5)
    ap.add_argument("--partitioned", type=int, default=0, metavar="N",
                    help="also fuzz the per-device path: N programs jitted with their "
                         "shardings and partitioned by XLA, each with --mutants text mutants")
    ap.add_argument("--json", help="write every outcome to this JSON file")
    ap.add_argument("--quiet", action="store_true", help="no progress, no per-program details")
    args = ap.parse_args(argv)
    start = time.perf_counter()
    results = run(args.n, args.seed, args.mutants, args.jobs, args.verify_rules_every,
                  args.max_layers, progress=not args.quiet)
    results.sort(key=lambda r: (r["seed"], not r["correct"]))
    s = summarize(results, time.perf_counter() - start)
    print_table(s)
    if not args.quiet:
        print_details(results)
    doc = {"summary": s, "results": results}
    bad = s["false_proofs"] + s["crashes"] + s["false_bug_reports"]
    if args.partitioned:
        start = time.perf_counter()
        part = run(args.partitioned, args.seed, args.mutants, args.jobs, 0, args.max_layers,
                   progress=not args.quiet, partitioned=True)
        part.sort(key=lambda r: (r["seed"], not r["correct"]))
        ps = summarize(part, time.perf_counter() - start)
        print("\nPer-device path (jit with shardings, partitioned by XLA; mutants mutate the "
              "per-device StableHLO):")
        print_table(ps)
        if not args.quiet:
            print_details(part)
        doc.update(partitioned_summary=ps, partitioned_results=part)
        bad += ps["false_proofs"] + ps["crashes"] + ps["false_bug_reports"]
    if args.json:
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=1)
    return 0 if bad == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
