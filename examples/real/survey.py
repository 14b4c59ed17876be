"""Survey the corpus: verdict of every program and *every* root cause that blocks a proof.

``python -m examples.real.survey [-k SUBSTRING] [--run]`` prints one line per program (verdict,
first diagnostic) and then every distinct root cause: an op whose relation became opaque while
none of its operands was opaque (so later causes hidden behind the first diagnostic show too),
in the reference and in the sharded program, with how many programs each one blocks.
"""

from __future__ import annotations

import argparse
import collections
import os
import re

from entangle_mlir.ir import context, parse_module
from entangle_mlir.layout import Opaque
from entangle_mlir.pipeline import PassState, parse_pipeline, run_pipeline
from entangle_mlir.program import from_two_modules

_PIPELINE = ("entangle-normalize,entangle-import-shardings,"
             "entangle-infer-relations{annotate=false},entangle-check-refinement")
_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def analyse(ref_text: str, sharded_text: str):
    """(report, [(side, reason, location, op name)] root causes, reference first)."""
    from passes import PASSES

    ref = parse_module(ref_text, "reference.mlir")
    shd = parse_module(sharded_text, "sharded.mlir")
    program = from_two_modules(ref, shd, "reference.mlir", "sharded.mlir")
    state = PassState(program.sharded_module, program.sharded_file, program=program)
    with context():
        run_pipeline(parse_pipeline(_PIPELINE, PASSES), state)
    causes = []
    for side in ("reference", "sharded"):
        walk = state.walks.get(side)
        if walk is None:
            continue
        for record in walk.records:
            outs = [v for v in record.outputs if isinstance(v, Opaque)]
            if not outs or any(isinstance(v, Opaque) for v in record.inputs):
                continue
            loc = str(record.loc).replace(_ROOT + "/", "") if record.loc else "?"
            causes.append((side, cause_key(outs[0].reason), loc, record.info.name))
    return state.report, causes


def cause_key(reason: str) -> str:
    """A reason with shapes and numbers blurred, to group equal causes."""
    reason = re.sub(r"tensor<[^>]*>", "tensor<..>", reason)
    reason = re.sub(r"\(\d+(, \d+)*\)", "(..)", reason)
    return reason


def main(argv=None) -> int:
    from .catalog import bug_line, examples, lower_pair, run_pair

    parser = argparse.ArgumentParser()
    parser.add_argument("-k", default="")
    parser.add_argument("--run", action="store_true", help="also run both programs")
    ns = parser.parse_args(argv)
    blocked: dict[str, set[str]] = collections.defaultdict(set)
    where: dict[str, str] = {}
    for ex in examples():
        if ns.k not in ex.name:
            continue
        report, causes = analyse(*lower_pair(ex))
        line = f"{ex.name}: {report.verdict}"
        if ns.run:
            import numpy as np

            ref, shd = run_pair(ex)
            diff = max(float(np.max(np.abs(a - b))) for a, b in zip(ref, shd))
            line += f" (max diff {diff:.1e})"
        if report.diagnostics:
            d = report.diagnostics[0]
            loc = str(d.loc).replace(_ROOT + "/", "") if d.loc else "?"
            line += f"  [{loc}] {d.message[:160]}"
        if ex.bug:
            _, bl = bug_line(ex)
            line += f"  (BUG line {bl})"
        print(line, flush=True)
        for side, reason, loc, op in causes:
            key = f"{side}: {op}: {reason[:140]}"
            blocked[key].add(ex.name)
            where.setdefault(key, loc)
    print("\nroot causes (programs blocked):")
    for key, names in sorted(blocked.items(), key=lambda kv: -len(kv[1])):
        print(f"{len(names):4d}  {key}  @ {where[key]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
