"""The verifier on the held-out corpus: one verdict per program, the reasons correct programs are
not proven (grouped), and the generated files.

    python -m examples.heldout.survey [-k SUBSTRING]      # one line per program, then the groups
    python -m examples.heldout.survey --write             # rewrite expected.py, RESULTS.md and
                                                          # the README block

Checks run as `entangle check --no-verify-rules` would (a buggy program not proven without the
Z3 rule checks is not proven with them either), bug claims confirmed by running both programs
as `entangle check` does (`entangle_mlir/confirm.py`). Nothing here is hand-written per program:
the verdicts and reasons are whatever the verifier says today.
"""

from __future__ import annotations

import argparse
import collections
import os
import re

from .corpus import SOURCES, Example, bug_line, examples, lower_pair

_HERE = os.path.dirname(os.path.abspath(__file__))
_ROOT = os.path.dirname(os.path.dirname(_HERE))

# Why a correct program is not proven, from its first diagnostic: (pattern, group, kind). The
# kind says what the diagnostic claims: "unsupported" (an op or form the verifier does not
# handle yet, said so), "cannot relate" (it could not express the value in terms of the
# reference, said so), "needs an assumption" (equal under an assumption the semantics policy
# does not make by default, named with its flag), or "claims a bug" (it states the program is
# wrong: on a correct program that is a false bug report, issue 18's third point). First match
# wins.
REASONS: list[tuple[str, str, str]] = [
    (r"^in the reference: ", "an op of the reference unsupported (argmax, lax.switch, ...)",
     "unsupported"),
    (r"a block on the diagonal of two dims split over one axis",
     ("a block on the diagonal of two dims split over one axis (dense expert parallelism "
      "around a ring of token blocks: each device's tokens against its own experts)"),
     "unsupported"),
    (r"entry \d+ of each device's block of one_hot",
     ("one entry of each device's block by a scalar index (dense expert parallelism's loop "
      "over its local experts, `ids == shard offset + i`)"), "unsupported"),
    (r"unsupported op|not supported yet",
     ("unsupported op or device-dependent tensor (ApproxTopK custom calls, axis_index as "
     "data)"), "unsupported"),
    (r"shard_map returns a device-dependent value",
     "a device-dependent value passed between manual computations (a gradient's residuals)",
     "unsupported"),
    (r"equal assuming no intermediate overflow", ("equal only where no value overflows "
     "(jax's is_finite guard of a max against an unguarded shift): proven with "
     "--assume-no-overflow"), "needs an assumption"),
    (r"pass --assume-no-overflow", ("a rewrite refused where a value may overflow (an online "
     "softmax's shift -inf on a whole block of overflowing scores): proven with "
     "--assume-no-overflow"), "needs an assumption"),
    (r"all_gather over .* of a partial (max|min)", ("per-device answers (argmax, top-k "
     "candidates) gathered by design called a gather of a partial max"), "claims a bug"),
    (r"the layout tier does not relate per-block answers",
     "argmax over a split dim (per-device answers combined by the program)", "unsupported"),
    (r"compare of i32 values plus a device offset",
     "vocab-parallel mask (ids - start compared with 0 and n)", "cannot relate"),
    (r"no block offsets of any mesh axes|selects no sub-block|computed offset",
     "dynamic_slice at a device-dependent chunk offset (collective matmuls, rings)",
     "cannot relate"),
    (r"device-dependent offset is wrong",
     "device-dependent chunk offset called wrong (collective matmuls)", "claims a bug"),
    (r"which the reference never computes", ("a value the reference never computes "
     "(XLA's rewrites, all_to_all block transposes, slices of weights)"), "cannot relate"),
    (r"replica groups .* do not correspond", "replica groups that are no mesh axes",
     "cannot relate"),
    (r"not split over .* along exactly one other dim", "all_to_all of an unsplit dim",
     "cannot relate"),
    (r"laid out differently", ("operands laid out differently (tiles of replicated inputs, "
     "pipeline stages)"), "cannot relate"),
    (r"(sums|takes the (max|min)) over .* of a value split over|reduce_scatter sums over",
     ("block sums/maxima by design (psum/pmax/psum_scatter of a tiled value) called a "
     "reduction of different blocks"), "claims a bug"),
    (r"combines a partial max over .* with a value split over",
     ("a block's own max shift (a local logsumexp, combined later) called a missing pmax"),
     "claims a bug"),
    (r"still a partial sum .* leaves shard_map|applied to a partial sum",
     "per-device results by design called a missing psum", "claims a bug"),
    (r"out_specs declares", "tiled or gathered outputs by design called a wrong out_specs",
     "claims a bug"),
    (r"all_gather concatenates along dim \d+ but", ("all_gather(tiled=False) (+ reshape) "
     "called a gather along the wrong dim"), "claims a bug"),
    (r"reshape regroups dim .* mixes blocks", ("reshape of a split dim (jax's transposes in "
     "gradients, ravel of blocks) called mixing blocks"), "claims a bug"),
    (r"each device (slices|sorts) its own block|each device's windows stop|each device picks",
     "per-device slice/sort/cumsum/top_k by design called local-only", "claims a bug"),
    (r"collective_permute moves blocks", ("ppermute over a tuple of axes called a wrong "
     "permutation"), "claims a bug"),
    (r"not consecutive in the global tensor", ("per-shard roll called halo windows out of "
     "order"), "claims a bug"),
    (r"differs from .* for some inputs", "the general tier's terms differ from the reference's",
     "claims a bug"),
    (r"the mask is not the device's block", ("a mask testing part of the device's block (ids "
     "== shard offset + i: one of the shard's experts) called an off-by-one bound"),
     "claims a bug"),
]


# A claim that running both programs did not confirm (`confirm.py`): "cannot relate <what> to
# the reference (the layout (general) tier's reading "<claim>" was not confirmed: ...)", or
# "(suspected: <claim>; not confirmed: <why>)" when the programs could not be run.
_WITHDRAWN = re.compile(r'^cannot relate .*? to the reference \(the (?:layout|general) tier\'s '
                        r'reading "(.*)" was not confirmed: |^cannot relate .*? to the '
                        r"reference \(suspected: (.*); not confirmed: ")


def reason(message: str) -> tuple[str, str]:
    """(group, kind) of a correct program's first diagnostic. A withdrawn claim is grouped by
    the reading it quotes, as "cannot relate"."""
    withdrawn = _WITHDRAWN.search(message)
    if withdrawn:
        group, kind = reason(withdrawn.group(1) or withdrawn.group(2))
        if kind == "claims a bug":
            return f"{group}: not confirmed by running, withdrawn", "cannot relate"
        return group, kind
    for pattern, group, kind in REASONS:
        if re.search(pattern, message):
            return group, kind
    return "other: " + blur(message), "unclassified"


def blur(message: str) -> str:
    """A message with shapes, numbers and names blurred, to group equal causes."""
    message = re.sub(r"tensor<[^>]*>", "tensor<..>", message)
    message = re.sub(r"'[^']*'", "'..'", message)
    return re.sub(r"\d+", "N", message)[:120]


def _short(text: str, n: int = 170) -> str:
    text = " ".join(text.split())
    return text if len(text) <= n else text[:n - 3] + "..."


def verdicts(names=None) -> list[dict]:
    """Check every program (no Z3 rule checks): one record per program."""
    from entangle_mlir.confirm import confirm_texts, is_claim
    from entangle_mlir.driver import check_texts

    out = []
    for ex in examples():
        if names is not None and ex.name not in names:
            continue
        texts = lower_pair(ex)
        raw = check_texts(*texts, verify_rules=False)
        raw_claim = bool(raw.diagnostics and is_claim(raw.diagnostics[0]))
        report = confirm_texts(raw, *texts)
        first = report.diagnostics[0] if report.diagnostics else None
        message = first.message if first else ""
        rec = {"example": ex, "proven": report.proven, "message": message,
               "loc": str(first.loc).replace(_ROOT + "/", "") if first and first.loc else "",
               "at_bug_line": None, "group": "", "kind": "",
               "claim": bool(first and is_claim(first)), "raw_claim": raw_claim,
               "confirm_seconds": report.stats.get("confirmation seconds", 0.0)}
        if ex.bug is None and not report.proven:
            rec["group"], rec["kind"] = reason(message)
            if rec["claim"]:
                rec["kind"] = "claims a bug"
        if ex.bug is not None:
            path, line = bug_line(ex)
            rec["at_bug_line"] = bool(first and first.loc and first.loc.file == path
                                      and first.loc.line == line)
        out.append(rec)
    return out


# ----- generated files ----------------------------------------------------------------------------

def write_expected(records: list[dict], path: str) -> None:
    not_proven = {r["example"].name: _short(r["message"]) for r in records
                  if r["example"].bug is None and not r["proven"]}
    unsound = [r["example"].name for r in records if r["example"].bug and r["proven"]]
    unconfirmed = {r["example"].name: _short(r["message"]) for r in records
                   if r["example"].bug and not r["proven"] and r["raw_claim"]
                   and not r["claim"]}
    lines = ['"""Expected verdicts of the verifier on the held-out corpus (strict xfails).',
             "",
             "Generated by `python -m examples.heldout.survey --write`; each reason is the first",
             'diagnostic. Do not edit by hand: regenerate when the verifier changes."""', "",
             "# Correct programs the verifier does not prove yet (program -> first diagnostic).",
             "NOT_PROVEN: dict[str, str] = {"]
    lines += [f"    {k!r}:\n        {v!r}," for k, v in not_proven.items()]
    lines += ["}", "", "# Buggy programs the verifier PROVES (false proofs; must stay empty).",
              f"UNSOUND: list[str] = {unsound!r}", "",
              ("# Buggy programs whose bug claim running both programs did not confirm "
               "(flagged, but"),
              ("# inconclusive: confirmation's random inputs do not reach the bug) -> the "
               "first diagnostic."),
              "UNCONFIRMED: dict[str, str] = {"]
    lines += [f"    {k!r}:\n        {v!r}," for k, v in unconfirmed.items()]
    lines += ["}", ""]
    with open(path, "w") as handle:
        handle.write("\n".join(lines))


def counts(records: list[dict]) -> dict[str, dict[str, int]]:
    """Per source (and "total"): correct proven/total, bugs flagged/total, false proofs,
    false bug reports on correct programs."""
    table: dict[str, dict[str, int]] = collections.defaultdict(lambda: collections.Counter())
    for r in records:
        ex: Example = r["example"]
        for key in (ex.source, "total"):
            c = table[key]
            if ex.bug is None:
                c["correct"] += 1
                c["proven"] += r["proven"]
                c["false_bug_report"] += r["kind"] == "claims a bug"
            else:
                c["bugs"] += 1
                c["flagged"] += not r["proven"]
                c["false_proof"] += r["proven"]
                c["at_bug_line"] += bool(r["at_bug_line"])
                c["claimed"] += r["claim"]
    return table


def _table_rows(records: list[dict]) -> list[str]:
    table = counts(records)
    rows = [("| source | programs | correct proven | bugs flagged | false proofs | "
             "false bug reports |"),
            "|---|---|---|---|---|---|"]
    for key in list(SOURCES) + ["total"]:
        c = table[key]
        name = f"`{key}`" if key != "total" else "**total**"
        rows.append(f"| {name} | {c['correct'] + c['bugs']} | {c['proven']} / {c['correct']} | "
                    f"{c['flagged']} / {c['bugs']} | {c['false_proof']} | "
                    f"{c['false_bug_report']} |")
    return rows


def write_results(records: list[dict], path: str) -> None:
    table = counts(records)
    total = table["total"]
    correct = [r for r in records if r["example"].bug is None]
    unproven = [r for r in correct if not r["proven"]]
    unsound = [r for r in records if r["example"].bug and r["proven"]]
    out = ["# The verifier on programs written by others", "",
           ("Generated by `python -m examples.heldout.survey --write` (checks without the Z3 "
           "rule-instance checks, as `entangle check --no-verify-rules`; a bug not proven "
           "there is not proven with them either; bug claims confirmed by running both "
           "programs, as `entangle check` does). Every label is grounded by execution on "
           "simulated CPU devices (tests/examples/test_heldout_grounded.py). A false bug report "
           "is a correct program whose first diagnostic claims a bug."), "",
           "## Counts by source", ""]
    out += _table_rows(records)
    out += ["", "Sources: " + "; ".join(f"`{k}`: {v}" for k, v in SOURCES.items()) + ".", ""]
    forms = collections.defaultdict(lambda: [0, 0])
    for r in correct:
        f = forms[r["example"].form]
        f[0] += r["proven"]
        f[1] += 1
    out += ["By form (correct programs proven): " + ", ".join(
        f"{k} {v[0]}/{v[1]}" for k, v in sorted(forms.items())) + ".", ""]
    out += ["## False proofs (buggy programs proven)", ""]
    if unsound:
        out += [f"* **`{r['example'].name}`**: {r['example'].bug}" for r in unsound]
    else:
        out += [(f"None: all {total['bugs']} buggy programs are flagged (never proven); "
                f"{total['at_bug_line']} of them at their `# BUG` line; {total['claimed']} with "
                "a bug claim confirmed by running both programs (the others say what they "
                "cannot relate or do not support).")]
    out += ["", _twins(records)]
    kinds = collections.Counter(r["kind"] for r in unproven)
    out += ["", "## Why correct programs are not proven", "",
            f"{len(unproven)} of {len(correct)} correct programs are not proven. What the first "
            "diagnostic says: " + ", ".join(f"{n} {k}" for k, n in kinds.most_common()) + ". "
            "\"claims a bug\" is a false bug report: the diagnostic states the program is wrong "
            "(a missing psum, a wrong offset, a reduction of different blocks) where it is "
            "correct by execution. A claim the layout tier makes but running both programs "
            "does not confirm is withdrawn: \"cannot relate\", grouped by the reading it "
            "quotes.", "",
            "| programs | kind | first diagnostic, grouped | programs |", "|---|---|---|---|"]
    groups = collections.defaultdict(list)
    for r in unproven:
        groups[(r["group"], r["kind"])].append(r["example"].name)
    for (group, kind), names in sorted(groups.items(), key=lambda kv: -len(kv[1])):
        out.append(f"| {len(names)} | {kind} | {group} | "
                   + ", ".join(f"`{n}`" for n in names) + " |")
    out += ["", "## Every program", "",
            "| program | source | mesh | form | verdict | first diagnostic |",
            "|---|---|---|---|---|---|"]
    for r in records:
        ex = r["example"]
        if ex.bug:
            verdict = ("**PROVEN (false proof)**" if r["proven"] else
                       "flagged at the BUG line" if r["at_bug_line"] else "flagged")
            name = f"`{ex.name}` (bug: {ex.bug})"
        else:
            verdict = "proven" if r["proven"] else f"not proven ({r['kind']})"
            name = f"`{ex.name}`"
        message = _short(r["message"], 200).replace("|", "\\|")
        out.append(f"| {name} | {ex.source} | {ex.mesh_text} | {ex.form} | {verdict} | "
                   f"{message} |")
    with open(path, "w") as handle:
        handle.write("\n".join(out) + "\n")


def _twins(records: list[dict]) -> str:
    """How many bugs had to be told apart from a proven correct twin (the ones that test
    soundness), and how many are flagged where their twin fails too."""
    by_name = {r["example"].name: r for r in records}
    bugs = [r for r in records if r["example"].bug]
    twin = {r["example"].name: by_name[r["example"].name.replace(f"_{r['example'].bug}_", "_",
                                                                  1)] for r in bugs}
    proven = [r for r in bugs if twin[r["example"].name]["proven"]]
    others = [r for r in bugs if not twin[r["example"].name]["proven"]]
    same = [r for r in others
            if blur(r["message"]) == blur(twin[r["example"].name]["message"])]
    return (f"Of the {len(bugs)} buggy programs, {len(proven)} are twins of a proven correct "
            f"program (the verifier had to tell them apart): "
            f"{sum(not r['proven'] for r in proven)} flagged. The other {len(others)} are "
            f"flagged where their correct twin is not proven either ({len(same)} with the "
            f"twin's first diagnostic): they show no false proof, but not discrimination.")


README_BEGIN = "<!-- heldout table: generated by python -m examples.heldout.survey --write -->"
README_END = "<!-- end of heldout table -->"


def write_readme(records: list[dict], path: str) -> None:
    """Replace the generated block of the README's "Programs written by others" section."""
    with open(path) as handle:
        text = handle.read()
    start, end = text.index(README_BEGIN), text.index(README_END)
    unproven = [r for r in records if r["example"].bug is None and not r["proven"]]
    kinds = collections.Counter(r["kind"] for r in unproven)
    summary = (f"Of the {len(unproven)} correct programs not proven, the first diagnostic "
               + ", ".join(f"{k} in {n}" for k, n in kinds.most_common())
               + " (a bug claimed on a correct program is a false bug report).")
    block = "\n".join([README_BEGIN, ""] + _table_rows(records) + ["", summary, "",
                                                                    README_END])
    with open(path, "w") as handle:
        handle.write(text[:start] + block + text[end + len(README_END):])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("-k", default="")
    parser.add_argument("--write", action="store_true",
                        help="rewrite expected.py, RESULTS.md and the README block")
    ns = parser.parse_args(argv)
    if ns.k and ns.write:
        parser.error("--write needs the whole corpus (no -k)")
    names = {e.name for e in examples() if ns.k in e.name}
    records = verdicts(names)
    for r in records:
        ex = r["example"]
        line = f"{ex.name}: {'proven' if r['proven'] else 'not proven'}"
        if r["confirm_seconds"]:
            line += f" [confirmation {r['confirm_seconds']:.2f} s]"
        if ex.bug:
            line += f" (bug: {ex.bug}{', at the BUG line' if r['at_bug_line'] else ''})"
            if r["proven"]:
                line += "  *** FALSE PROOF ***"
        if r["message"]:
            line += f"  [{r['kind'] or r['loc']}] {_short(r['message'], 150)}"
        print(line, flush=True)
    print()
    for row in _table_rows(records):
        print(row)
    timed = sorted(r["confirm_seconds"] for r in records if r["confirm_seconds"])
    if timed:
        print(f"\nconfirmation: {len(timed)} programs, {sum(timed):.1f} s in all, median "
              f"{timed[len(timed) // 2]:.2f} s, max {timed[-1]:.2f} s (the first loads jax)")
    if ns.write:
        write_expected(records, os.path.join(_HERE, "expected.py"))
        write_results(records, os.path.join(_HERE, "RESULTS.md"))
        write_readme(records, os.path.join(_ROOT, "README.md"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
