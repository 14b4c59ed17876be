"""`entangle`: check a reference/sharded pair, or run the bundled demo.

Exit codes: 0 refinement proven, 1 not proven because the program is shown or claimed wrong,
2 input that cannot be used at all, 3 not proven because the check could not decide (an op
without a rule, Z3 unknown or over budget; `core/reasons.py`, `OUTCOMES`).
"""

from __future__ import annotations

import argparse
import atexit
import gc
import json
import os
import sys
import threading
from pathlib import Path

from entangle_mlir import VersionFlag
from entangle_mlir.core.diagnostics import InputError

DEMO_DIR = Path(__file__).resolve().parent / "demo"


def entry() -> None:
    """The `entangle` console script: `main` on the command line, then `exit_now`."""
    exit_now(main())


def exit_now(code: int) -> None:
    """End the process with `code` without the interpreter's teardown, which frees every
    object one by one (a 64-device check's terms: 6 s of CPU after its report is printed).
    The exit handlers run (a pool's shutdown, Ray's) and the output is flushed first; while
    another thread runs (nothing of entangle's leaves one), the ordinary exit waits for it."""
    if threading.active_count() > 1:
        sys.exit(code)
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe or stream: nothing more reaches it
            pass
    os._exit(code)


def main(argv: list[str] | None = None) -> int:
    # A check allocates many small objects (terms, relations, op records) that live to the
    # end and form almost no cycles: the cyclic collector only rescans them (0.2 s of Llama's
    # 4 s even at thresholds of 50000; the same peak RSS without it). A short-lived process
    # does without.
    gc.disable()
    parser = argparse.ArgumentParser(
        prog="entangle",
        description="Prove that a sharded StableHLO program refines its unsharded reference.")
    parser.add_argument("--version", action=VersionFlag)
    sub = parser.add_subparsers(dest="command", required=True)
    check = sub.add_parser("check", help="check SHARDED against REF")
    check.add_argument("ref", help="reference program (.mlir text or bytecode)")
    check.add_argument("sharded", nargs="?", default=None,
                       help="sharded program (shard_map lowering); omit it for one file holding "
                            "both functions, the sharded one marked `entangle.refines = @ref`")
    _common_options(check)
    check.add_argument("--evidence", action="store_true",
                       help="when not proven, run the diverging op and its reference "
                            "counterpart on a random input (imports jax; simulated CPU "
                            "devices) and show how far apart they are")
    check.add_argument("--assume-no-overflow", action="store_true",
                       help="take sums and products of finite values as finite (real-number "
                            "behaviour: an online softmax's scores never overflow); a proof "
                            "that relies on it lists the assumption")
    check.add_argument("--general-budget", type=int, default=30, metavar="SECONDS",
                       help="the general tier's budget in CPU seconds (default 30): "
                            "expansion, decisions and its rule-instance checks; out of time "
                            "is 'not proven' (CPU time, so the verdict does not depend on "
                            "the machine's load)")
    check.add_argument("--html", metavar="REPORT.html",
                       help="also write the report as one self-contained HTML page: both "
                            "programs side by side, each op coloured by its relation, the "
                            "diverging op next to its diagnostic, every input and output as "
                            "a device grid (every op walked: no layer reuse)")
    demo = sub.add_parser("demo", help="check the bundled examples (and one caught bug)")
    _common_options(demo)
    many = sub.add_parser("check-many", help="check every pair of a manifest (results cached)",
                          description="Check every pair (and jax entry point x mesh) of a "
                          "manifest, skipping those whose results are cached; print a summary "
                          "table; exit with the worst exit code (2 > 1 > 3 > 0). The manifest "
                          "format: docs/check-many.md.")
    _many_options(many)
    args, extra = parser.parse_known_args(argv)
    if extra:
        {"check": check, "demo": demo, "check-many": many}[args.command].error(
            f"unrecognized arguments: {' '.join(extra)}")
    if getattr(args, "evidence", False) or not args.no_confirm:
        # jax's CPU client lists its devices on stderr unless told before jaxlib loads.
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    if getattr(args, "dump_smt", None):
        from entangle_mlir.analysis.solver import set_dump_dir  # lazy: z3 takes 40 ms to import

        set_dump_dir(args.dump_smt)
    if args.command == "check-many":
        return run_check_many(args)
    try:
        if args.command == "demo":
            try:
                return run_demo(args)
            except BrokenPipeError:
                _quiet_broken_pipe()
                return 0
        from entangle_mlir.driver import check_files  # lazy: jaxlib must load after the env above

        report = check_files(args.ref, args.sharded or args.ref,
                             verify_rules=not args.no_verify_rules,
                             reuse_layers=not (args.explain or args.json or args.html),
                             assume_no_overflow=args.assume_no_overflow,
                             general_tier=not args.no_general_tier, jobs=args.jobs,
                             repair_bugs=getattr(args, "repair", False),
                             general_budget=args.general_budget,
                             layer_templates=not args.no_layer_templates)
        if not args.no_confirm and not report.proven:
            from entangle_mlir.confirm import confirm_files  # lazy: runs jax, only on a claim

            confirm_files(report, args.ref, args.sharded or args.ref)
        if args.evidence and not report.proven:
            from entangle_mlir.driver import load_program  # lazy: loads jaxlib (see above)
            from entangle_mlir.evidence import check_evidence  # lazy: 7 ms; --evidence only

            report.evidence.update(check_evidence(
                report, load_program(args.ref, args.sharded or args.ref)))
    except InputError as err:
        if getattr(args, "json", False):
            print(json.dumps({"verdict": "bad input", "outcome": "bad input", "exit_code": 2,
                              "error": err.render()}, indent=2))
        else:
            print(err.render(), file=sys.stderr)
        return 2
    except RecursionError:
        print("entangle: error: input nests too deeply to analyse", file=sys.stderr)
        return 2
    if args.html:
        try:
            Path(args.html).write_text(report.to_html(), encoding="utf-8")
        except OSError as err:
            print(f"entangle: error: cannot write {args.html}: {err.strerror}", file=sys.stderr)
            return 2
    try:
        print(report.dumps() if args.json else report.render_text())
        if args.explain and not args.json:
            print(report.render_explanation())
        sys.stdout.flush()
    except BrokenPipeError:
        _quiet_broken_pipe()
    return report.exit_code


def _quiet_broken_pipe() -> None:
    """`entangle ... | head` closed our stdout: stop printing without a traceback."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())


def _common_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true",
                        help="print the report as JSON (every op walked: no layer reuse)")
    parser.add_argument("--no-verify-rules", action="store_true",
                        help="skip the Z3 rule-instance checks (faster; the report says so)")
    parser.add_argument("--no-general-tier", action="store_true",
                        help="where the layout tier does not prove the program, do not expand "
                             "it per device (the general tier)")
    parser.add_argument("--no-layer-templates", action="store_true",
                        help="in the general tier, expand every layer instead of first trying "
                             "one layer's proof reused for every repeated layer (the verdict "
                             "is the same; only the time differs)")
    parser.add_argument("--no-confirm", action="store_true",
                        help="state the layout tier's bug claims as they are, without running "
                             "both programs on random inputs to confirm them (by default a "
                             "claim the outputs do not confirm becomes 'cannot relate')")
    parser.add_argument("--repair", action="store_true",
                        help="where a bug is claimed and the general tier does not prove the "
                             "program, name the one op whose nearest alternative (a permute's "
                             "pairs, an index constant, a select's branches) makes it proven "
                             "(proof-backed repair; bounded in candidates and time)")
    parser.add_argument("--dump-smt", metavar="DIR", help="write every Z3 query as SMT-LIB")
    parser.add_argument("--explain", action="store_true",
                        help="print, for each output, the chain of relations that builds it "
                             "(every op walked: no layer reuse)")
    _jobs_option(parser, "worker processes for the Z3 rule-instance checks (default: one per "
                         "free core; 1: serial); the verdict does not depend on it")


def _jobs_option(parser: argparse.ArgumentParser, what: str) -> None:
    parser.add_argument("--jobs", "-j", type=_jobs, default=0, metavar="N", help=what)


def _jobs(text: str) -> int:
    """`--jobs`: a positive number (0: automatic, as when not given)."""
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"a number of processes, not '{text}'")
    return value


def _many_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("manifest", help="the manifest (TOML, or JSON with the same structure)")
    parser.add_argument("--json", action="store_true",
                        help="print the results as one JSON document (each check's report)")
    _jobs_option(parser, "checks run at once (local executor; default: one per free core; "
                         "1: one after the other, in this process)")
    parser.add_argument("--executor", choices=("local", "ray"), default="local",
                        help="where checks run: a local process pool (default), or Ray tasks "
                             "(pip install 'entangle-mlir[ray]')")
    parser.add_argument("--ray", dest="executor", action="store_const", const="ray",
                        help="--executor ray")
    parser.add_argument("--ray-address", metavar="ADDRESS",
                        help="the Ray cluster to use (default: RAY_ADDRESS, else a local one)")
    parser.add_argument("--cache-dir", metavar="DIR",
                        help="the results cache (default: $ENTANGLE_CACHE_DIR, else "
                             "$XDG_CACHE_HOME/entangle or ~/.cache/entangle)")
    parser.add_argument("--no-cache", action="store_true",
                        help="check every pair, and store nothing")
    parser.add_argument("--no-verify-rules", action="store_true",
                        help="every check: skip the Z3 rule-instance checks")
    parser.add_argument("--no-general-tier", action="store_true",
                        help="every check: no per-device expansion (the general tier)")
    parser.add_argument("--no-confirm", action="store_true",
                        help="every check: state bug claims without running both programs")
    parser.add_argument("--assume-no-overflow", action="store_true",
                        help="every check: take sums and products of finite values as finite")


def run_check_many(args) -> int:
    """`entangle check-many`: the summary table (or JSON) and the worst exit code."""
    import time  # lazy: only check-many times itself

    from entangle_mlir import many  # lazy: only check-many needs it
    from entangle_mlir.core.progress import Progress  # lazy: as above

    start = time.perf_counter()
    overrides = {key: False for key in ("verify_rules", "general_tier", "confirm")
                 if getattr(args, f"no_{key}")}
    if args.assume_no_overflow:
        overrides["assume_no_overflow"] = True
    try:
        manifest = many.load_manifest(args.manifest, overrides)
        cache = None if args.no_cache else many.ResultCache(
            Path(args.cache_dir) if args.cache_dir else many.default_cache_dir())
        progress = Progress("checking", len(manifest.names))
        done = [len(manifest.failed)]

        def count(_outcome) -> None:
            done[0] += 1
            progress.update(done[0])

        outcomes = many.check_many(manifest, jobs=args.jobs, cache=cache,
                                   executor=args.executor, ray_address=args.ray_address,
                                   progress=count)
        progress.close()
    except InputError as err:
        if args.json:
            print(json.dumps({"verdict": "bad input", "outcome": "bad input", "exit_code": 2,
                              "error": err.render()}, indent=2))
        else:
            print(err.render(), file=sys.stderr)
        return 2
    seconds = time.perf_counter() - start
    try:
        print(json.dumps(many.to_json(outcomes, seconds), indent=2) if args.json
              else many.render_table(outcomes, seconds))
        sys.stdout.flush()
    except BrokenPipeError:
        _quiet_broken_pipe()
    return many.worst(o.exit_code for o in outcomes)


def run_demo(args) -> int:
    """Prove every bundled correct pair, flag every bundled buggy one as a bug (exit code 1:
    claimed wrong, not inconclusive)."""
    from entangle_mlir.driver import check_files  # lazy: loads jaxlib (see main)

    pairs = sorted(DEMO_DIR.glob("*.ref.mlir"))
    if not pairs:
        raise InputError(f"no bundled examples found in {DEMO_DIR}")
    failures = 0
    results = []
    for ref in pairs:
        name = ref.name[: -len(".ref.mlir")]
        sharded = ref.with_name(f"{name}.sharded.mlir")
        report = check_files(str(ref), str(sharded), verify_rules=not args.no_verify_rules,
                             general_tier=not args.no_general_tier, jobs=args.jobs,
                             repair_bugs=getattr(args, "repair", False),
                             layer_templates=not args.no_layer_templates)
        if not args.no_confirm and not report.proven:
            from entangle_mlir.confirm import confirm_files  # lazy: runs jax, only on a claim

            confirm_files(report, str(ref), str(sharded))
        buggy = any(tag in name for tag in _BUG_TAGS)
        # A buggy twin must be claimed wrong (exit code 1), not merely left inconclusive.
        as_expected = report.exit_code == (1 if buggy else 0)
        failures += not as_expected
        results.append((name, report))
        if args.json:
            continue
        print(f"== {name}: {'verified' if report.proven else 'NOT PROVEN'}"
              f"{'' if as_expected else '   <-- UNEXPECTED'}")
        print("   " + report.render_text().replace("\n", "\n   "))
    if args.json:
        print(json.dumps({name: r.to_json() for name, r in results}, indent=2))
    else:
        proven = sum(r.proven for _, r in results)
        print(f"\n{proven} of {len(results)} bundled programs proven, "
              f"{len(results) - proven} flagged; {'all as expected' if not failures else str(failures) + ' unexpected'}")
    return 0 if not failures else 1


_BUG_TAGS = ("missing_psum", "pmean", "bias_before_psum", "gelu_before_psum", "wrong_dim",
             "local_stats", "wrong_axis")


if __name__ == "__main__":
    entry()
