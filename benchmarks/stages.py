"""Where the time of one `entangle check` goes: CPU seconds per stage, in a fresh process.

    python benchmarks/stages.py REF SHARDED [REF SHARDED ...]
    python benchmarks/scaling.py --quick --keep DIR && python benchmarks/stages.py DIR/gpt2_L8_tp8.{ref,sharded}.mlir

Stages: start-up (imports: numpy, jaxlib's MLIR bindings, z3, entangle), parsing both files,
each pass of the pipeline `entangle check` runs (normalize, import-shardings, the two walks,
the comparison, the Z3 rule-instance checks). Each pair runs in its own process, `--repeat`
times; the least time per stage is kept (the machine is shared).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

_CHILD = r"""
import json, sys, time
clock = time.process_time
import gc
gc.disable()  # as the CLI does
t0 = clock()
from entangle_mlir.driver import check_program
from entangle_mlir.mlir.ir import context
from entangle_mlir.mlir.load import load_file
from entangle_mlir.passes.pipeline import PassState, parse_pipeline, run_pipeline
from entangle_mlir.mlir.program import from_two_modules
from entangle_mlir.passes import PASSES
import entangle_mlir.analysis.instance.checker, entangle_mlir.semantics.ops, z3
z3.main_ctx()
stages = {"start-up": clock() - t0}
t = clock()
ref, sharded = load_file(sys.argv[1]), load_file(sys.argv[2])
program = from_two_modules(ref, sharded, sys.argv[1], sys.argv[2])
stages["parsing"] = clock() - t
state = PassState(program.sharded_module, program.sharded_file, program=program)
names = ["entangle-normalize", "entangle-import-shardings",
         "entangle-infer-relations{annotate=false reuse-layers=true}",
         "entangle-check-refinement", "entangle-verify-rules"]
labels = ["normalize", "import shardings", "both walks", "comparing outputs",
          "Z3 rule-instance checks"]
with context():
    for name, label in zip(names, labels):
        t = clock()
        run_pipeline(parse_pipeline(name, PASSES), state)
        stages[label] = clock() - t
stages["total"] = clock() - t0
stages["verdict"] = state.report.verdict
stages["layers reused"] = state.layers_reused.get("sharded", 0)
print(json.dumps(stages))
"""


def measure(ref: str, sharded: str, repeat: int) -> dict:
    best: dict = {}
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    for _ in range(repeat):
        done = subprocess.run([sys.executable, "-c", _CHILD, ref, sharded], cwd=root,
                              capture_output=True, text=True, check=True)
        row = json.loads(done.stdout.strip().splitlines()[-1])
        for key, value in row.items():
            if isinstance(value, float):
                best[key] = min(best.get(key, value), value)
            else:
                best[key] = value
    return best


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="+", help="REF SHARDED pairs")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args(argv)
    if len(args.files) % 2:
        parser.error("give REF SHARDED pairs")
    pairs = list(zip(args.files[::2], args.files[1::2]))
    rows = [measure(os.path.abspath(r), os.path.abspath(s), args.repeat) for r, s in pairs]
    names = [os.path.basename(r).split(".")[0] for r, _ in pairs]
    keys = [k for k in rows[0] if isinstance(rows[0][k], float)]
    print("| stage (CPU s) | " + " | ".join(names) + " |")
    print("| --- |" + " --- |" * len(names))
    for key in keys:
        print(f"| {key} | " + " | ".join(f"{row[key]:.2f}" for row in rows) + " |")
    print("| verdict | " + " | ".join(str(row["verdict"]) for row in rows) + " |")
    print("| layers reused | " + " | ".join(str(row["layers reused"]) for row in rows) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
