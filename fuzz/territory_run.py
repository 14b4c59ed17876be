"""Execute, label and check the general tier's territory programs (`fuzz.territory`).

    from fuzz.territory_run import run_seed, summarize
    outcomes = run_seed(7, mutants=2)     # the program of seed 7 and two of its mutants

**Labels come from execution, never from construction.** The reference and the shard_map
program run on simulated CPU devices on four input sets: two random ones, an *exact* one
(floats that are integers up to 500 in magnitude, so the programs' sums and products are exact
in any order while bfloat16 cannot hold most of them; index arguments at the blocks' edges)
and a *wrap* one (int32 values near +-2^31 and between 2^16 and 2^24). A program is `correct` when, on
every input set where the reference is finite, its result matches: integers exactly, floats
within rtol/atol 1e-4 (float sums may be reassociated: the semantics policy). A mutant is
`buggy` when it differs there from the reference on an input set where its unmutated program
matched, or when, on the exact set where the unmutated program reproduces the reference bit
for bit, the mutant does not (a constant one ulp off, a narrowed dtype: changes smaller than
the tolerance that reassociation cannot explain). A mutant that computes the same numbers is
`correct` (an equivalent mutant: a wrap-around that cancels, a rotation by 0). A program jax
cannot build or run is `invalid`; one with no finite reference value `unjudged`.

**Verdicts** are `entangle check`'s defaults (`check_texts`, rule instances verified by Z3,
general tier on). For a proof, `tier` says which tier proved it (`report.stats["tier"]`);
otherwise `reason` is the general tier's own reason (`stats["general_tier"]`), else the
layout tier's first diagnostic. A program whose numbers match and whose report claims a bug
has its claims confirmed as `entangle check` does (`fuzz.run.confirm_claims`): a claim that
survives on a `correct` program is a false bug report.

`problems(outcome)` is the consistency check of a verdict with its grounded label (a false
proof, a false bug report); the tests and the benchmark use it.

Importing this module imports jax with 8 simulated CPU devices.
"""

from __future__ import annotations

import os

if "--xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                               + " --xla_force_host_platform_device_count=8").strip()

import collections
import re
import time
from dataclasses import asdict, dataclass

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from entangle_mlir.evidence import FAST_COMPILE
from fuzz.gen import RandomChooser
from fuzz.run import (
    CHECK_TIMEOUT,
    compare,
    confirm_claims,
    jax_mesh,
    pspec,
    timed_check,
)
from fuzz.territory import TArg, TProgram, generate, mutants

INPUT_SETS = ("random0", "random1", "exact", "wrap")


# ----- building and running -------------------------------------------------------------------

def build(prog: TProgram):
    """(reference function, jitted shard_map function) of a program, from its source."""
    ns: dict = {"jax": jax, "jnp": jnp, "lax": lax, "P": P}
    exec(compile(prog.source(), "territory_program.py", "exec"), ns)  # noqa: S102 - generated
    sharded = jax.jit(jax.shard_map(ns["body"], mesh=jax_mesh(prog.mesh),
                                    in_specs=tuple(pspec(a.spec) for a in prog.args),
                                    out_specs=pspec(prog.out_spec), check_vma=False))
    return ns["reference"], sharded


def _avals(prog: TProgram, sharded: bool):
    mesh = jax_mesh(prog.mesh)
    return [jax.ShapeDtypeStruct(a.shape, jnp.dtype(a.dtype),
                                 sharding=NamedSharding(mesh, pspec(a.spec)) if sharded else None)
            for a in prog.args]


def _draw(a: TArg, label: str, rng) -> np.ndarray:
    shape = a.shape
    if a.role == "index":
        if label == "exact":
            m = max(a.high // 8, 1)
            edges = np.array(sorted({min(max(v, 0), a.high - 1) for k in range(0, a.high + 1, m)
                                     for v in (k - 1, k, k + 1)}))
            return rng.choice(edges, shape).astype(a.dtype)
        return rng.integers(0, a.high, shape).astype(a.dtype)
    if a.dtype == "int32":
        if label == "wrap":
            sign = np.where(rng.random(shape) < 0.5, -1, 1)
            near = np.where(sign > 0, 2**31 - 1 - rng.integers(0, 64, shape),
                            -(2**31) + rng.integers(0, 64, shape))
            x = np.where(rng.random(shape) < 0.5, near, sign * rng.integers(1 << 16, 1 << 24,
                                                                            shape))
        elif label == "exact":
            x = rng.integers(-3, 4, shape)
        else:
            x = rng.integers(-1000, 1000, shape)
        return x.astype(np.int32)
    if label == "exact":
        x = rng.integers(-500, 501, shape).astype(np.float64)
    else:
        x = rng.standard_normal(shape)
        if a.role == "weight":
            x = x / np.sqrt(max(shape[0], 1))
    return np.asarray(x, dtype=np.float32)


def input_sets(prog: TProgram) -> list[tuple[str, list[np.ndarray]]]:
    out = []
    for k, label in enumerate(INPUT_SETS):
        rng = np.random.default_rng(1000 + k)
        out.append((label, [_draw(a, label, rng) for a in prog.args]))
    return out


class Built:
    """A program lowered (texts for the checker) and compiled (for execution)."""

    def __init__(self, prog: TProgram, reference: bool):
        ref_fn, sharded = build(prog)
        self.prog = prog
        shd_lowered = sharded.lower(*_avals(prog, True))
        self.shd_text = shd_lowered.as_text(debug_info=True)
        self.shd = shd_lowered.compile(compiler_options=FAST_COMPILE)
        if reference:
            ref_lowered = jax.jit(ref_fn).lower(*_avals(prog, False))
            self.ref_text = ref_lowered.as_text(debug_info=True)
            self.ref = ref_lowered.compile(compiler_options=FAST_COMPILE)

    def run_reference(self, inputs) -> np.ndarray:
        return np.asarray(self.ref(*inputs))

    def run(self, inputs) -> np.ndarray:
        mesh = jax_mesh(self.prog.mesh)
        placed = [jax.device_put(x, NamedSharding(mesh, pspec(a.spec)))
                  for x, a in zip(inputs, self.prog.args, strict=True)]
        return np.asarray(self.shd(*placed))


# ----- grounding ------------------------------------------------------------------------------

def _bits(a: np.ndarray) -> np.ndarray:
    a = np.ascontiguousarray(a)
    return a.view(np.dtype(f"u{a.dtype.itemsize}"))


def _finite(r: np.ndarray) -> bool:
    return not np.issubdtype(r.dtype, np.floating) or bool(np.all(np.isfinite(r)))


def matches(ref: np.ndarray, got: np.ndarray) -> bool:
    """The result agrees with the reference: same shape, integers exactly, floats within
    the fuzzers' tolerance (finite)."""
    if ref.shape != got.shape or ref.dtype != got.dtype:
        return False
    if not np.issubdtype(ref.dtype, np.floating):
        return bool(np.array_equal(ref, got))
    return bool(np.all(np.isfinite(got))) and compare(ref, got)[0]


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and bool(
        np.array_equal(_bits(a), _bits(b)))


@dataclass
class Grounded:
    """A base program executed: the reference's and its own results per input set."""

    built: Built
    sets: list[tuple[str, list[np.ndarray], np.ndarray, np.ndarray]]
    """(label, inputs, reference result, the program's result) per input set."""

    @staticmethod
    def of(prog: TProgram) -> Grounded:
        built = Built(prog, reference=True)
        sets = []
        for label, inputs in input_sets(prog):
            sets.append((label, inputs, built.run_reference(inputs), built.run(inputs)))
        return Grounded(built, sets)

    def label(self) -> tuple[str, str, str]:
        """(correct / buggy / unjudged, numbers, the input sets that show it) of the base."""
        judged = [(lab, r, g) for lab, _, r, g in self.sets if _finite(r)]
        if not judged:
            return "unjudged", "", ""
        bad = [lab for lab, r, g in judged if not matches(r, g)]
        return ("buggy", "differ", ",".join(bad)) if bad else ("correct", "same", "")

    def label_mutant(self, built: Built) -> tuple[str, str, str]:
        """(correct / buggy / unjudged, differ / bits / same, the input sets that show it)
        of a mutant, on the input sets where the base reproduces the reference."""
        usable = [(lab, x, r, g) for lab, x, r, g in self.sets if _finite(r) and matches(r, g)]
        if not usable:
            return "unjudged", "", ""
        differ, bits = [], []
        for lab, inputs, ref, base in usable:
            got = built.run(inputs)
            if not matches(ref, got):
                differ.append(lab)
            elif lab == "exact" and same_bits(ref, base) and not same_bits(ref, got):
                bits.append(lab)
        if differ:
            return "buggy", "differ", ",".join(differ)
        if bits:
            return "buggy", "bits", ",".join(bits)
        return "correct", "same", ""


# ----- checking and classifying ---------------------------------------------------------------

@dataclass
class TOutcome:
    seed: object
    kind: str
    mesh: str
    constructs: tuple
    mutation: str | None
    mutation_kind: str | None
    label: str = ""          # correct / buggy / invalid / unjudged
    numbers: str = ""        # same / differ / bits
    where: str = ""          # input sets that show a difference
    verdict: str = ""        # proven / not_proven / input_error / crash / timeout
    tier: str = ""           # layout / general (of a proof)
    reason: str = ""         # why not proven (the general tier's reason, else the layout's)
    layout_reason: str = ""  # the layout tier's first diagnostic's category
    claim: str = ""          # "" / withdrawn / confirmed / stands (fuzz.run.confirm_claims)
    status: str = ""         # see `classify`
    message: str = ""
    seconds: float = 0.0
    check_seconds: float = 0.0
    source: str = ""

    def to_json(self) -> dict:
        return asdict(self)


STATUSES = ("proven", "unproven", "false_bug_report", "flagged", "rejected", "false_proof",
            "input_error", "crash", "timeout", "invalid", "unjudged", "gen_error")


def classify(label: str, verdict: str, claim: str = "") -> str:
    """The status of a verdict against its grounded label: on a `correct` program `proven`,
    `unproven`, `false_bug_report` (a bug claim survives confirmation), `input_error`; on a
    `buggy` one `flagged`, `rejected` (bad input: also flagged), `false_proof`; `crash` and
    `timeout` on either; `invalid` / `unjudged` labels carry over."""
    if label in ("invalid", "unjudged"):
        return label
    if verdict in ("crash", "timeout"):
        return verdict
    if label == "correct":
        if verdict == "proven":
            return "proven"
        if verdict == "input_error":
            return "input_error"
        return "false_bug_report" if claim in ("stands", "confirmed") else "unproven"
    if label == "buggy":
        if verdict == "proven":
            return "false_proof"
        return "rejected" if verdict == "input_error" else "flagged"
    raise ValueError(f"unknown label {label!r}")


def problems(outcome: TOutcome | dict) -> list[str]:
    """What is wrong with a verdict given its grounded label: a proof of a program whose
    numbers differ (a soundness bug), a bug claim that stands on a program whose numbers
    match, a crash. Empty when the verdict is consistent (a timeout is counted, not a
    problem: the check's time budget on a loaded machine)."""
    o = outcome if isinstance(outcome, dict) else outcome.to_json()
    status = classify(o["label"], o["verdict"], o.get("claim", ""))
    return {"false_proof": [("FALSE PROOF: proven, but the numbers differ "
                            f"({o.get('numbers')} on {o.get('where')})")],
            "false_bug_report": [(f"FALSE BUG REPORT: the numbers match, the claim "
                                 f"{o.get('claim')}: {o.get('message', '')[:200]}")],
            "crash": ["CRASH: " + o.get("message", "")[-300:]]}.get(status, [])


def norm_reason(msg: str) -> str:
    """A reason with its numbers, names and types blanked (for the histogram)."""
    msg = re.sub(r"tensor<[^>]*>", "T", msg)
    msg = re.sub(r"'[^']*'|\"[^\"]*\"", "'A'", msg)
    msg = re.sub(r"%[\w#]+", "%v", msg)
    msg = re.sub(r"\d+", "N", msg)
    return msg.strip()[:160]


def verdict_of(report, kind: str | None, msg: str) -> tuple[str, str, str, str, str]:
    """(verdict, tier, reason, layout reason, message) of a check."""
    if report is None:
        return kind or "crash", "", norm_reason(msg.splitlines()[-1] if msg else ""), "", msg
    first = report.diagnostics[0] if report.diagnostics else None
    message = first.message if first is not None else ""
    layout = first.category if first is not None else ""
    if report.proven:
        return "proven", report.stats.get("tier", "layout"), "", layout, message
    general = report.stats.get("general_tier") or {}
    reason = general.get("reason") or (f"{layout}: {message}" if first else "no diagnostic")
    if "_Timeout" in reason:   # timed_check's alarm, caught by the general tier's guard
        return "timeout", "", "", layout, message
    return "not_proven", "", norm_reason(reason), layout, message


def check_one(prog: TProgram, built: Built, ref_text: str, label: tuple[str, str, str],
              timeout: int = CHECK_TIMEOUT) -> TOutcome:
    out = TOutcome(prog.seed, prog.kind, prog.mesh.describe(), prog.constructs, prog.mutation,
                   prog.mutation_kind, source=prog.source())
    out.label, out.numbers, out.where = label
    t0 = time.perf_counter()
    report, kind, msg = timed_check(ref_text, built.shd_text, verify_rules=True,
                                    timeout=timeout)
    out.check_seconds = time.perf_counter() - t0
    out.verdict, out.tier, out.reason, out.layout_reason, out.message = verdict_of(
        report, kind, msg)
    if out.label == "correct" and out.verdict == "not_proven":
        out.claim = confirm_claims(report, ref_text, built.shd_text)
    out.status = classify(out.label, out.verdict, out.claim)
    return out


def run_seed(seed: int, mutants_per_program: int = 2, kinds=None,
             timeout: int = CHECK_TIMEOUT) -> list[TOutcome]:
    """The program of `seed` and up to `mutants_per_program` of its mutants (those jax can
    build), each executed, labelled and checked."""
    start = time.perf_counter()
    prog = generate(RandomChooser(seed), seed, kinds)
    try:
        base = Grounded.of(prog)
    except Exception as err:  # noqa: BLE001 - jax rejects the generated program
        return [TOutcome(seed, prog.kind, prog.mesh.describe(), prog.constructs, None, None,
                         label="invalid", status="gen_error", source=prog.source(),
                         message=f"{type(err).__name__}: {str(err)[:500]}")]
    results = [check_one(prog, base.built, base.built.ref_text, base.label(), timeout)]
    results[0].seconds = time.perf_counter() - start
    if results[0].label != "correct":
        # The generator meant it to be correct; its mutants are not judged against it.
        results[0].message = "[the base program's numbers differ] " + results[0].message
        return results
    ch = RandomChooser(seed * 7919 + 17)
    for mut in mutants(prog, ch, 3 * mutants_per_program):
        if sum(1 for r in results[1:] if r.label != "invalid") >= mutants_per_program:
            break
        t = time.perf_counter()
        try:
            built = Built(mut, reference=False)
            label = base.label_mutant(built)
        except Exception as err:  # noqa: BLE001 - jax rejects the mutant: not counted
            results.append(TOutcome(seed, mut.kind, mut.mesh.describe(), mut.constructs,
                                    mut.mutation, mut.mutation_kind, label="invalid",
                                    status="invalid", source=mut.source(),
                                    message=f"{type(err).__name__}: {str(err)[:300]}"))
            continue
        o = check_one(mut, built, base.built.ref_text, label, timeout)
        o.seconds = time.perf_counter() - t
        results.append(o)
    return results


# ----- the table ------------------------------------------------------------------------------

def summarize(results: list[dict]) -> dict:
    """Counts of the run: correct programs by tier, buggy ones flagged, problems."""
    correct = [r for r in results if r["label"] == "correct"]
    buggy = [r for r in results if r["label"] == "buggy"]
    status = collections.Counter(r["status"] for r in results)
    unproven = [r for r in correct if r["verdict"] != "proven"]
    return {
        "programs": sum(1 for r in results if r["label"] in ("correct", "buggy")),
        "base_programs": sum(1 for r in results if r["mutation"] is None),
        "base_not_correct": sum(1 for r in results if r["mutation"] is None
                                and r["label"] != "correct"),
        "correct": len(correct),
        "correct_mutants": sum(1 for r in correct if r["mutation"] is not None),
        "proven_layout": sum(1 for r in correct if r["verdict"] == "proven"
                             and r["tier"] == "layout"),
        "proven_general": sum(1 for r in correct if r["verdict"] == "proven"
                              and r["tier"] == "general"),
        "not_proven": len(unproven),
        "not_proven_reasons": collections.Counter(r["reason"] or r["verdict"]
                                                  for r in unproven).most_common(),
        "buggy": len(buggy),
        "buggy_bits": sum(1 for r in buggy if r["numbers"] == "bits"),
        "flagged": sum(1 for r in buggy if r["status"] in ("flagged", "rejected")),
        "buggy_by_kind": {k: (sum(1 for r in buggy if r["mutation_kind"] == k),
                              sum(1 for r in buggy if r["mutation_kind"] == k
                                  and r["status"] in ("flagged", "rejected")))
                          for k in ("value", "collective")},
        "flagged_bug_claim": sum(1 for r in buggy if r["status"] == "flagged"
                                 and r["layout_reason"] in _claims()),
        "false_proofs": status["false_proof"],
        "false_bug_reports": status["false_bug_report"],
        "claims_withdrawn": sum(1 for r in correct if r["claim"] == "withdrawn"),
        "crashes": status["crash"],
        "timeouts": status["timeout"],
        "input_errors": status["input_error"],
        "invalid_mutants": status["invalid"],
        "gen_errors": status["gen_error"],
        "by_kind": {k: _kind_row(results, k) for k in sorted({r["kind"] for r in results})},
    }


def _claims() -> frozenset[str]:
    from entangle_mlir.core.reasons import CLAIMS

    return CLAIMS


def _kind_row(results: list[dict], kind: str) -> dict:
    rs = [r for r in results if r["kind"] == kind]
    correct = [r for r in rs if r["label"] == "correct"]
    buggy = [r for r in rs if r["label"] == "buggy"]
    return {"correct": len(correct),
            "layout": sum(1 for r in correct if r["status"] == "proven" and r["tier"] == "layout"),
            "general": sum(1 for r in correct if r["status"] == "proven"
                           and r["tier"] == "general"),
            "buggy": len(buggy),
            "flagged": sum(1 for r in buggy if r["status"] in ("flagged", "rejected")),
        "buggy_by_kind": {k: (sum(1 for r in buggy if r["mutation_kind"] == k),
                              sum(1 for r in buggy if r["mutation_kind"] == k
                                  and r["status"] in ("flagged", "rejected")))
                          for k in ("value", "collective")},
            "problems": sum(1 for r in rs if problems(r))}


def _pct(k: int, n: int) -> str:
    return f"{k} ({100.0 * k / n:.1f}%)" if n else f"{k}"


def table(s: dict, header: str = "") -> str:
    """The run's table as Markdown."""
    c, b = s["correct"], s["buggy"]
    rows = [
        ("programs judged (label from execution)", s["programs"]),
        ("correct (numbers match the reference)", (f"{c} ({s['correct_mutants']} of them "
                                                  "equivalent mutants)")),
        ("  proven by the layout tier", _pct(s["proven_layout"], c)),
        ("  proven by the general tier", _pct(s["proven_general"], c)),
        ("  not proven", _pct(s["not_proven"], c)),
        ("buggy (numbers differ)", f"{b} ({s['buggy_bits']} only bitwise, on exact inputs)"),
        ("  flagged (not proven)", _pct(s["flagged"], b)),
        ("  of them with a located bug claim (before confirmation)", s["flagged_bug_claim"]),
        *((f"  {k} mutants flagged", f"{f} of {n}") for k, (n, f) in s["buggy_by_kind"].items()),
        ("FALSE PROOFS", s["false_proofs"]),
        ("FALSE BUG REPORTS (a claim stands on a correct program)", s["false_bug_reports"]),
        ("bug claims on correct programs withdrawn by confirmation", s["claims_withdrawn"]),
        ("crashes", s["crashes"]),
        ("timeouts (the check's 60 s budget)", s["timeouts"]),
        ("input errors on correct programs", s["input_errors"]),
        ("base programs whose numbers differ (generator defects)", s["base_not_correct"]),
        ("mutants jax rejects (not counted)", s["invalid_mutants"]),
    ]
    out = [header] if header else []
    out += ["| | count |", "| --- | ---: |"]
    out += [f"| {k} | {v} |" for k, v in rows]
    out += ["", "| template | correct | layout tier | general tier | buggy | flagged | problems |",
            "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for kind, r in s["by_kind"].items():
        out.append(f"| {kind} | {r['correct']} | {r['layout']} | {r['general']} | {r['buggy']} "
                   f"| {r['flagged']} | {r['problems']} |")
    if s["not_proven_reasons"]:
        out += ["", ("Correct programs not proven, by reason (the general tier's, else the "
                "layout tier's):"), "", "| count | reason |", "| ---: | --- |"]
        out += [f"| {k} | {reason.replace('|', '/')} |" for reason, k in s["not_proven_reasons"]]
    return "\n".join(out)


def explain(seed: int, mutation: str | None = None) -> str:
    """The program of `seed` (or its mutant whose description contains `mutation`), its
    grounded label and `entangle check`'s report: reproduces one finding."""
    from dataclasses import replace as _replace

    from fuzz.territory import apply_mutation, generate_seed, program_mutations

    prog = generate_seed(seed)
    base = Grounded.of(prog)
    label, built = base.label(), base.built
    if mutation is not None:
        found = [m for m in program_mutations(prog) if mutation in m[0]]
        if not found:
            raise SystemExit(f"seed {seed} has no mutation like {mutation!r}")
        prog = _replace(apply_mutation(prog, found[0]), seed=seed)
        built = Built(prog, reference=False)
        label = base.label_mutant(built)
    report, kind, msg = timed_check(base.built.ref_text, built.shd_text, verify_rules=True)
    verdict = report.render_text() if report is not None else f"{kind}: {msg}"
    return (f"{prog.source()}\n--- label: {label[0]} (numbers {label[1] or '-'}"
            f"{' on ' + label[2] if label[2] else ''})\n--- entangle:\n{verdict}")


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser(description="reproduce one territory fuzz program: "
                                 "python -m fuzz.territory_run SEED [--mutation DESC]")
    ap.add_argument("seed", type=int)
    ap.add_argument("--mutation", default=None, help="(a substring of) the mutant's description")
    a = ap.parse_args()
    print(explain(a.seed, a.mutation))
