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

from entangle_mlir.core.relations import Opaque
from entangle_mlir.mlir.ir import context, parse_module
from entangle_mlir.mlir.program import from_two_modules
from entangle_mlir.passes.pipeline import PassState, parse_pipeline, run_pipeline

_PIPELINE = ("entangle-normalize,entangle-import-shardings,"
             "entangle-infer-relations{annotate=false},entangle-check-refinement")
_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def analyse(ref_text: str, sharded_text: str):
    """(report, [(side, reason, location, op name)] root causes, reference first)."""
    from entangle_mlir.passes import PASSES

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


# Why a program is not proven (or a bug is not flagged at its line): (key, construct, pattern on
# the first diagnostic). The first match wins; the keys name the reproducers in `repro.py`.
CAUSES: list[tuple[str, str, str]] = [
    ("take_and_reducer", ("jnp.take / take_along_axis bounds check (reduce with an `and` "
     "reducer)"), r"reduce with a 'and' reducer"),
    ("device_offset_tensor", ("axis_index offsets broadcast into tensors (vocab-parallel mask, "
     "sequence positions)"), (r"device-dependent scalar broadcast|remainder mixes a "
     r"device-dependent|device-dependent offset tensor used by|device-dependent integer "
     r"carried through a loop|broadcast_in_dim computes broadcast\(iota|split over 'cp' vs not "
     r"split")),
    ("gather_batching_dims", "take_along_axis (gather with batching dims)",
     r"gather with batching dims"),
    ("scatter_batching_dims", "take_along_axis gradient (scatter with batching dims)",
     r"scatter with batching dims"),
    ("top_k", "chlo.top_k (MoE router)", r"chlo\.top_k"),
    ("scan_backward", ("lax.scan backward (stacked gradients by dynamic_update_slice in "
     "stablehlo.while)"), (r"dynamic_update_slice into dim|select: operands are laid out "
     r"differently along dim 1 \(not split vs split over 'tp'\)")),
    ("bias_grad_unit_dims", ("gradient of a tp-split bias (reshape (n,) -> (1, 1, n) puts the "
     "split on a unit dim, then a reduce makes it a partial sum)"),
     r"(subtract combines|square applied to) a partial sum over 'tp'"),
    ("dp_mean_coefficients", ("local mean under data parallelism (1/N_local cotangent; the "
     "pmean's 1/n is not factored through the gradient's products)"),
     r"multiply computes \(1/\d+\*"),
    ("unit_dim_transpose", ("a split dim of local size 1 (one sequence, head or kv head per "
     "device): jax's transpose of broadcast_in_dim / repeat reduces it as a unit dim"),
     (r"combines a partial sum over 'dp'|dot_general: operands are laid out differently along "
     r"dim 0|add combines a partial sum over 'tp' \(missing all_reduce/psum\) with a value "
     r"split over 'tp'")),
    ("slice_of_split_dim", "micro-batching the local batch (static slice of a dp-split dim)",
     r"slice of dim 0, which is split over 'dp'"),
    ("unit_batch_view", ("one sequence per device under dp: the loss's gradient mixes the "
     "batch dim's global views"), (r"pad of dim 0, which is split over 'dp'|reduce computes "
     r"\(\S+\*reduce_sum")),
    ("moe_flatten_split_seq", "MoE under sequence parallelism (flattening a seq-split batch)",
     r"reshape regroups dim 1, which is split over 'tp'"),
    ("scale_located_at_backward_op", ("a wrongly scaled gradient reduction is reported at the "
     "first gradient value at the wrong scale, not at the synchronisation"),
     r"value is \d+ x what the reference computes here"),
    ("grad_norm_located_at_sum", "grad-norm sum counting replicated parameters",
     r"add computes \(\S+\*reduce_sum"),
    ("ring_overflow", ("ring attention whose running max may be -inf where a whole block of "
     "scores overflows (NaN where the reference is finite): not proven by default, proven "
     "under --assume-no-overflow"), r"running max may be -inf where a whole block of scores"),
    ("ring_permute", "ring attention (collective_permute of K/V blocks, online softmax)",
     r"collective_permute moves blocks|key positions of ring step"),
    ("allgather_partial", "psum written as all_gather on a new axis + sum",
     r"all_gather over 'tp' of a partial sum"),
    ("local_max", "per-shard max without pmax (exp(m_local) rescaling)", r"partial max"),
    ("exp_algebra", "log-sum-exp without max subtraction (exp(x - m) * exp(m) = exp(x))",
     r"exponential computes exponential"),
    ("missing_grad_reduction_located_at_backward_op", ("a missing gradient all-reduce is "
     "reported at the backward op that made the partial sum, not at the synchronisation"),
     r"still a partial sum over .* when it leaves shard_map"),
]


def classify(message: str) -> tuple[str, str]:
    """(cause key, construct) of a first diagnostic; ("other", message) if none matches."""
    for key, construct, pattern in CAUSES:
        if re.search(pattern, message):
            return key, construct
    return "other", "not classified"


def cause_key(reason: str) -> str:
    """A reason with shapes and numbers blurred, to group equal causes."""
    reason = re.sub(r"tensor<[^>]*>", "tensor<..>", reason)
    reason = re.sub(r"\(\d+(, \d+)*\)", "(..)", reason)
    return reason


def verdicts(names=None) -> list[dict]:
    """Check every example (no Z3 rule checks): one record per program."""
    from .catalog import bug_line, examples, lower_pair

    out = []
    for ex in examples():
        if names is not None and ex.name not in names:
            continue
        report, causes = analyse(*lower_pair(ex))
        first = report.diagnostics[0] if report.diagnostics else None
        loc = (str(first.loc).replace(_ROOT + "/", "") if first and first.loc else "")
        message = first.message if first else ""
        rec = {"example": ex, "proven": report.proven, "message": message, "loc": loc,
               "causes": causes, "at_bug_line": None}
        rec["cause"], rec["construct"] = classify(message) if not report.proven else ("", "")
        if ex.bug:
            path, line = bug_line(ex)
            rec["bug_loc"] = f"{path.replace(_ROOT + '/', '')}:{line}"
            rec["at_bug_line"] = bool(first and first.loc and first.loc.file == path
                                      and first.loc.line == line)
        out.append(rec)
    return out


def _short(text: str, n: int = 170) -> str:
    text = " ".join(text.split())
    return text if len(text) <= n else text[:n - 3] + "..."


def write_expected(records: list[dict], path: str) -> None:
    not_proven, mislocated, unsound = {}, {}, []
    for r in records:
        ex = r["example"]
        if ex.bug is None and not r["proven"]:
            not_proven[ex.name] = f"{r['construct']}: {_short(r['message'])}"
        elif ex.bug is not None and r["proven"]:
            unsound.append(ex.name)
        elif ex.bug is not None and not r["at_bug_line"]:
            mislocated[ex.name] = (f"{r['construct']}: flagged at {r['loc']}, not at the BUG "
                                   f"line {r['bug_loc']}: {_short(r['message'], 120)}")
    lines = ['"""Expected verdicts of the verifier on the real-model corpus (strict xfails).',
             "",
             "Generated by `python -m examples.real.survey --write-expected`; each reason is",
             "`<construct>: <what the verifier says>`; the constructs have reproducers in",
             '`repro.py` and are ranked in FAILURES.md."""', "",
             "# Correct programs the verifier does not prove yet.",
             "NOT_PROVEN: dict[str, str] = {"]
    lines += [f"    {k!r}:\n        {v!r}," for k, v in not_proven.items()]
    lines += ["}", "", "# Buggy programs flagged (never proven), but not at their `# BUG` line.",
              "MISLOCATED: dict[str, str] = {"]
    lines += [f"    {k!r}:\n        {v!r}," for k, v in mislocated.items()]
    lines += ["}", "", "# Buggy programs the verifier PROVES (soundness bugs; must stay empty).",
              f"UNSOUND: list[str] = {unsound!r}", ""]
    with open(path, "w") as handle:
        handle.write("\n".join(lines))


_FWD = ("stack", "fwd", "loss")


def write_results(records: list[dict], path: str) -> None:
    """RESULTS.md: the model x parallelism x fwd/bwd matrix and one line per program."""
    rows = [r for r in records if r["example"].bug is None]
    models = sorted(dict.fromkeys(r["example"].model or "-" for r in rows),
                    key=lambda m: (["gpt2", "llama3", "qwen2", "moe"] + [m]).index(m))
    styles = list(dict.fromkeys(r["example"].style for r in rows))
    cell: dict = collections.defaultdict(lambda: [0, 0, 0, 0])
    for r in rows:
        ex = r["example"]
        c = cell[(ex.model or "-", ex.style)]
        bwd = ex.task not in _FWD
        c[2 * bwd] += r["proven"]
        c[2 * bwd + 1] += 1
    out = ["# Verdicts on the real-model corpus", "",
           ("Generated by `python -m examples.real.survey --write-results` (no Z3 rule-instance "
           "checks)."), ("Cells: proven / programs, forward (`fwd`: layers, logits or loss) and "
           "backward (`bwd`: value_and_grad + SGD/AdamW). Causes of the failures: FAILURES.md."),
           "", "| model | " + " | ".join(styles) + " |", "|---" * (len(styles) + 1) + "|"]
    for model in models:
        cells = []
        for style in styles:
            c = cell.get((model, style))
            if not c:
                cells.append("")
                continue
            parts = []
            if c[1]:
                parts.append(f"fwd {c[0]}/{c[1]}")
            if c[3]:
                parts.append(f"bwd {c[2]}/{c[3]}")
            cells.append(", ".join(parts))
        out.append(f"| {model} | " + " | ".join(cells) + " |")
    proven = sum(r["proven"] for r in rows)
    bugs = [r for r in records if r["example"].bug]
    out += ["", (f"Correct programs proven: {proven}/{len(rows)}. Buggy programs flagged: "
            f"{sum(not r['proven'] for r in bugs)}/{len(bugs)} (never proven), at their "
            f"`# BUG` line: {sum(bool(r['at_bug_line']) for r in bugs)}/{len(bugs)}."), "",
            "## Every program", "",
            "| program | model | parallelism | mesh | task | scan | verdict |",
            "|---|---|---|---|---|---|---|"]
    for r in records:
        ex = r["example"]
        if ex.bug:
            verdict = ("**PROVEN (unsound)**" if r["proven"] else
                       "flagged at the BUG line" if r["at_bug_line"] else
                       f"flagged elsewhere ({r['cause']})")
        else:
            verdict = "proven" if r["proven"] else f"not proven ({r['cause']})"
        kind = "bug: " + ex.bug if ex.bug else ("tricky" if ex.tricky else "")
        out.append(f"| `{ex.name}` {kind} | {ex.model} | {ex.style} | {ex.mesh_text} | "
                   f"{ex.task} | {'yes' if ex.scan else ''} | {verdict} |")
    with open(path, "w") as handle:
        handle.write("\n".join(out) + "\n")


def main(argv=None) -> int:
    from .catalog import examples, run_pair

    parser = argparse.ArgumentParser()
    parser.add_argument("-k", default="")
    parser.add_argument("--run", action="store_true", help="also run both programs")
    parser.add_argument("--write-expected", action="store_true",
                        help="rewrite examples/real/expected.py from the current verdicts")
    parser.add_argument("--write-results", action="store_true",
                        help="rewrite examples/real/RESULTS.md from the current verdicts")
    ns = parser.parse_args(argv)
    if ns.k and (ns.write_expected or ns.write_results):
        parser.error("--write-expected / --write-results need the whole corpus (no -k)")
    names = {e.name for e in examples() if ns.k in e.name}
    records = verdicts(names)
    blocked: dict[str, set[str]] = collections.defaultdict(set)
    where: dict[str, str] = {}
    for r in records:
        ex = r["example"]
        line = f"{ex.name}: {'proven' if r['proven'] else 'not proven'}"
        if ns.run:
            import numpy as np

            ref, shd = run_pair(ex)
            diff = max(float(np.max(np.abs(a - b))) for a, b in zip(ref, shd))
            line += f" (max diff {diff:.1e})"
        if r["message"]:
            line += f"  [{r['loc']}] {r['message'][:160]}"
        if ex.bug:
            line += f"  (BUG {r['bug_loc']}{', HERE' if r['at_bug_line'] else ''})"
            if r["proven"]:
                line += "  *** SOUNDNESS: buggy program proven ***"
        print(line, flush=True)
        for side, reason, loc, op in r["causes"]:
            if op in ("sdy.manual_computation", "func.return"):
                continue
            key = f"{side}: {op}: {reason[:140]}"
            blocked[key].add(ex.name)
            where.setdefault(key, loc)
    print("\nfirst blockers (programs):")
    first = collections.Counter(r["cause"] for r in records if not r["proven"]
                                and not (r["example"].bug and r["at_bug_line"]))
    for key, count in first.most_common():
        print(f"{count:4d}  {key}")
    print("\nroot causes anywhere in the walks (programs):")
    for key, found in sorted(blocked.items(), key=lambda kv: -len(kv[1])):
        print(f"{len(found):4d}  {key}  @ {where[key]}")
    here = os.path.dirname(__file__)
    if ns.write_expected:
        write_expected(records, os.path.join(here, "expected.py"))
    if ns.write_results:
        write_results(records, os.path.join(here, "RESULTS.md"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
