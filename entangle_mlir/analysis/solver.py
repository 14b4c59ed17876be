"""The one entry point for every Z3 query: `prove(claim, hypotheses, name, timeout_ms)`.

A claim is *proved* only when `hypotheses AND NOT claim` is unsatisfiable. A satisfiable query is
*refuted* (with the model as counterexample); a timeout or an incomplete theory answer is
*unknown* and is never reported as proved.

Every query can be written as an SMT-LIB file named after the query, for replay with `z3` or
another solver: call `set_dump_dir(path)`, or set the environment variable `ENTANGLE_DUMP_SMT`
(read at each query unless `set_dump_dir` was called). A worker process checking instances in
parallel captures its queries (`capture_dumps`) and hands them back, and the parent writes them
(`write_dump`) in the order a serial run would: the same files, the same names.
"""

from __future__ import annotations

import os
import re
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path

import z3

DEFAULT_TIMEOUT_MS = 10_000
MAX_COUNTEREXAMPLE_ENTRIES = 32

WORK_PER_MS = 20_000
"""Z3 work units (its `rlimit` count) a query gets per millisecond of its budget. A budget is
work, not wall time, so a verdict does not depend on how loaded the machine is: Z3 counts
6,000 to 14,000 units per millisecond of CPU on these machines, so a 5 s budget is 5 to 15 s
of one idle core's work."""

WALL_SLACK = 8
"""A query also stops after this many times its budget in wall time (a machine so loaded,
or a query so unlike the calibration, that the work limit would take too long), and never
before `WALL_FLOOR_MS`."""

WALL_FLOOR_MS = 2_000
"""The least wall time a query gets: a small budget's `WALL_SLACK` multiple (120 ms for 15 ms)
is met by a loaded machine's scheduling alone, which made a verdict depend on the load."""

_UNSET = object()
_dump_dir: object = _UNSET
_dump_lock = threading.Lock()
_dump_names: dict[str, int] = {}
_captured: list[tuple[str, str]] | None = None


@dataclass
class ProofResult:
    """The outcome of one query (or of an instance check built on queries).

    status: "proved", "refuted", "unknown" (timeout, incomplete theory, error) or "skipped"
    (instance checks only: nothing was asked, e.g. too large or out of time budget).
    counterexample: variable name -> value (as text) when refuted.
    witness: when refuted and the query asked for one (`prove(..., witness=)`), what that
    function made of the model (the term comparison: the inputs as exact values).
    """

    status: str
    counterexample: dict[str, str] | None = None
    seconds: float = 0.0
    name: str = ""
    reason: str = ""
    cached: bool = False
    details: dict = field(default_factory=dict)
    witness: object = field(default=None, repr=False, compare=False)

    @property
    def proved(self) -> bool:
        return self.status == "proved"

    @property
    def refuted(self) -> bool:
        return self.status == "refuted"

    def describe(self) -> str:
        text = f"{self.name or 'query'}: {self.status} ({self.seconds * 1000:.1f} ms)"
        if self.reason:
            text += f" - {self.reason}"
        if self.counterexample:
            shown = ", ".join(f"{k}={v}" for k, v in list(self.counterexample.items())[:8])
            text += f" [counterexample: {shown}]"
        return text


_resource_limit = 0


def set_resource_limit(limit: int) -> None:
    """A deterministic per-query work limit (Z3's rlimit; 0: none). Exceeding it is `unknown`."""
    global _resource_limit
    _resource_limit = max(0, int(limit))


_fresh = threading.local()


@contextmanager
def fresh_contexts() -> Iterator[None]:
    """Ask every query inside the block in a new Z3 context (its formulas translated there).
    Z3's search order follows its terms' ids, which depend on everything the process built
    before: a general-tier decision that takes 2 s in a fresh process ran out of its budget
    (40 s of wall) in a test worker that had checked other programs first. For the few large
    queries a verdict rests on (the general tier's decisions): translating costs ~5 ms a
    query, too much for the many small rule instances (+30% on a ring at cp 8)."""
    before = getattr(_fresh, "on", False)
    _fresh.on = True
    try:
        yield
    finally:
        _fresh.on = before


def set_dump_dir(path: str | os.PathLike | None) -> None:
    """Write every later query to `path/<name>.smt2` (None: stop dumping, ignore the env var)."""
    global _dump_dir
    _dump_dir = None if path is None else Path(path)


def follow_env_dump_dir() -> None:
    """Forget any `set_dump_dir` call: dump where ENTANGLE_DUMP_SMT says (if set)."""
    global _dump_dir
    _dump_dir = _UNSET


def dump_dir() -> Path | None:
    """Where queries are dumped, if anywhere (`set_dump_dir` wins over ENTANGLE_DUMP_SMT)."""
    if _dump_dir is not _UNSET:
        return _dump_dir  # type: ignore[return-value]
    env = os.environ.get("ENTANGLE_DUMP_SMT")
    return Path(env) if env else None


def _file_name(name: str) -> str:
    safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", name).strip("._") or "query"
    safe = safe[:120]
    with _dump_lock:
        count = _dump_names.get(safe, 0)
        _dump_names[safe] = count + 1
    return f"{safe}.smt2" if count == 0 else f"{safe}.{count}.smt2"


def _dump(solver: z3.Solver, name: str) -> None:
    if dump_dir() is None:
        return
    text = f"; entangle query: {name}\n; proved iff unsat\n" + solver.to_smt2()
    if _captured is not None:
        _captured.append((name, text))
    else:
        write_dump(name, text)


def write_dump(name: str, text: str) -> None:
    """Write one query's SMT-LIB text to the dump directory (if any), under its query's name
    (numbered from the second query of that name on)."""
    directory = dump_dir()
    if directory is None:
        return
    directory.mkdir(parents=True, exist_ok=True)
    (directory / _file_name(name)).write_text(text)


@contextmanager
def capture_dumps() -> Iterator[list[tuple[str, str]]]:
    """Within the block, the queries that would be dumped are collected as (name, SMT-LIB
    text) in the list yielded instead of written (a worker process: the parent writes them
    with `write_dump`, so file names are numbered as in a serial run)."""
    global _captured
    outer, _captured = _captured, []
    try:
        yield _captured
    finally:
        _captured = outer


def _as_bool(value) -> z3.BoolRef:
    if isinstance(value, z3.BoolRef):
        return value
    if isinstance(value, bool):
        return z3.BoolVal(value)
    raise TypeError(f"a claim or hypothesis must be a z3 BoolRef or a bool, not {value!r}")


def _counterexample(model: z3.ModelRef) -> dict[str, str]:
    out: dict[str, str] = {}
    for decl in sorted(model.decls(), key=lambda d: d.name()):
        if len(out) >= MAX_COUNTEREXAMPLE_ENTRIES:
            break
        try:
            value = model[decl]
            out[decl.name()] = str(value)
        except z3.Z3Exception:  # pragma: no cover - exotic declarations
            continue
    return out


def prove(claim, hypotheses: Iterable = (), name: str = "query",
          timeout_ms: int | None = None,
          witness: Callable[[z3.ModelRef], object] | None = None) -> ProofResult:
    """Prove `claim` valid under `hypotheses` (checks `hypotheses AND NOT claim` is unsat).

    `timeout_ms` is a budget of work (`WORK_PER_MS` Z3 units per millisecond; the
    `set_resource_limit` limit instead where one is set), with `WALL_SLACK` times it in wall
    time as a backstop: the same query gets the same verdict on an idle and a busy machine.

    `claim` and each hypothesis are z3 BoolRefs (Python bools are accepted). Never raises on a
    solver failure: that is `unknown` with the reason. `witness`: called on the model of a
    refutation, its value kept as the result's `witness` (the model itself is not kept).
    """
    start = time.perf_counter()
    timeout = DEFAULT_TIMEOUT_MS if timeout_ms is None else max(1, int(timeout_ms))
    work = _resource_limit or timeout * WORK_PER_MS
    try:
        goal = _as_bool(claim)
        hyps = [_as_bool(h) for h in hypotheses]
    except TypeError as err:
        return ProofResult("unknown", None, time.perf_counter() - start, name,
                           f"solver error: {err}")
    return _query(goal, hyps, name, timeout, work, witness, start)


def _query(goal: z3.BoolRef, hyps: list, name: str, timeout: int, work: int,
           witness: Callable[[z3.ModelRef], object] | None, start: float) -> ProofResult:
    """One Z3 check of `hyps and not goal` with `work` rlimit units (and `WALL_SLACK` times
    `timeout` ms of wall time); `start`: when the whole proof began (for `seconds`)."""
    home = goal.ctx
    context = z3.Context() if getattr(_fresh, "on", False) else None
    try:
        solver = z3.Solver(ctx=context)
        solver.set("timeout", max(WALL_FLOOR_MS, timeout * WALL_SLACK))
        solver.set("rlimit", work)
        if context is not None:
            goal, hyps = goal.translate(context), [h.translate(context) for h in hyps]
        solver.add(*hyps)
        solver.add(z3.Not(goal))
        _dump(solver, name)
        answer = solver.check()
    except (z3.Z3Exception, TypeError, OSError) as err:
        return ProofResult("unknown", None, time.perf_counter() - start, name,
                           f"solver error: {err}")
    seconds = time.perf_counter() - start
    if answer == z3.unsat:
        return ProofResult("proved", None, seconds, name)
    if answer == z3.sat:
        model = solver.model() if context is None else solver.model().translate(home)
        return ProofResult("refuted", _counterexample(model), seconds, name,
                           witness=witness(model) if witness is not None else None)
    return ProofResult("unknown", None, seconds, name, solver.reason_unknown())


def _free_constants(formulas: Iterable[z3.ExprRef]) -> list[z3.ExprRef]:
    """The uninterpreted constants (free variables) of `formulas` in order of first appearance
    (depth first, left to right), each shared subterm visited once. (Walked with z3's C
    functions on the terms' addresses: the Python wrappers of every subterm cost most of a
    large query's split.)"""
    formulas = list(formulas)
    if not formulas:
        return []
    ctx = formulas[0].ctx
    ref = ctx.ref()
    seen: set[int] = set()
    found: list[z3.ExprRef] = []
    stack = [f.as_ast() for f in reversed(formulas)]
    app, uninterpreted = z3.Z3_APP_AST, z3.Z3_OP_UNINTERPRETED
    while stack:
        ast = stack.pop()
        key = z3.Z3_get_ast_id(ref, ast)
        if key in seen:
            continue
        seen.add(key)
        if z3.Z3_get_ast_kind(ref, ast) != app:
            continue
        count = z3.Z3_get_app_num_args(ref, ast)
        if count == 0:
            if z3.Z3_get_decl_kind(ref, z3.Z3_get_app_decl(ref, ast)) == uninterpreted:
                found.append(z3.z3._to_expr_ref(ast, ctx))
            continue
        stack.extend(z3.Z3_get_app_arg(ref, ast, i) for i in reversed(range(count)))
    return found


def consistent(hypotheses: Iterable, name: str = "query",
               timeout_ms: int | None = None) -> ProofResult:
    """Whether `hypotheses` have a model: status "refuted" (of False) when they do, as
    `prove(False, hypotheses)` answers. A proof under contradictory hypotheses proves nothing,
    so every proof with hypotheses asks this.

    A model is first looked for with every numeric free variable 1 (then the query is ground
    and cheap: a rounding function's pairwise monotonicity over 64 elements otherwise keeps Z3
    busy for minutes); only when that fails is the question asked in full. Sound either way:
    a model of the hypotheses plus extra equations is a model of the hypotheses."""
    hyps = [_as_bool(h) for h in hypotheses]
    pinned = [v == 1 for v in _free_constants(hyps) if v.sort().kind() in (z3.Z3_INT_SORT,
                                                                             z3.Z3_REAL_SORT)]
    if pinned:
        ground = prove(z3.BoolVal(False), hyps + pinned, name=f"{name}.ground",
                       timeout_ms=timeout_ms)
        if ground.status == "refuted":
            return ground
    return prove(z3.BoolVal(False), hyps, name=name, timeout_ms=timeout_ms)


MAX_SPLIT_PARTS = 256
"""`prove_all` splits a conjunction into at most this many independent parts (more: one query)."""
WHOLE_FIRST_SHARE = 16
"""`prove_all` asks the whole conjunction first with 1/WHOLE_FIRST_SHARE of the budget, the
parts share the rest: never more than the budget in all. A small share: most conjunctions Z3
settles whole are settled at once, and one it cannot settle (a nonlinear divide instance of
a cross-entropy gradient) spent half the budget, ~20 s, before its parts were proved in
moments (1/16: 43 -> 4.3 s CPU for that check, the same 97 instances proved)."""


def conjunction(claims: list) -> z3.BoolRef:
    """`z3.And(claims)`: built directly when every claim is a z3 boolean (the same term;
    `z3.And` spends most of a large instance's time checking the claims' sorts one by one)."""
    if claims and all(type(c) is z3.BoolRef for c in claims):
        ctx = claims[0].ctx
        if all(c.ctx is ctx for c in claims):
            args = (z3.Ast * len(claims))(*(c.as_ast() for c in claims))
            return z3.BoolRef(z3.Z3_mk_and(ctx.ref(), len(claims), args), ctx)
    return z3.And(claims)


def prove_all(claims: list, hypotheses: Iterable = (), name: str = "query",
              timeout_ms: int | None = None,
              witness: Callable[[z3.ModelRef], object] | None = None) -> ProofResult:
    """Prove every claim of `claims` under `hypotheses`: `prove(And(claims), ...)`, asked in
    parts when the whole is inconclusive.

    `H -> c1 and c2` is valid exactly when `H -> c1` and `H -> c2` are, so any split is exact;
    Z3 may time out on n independent copies of a claim it settles at once alone (64 int32
    wrap-around products: 60 ms each, their conjunction not in 40 s; 16 cells of
    `c / x == c * (1 / x)`: 40 s). So the conjunction is first asked whole with
    1/`WHOLE_FIRST_SHARE` of the budget (Z3's work count: the same verdict on any machine; most
    are decided so, and finding parts costs a walk of every claim); then part by part, each
    distinct query with an equal share of the rest (the whole budget is never exceeded; 32
    parts asked as one query get all of it, not 1/32 each: a share too thin for one query
    makes its verdict hang on Z3's search order, which differs with the process's history):
    the parts are the groups of claims sharing no free variable, or each claim alone where
    all share one. A part is asked under the hypotheses that share a variable with it (a
    proof under fewer hypotheses is a proof); parts that are the same query up to the names
    of their variables (`x[0] * 5` and `x[1] * 5`) are asked once; a part refuted is asked again under every hypothesis (its model then satisfies them
    all: a real counterexample of the conjunction); an inconclusive part makes the answer
    inconclusive."""
    claims = [_as_bool(c) for c in claims]
    hyps = [_as_bool(h) for h in hypotheses]
    start = time.perf_counter()
    budget = DEFAULT_TIMEOUT_MS if timeout_ms is None else max(1, int(timeout_ms))

    def whole(share: int) -> ProofResult:
        result = prove(conjunction(claims) if claims else True, hyps, name=name,
                       timeout_ms=max(1, budget // share), witness=witness)
        result.seconds = time.perf_counter() - start
        return result

    if len(claims) <= 1:
        return whole(1)
    first = whole(WHOLE_FIRST_SHARE)
    if first.status != "unknown":
        return first
    parts = _independent_parts(claims)
    if len(parts) == 1:
        parts = [([c], {v.get_id() for v in _free_constants([c])}) for c in claims]
    if len(parts) > MAX_SPLIT_PARTS:
        return whole(2)
    hyp_vars = [{v.get_id() for v in _free_constants([h])} for h in hyps]
    renamed: list = []
    queries = []
    for part, variables in parts:
        relevant = [h for h, vs in zip(hyps, hyp_vars) if not vs or vs & variables]
        queries.append((part, relevant, _renamed_key(part, relevant, renamed)))
    share = max(1, (budget - budget // WHOLE_FIRST_SHARE) // len({q[2] for q in queries}))
    asked: dict[tuple, ProofResult] = {}
    for n, (part, relevant, key) in enumerate(queries):
        result = asked.get(key)
        if result is None:
            result = prove(conjunction(part), relevant, name=f"{name}.part{n}",
                           timeout_ms=share)
            asked[key] = result
        if result.status == "refuted":
            result = prove(conjunction(part), hyps, name=f"{name}.part{n}.all",
                           timeout_ms=share, witness=witness)
        if result.status != "proved":
            return replace(result, seconds=time.perf_counter() - start, name=name)
    return ProofResult("proved", None, time.perf_counter() - start, name)


def _independent_parts(claims: list[z3.BoolRef]) -> list[tuple[list[z3.BoolRef], set[int]]]:
    """The claims grouped into parts that share no free variable (union-find over variable
    ids), each with its variables' ids, in the claims' order. One walk over the claims'
    shared DAG: each subterm is visited once and stands for one variable of its group (the
    claims of a block share most of their subterms: walking each claim's DAG apart was
    quadratic in their number)."""
    parent: dict[int, int] = {}

    def find(x: int) -> int:
        root = x
        while parent.setdefault(root, root) != root:
            root = parent[root]
        while parent[x] != root:
            parent[x], x = root, parent[x]
        return root

    def union(a: int | None, b: int) -> int:
        if a is None:
            return b
        ra, rb = find(a), find(b)
        if ra != rb:
            parent[ra] = rb
        return rb

    variables = _group_variables(claims, union) if claims else {}
    nodes = [-1 - index for index in range(len(claims))]
    for index, node in enumerate(nodes):
        find(node)
        if variables.get(index) is not None:
            union(variables[index], node)
    members: dict[int, set[int]] = {}
    for v in {v for v in parent if v >= 0}:
        members.setdefault(find(v), set()).add(v)
    groups: dict[int, tuple[list[z3.BoolRef], set[int]]] = {}
    for claim, node in zip(claims, nodes):
        root = find(node)
        part = groups.setdefault(root, ([], members.get(root, set())))
        part[0].append(claim)
    return list(groups.values())


def _group_variables(claims: list[z3.BoolRef], union: Callable[[int | None, int], int]
                     ) -> dict[int, int | None]:
    """Claim index -> one free variable's id of that claim (None: it has none), every free
    variable of a subterm joined (`union`) with the others of that subterm. Walked once, post
    order, with z3's C functions on the terms' addresses (as `_free_constants`)."""
    ctx = claims[0].ctx
    ref = ctx.ref()
    app, uninterpreted = z3.Z3_APP_AST, z3.Z3_OP_UNINTERPRETED
    rep: dict[int, int | None] = {}
    out: dict[int, int | None] = {}
    for index, claim in enumerate(claims):
        stack = [(claim.as_ast(), False)]
        while stack:
            ast, expanded = stack.pop()
            key = z3.Z3_get_ast_id(ref, ast)
            if key in rep and not expanded:
                continue
            if z3.Z3_get_ast_kind(ref, ast) != app:
                rep[key] = None
                continue
            count = z3.Z3_get_app_num_args(ref, ast)
            if count == 0:
                uninterpreted_const = z3.Z3_get_decl_kind(
                    ref, z3.Z3_get_app_decl(ref, ast)) == uninterpreted
                rep[key] = union(None, key) if uninterpreted_const else None
                continue
            if not expanded:
                rep[key] = None  # visited: a DAG has no cycles, only shared subterms
                stack.append((ast, True))
                stack.extend((z3.Z3_get_app_arg(ref, ast, i), False) for i in range(count))
                continue
            joined = None
            for i in range(count):
                child = rep[z3.Z3_get_ast_id(ref, z3.Z3_get_app_arg(ref, ast, i))]
                if child is not None:
                    joined = union(joined, child)
            rep[key] = joined
        out[index] = rep[z3.Z3_get_ast_id(ref, claim.as_ast())]
    return out


def _renamed_key(part: list[z3.BoolRef], hypotheses: list[z3.BoolRef], keep: list) -> tuple:
    """The query with its free variables renamed in order of first appearance, as the terms
    it is made of: equal for two queries that differ only in which variables they are about
    (z3 shares equal terms, so equal terms are one term: their ids). `keep` holds the
    renamed terms while the keys are compared (an id is reused once its term is freed)."""
    formulas = [*part, *hypotheses]
    order = _free_constants(formulas)
    renamed = _substituted(formulas, [(v, z3.Const(f"_v{i}", v.sort()))
                                      for i, v in enumerate(order)])
    keep.append(renamed)
    return (len(part), *(f.get_id() for f in renamed))


def _substituted(formulas: list[z3.ExprRef], pairs: list[tuple[z3.ExprRef, z3.ExprRef]]
                 ) -> list[z3.ExprRef]:
    """`z3.substitute(f, *pairs)` of each formula, the pairs' arrays built once (the Python
    wrapper checks every pair's sorts again for every formula: most of a large query's
    split; here each pair has one sort by construction)."""
    if not pairs or not formulas:
        return list(formulas)
    ctx = formulas[0].ctx
    count = len(pairs)
    sources, targets = (z3.Ast * count)(), (z3.Ast * count)()
    for i, (source, target) in enumerate(pairs):
        sources[i], targets[i] = source.as_ast(), target.as_ast()
    return [z3.z3._to_expr_ref(z3.Z3_substitute(ctx.ref(), f.as_ast(), count, sources, targets),
                            ctx) for f in formulas]
