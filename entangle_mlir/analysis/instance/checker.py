"""`check_instance` and the `InstanceChecker` behind it: which form of an instance is checked
(abstract, reduced, or at its real shape; skipped when too large), the proof and plan caches,
the time budget and per-op statistics."""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from entangle_mlir.analysis.instance.abstraction import (
    STATED,
    abstract_with_strategy,
    as_padded_rel,
)
from entangle_mlir.analysis.instance.cache import CacheKey, Plan, plan_key, proof_key
from entangle_mlir.analysis.instance.common import (
    DEFAULT_TIMEOUT_MS,
    MAX_TERM_COST,
    instance_size,
    query_name,
    rel_of,
    rels_of,
    term_cost,
)
from entangle_mlir.analysis.instance.devices import distinct_devices, one_block
from entangle_mlir.analysis.instance.reduce import reduced_instance, reduced_shifted_scatter
from entangle_mlir.analysis.instance.solve import run_check
from entangle_mlir.analysis.solver import ProofResult
from entangle_mlir.core.mesh import Mesh
from entangle_mlir.core.relations import DEVICE_BLOCK_VALUES, GLOBAL, Opaque, Rel, Shifted, Value
from entangle_mlir.mlir.opinfo import OpInfo
from entangle_mlir.rules.base import RuleContext
from entangle_mlir.semantics.collectives import COLLECTIVE_SEMANTICS
from entangle_mlir.semantics.ops import OP_SEMANTICS

REDUCE_ABOVE = 64
"""Instances whose largest tensor has more elements are checked at a reduced shape if possible."""

INDEXED_OPS = ("stablehlo.gather", "stablehlo.scatter")
INDEXED_REDUCTION = 16
"""gather/scatter instances are reduced above REDUCE_ABOVE / 16 elements: their symbolic
indices make an If-chain over every position of every index (a 16x8 scatter-add with 6
indices at its real shape times out after 5 s; reduced, it proves in well under a second)."""

MAX_ELEMENTS = 4096
"""The largest tensor checked at its real shape."""


def check_instance(info: OpInfo, in_values: Sequence[Value], out_values: Sequence[Value],
                   mesh: Mesh | None, ctx: RuleContext | None = None,
                   checker: InstanceChecker | None = None) -> ProofResult:
    """Prove that `out_values` hold after `info` given `in_values` (see the package's docstring).

    `ctx` gives the manual axes (default: every mesh axis, or none when the values are global);
    `checker` holds the cache, time budget and statistics (default: a module-wide one).
    """
    return (checker or DEFAULT_CHECKER).check(info, in_values, out_values, mesh, ctx)


@dataclass
class OpStats:
    """One op's instance checks: how many, cache hits, seconds, and the count of each status."""

    checks: int = 0
    cache_hits: int = 0
    seconds: float = 0.0
    statuses: dict[str, int] = field(default_factory=dict)


@dataclass
class Pending:
    """A planned Z3 query of one instance (`run_pending` proves it): the form checked
    (abstract, reduced or real), its query name, timeout and proof-cache key."""

    info: OpInfo
    ins: list[Value]
    outs: list[Value]
    mesh: Mesh | None
    ctx: RuleContext
    query: str
    mode: str
    timeout_ms: int
    key: CacheKey | None

    @property
    def name(self) -> str:
        return f"{self.query}.{self.mode}"


@dataclass
class Planned:
    """An instance between `InstanceChecker.plan` and `finish`: its op's statistics, when it
    was planned and how long that took, and the pending query or the result already known."""

    op: str
    stats: OpStats
    start: float
    plan_seconds: float
    outcome: ProofResult | Pending


def checked_size(info: OpInfo, ins: list[Value], outs: list[Value], mesh: Mesh | None,
                 ctx: RuleContext) -> int:
    """The local elements of the instance's largest operand or result times the devices
    whose claims are checked (`devices.distinct_devices`): what the query computes, where
    `instance_size` counts the global terms' elements (a ring's one generic device holds
    all the blocks of the keys, not the global scores of every device); a sum over the ring
    checked on one block (`devices.one_block`) computes one block's window per device."""
    single = ctx.is_global or mesh is None
    devices = 1 if single else len(distinct_devices(
        info, ins, outs, mesh, single, mesh.num_devices))
    local = max((math.prod(t.shape) for t in info.operand_types + info.result_types),
                default=1)
    if not single and one_block(ins, outs, mesh):  # each device computes one block's window
        local = max(1, local // len(outs[0].orders[0]))
    return local * devices


def run_pending(pending: Pending) -> ProofResult:
    """Prove a planned query (no cache): what a worker process runs. Never raises."""
    try:
        result = run_check(pending.info, pending.ins, pending.outs, pending.mesh, pending.ctx,
                           name=pending.name, timeout_ms=pending.timeout_ms)
    except Exception as err:  # noqa: BLE001 - a checker bug must not crash the run
        return internal_error(pending.query, err)
    result.details = {**result.details, "mode": pending.mode}
    return result


def internal_error(name: str, err: Exception) -> ProofResult:
    """The result of an instance check that raised: unknown, with the error."""
    return ProofResult("unknown", name=name, reason=f"internal error in the instance check: "
                                                    f"{type(err).__name__}: {err}")


class InstanceChecker:
    """Cache, per-run time budget and per-op statistics for instance checks.

    `budget_s`: total seconds this checker may spend (None: unlimited); once spent, checks
    return "skipped". `timeout_ms`: per Z3 query (capped by what is left of the budget).
    """

    def __init__(self, budget_s: float | None = None, timeout_ms: int = DEFAULT_TIMEOUT_MS,
                 reduce_above: int = REDUCE_ABOVE, max_elements: int = MAX_ELEMENTS) -> None:
        self.budget_s = budget_s
        self.timeout_ms = timeout_ms
        self.reduce_above = reduce_above
        self.max_elements = max_elements
        self.spent = 0.0
        self.cache: dict[CacheKey, ProofResult] = {}
        self.plans: dict[CacheKey, Plan] = {}
        self.stats: dict[str, OpStats] = {}

    def remaining(self) -> float | None:
        return None if self.budget_s is None else self.budget_s - self.spent

    def clear(self) -> None:
        self.cache.clear()
        self.plans.clear()
        self.stats.clear()
        self.spent = 0.0

    def check(self, info: OpInfo, in_values: Sequence[Value], out_values: Sequence[Value],
              mesh: Mesh | None, ctx: RuleContext | None = None) -> ProofResult:
        """A zero-padded window (`rules/kinds/window.py`) is claimed as the padded relation it
        stands for: the same local values on every device."""
        planned = self.plan(info, in_values, out_values, mesh, ctx)
        if isinstance(planned.outcome, ProofResult):
            return self.finish(planned, planned.outcome)
        cached = self.cached(planned)
        return self.finish(planned, cached or run_pending(planned.outcome))

    def plan(self, info: OpInfo, in_values: Sequence[Value], out_values: Sequence[Value],
             mesh: Mesh | None, ctx: RuleContext | None = None) -> Planned:
        """The first half of `check`: what to check (a `Pending` query, not yet looked up in
        the proof cache), or the result when nothing is to be proved (skipped, an internal
        error). `finish` completes it; `check_batch` runs the pending queries of many
        instances in worker processes in between."""
        out_values = [as_padded_rel(v) for v in out_values]
        start = time.perf_counter()
        stats = self.stats.get(info.name)
        if stats is None:
            stats = self.stats[info.name] = OpStats()
        stats.checks += 1
        try:
            outcome = self._prepare(info, list(in_values), list(out_values), mesh, ctx)
        except Exception as err:  # noqa: BLE001 - a checker bug must not crash the run
            outcome = internal_error(query_name(info), err)
        return Planned(info.name, stats, start, time.perf_counter() - start, outcome)

    def cached(self, planned: Planned) -> ProofResult | None:
        """The proof cache's answer for a planned query (a cache hit, counted), or None."""
        pending = planned.outcome
        known = self.cache.get(pending.key) if pending.key is not None else None
        if known is None:
            return None
        planned.stats.cache_hits += 1
        return ProofResult(known.status, known.counterexample, known.seconds, known.name,
                           known.reason, True, {**known.details, "mode": pending.mode})

    def finish(self, planned: Planned, result: ProofResult,
               run_seconds: float | None = None) -> ProofResult:
        """Record a planned instance's result: the proof cache, the budget, the statistics.
        `run_seconds`: the query's time where it ran elsewhere (default: the time since it was
        planned, here)."""
        pending = planned.outcome
        if (isinstance(pending, Pending) and not result.cached and pending.key is not None
                and result.status in ("proved", "refuted")):
            self.cache[pending.key] = result
        elapsed = (time.perf_counter() - planned.start if run_seconds is None
                   else planned.plan_seconds + run_seconds)
        if not result.cached:
            self.spent += elapsed
            result.seconds = elapsed
        planned.stats.seconds += elapsed
        planned.stats.statuses[result.status] = planned.stats.statuses.get(result.status, 0) + 1
        return result

    def _prepare(self, info: OpInfo, ins: list[Value], outs: list[Value], mesh: Mesh | None,
                 ctx: RuleContext | None) -> ProofResult | Pending:
        remaining = self.remaining()
        if remaining is not None and remaining <= 0:
            return ProofResult("skipped", name=query_name(info),
                               reason="instance-check time budget spent")
        if all(isinstance(v, Opaque) for v in outs):
            return ProofResult("skipped", name=query_name(info), reason="no relation claimed")
        if info.name not in OP_SEMANTICS and info.name not in COLLECTIVE_SEMANTICS:
            return ProofResult("skipped", name=query_name(info),
                               reason=f"no semantics for {info.name}")
        manual = tuple(ctx.manual_axes) if ctx else _default_manual_axes(ins, outs, mesh)
        shape_key = plan_key(info, ins, outs, mesh, manual)
        known = self.plans.get(shape_key) if shape_key is not None else None
        if known is not None and known.instance_of(ins, outs):
            p_info, p_ins, p_outs, mode = known.plan
            key = known.key
        else:
            ctx = ctx or RuleContext(mesh=mesh, manual_axes=manual)
            plan = self._plan(info, ins, outs, mesh, ctx)
            if isinstance(plan, ProofResult):
                plan.name = plan.name or query_name(info)
                return plan
            p_info, p_ins, p_outs, mode = plan[:4]
            key = proof_key(p_info, p_ins, p_outs, mesh, ctx)
            abstract = plan[4]
            if shape_key is not None and abstract is not None:
                self.plans[shape_key] = Plan(abstract[0], abstract[1], plan[:4], key)
        timeout = self.timeout_ms
        if remaining is not None:
            timeout = max(1, min(timeout, int(remaining * 1000)))
        ctx = ctx or RuleContext(mesh=mesh, manual_axes=manual)
        return Pending(p_info, p_ins, p_outs, mesh, ctx, query_name(info), mode, timeout, key)

    def _plan(self, info: OpInfo, ins: list[Value], outs: list[Value], mesh: Mesh | None,
              ctx: RuleContext):
        """(info, ins, outs, mode, abstraction) to check, or a ProofResult when nothing can
        be checked. `abstraction` is the (inputs, outputs) of the "leaf" abstraction when that
        is what the plan was derived from (the plan is then reusable, see `Plan`), else None."""
        size = instance_size(info, ins, outs)
        if any(isinstance(v, DEVICE_BLOCK_VALUES) for v in list(ins) + list(outs)):
            return self._plan_block_values(info, ins, outs, mesh, ctx, size)
        if any(isinstance(v, Shifted) for v in list(ins) + list(outs)):
            if info.name == "stablehlo.scatter" and size > self.reduce_above // INDEXED_REDUCTION:
                reduced = reduced_shifted_scatter(info, ins, outs, mesh, ctx)
                if reduced is not None:
                    return (*reduced, "reduced (device-shifted indices)", None)
            elif size > self.reduce_above:
                abstract, _ = abstract_with_strategy(info, ins, outs, mesh, ctx)
                reduced = (reduced_instance(info, abstract[0], abstract[1], mesh, ctx)
                           if abstract is not None else None)
                if reduced is not None and not isinstance(reduced, str):
                    return (*reduced, "reduced (device offsets)", None)
            if size > self.max_elements:
                return ProofResult("skipped", reason="device-offset tensor too large to check "
                                   f"at its real shape ({size} elements)")
            return info, ins, outs, "real", None
        abstract, strategy = abstract_with_strategy(info, ins, outs, mesh, ctx)
        reusable = abstract if strategy in ("leaf", STATED) else None
        why_not = "the rule's output is not generic in its input terms"
        reduce_above = self.reduce_above
        if info.name in INDEXED_OPS:
            reduce_above //= INDEXED_REDUCTION
        if abstract is not None and size > reduce_above:
            reduced = reduced_instance(info, abstract[0], abstract[1], mesh, ctx, strategy)
            if isinstance(reduced, str):
                why_not = reduced
            else:
                r_info, r_ins, r_outs = reduced
                if instance_size(r_info, r_ins, r_outs) <= self.max_elements or (
                        checked_size(r_info, r_ins, r_outs, mesh, ctx) <= self.max_elements):
                    return r_info, r_ins, r_outs, "reduced", reusable
                why_not = "still too large at the reduced shape"
        if size > self.max_elements:
            return ProofResult("skipped", reason=f"too large to check at its real shape "
                               f"({size} elements) and not reducible: {why_not}")
        if abstract is not None:
            mode = "abstract" if size <= reduce_above else f"abstract ({why_not})"
            return info, abstract[0], abstract[1], mode, reusable
        cost = term_cost([r.term for r in map(rel_of, list(ins) + list(outs))
                          if r is not None])
        if cost > MAX_TERM_COST:
            return ProofResult("skipped", reason=f"{why_not}, and its reference terms are too "
                               f"large to evaluate ({cost} elements over all subterms)")
        return info, ins, outs, "real", None

    def _plan_block_values(self, info: OpInfo, ins: list[Value], outs: list[Value],
                           mesh: Mesh | None, ctx: RuleContext, size: int):
        """Device masks and local indices: the index terms stay concrete (the rule matches
        them by identity), the data they mask or index becomes leaves."""
        abstract, _ = abstract_with_strategy(info, ins, outs, mesh, ctx)
        reduce_above = self.reduce_above // (INDEXED_REDUCTION if info.name in INDEXED_OPS
                                             else 1)
        if abstract is not None and size > reduce_above:
            reduced = reduced_instance(info, abstract[0], abstract[1], mesh, ctx)
            if not isinstance(reduced, str):
                return (*reduced, "reduced (device mask)", None)
        if size > self.max_elements:
            return ProofResult("skipped", reason="device-masked value too large to check at "
                               f"its real shape ({size} elements)")
        if abstract is not None:
            return info, abstract[0], abstract[1], "abstract (device mask)", None
        cost = term_cost([r.term for v in list(ins) + list(outs) for r in rels_of(v)])
        if cost > MAX_TERM_COST:
            return ProofResult("skipped", reason="the rule's output is not generic in its "
                               f"input terms, and they are too large to evaluate ({cost} "
                               "elements over all subterms)")
        return info, ins, outs, "real", None


DEFAULT_CHECKER = InstanceChecker()


def set_budget(seconds: float | None) -> None:
    """Give the default checker a fresh time budget (None: unlimited)."""
    DEFAULT_CHECKER.budget_s = seconds
    DEFAULT_CHECKER.spent = 0.0


def default_context(ins: Sequence[Value], outs: Sequence[Value], mesh: Mesh | None
                    ) -> RuleContext:
    """Global scope when there is no mesh or the values are global, else fully manual."""
    return RuleContext(mesh=mesh, manual_axes=_default_manual_axes(ins, outs, mesh))


def _default_manual_axes(ins: Sequence[Value], outs: Sequence[Value], mesh: Mesh | None
                         ) -> tuple[str, ...]:
    """`default_context`'s manual axes."""
    if mesh is None:
        return ()
    for values in (ins, outs):
        for v in values:
            if isinstance(v, Rel) and v.scope == GLOBAL:
                return ()
    return mesh.names
