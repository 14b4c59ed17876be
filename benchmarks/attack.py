"""The semantic attacker at scale: value mutants of every correct program, grounded and checked.

    python benchmarks/attack.py [--only NAME_SUBSTRING] [--sources attack,twins,catalog,partitioned,real]
        [--kinds dtype,constant,...] [--per-kind K] [--limit N] [--jobs 2] [--json out.json]
    python benchmarks/attack.py --twins [--only NAME_SUBSTRING] [--json out.json]

Each subject (the integer / compare programs of `fuzz.attack.attack_programs`, the
catalogue's correct examples, XLA-partitioned programs of examples/partitioned.py, the real-model
corpus) is lowered; a seeded sample of at most K value mutants per kind of
`mlir_mutate.value_sites` (element types narrowed by converts, constants by 1 ulp / 2^-20 /
2^-10 / +-1 / near 2^31, integer widths, compare types and directions, region returns, reducer
bodies, collectives computed in bf16/f16) is compiled and executed on 8 simulated CPU devices on
random and chosen inputs (ties, +-0, large, near 2^24, near 2^31) and checked. A mutant whose
numbers differ (exactly for integers; beyond 1e-4, or bitwise against both the reference and the
unmutated program for floats: `ulp`) must never be proven.

`--twins` runs the hand-written wrong twins of `fuzz.twins` instead: each correct program with
its nearest wrong variants (a conversion, signed vs unsigned, floor vs truncating division, a
device offset, a ppermute pair, a boolean op), every one executed on the same input sets; a
wrong twin must compute other numbers and must not be proven. Their correct programs are the
`twins` source of the mutation run.

Each mutant is compiled and executed in a child process under `--run-timeout` seconds (a
mutant looping for hours is `skipped`, counted with the invalid ones).

Prints a table per mutation kind and per source (mutants, invalid, differing (of which ulp),
caught, FALSE proofs (of which ulp), equivalent proven / not proven, crashes+timeouts) and lists
every false proof and crash. Exit 1 if any false proof or crash.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

SOURCES = ("attack", "twins", "catalog", "partitioned", "real")


def subjects(sources, only: str = "") -> list:
    """(source, name, factory) of the mutation subjects: `fuzz.attack`'s sources and the
    correct programs of `fuzz.twins` (source `twins`)."""
    from fuzz import attack, twins

    out = attack.subjects(tuple(s for s in sources if s != "twins"), only)
    return out + (twins.subjects(only) if "twins" in sources else [])


def _work(task):
    source, name, per_kind, kinds, limit, timeout, match, sides, run_timeout = task
    from fuzz.attack import attack

    start = time.perf_counter()
    try:
        make = next(m for s, n, m in subjects((source,)) if n == name)
        g, res = attack(make(), per_kind=per_kind, kinds=kinds, timeout=timeout,
                        select=(lambda site: match in site.desc) if match else None,
                        sides=sides, recipe=(source, name), run_timeout=run_timeout)
    except Exception as err:  # noqa: BLE001 - a subject that cannot be lowered or grounded
        return source, name, [], time.perf_counter() - start, f"{type(err).__name__}: {err}"[:300]
    if limit is not None:
        res = res[:limit]
    note = "" if g.proven else "baseline not proven"
    note += f" sets={len(g.sets)}"
    return source, name, [o.to_json() for o in res], time.perf_counter() - start, note


def _row(label: str, s: dict, secs: float | None = None) -> str:
    tail = f" {secs:>7.1f}" if secs is not None else ""
    return (f"{label:<34} {s['mutants']:>7} {s['invalid']:>7} {s['differing']:>6} "
            f"{s['differing_ulp']:>4} {s['caught']:>6} {s['false_proofs']:>5} "
            f"{s['false_proofs_ulp']:>4} {s['equivalent_proven']:>6} "
            f"{s['equivalent_not_proven']:>5} {s['crashes']:>5}{tail}")


HEADER = (f"{'':<34} {'mutants':>7} {'invalid':>7} {'differ':>6} {'ulp':>4} {'caught':>6} "
          f"{'FALSE':>5} {'ulp':>4} {'eq.prv':>6} {'eq.np':>5} {'crash':>5}")


def table(everything: list[dict], key: str) -> list[str]:
    from fuzz.attack import score

    groups: dict[str, list] = {}
    for r in everything:
        groups.setdefault(r[key], []).append(r)
    lines = [f"{'by ' + key:<34}" + HEADER[34:], "-" * len(HEADER)]
    for k in sorted(groups):
        lines.append(_row(k, score(groups[k])))
    lines.append("-" * len(HEADER))
    lines.append(_row("TOTAL", score(everything)))
    return lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default="", help="subjects whose name contains this")
    ap.add_argument("--sources", default=",".join(SOURCES))
    ap.add_argument("--kinds", default="", help="mutation kinds (default: every kind)")
    ap.add_argument("--per-kind", type=int, default=6, help="mutants per kind per subject")
    ap.add_argument("--limit", type=int, default=None, help="mutants per subject")
    ap.add_argument("--timeout", type=int, default=60, help="seconds per check")
    ap.add_argument("--run-timeout", type=float, default=120,
                    help="seconds a mutant's compilation and execution may take (in a child "
                         "process); past it the mutant is skipped")
    ap.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1))
    ap.add_argument("--json", help="write every outcome to this JSON file")
    ap.add_argument("--shuffle", action="store_true",
                    help="subjects in a seeded random order (a partial run is a fair sample)")
    ap.add_argument("--reverse", action="store_true",
                    help="the (shuffled) subjects from the end (a second run meets the first)")
    ap.add_argument("--skip", default="", help="a JSON file of an earlier run: skip its subjects")
    ap.add_argument("--sides", default="sharded",
                    help="mutate the sharded program, the reference (kinds ref:*), or both: "
                         "sharded,reference")
    ap.add_argument("--match", default="", help="only mutants whose description contains this")
    ap.add_argument("--merge", nargs="+", help="print the tables of these --json files (no run)")
    ap.add_argument("--twins", action="store_true",
                    help="judge the hand-written wrong twins of fuzz.twins (no mutants)")
    args = ap.parse_args(argv)
    if args.merge:
        return merge(args.merge)
    if args.twins:
        return run_twins(args.only, args.timeout, args.json)

    from fuzz.attack import STATUSES, score

    sources = tuple(s for s in args.sources.split(",") if s)
    kinds = tuple(k for k in args.kinds.split(",") if k) or None
    sides = tuple(args.sides.split(","))
    tasks = [(src, name, args.per_kind, kinds, args.limit, args.timeout, args.match, sides,
              args.run_timeout) for src, name, _ in subjects(sources, args.only)]
    if args.skip:
        with open(args.skip) as f:
            seen = {s["name"] for s in json.load(f)["subjects"]}
        tasks = [t for t in tasks if t[1] not in seen]
    if args.shuffle:
        import random

        random.Random(0).shuffle(tasks)
    if args.reverse:
        tasks.reverse()
    start = time.perf_counter()
    done = []

    def record(item):
        done.append(item)
        src, name, res, secs, note = item
        s = score(res)
        print(f"  [{len(done)}/{len(tasks)}] {src}:{name}: {s['mutants']} mutants, "
              f"{s['differing']} differ, {s['false_proofs']} FALSE, {s['crashes']} crash "
              f"({secs:.0f}s) {note}", file=sys.stderr, flush=True)
        if args.json:
            _dump(args.json, done, None)

    if args.jobs <= 1:
        for t in tasks:
            record(_work(t))
    else:  # (not a multiprocessing Pool: its daemonic workers may not start executors)
        with ProcessPoolExecutor(args.jobs, mp_context=mp.get_context("spawn"),
                                 max_tasks_per_child=8) as pool:
            for item in as_completed([pool.submit(_work, t) for t in tasks]):
                record(item.result())
    everything = [dict(r, source=src) for src, _, res, _, _ in done for r in res]
    for line in table(everything, "kind") + [""] + table(everything, "source"):
        print(line)
    total = score(everything)
    print(f"\n{len(done)} subjects, {total['mutants']} mutants in "
          f"{time.perf_counter() - start:.0f}s; differing {total['differing']} (ulp-only "
          f"{total['differing_ulp']}); FALSE PROOFS {total['false_proofs']} (ulp-only "
          f"{total['false_proofs_ulp']}); crashes/timeouts {total['crashes']}; skipped "
          f"(execution timed out, counted as invalid) {total['skipped']}")
    print("(differ: numbers differ, `ulp` of them only bitwise; caught: not proven, incl. "
          "rejected and those only the Z3 rule check refuses; eq.prv / eq.np: same numbers, "
          "proven / not proven)")
    failed = [(src, name, note) for src, name, res, _, note in done if not res]
    for src, name, note in failed:
        print(f"  no mutants run for {src}:{name}: {note}")
    for r in everything:
        if r["status"] in ("false_proof", "false_proof_ulp", "crash", "timeout"):
            print(f"\n=== {r['status'].upper()} {r['subject']} [{r['kind']}] {r['mutation']} "
                  f"(numbers {r['numbers']} on {r['inputs']})\n{r['message'][:600]}")
    if args.json:
        _dump(args.json, done, total)
    assert set(STATUSES) >= {r["status"] for r in everything}
    return 0 if total["false_proofs"] == 0 and total["crashes"] == 0 else 1


TWIN_STATUSES = ("proven", "incomplete", "caught", "false_proof", "ungrounded",
                 "wrong_reference", "crash", "timeout")


def run_twins(only: str, timeout: int, path: str | None) -> int:
    """Judge every twin of `fuzz.twins` (whose name contains `only`); print one line per
    program and the counts. Exit 1 on a false proof, a crash, an ungrounded wrong twin or a
    correct twin that does not compute its reference's numbers."""
    from fuzz.twins import judge_twin, twins

    start = time.perf_counter()
    outcomes = []
    for t in twins():
        if only not in t.name:
            continue
        for o in judge_twin(t, timeout):
            outcomes.append(o)
            print(f"{o.twin:<28} {o.variant:<22} {o.status:<12} {o.numbers:<6} "
                  f"{o.seconds:6.1f}s  {o.message[:90]}", flush=True)
    counts = {s: sum(o.status == s for o in outcomes) for s in TWIN_STATUSES}
    wrong = [o for o in outcomes if o.variant != "correct"]
    print(f"\n{len(outcomes) - len(wrong)} correct programs ({counts['proven']} proven, "
          f"{counts['incomplete']} not proven, {counts['wrong_reference']} not computing the "
          f"reference), {len(wrong)} wrong twins ({counts['caught']} caught, "
          f"{counts['false_proof']} FALSE PROOFS, {counts['ungrounded']} ungrounded); "
          f"crashes/timeouts {counts['crash'] + counts['timeout']}; "
          f"{time.perf_counter() - start:.0f}s")
    if path:
        with open(path, "w") as f:
            json.dump({"summary": counts, "twins": [o.to_json() for o in outcomes]}, f,
                      indent=1)
    bad = ("false_proof", "ungrounded", "wrong_reference", "crash", "timeout")
    return 1 if any(counts[s] for s in bad) else 0


def merge(paths: list[str]) -> int:
    """The tables of earlier runs' JSON files together (a mutant counted once: the first)."""
    from fuzz.attack import score

    seen: set[tuple[str, str]] = set()
    subjects: set[str] = set()
    everything = []
    for path in paths:
        with open(path) as f:
            data = json.load(f)
        subjects |= {s["name"] for s in data["subjects"]}
        for r in data["results"]:
            if (r["subject"], r["mutation"]) not in seen:
                seen.add((r["subject"], r["mutation"]))
                everything.append(r)
    for line in table(everything, "kind") + [""] + table(everything, "source"):
        print(line)
    total = score(everything)
    print(f"\n{len(subjects)} subjects, {total['mutants']} mutants; differing {total['differing']} "
          f"(ulp-only {total['differing_ulp']}); FALSE PROOFS {total['false_proofs']} (ulp-only "
          f"{total['false_proofs_ulp']}); crashes/timeouts {total['crashes']}")
    return 0


def _dump(path: str, done, total) -> None:
    with open(path + ".tmp", "w") as f:
        json.dump({"summary": total,
                   "subjects": [{"source": s, "name": n, "seconds": secs, "note": note}
                                for s, n, _, secs, note in done],
                   "results": [dict(r, source=s) for s, _, res, _, _ in done for r in res]},
                  f, indent=1)
    os.replace(path + ".tmp", path)


if __name__ == "__main__":
    sys.exit(main())
