"""`entangle check-many MANIFEST`: many checks in one command, with a results cache; in a
local process pool, or on a Ray cluster (`--ray`).

The manifest (docs/check-many.md) lists pairs of files (`[[pair]]`: `ref`, `sharded` or one
combined file) and jax entry points (`[[jax]]`: `module:function`, called with each of its
`meshes` to give `(reference_fn, sharded_fn, avals)`, lowered here). Each check becomes a
`Task` holding the programs' bytes, the names diagnostics give them and the options, so it
runs wherever a worker is (a Ray node without the files). Its cache key hashes those bytes,
names and options with entangle's own code, z3's and jaxlib's versions (`fingerprint`): an
unchanged pair is not checked again; a changed file, option or entangle is. The results cache
lives under the user's cache directory (`default_cache_dir`), never in the repository.

Every check gets a line of the summary table (name, verdict, exit code and its class, time,
cached?) or an element of `--json`; the command's exit code is the worst of the pairs', in the
order 2 (bad input) > 1 (bug) > 3 (inconclusive) > 0 (proven).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import sys
import time
import tomllib
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from entangle_mlir import version
from entangle_mlir.core.diagnostics import InputError

EXIT_CLASSES = {0: "proven", 1: "bug", 3: "inconclusive", 2: "bad input"}
WORST_FIRST = (2, 1, 3, 0)
"""Exit codes, the worst first: the command exits with the worst of its checks'."""

CACHE_FORMAT = 1
OPTION_KEYS = ("verify_rules", "general_tier", "confirm", "assume_no_overflow")
_PAIR_KEYS = {"name", "ref", "sharded", *OPTION_KEYS}
_JAX_KEYS = {"name", "entry", "meshes", *OPTION_KEYS}


@dataclass(frozen=True)
class Options:
    """What a check does (the manifest's `[options]`, an entry's own keys, command-line
    flags). `jobs` (worker processes of its rule-instance checks) never changes a verdict,
    so it is not part of the cache key."""

    verify_rules: bool = True
    general_tier: bool = True
    confirm: bool = True
    assume_no_overflow: bool = False


@dataclass
class Task:
    """One check, self-contained: the programs' bytes and the paths diagnostics name them
    by (`sharded` None: `ref` is one combined file), and its options."""

    name: str
    ref_path: str
    ref: bytes
    sharded_path: str | None
    sharded: bytes | None
    options: Options

    def key(self, entangle: str) -> str:
        """The cache key: a hash of the programs, their names, the options and `entangle`
        (`fingerprint()`)."""
        digest = hashlib.sha256()
        for part in (str(CACHE_FORMAT), entangle, json.dumps(asdict(self.options)),
                     self.ref_path, self.sharded_path or "", self.ref, self.sharded or b""):
            data = part if isinstance(part, bytes) else part.encode()
            digest.update(len(data).to_bytes(8, "little"))
            digest.update(data)
        return digest.hexdigest()


@dataclass
class Outcome:
    """One check's result, plain data (it travels back from workers and into the cache)."""

    name: str
    exit_code: int
    verdict: str
    seconds: float = 0.0
    cached: bool = False
    text: str = ""
    """The text report, or the error of input that cannot be used."""
    report: dict | None = None
    """The JSON report (None for bad input)."""
    ref: str = ""
    sharded: str | None = None
    checked_seconds: float = 0.0
    """How long the check itself took (when it ran: this run, or the one cached)."""

    @property
    def exit_class(self) -> str:
        return EXIT_CLASSES.get(self.exit_code, "error")

    def to_json(self) -> dict:
        out = {"name": self.name, "ref": self.ref, "sharded": self.sharded,
               "verdict": self.verdict, "outcome": self.exit_class,
               "exit_code": self.exit_code, "seconds": round(self.seconds, 4),
               "checked_seconds": round(self.checked_seconds, 4), "cached": self.cached}
        if self.report is None:
            out["error"] = self.text
        else:
            out["report"] = self.report
        return out


def worst(codes) -> int:
    """The worst exit code of `codes` (`WORST_FIRST`); 0 for none."""
    codes = set(codes)
    return next((code for code in WORST_FIRST if code in codes), 0)


# ----- the manifest -----------------------------------------------------------------------------

@dataclass
class Manifest:
    """The checks a manifest asks for, by name in its order: tasks, and entries that failed
    to load (bad input)."""

    tasks: list[Task] = field(default_factory=list)
    failed: list[Outcome] = field(default_factory=list)
    names: list[str] = field(default_factory=list)

    def add(self, check: Task | Outcome) -> None:
        (self.tasks if isinstance(check, Task) else self.failed).append(check)
        self.names.append(check.name)


def load_manifest(path: str, overrides: dict[str, bool] | None = None) -> Manifest:
    """Read a manifest (TOML, or JSON with the same structure): every `[[pair]]` read, every
    `[[jax]]` entry lowered at each of its meshes. `overrides`: options that win over the
    manifest's (the command line's `--no-confirm`, ...). A malformed manifest is an
    `InputError`; an entry whose files cannot be read or whose function cannot be lowered is
    that check's bad input (`Manifest.failed`), the others still run."""
    try:
        raw = Path(path).read_bytes()
    except OSError as err:
        raise InputError(f"cannot read the manifest: {err.strerror}", file=path) from None
    try:
        data = json.loads(raw) if path.endswith(".json") else tomllib.loads(raw.decode())
    except (ValueError, UnicodeDecodeError) as err:
        raise InputError(f"not a valid {'JSON' if path.endswith('.json') else 'TOML'} "
                         f"manifest: {err}", file=path) from None
    if not isinstance(data, dict):
        raise InputError("a manifest is a table of `options`, `pair` and `jax`", file=path)
    unknown = set(data) - {"options", "pair", "jax"}
    if unknown:
        raise InputError(f"unknown manifest key(s) {', '.join(sorted(unknown))} (known: "
                         "options, pair, jax)", file=path)
    table = _table(data.get("options", {}), "options", path)
    _known(table, set(OPTION_KEYS), "options", path)
    base = _options(Options(), table, "options", path)
    here = Path(path).parent
    manifest = Manifest()
    for index, entry in enumerate(_entries(data, "pair", path)):
        _known(entry, _PAIR_KEYS, f"pair #{index + 1}", path)
        _pair(manifest, entry, here, _entry_options(base, entry, overrides, path), path)
    jax_entries = _entries(data, "jax", path)
    for index, entry in enumerate(jax_entries):
        _known(entry, _JAX_KEYS, f"jax #{index + 1}", path)
        _jax(manifest, entry, here, _entry_options(base, entry, overrides, path), path)
    seen: set[str] = set()
    for name in manifest.names:
        if name in seen:
            raise InputError(f"two checks are named '{name}': give them `name`s", file=path)
        seen.add(name)
    if not manifest.names:
        raise InputError("the manifest lists no check ([[pair]] or [[jax]])", file=path)
    return manifest


def _table(value, what: str, path: str) -> dict:
    if not isinstance(value, dict):
        raise InputError(f"`{what}` must be a table", file=path)
    return value


def _entries(data: dict, key: str, path: str) -> list[dict]:
    entries = data.get(key, [])
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        raise InputError(f"`{key}` must be a list of tables ([[{key}]])", file=path)
    return entries


def _known(entry: dict, keys: set[str], what: str, path: str) -> None:
    unknown = set(entry) - keys
    if unknown:
        raise InputError(f"{what}: unknown key(s) {', '.join(sorted(unknown))} (known: "
                         f"{', '.join(sorted(keys))})", file=path)


def _options(base: Options, table: dict, what: str, path: str) -> Options:
    """`base` with the options `table` sets (its other keys are not options)."""
    values = {k: v for k, v in table.items() if k in OPTION_KEYS}
    for key, value in values.items():
        if not isinstance(value, bool):
            raise InputError(f"{what}: `{key}` is true or false, not {value!r}", file=path)
    return replace(base, **values)


def _entry_options(base: Options, entry: dict, overrides: dict | None, path: str) -> Options:
    """An entry's options: the manifest's, then its own, then the command line's."""
    what = f"entry '{entry.get('name') or entry.get('ref') or entry.get('entry')}'"
    return replace(_options(base, entry, what, path), **(overrides or {}))


def _string(entry: dict, key: str, what: str, path: str, required: bool = True) -> str | None:
    value = entry.get(key)
    if value is None and not required:
        return None
    if not isinstance(value, str) or not value:
        raise InputError(f"{what}: `{key}` must be a non-empty string", file=path)
    return value


def _pair(manifest: Manifest, entry: dict, here: Path, options: Options, path: str) -> None:
    ref = _string(entry, "ref", "a [[pair]]", path)
    sharded = _string(entry, "sharded", "a [[pair]]", path, required=False)
    name = _string(entry, "name", "a [[pair]]", path, required=False) or _stem(ref)
    ref_path = os.path.normpath(here / ref)
    sharded_path = os.path.normpath(here / sharded) if sharded else None
    from entangle_mlir.mlir.load import read_file  # lazy: jaxlib's MLIR bindings (0.3 s)

    try:
        ref_data = read_file(ref_path)
        sharded_data = read_file(sharded_path) if sharded_path else None
    except InputError as err:
        manifest.add(Outcome(name, 2, "bad input", text=err.render(), ref=ref_path,
                                       sharded=sharded_path))
        return
    manifest.add(Task(name, ref_path, ref_data, sharded_path, sharded_data, options))


def _stem(ref: str) -> str:
    name = Path(ref).name
    for suffix in (".ref.mlir", ".ref.mlirbc", ".mlir", ".mlirbc"):
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


def _jax(manifest: Manifest, entry: dict, here: Path, options: Options, path: str) -> None:
    target = _string(entry, "entry", "a [[jax]]", path)
    module_name, _, function_name = target.partition(":")
    if not module_name or not function_name:
        raise InputError(f"[[jax]] entry '{target}' is not `module:function`", file=path)
    meshes = entry.get("meshes")
    if not isinstance(meshes, list) or not meshes or not all(
            isinstance(m, dict) and m and all(isinstance(n, int) and not isinstance(n, bool)
                                              and n > 0 for n in m.values()) for m in meshes):
        raise InputError(f"[[jax]] '{target}': `meshes` must be a non-empty list of tables "
                         "of axis sizes, e.g. [{tp = 4}, {dp = 2, tp = 4}]", file=path)
    name = _string(entry, "name", "a [[jax]]", path, required=False) or function_name
    function = None
    for mesh in meshes:
        label = "_".join(f"{axis}{size}" for axis, size in mesh.items())
        check_name = f"{name}_{label}"
        ref_file, sharded_file = f"<{target} on {label}: reference>", f"<{target} on {label}>"
        try:
            if function is None:
                function = _import(module_name, function_name, here)
            from entangle_mlir.jax import lower_entry  # lazy: imports jax (1 s)

            ref_text, sharded_text = lower_entry(function, mesh)
        except InputError as err:
            manifest.add(Outcome(check_name, 2, "bad input", text=err.render(),
                                           ref=ref_file, sharded=sharded_file))
            continue
        except Exception as err:  # noqa: BLE001 - the user's function failing is bad input
            message = f"{target} on {label}: {type(err).__name__}: {err}"
            manifest.add(Outcome(check_name, 2, "bad input",
                                           text=f"error: cannot lower {message}",
                                           ref=ref_file, sharded=sharded_file))
            continue
        manifest.add(Task(check_name, ref_file, ref_text.encode(), sharded_file,
                                   sharded_text.encode(), options))


def _import(module_name: str, function_name: str, here: Path) -> Callable:
    """`module:function`, looked up with the manifest's folder and the working directory on
    the import path."""
    import importlib  # lazy: only [[jax]] entries import user modules

    for folder in (str(here.resolve()), os.getcwd()):
        if folder not in sys.path:
            sys.path.insert(0, folder)
    _enough_devices()
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise InputError(f"cannot import {module_name}: {err}") from None
    function = getattr(module, function_name, None)
    if not callable(function):
        raise InputError(f"{module_name} has no function {function_name}")
    return function


# ----- running checks ---------------------------------------------------------------------------

def _enough_devices() -> None:
    """Before jax loads: as many simulated CPU devices as claim confirmation may run on (one
    process checks many pairs: the first pair's mesh must not decide for the others)."""
    from entangle_mlir.evidence import MAX_RUN_DEVICES  # lazy: numpy and jaxlib's bindings

    flags = os.environ.get("XLA_FLAGS", "")
    if "jax" not in sys.modules and "xla_force_host_platform_device_count" not in flags:
        os.environ["XLA_FLAGS"] = (
            f"{flags} --xla_force_host_platform_device_count={MAX_RUN_DEVICES}").strip()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def run_task(task: Task, jobs: int = 1) -> Outcome:
    """Check one task (in whichever process runs it: this one, a pool's, a Ray worker):
    `entangle check` on its bytes, a failing check's claims confirmed by running both
    programs unless its options say not to. `jobs`: worker processes of its rule-instance
    checks."""
    import gc  # lazy: tiny, and only a check's own process wants it

    collecting = gc.isenabled()
    gc.disable()  # as `entangle check` (cli.main): long-lived objects, almost no cycles
    _enough_devices()
    from entangle_mlir.driver import check_program, load_program_data  # lazy: jaxlib (0.3 s)

    start = time.perf_counter()
    ref = (task.ref_path, task.ref)
    sharded = (task.sharded_path, task.sharded) if task.sharded_path is not None else None
    failed = Outcome(task.name, 2, "bad input", ref=task.ref_path, sharded=task.sharded_path)
    try:
        options = task.options
        report = check_program(load_program_data(ref, sharded),
                               verify_rules=options.verify_rules,
                               general_tier=options.general_tier,
                               assume_no_overflow=options.assume_no_overflow, jobs=jobs)
        if options.confirm and not report.proven:
            from entangle_mlir.confirm import confirm  # lazy: runs jax, only on a claim

            confirm(report, lambda: load_program_data(ref, sharded))
    except InputError as err:
        failed.text = err.render()
    except RecursionError:
        failed.text = "entangle: error: input nests too deeply to analyse"
    else:
        seconds = time.perf_counter() - start
        return Outcome(task.name, report.exit_code, report.verdict, seconds,
                       text=report.render_text(), report=json.loads(report.dumps()),
                       ref=task.ref_path, sharded=task.sharded_path, checked_seconds=seconds)
    finally:
        if collecting:
            gc.enable()
    failed.seconds = failed.checked_seconds = time.perf_counter() - start
    return failed


def run_local(tasks: list[Task], jobs: int | None) -> Iterator[tuple[int, Outcome]]:
    """(index, outcome) of each task as it finishes: in this process when one worker would do
    (one task, or `jobs` 1: its instance checks get the free cores), else in a pool of fresh
    (spawned) processes, one task each at a time, the largest programs first."""
    from entangle_mlir.analysis.instance.parallel import (
        resolve_jobs,  # lazy: z3 (40 ms); the cached run needs none of it
    )

    workers = min(resolve_jobs(jobs), len(tasks))
    if workers <= 1:
        for index, task in enumerate(tasks):
            yield index, run_task(task, jobs or 0)
        return
    import multiprocessing  # lazy: only a pool needs it

    order = sorted(range(len(tasks)), key=lambda i: -(len(tasks[i].ref) +
                                                      len(tasks[i].sharded or b"")))
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = {pool.submit(run_task, tasks[i], 1): i for i in order}
        for future in as_completed(futures):
            yield futures[future], future.result()


def run_ray(tasks: list[Task], address: str | None) -> Iterator[tuple[int, Outcome]]:
    """(index, outcome) of each task as it finishes, each a Ray task of one CPU (the cluster
    at `address`, or the one `ray.init()` finds or starts: RAY_ADDRESS, else a local one; a
    cluster already initialized in this process is used as it is). Needs `pip install
    entangle-mlir[ray]`, and entangle installed on the cluster's nodes."""
    try:
        import ray  # lazy: an optional extra
    except ImportError:
        raise InputError("--ray needs Ray: pip install 'entangle-mlir[ray]'") from None
    if not ray.is_initialized():
        ray.init(address=address, include_dashboard=False, log_to_driver=False)
    remote = ray.remote(num_cpus=1)(run_task)
    refs = {remote.remote(task, 1): index for index, task in enumerate(tasks)}
    pending = list(refs)
    while pending:
        done, pending = ray.wait(pending, num_returns=1)
        for ref in done:
            yield refs[ref], ray.get(ref)


# ----- the results cache ------------------------------------------------------------------------

def default_cache_dir() -> Path:
    """$ENTANGLE_CACHE_DIR, else $XDG_CACHE_HOME/entangle, else ~/.cache/entangle."""
    if os.environ.get("ENTANGLE_CACHE_DIR"):
        return Path(os.environ["ENTANGLE_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "entangle"


@functools.cache
def fingerprint() -> str:
    """What a cached result depends on besides the task: entangle's version and the bytes of
    its own modules (a source checkout changes without a new version), z3's and jaxlib's
    versions."""
    import z3  # lazy: 40 ms; only a run that consults the cache needs the version

    from entangle_mlir.mlir.compat import JAXLIB_VERSION  # lazy: loads jaxlib's bindings

    digest = hashlib.sha256(f"{version()}|{z3.get_version_string()}|{JAXLIB_VERSION}".encode())
    root = Path(__file__).resolve().parent
    for path in sorted(root.rglob("*.py")):
        digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


class ResultCache:
    """Outcomes by task key, one JSON file each under `directory/check-many/` (written
    atomically: a reader never sees half a file; unreadable ones are misses)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory / "check-many"

    def _path(self, key: str) -> Path:
        return self.directory / key[:2] / f"{key}.json"

    def get(self, key: str) -> Outcome | None:
        try:
            data = json.loads(self._path(key).read_text())
            return Outcome(**{k: v for k, v in data.items()
                              if k in Outcome.__dataclass_fields__})
        except (OSError, ValueError, TypeError):
            return None

    def put(self, key: str, outcome: Outcome) -> None:
        path = self._path(key)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            temporary = path.with_suffix(f".{os.getpid()}.tmp")
            temporary.write_text(json.dumps(asdict(outcome)))
            os.replace(temporary, path)
        except OSError as err:
            print(f"entangle: warning: cannot write the results cache: {err}", file=sys.stderr)


# ----- the command ------------------------------------------------------------------------------

def check_many(manifest: Manifest, *, jobs: int | None = None, cache: ResultCache | None,
               executor: str = "local", ray_address: str | None = None,
               progress: Callable[[Outcome], None] | None = None) -> list[Outcome]:
    """Every check of `manifest`, in its order: from `cache` where it holds the task's key,
    else run (`run_local` or `run_ray`) and stored."""
    outcomes: dict[str, Outcome] = {o.name: o for o in manifest.failed}
    keys = [task.key(fingerprint()) for task in manifest.tasks] if cache else []
    todo: list[int] = []
    for index, task in enumerate(manifest.tasks):
        start = time.perf_counter()
        found = cache.get(keys[index]) if cache else None
        if found is None:
            todo.append(index)
            continue
        found.name, found.cached = task.name, True
        found.seconds = time.perf_counter() - start
        outcomes[task.name] = found
        if progress is not None:
            progress(found)
    tasks = [manifest.tasks[i] for i in todo]
    run = run_ray(tasks, ray_address) if executor == "ray" else run_local(tasks, jobs)
    for position, outcome in run:
        index = todo[position]
        if cache and outcome.report is not None:
            cache.put(keys[index], outcome)
        outcomes[manifest.tasks[index].name] = outcome
        if progress is not None:
            progress(outcome)
    return [outcomes[name] for name in manifest.names]


def render_table(outcomes: list[Outcome], seconds: float) -> str:
    """The summary: one line per check, a totals line, then the first line of each failing
    check's report (its diagnostic, or why its input cannot be used)."""
    width = max([len("check")] + [len(o.name) for o in outcomes])
    lines = [f"{'check':<{width}}  {'verdict':<12} {'exit':<16} {'time':>8}  cached"]
    for o in outcomes:
        lines.append(f"{o.name:<{width}}  {o.verdict:<12} {o.exit_code} {o.exit_class:<14} "
                     f"{o.seconds:>7.2f}s  {'yes' if o.cached else 'no'}")
    counts = {cls: sum(o.exit_class == cls for o in outcomes) for cls in EXIT_CLASSES.values()}
    lines.append(f"{len(outcomes)} checks: " + ", ".join(f"{n} {cls}" for cls, n in
                                                          counts.items())
                 + f"; {sum(o.cached for o in outcomes)} from the cache; {seconds:.1f} s; "
                 f"exit code {worst(o.exit_code for o in outcomes)}")
    failing = [o for o in outcomes if o.exit_code != 0]
    if failing:
        lines.append("")
        for o in failing:
            first = next((line for line in o.text.splitlines() if line.strip()), "")
            lines.append(f"{o.name}: {first}")
    return "\n".join(lines)


def to_json(outcomes: list[Outcome], seconds: float) -> dict:
    return {"exit_code": worst(o.exit_code for o in outcomes),
            "seconds": round(seconds, 4),
            "counts": {cls: sum(o.exit_class == cls for o in outcomes)
                       for cls in EXIT_CLASSES.values()},
            "cached": sum(o.cached for o in outcomes),
            "checks": [o.to_json() for o in outcomes]}
