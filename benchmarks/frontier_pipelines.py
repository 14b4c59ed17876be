"""The frontier pipeline at test widths (issues 19 and 21): examples/frontier.py's
`pipeline_step` (Llama layers, Megatron tp inside each 1F1B stage, Adam-like update) over
layers a stage, micro-batches and meshes, each grounded by execution on simulated CPU devices
(the sharded program's numbers against the reference's) and checked by the general tier.

    python benchmarks/frontier_pipelines.py            # every row
    python benchmarks/frontier_pipelines.py --quick    # the rows of 4 devices

Each row: the check's CPU seconds (`check_texts`, rule instances not re-verified, as the
tests run it), the verdict and the general tier's reason when not proven, the largest
difference from the reference's numbers. The load average (shared cores) is printed.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import replace
from pathlib import Path

if __name__ == "__main__":
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                               + " --xla_force_host_platform_device_count=8").strip()

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

ROWS = [
    # (layers, pp, tp, micro-batches, attention)
    (2, 2, 2, 2, True), (4, 2, 2, 1, True), (4, 2, 2, 2, True), (4, 2, 2, 4, True),
    (8, 2, 2, 2, True), (4, 2, 2, 2, False), (4, 2, 2, 4, False),
    (8, 4, 2, 2, True), (8, 4, 2, 4, False),
    (6, 2, 1, 2, False, 2), (8, 4, 1, 2, False, 2),
    (1, 1, 1, 2, True, 2), (1, 1, 1, 1, True, 2), (2, 2, 2, 2, True, 2),
    (2, 2, 2, 1, True, 2), (4, 2, 2, 2, True, 2),
    (14, 2, 1, 2, False, 2), (32, 2, 1, 2, False, 2), (16, 2, 2, 2, False, 2),
    (4, 4, 1, 2, True, 2),
]
"""The rows: gap 2 of benchmarks/FRONTIER_RESULTS.md (several layers a stage and several
micro-batches, with tp) and its neighbours; a sixth field is dp (1 when left out; dp 2 with
a batch of 2 is one row a device, gap 1: its MLP half, then with attention). The last three:
deep stages (7, 16 and 8 layers a stage: the normal form's memo chains, the micro-batch slice
past 64 weight slices). Last: dp 2 x pp 4 with attention (one row a device on 4 stages)."""


def run(layers: int, pp: int, tp: int, micro: int, attention: bool, dp: int = 1,
        budget: int = 30) -> str:
    from entangle_mlir.driver import check_texts
    from examples import frontier as F
    from examples.heldout.corpus import input_sets, lower_pair, max_error

    cfg = replace(F.tiny(F.LLAMA_70B, layers), batch=2)
    ex = F.pipeline_step(cfg, dp, pp, tp, micro=micro, attention=attention)
    error = max_error(ex, input_sets(ex)[0])
    texts = lower_pair(ex)
    start = time.process_time()
    report = check_texts(*texts, verify_rules=False, general_budget=budget)
    cpu = time.process_time() - start
    tier = report.stats.get("general_tier") or {}
    reason = "" if report.proven else f"  {tier.get('reason', '')[:100]}"
    kind = "attention" if attention else "mlp"
    mesh = f"dp{dp} " if dp > 1 else ""
    return (f"L{layers:<2} {mesh}pp{pp} tp{tp} micro {micro} {kind:<9} {cpu:6.1f} "
            f"{report.verdict:<12} {error:9.2e}{reason}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="only the rows of 4 devices")
    parser.add_argument("--general-budget", type=int, default=30, metavar="SECONDS",
                        help="each check's general-tier budget (wall)")
    args = parser.parse_args(argv)
    rows = [r for r in ROWS if not args.quick or r[1] * r[2] * (r[5:] or (1,))[0] == 4]
    print(f"load average before: {os.getloadavg()[0]:.1f}")
    print(f"{'row':<34} {'CPU s':>6} {'verdict':<12} {'max error':>9}")
    for row in rows:
        print(run(*row[:5], *(row[5:] or (1,)), budget=args.general_budget), flush=True)
    print(f"load average after: {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
