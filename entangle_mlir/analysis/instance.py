"""Z3 checks of rule instances: does an op's inferred output relation really hold?

`check_instance(info, in_values, out_values, mesh)` proves that, for EVERY global tensor
satisfying the input relations, running the op on each device (`semantics.py`) produces values
satisfying the output relations. The query is built on small symbolic tensors:

1. every input relation's term becomes a global tensor of z3 variables (see "abstraction");
2. each device's LOCAL operand is derived from the relation's exact meaning (`layout.py`):
   the block of the global tensor for tiled dims (mesh axes major first; poly dims whole);
   for a partial SUM over axes P, fresh local variables on all but the last device of each
   P-group and the last one = block minus the others (so every split of the block is covered);
   for a partial MAX/MIN, fresh locals constrained (hypotheses) to have the block as max/min;
   a `DeviceScalar` is its concrete per-device integer; an `Opaque` operand is unconstrained;
3. the op runs per device (collectives across devices);
4. the claim: on every device, the result reduced over the output's partial axes equals the
   block of the output term (a `DeviceScalar` output equals its table entry).

On big meshes only one device per symmetric mesh axis is simulated (`_symmetric_axes`: the
other devices' claims are the same up to a renaming of the variables), and terms are evaluated
on those devices' blocks only (`_region_value`), so the cost stays nearly flat in mesh size.

**Abstraction and reduced shapes.** Input terms can be whole-network DAGs, and tensors can be
large. So each input term is replaced by a fresh leaf (splat and iota constants are kept, a
poly broadcast keeps its broadcast), the rule is re-run on the abstract inputs, and the real
output terms must be exactly the abstract outputs with the leaves substituted back (otherwise
the real terms are used, when small). A large instance of a shape-uniform op (elementwise,
dot_general, reduce, transpose, broadcast_in_dim, reshapes that only merge or split dims,
concatenate, iota, splat constants, gather/scatter, collectives, slice and pad along the dims
they take whole) is then checked at a reduced shape: every local dim becomes min(size, 2) (1
stays 1; each global dim stays a multiple of its number of blocks; dims tied by the attributes
stay tied; a dim a slice cuts or a pad pads keeps its size), the rule is run again there, and
its outputs must have the same layouts and the same term skeleton as at the real shape. Other
ops are checked at their real shape when small, else "skipped" with the reason. Results are
cached by (op signature, layouts, abstract terms, shape class), so the 2nd..Nth identical layer
costs a dictionary lookup.

Assumptions, all in the direction of "not proved" rather than "wrongly proved": every divisor
met is nonzero (exact real semantics leaves x / 0 undefined; a contradictory assumption set is
reported as unknown), loop variables and loop results are arbitrary values, transcendental
functions are uninterpreted. The abstraction's substitution step trusts the term constructors
of `terms.py` to preserve meaning (property-tested in tests/test_instance.py).

`unknown` is never reported as proved; when Z3 answers unknown, a few concrete evaluations
with exact rationals (and pseudo-random interpretations of the uninterpreted functions) look
for a genuine counterexample before giving up.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from fractions import Fraction
from functools import reduce as _fold

import numpy as np
import z3

from entangle_mlir.analysis.solver import ProofResult, prove
from entangle_mlir.core.mesh import Mesh
from entangle_mlir.core.relations import (
    DEVICE_BLOCK_VALUES,
    GLOBAL,
    BlockIndex,
    DeviceScalar,
    InBlock,
    Masked,
    Opaque,
    Permuted,
    Rel,
    Reordered,
    Returning,
    Shifted,
    Value,
    Windowed,
    is_padded,
    padded_rel,
)
from entangle_mlir.core.terms import (
    ARITHMETIC_TERM_OPS,
    COMMUTATIVE,
    DENSE_VALUES,
    ELEMENTWISE_STABLEHLO,
    Term,
    make_arg,
    make_broadcast,
    make_div,
    make_elementwise,
    make_iota,
    make_lin,
    make_mul,
    make_reshape,
    make_roll,
    make_splat,
    make_transpose,
    rebuild,
    reshape_groups,
    roll_parts,
    subterms,
)
from entangle_mlir.core.traits import ELEMENTWISE_OPS
from entangle_mlir.mlir.opinfo import OpInfo, TensorType, scatter_kind
from entangle_mlir.rules import RULES
from entangle_mlir.rules.base import ReferenceTerms, RuleContext
from entangle_mlir.rules.kinds.reordered import with_orders
from entangle_mlir.rules.kinds.window import completed_sums
from entangle_mlir.semantics.collectives import COLLECTIVE_SEMANTICS, replica_groups, run_op
from entangle_mlir.semantics.element import (
    SemanticsError,
    add,
    collect_divisors,
    combine,
    compare,
    equal,
    int_limits,
    is_bool_dtype,
    is_int_dtype,
    is_z3,
    random_functions,
    select,
    sub,
    sum_list,
    to_z3,
    wrap_int,
    wrap_shift,
)
from entangle_mlir.semantics.evaluate import evaluate_node, evaluate_term, wrap_node
from entangle_mlir.semantics.groups import GROUPED
from entangle_mlir.semantics.ops import OP_SEMANTICS, WRAPPED_OPS, dimension_numbers
from entangle_mlir.semantics.tensor import (
    apply,
    broadcast_in_dim,
    dot_general,
    full,
    obj_array,
    reduce_dims,
    take,
    transpose,
    wrap_node_dtype,
)

ABSTRACT_BASE = 1_000_000_000
"""Argument indices of abstract leaves (never used by real programs)."""

REDUCE_ABOVE = 64
"""Instances whose largest tensor has more elements are checked at a reduced shape if possible."""

INDEXED_OPS = ("stablehlo.gather", "stablehlo.scatter")
INDEXED_REDUCTION = 16
"""gather/scatter instances are reduced above REDUCE_ABOVE / 16 elements: their symbolic
indices make an If-chain over every position of every index (a 16x8 scatter-add with 6
indices at its real shape times out after 5 s; reduced, it proves in well under a second)."""

MAX_ELEMENTS = 4096
"""The largest tensor checked at its real shape."""

MAX_TERM_COST = 20_000
"""Real (non-abstracted) terms are evaluated only when all their subterms together have at most
this many elements."""

REDUCED_LOCAL = 2
"""The local size every dim > 1 gets at a reduced shape."""

DEFAULT_TIMEOUT_MS = 5_000
CONCRETE_TRIALS = 4


# ----- public API -----------------------------------------------------------------------------

def check_instance(info: OpInfo, in_values: Sequence[Value], out_values: Sequence[Value],
                   mesh: Mesh | None, ctx: RuleContext | None = None,
                   checker: InstanceChecker | None = None) -> ProofResult:
    """Prove that `out_values` hold after `info` given `in_values` (see the module docstring).

    `ctx` gives the manual axes (default: every mesh axis, or none when the values are global);
    `checker` holds the cache, time budget and statistics (default: a module-wide one).
    """
    return (checker or DEFAULT_CHECKER).check(info, in_values, out_values, mesh, ctx)


@dataclass
class OpStats:
    checks: int = 0
    cache_hits: int = 0
    seconds: float = 0.0
    statuses: dict[str, int] = field(default_factory=dict)


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
        self.cache: dict[_Key, ProofResult] = {}
        self.plans: dict[_Key, _Plan] = {}
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
        """A zero-padded window (`rules/window.py`) is claimed as the padded relation it
        stands for: the same local values on every device."""
        out_values = [_as_padded_rel(v) for v in out_values]
        start = time.perf_counter()
        stats = self.stats.get(info.name)
        if stats is None:
            stats = self.stats[info.name] = OpStats()
        stats.checks += 1
        try:
            result = self._check(info, list(in_values), list(out_values), mesh, ctx, stats)
        except Exception as err:  # noqa: BLE001 - a checker bug must not crash the run
            result = ProofResult("unknown", name=_query_name(info),
                                 reason=f"internal error in the instance check: "
                                        f"{type(err).__name__}: {err}")
        elapsed = time.perf_counter() - start
        if not result.cached:
            self.spent += elapsed
        stats.seconds += elapsed
        stats.statuses[result.status] = stats.statuses.get(result.status, 0) + 1
        if not result.cached:
            result.seconds = elapsed
        return result

    def _check(self, info: OpInfo, ins: list[Value], outs: list[Value], mesh: Mesh | None,
               ctx: RuleContext | None, stats: OpStats) -> ProofResult:
        remaining = self.remaining()
        if remaining is not None and remaining <= 0:
            return ProofResult("skipped", name=_query_name(info),
                               reason="instance-check time budget spent")
        if all(isinstance(v, Opaque) for v in outs):
            return ProofResult("skipped", name=_query_name(info), reason="no relation claimed")
        if info.name not in OP_SEMANTICS and info.name not in COLLECTIVE_SEMANTICS:
            return ProofResult("skipped", name=_query_name(info),
                               reason=f"no semantics for {info.name}")
        manual = tuple(ctx.manual_axes) if ctx else _default_manual_axes(ins, outs, mesh)
        shape_key = _shape_key(info, ins, outs, mesh, manual)
        known = self.plans.get(shape_key) if shape_key is not None else None
        if known is not None and known.instance_of(ins, outs):
            p_info, p_ins, p_outs, mode = known.plan
            key = known.key
        else:
            ctx = ctx or RuleContext(mesh=mesh, manual_axes=manual)
            plan = self._plan(info, ins, outs, mesh, ctx)
            if isinstance(plan, ProofResult):
                plan.name = plan.name or _query_name(info)
                return plan
            p_info, p_ins, p_outs, mode = plan[:4]
            key = _cache_key(p_info, p_ins, p_outs, mesh, ctx)
            abstract = plan[4]
            if shape_key is not None and abstract is not None:
                self.plans[shape_key] = _Plan(abstract[0], abstract[1], plan[:4], key)
        known_result = self.cache.get(key) if key is not None else None
        if known_result is not None:
            stats.cache_hits += 1
            r = known_result
            return ProofResult(r.status, r.counterexample, r.seconds, r.name, r.reason, True,
                               {**r.details, "mode": mode})
        timeout = self.timeout_ms
        if remaining is not None:
            timeout = max(1, min(timeout, int(remaining * 1000)))
        ctx = ctx or RuleContext(mesh=mesh, manual_axes=manual)
        result = run_check(p_info, p_ins, p_outs, mesh, ctx, name=f"{_query_name(info)}.{mode}",
                           timeout_ms=timeout)
        result.details = {**result.details, "mode": mode}
        if key is not None and result.status in ("proved", "refuted"):
            self.cache[key] = result
        return result

    def _plan(self, info: OpInfo, ins: list[Value], outs: list[Value], mesh: Mesh | None,
              ctx: RuleContext):
        """(info, ins, outs, mode, abstraction) to check, or a ProofResult when nothing can
        be checked. `abstraction` is the (inputs, outputs) of the "leaf" abstraction when that
        is what the plan was derived from (the plan is then reusable, see `_Plan`), else None."""
        size = _instance_size(info, ins, outs)
        if any(isinstance(v, DEVICE_BLOCK_VALUES) for v in list(ins) + list(outs)):
            return self._plan_block_values(info, ins, outs, mesh, ctx, size)
        if any(isinstance(v, Shifted) for v in list(ins) + list(outs)):
            if info.name == "stablehlo.scatter" and size > self.reduce_above // INDEXED_REDUCTION:
                reduced = _reduced_shifted_scatter(info, ins, outs, mesh, ctx)
                if reduced is not None:
                    return (*reduced, "reduced (device-shifted indices)", None)
            elif size > self.reduce_above:
                abstract, _ = _abstract_instance(info, ins, outs, mesh, ctx)
                reduced = (_reduced_instance(info, abstract[0], abstract[1], mesh, ctx)
                           if abstract is not None else None)
                if reduced is not None and not isinstance(reduced, str):
                    return (*reduced, "reduced (device offsets)", None)
            if size > self.max_elements:
                return ProofResult("skipped", reason="device-offset tensor too large to check "
                                   f"at its real shape ({size} elements)")
            return info, ins, outs, "real", None
        abstract, strategy = _abstract_instance(info, ins, outs, mesh, ctx)
        reusable = abstract if strategy == "leaf" else None
        why_not = "the rule's output is not generic in its input terms"
        reduce_above = self.reduce_above
        if info.name in INDEXED_OPS:
            reduce_above //= INDEXED_REDUCTION
        if abstract is not None and size > reduce_above:
            reduced = _reduced_instance(info, abstract[0], abstract[1], mesh, ctx)
            if isinstance(reduced, str):
                why_not = reduced
            else:
                r_info, r_ins, r_outs = reduced
                if _instance_size(r_info, r_ins, r_outs) <= self.max_elements:
                    return r_info, r_ins, r_outs, "reduced", reusable
                why_not = "still too large at the reduced shape"
        if size > self.max_elements:
            return ProofResult("skipped", reason=f"too large to check at its real shape "
                               f"({size} elements) and not reducible: {why_not}")
        if abstract is not None:
            mode = "abstract" if size <= reduce_above else f"abstract ({why_not})"
            return info, abstract[0], abstract[1], mode, reusable
        cost = _term_cost([r.term for r in map(_rel_of, list(ins) + list(outs))
                           if r is not None])
        if cost > MAX_TERM_COST:
            return ProofResult("skipped", reason=f"{why_not}, and its reference terms are too "
                               f"large to evaluate ({cost} elements over all subterms)")
        return info, ins, outs, "real", None

    def _plan_block_values(self, info: OpInfo, ins: list[Value], outs: list[Value],
                           mesh: Mesh | None, ctx: RuleContext, size: int):
        """Device masks and local indices: the index terms stay concrete (the rule matches
        them by identity), the data they mask or index becomes leaves."""
        abstract, _ = _abstract_instance(info, ins, outs, mesh, ctx)
        reduce_above = self.reduce_above // (INDEXED_REDUCTION if info.name in INDEXED_OPS
                                             else 1)
        if abstract is not None and size > reduce_above:
            reduced = _reduced_instance(info, abstract[0], abstract[1], mesh, ctx)
            if not isinstance(reduced, str):
                return (*reduced, "reduced (device mask)", None)
        if size > self.max_elements:
            return ProofResult("skipped", reason="device-masked value too large to check at "
                               f"its real shape ({size} elements)")
        if abstract is not None:
            return info, abstract[0], abstract[1], "abstract (device mask)", None
        cost = _term_cost([r.term for v in list(ins) + list(outs) for r in _rels_of(v)])
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


# ----- helpers: names, sizes, cache keys ------------------------------------------------------

def _query_name(info: OpInfo) -> str:
    base = info.name.split(".")[-1]
    if info.loc is not None:
        loc = getattr(info.loc, "line", None)
        if loc:
            base += f"@{loc}"
    return f"instance.{base}"


def _instance_size(info: OpInfo, ins: Sequence[Value], outs: Sequence[Value]) -> int:
    sizes = [math.prod(t.shape) for t in info.operand_types + info.result_types]
    sizes += [math.prod(r.term.shape) for r in map(_rel_of, list(ins) + list(outs))
              if r is not None]
    return max(sizes, default=1)


def _rel_of(value: Value) -> Rel | None:
    """The relation a value is built on (a moved or shifted value's underlying Rel)."""
    if isinstance(value, Rel):
        return value
    if isinstance(value, Permuted | Windowed | Shifted | Reordered | Returning | InBlock
                  | BlockIndex | Masked):
        return value.rel
    return None


def _rels_of(value: Value) -> list[Rel]:
    """Every relation a value is built on (a masked value's predicate too)."""
    rel = _rel_of(value)
    if rel is None:
        return []
    return [rel, value.pred.rel] if isinstance(value, Masked) else [rel]


def _term_cost(terms: Sequence[Term]) -> int:
    """Elements over all distinct subterms (the work of evaluating them symbolically)."""
    return sum(math.prod(term.shape) for term in subterms(terms))


def _value_key(value: Value) -> tuple:
    if isinstance(value, Rel):
        return ("rel", value.term, value.tiling, value.partial, value.kind, value.poly,
                value.scope)
    if isinstance(value, DeviceScalar):
        return ("scalar", value.values, value.shape)
    if isinstance(value, Shifted):
        return ("shifted", _value_key(value.rel), value.offsets)
    if isinstance(value, Permuted):
        return ("permuted", _value_key(value.rel), value.sources)
    if isinstance(value, Reordered):
        return ("reordered", _value_key(value.rel), value.dim, value.orders,
                None if value.pieces is None else id(value.pieces))
    if isinstance(value, Returning):
        return ("returning", _value_key(value.rel), value.dim, value.blocks, value.sources,
                None if value.pieces is None else id(value.pieces))
    if isinstance(value, Windowed):
        return ("windowed", _value_key(value.rel), value.dim, value.offset, value.length,
                value.holes, value.summed, value.starts)
    if isinstance(value, InBlock):
        return ("inblock", _value_key(value.rel), value.axes, value.length, value.lo, value.hi,
                value.negated)
    if isinstance(value, BlockIndex):
        return ("blockindex", _value_key(value.rel), value.axes, value.length, value.fill,
                value.add)
    if isinstance(value, Masked):
        return ("masked", _value_key(value.rel), _value_key(value.pred), value.zero)
    return ("opaque",)


class _Key:
    """A cache key (a deep tuple) with its hash computed once: the plan and proof caches look
    keys up on every op. Equal exactly when the tuples are equal."""

    __slots__ = ("_hash", "parts")

    def __init__(self, parts: tuple) -> None:
        self._hash = hash(parts)  # TypeError when a part is unhashable
        self.parts = parts

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        return self is other or (type(other) is _Key and self._hash == other._hash
                                 and self.parts == other.parts)


def _cache_key(info: OpInfo, ins: Sequence[Value], outs: Sequence[Value], mesh: Mesh | None,
               ctx: RuleContext) -> _Key | None:
    try:
        return _Key((info.signature(), tuple(info.operand_types), tuple(info.result_types),
                     tuple(_value_key(v) for v in ins), tuple(_value_key(v) for v in outs), mesh,
                     tuple(ctx.manual_axes)))
    except TypeError:
        return None


def _layout_key(value: Value) -> tuple:
    """A value without its term: layout, shape and dtype (`_value_key` for the others)."""
    if isinstance(value, Rel):
        return ("rel", value.tiling, value.partial, value.kind, value.poly, value.scope,
                value.term.shape, value.term.dtype)
    return _value_key(value)


def _shape_key(info: OpInfo, ins: Sequence[Value], outs: Sequence[Value], mesh: Mesh | None,
               manual_axes: tuple[str, ...]) -> _Key | None:
    """What determines an instance's "leaf" abstraction and everything planned from it: the
    op's attributes and types, the layouts, which inputs share a term, and the constants the
    abstraction keeps (see `_Abstractor.abstract`). Cheap: no rule runs, no term is built.
    None when the instance is not eligible (device-offset values are checked as they are)."""
    numbering: dict[int, int] = {}  # which inputs share a leaf: serial -> leaf number
    parts = []
    for value in ins:
        if type(value) is not Rel:
            if isinstance(value, _UNPLANNED):
                return None
            if not isinstance(value, Rel):
                parts.append(_value_key(value))
                continue
        term = value.term
        layout = ("rel", value.tiling, value.partial, value.kind, value.poly, value.scope,
                  term.shape, term.dtype)  # _layout_key
        op = term.op
        if op == "splat" or op == "iota":
            parts.append((layout, term))
        elif op == "broadcast" and value.poly:
            operand = term.args[0]
            parts.append((layout, term.attrs, operand.shape, operand.dtype,
                          numbering.setdefault(operand.serial, len(numbering))))
        else:
            parts.append((layout, numbering.setdefault(term.serial, len(numbering))))
    if any(isinstance(v, _UNPLANNED) for v in outs):
        return None
    try:
        return _Key((info.signature(), tuple(info.operand_types), tuple(info.result_types),
                     tuple(parts), tuple(_layout_key(v) for v in outs), mesh, manual_axes))
    except TypeError:
        return None


_UNPLANNED = (Shifted, Returning, *DEVICE_BLOCK_VALUES)
"""Values checked as they are, never through a reusable plan."""


@dataclass
class _Plan:
    """A planned check reusable by every instance with the same `_shape_key`: the abstract
    instance (the rule's output on fresh leaves), what is checked, and its cache key.

    Reuse re-validates the abstraction for the new instance: its outputs must be the abstract
    outputs with its own input terms substituted (so a changed layer is checked afresh)."""

    abstract_ins: list[Value]
    abstract_outs: list[Value]
    plan: tuple
    key: _Key | None

    def instance_of(self, ins: Sequence[Value], outs: Sequence[Value]) -> bool:
        mapping: dict[int, Term] = {}
        for abstract, real in zip(self.abstract_ins, ins):
            if not isinstance(abstract, Rel):
                continue
            a, r = abstract.term, real.term
            if a.op in ("splat", "iota"):
                if a is not r:
                    return False
                continue
            if a.op == "broadcast" and r.op == "broadcast":
                if (a.attrs, a.shape, a.dtype) != (r.attrs, r.shape, r.dtype):
                    return False
                a, r = a.args[0], r.args[0]
            if not _is_leaf(a) or mapping.setdefault(a.serial, r) is not r:
                return False
        return _outputs_are_instances(self.abstract_outs, outs, mapping)


def _is_leaf(term: Term) -> bool:
    return term.op == "arg" and term.attrs[0] >= ABSTRACT_BASE


# ----- abstraction ----------------------------------------------------------------------------

def _rule_for(name: str):
    rule = RULES.get(name)
    return None if rule is None else with_orders(rule)


def _run_rule(info: OpInfo, ins: list[Value], mesh: Mesh | None, ctx: RuleContext,
              claimed: Sequence[Value] = ()) -> list[Value] | None:
    """The rule's outputs on `ins`; `claimed` (the outputs the walk claims, possibly at
    another shape) steer a rule that chooses between equally valid global views of a value
    (`_layout_hint`)."""
    rule = _rule_for(info.name)
    if rule is None:
        return None
    reference = _layout_hint(info, claimed, mesh, ctx) if claimed else None
    try:
        outs = list(rule(info, ins, RuleContext(mesh=mesh, manual_axes=ctx.manual_axes,
                                                reference=reference)))
    except Exception:  # noqa: BLE001 - a crashing rule just disables the abstraction
        return None
    claims = list(claimed) + [None] * (len(outs) - len(claimed))
    return [_as_padded_rel(v) if isinstance(c, Rel) else v for v, c in zip(outs, claims)]


def _as_padded_rel(value: Value) -> Value:
    """A zero-padded window as the padded relation it stands for; any other value as is."""
    if not isinstance(value, Windowed):
        return value
    return padded_rel(value) if is_padded(value) else value


def _layout_hint(info: OpInfo, claimed: Sequence[Value], mesh: Mesh | None,
                 ctx: RuleContext) -> ReferenceTerms | None:
    """The global shapes the claimed outputs' layouts give `info`'s local results, as the
    shapes of a (term-less) reference.

    A reshape of a split dim among unit dims has several valid global views (local 1x384 on
    8 devices: 8x384 or 1x3072); the walk picks one by consulting the reference's terms,
    which an instance check on fresh leaves does not have, so without a hint the rule picks
    another view and the instance cannot be abstracted or reduced. The hint only steers which
    claim the rule makes: the claim is still proved by Z3 for all leaf values, and the real
    output must still be an instance of it with the same layout, so a wrong hint can only
    make the check fail, never prove a false claim."""
    shapes = set()
    for value, result in zip(claimed, info.result_types):
        if not isinstance(value, Rel) or len(value.tiling) != len(result.shape):
            continue
        if ctx.is_global or mesh is None:
            shapes.add(tuple(result.shape))
            continue
        shapes.add(tuple(n * mesh.group_size(axes) if axes else n
                         for n, axes in zip(result.shape, value.tiling)))
    if not shapes:
        return None
    hint = ReferenceTerms()
    hint.shapes = frozenset(shapes)
    return hint


def _same_layout(a: Value, b: Value) -> bool:
    if isinstance(a, Rel) and isinstance(b, Rel):
        return (a.tiling, a.partial, a.kind, a.poly, a.scope, a.term.shape, a.term.dtype) == (
            b.tiling, b.partial, b.kind, b.poly, b.scope, b.term.shape, b.term.dtype)
    if isinstance(a, DeviceScalar) and isinstance(b, DeviceScalar):
        return a == b
    if isinstance(a, Permuted) and isinstance(b, Permuted):
        return a.sources == b.sources and _same_layout(a.rel, b.rel)
    if isinstance(a, Reordered) and isinstance(b, Reordered):
        return (a.dim, a.orders) == (b.dim, b.orders) and _same_layout(a.rel, b.rel)
    if isinstance(a, Returning) and isinstance(b, Returning):
        return (a.dim, a.blocks, a.sources) == (b.dim, b.blocks, b.sources) and (
            a.pieces is b.pieces) and _same_layout(a.rel, b.rel)
    if isinstance(a, Windowed) and isinstance(b, Windowed):
        return (a.dim, a.offset, a.length, a.summed, a.starts) == (
            b.dim, b.offset, b.length, b.summed, b.starts) and _same_layout(
            a.rel, b.rel)
    if isinstance(a, Shifted) and isinstance(b, Shifted):
        return a.offsets == b.offsets and _same_layout(a.rel, b.rel)
    if isinstance(a, InBlock) and isinstance(b, InBlock):
        return replace(a, rel=None) == replace(b, rel=None) and _same_layout(a.rel, b.rel)
    if isinstance(a, BlockIndex) and isinstance(b, BlockIndex):
        return replace(a, rel=None) == replace(b, rel=None) and _same_layout(a.rel, b.rel)
    if isinstance(a, Masked) and isinstance(b, Masked):
        return a.zero == b.zero and _same_layout(a.pred, b.pred) and _same_layout(a.rel, b.rel)
    return isinstance(a, Opaque) and isinstance(b, Opaque)


SKELETON_LIMIT = 64
"""The most structural nodes kept above the leaves by the "skeleton" abstraction."""


class _Abstractor:
    """Replaces input terms by fresh leaves, numbered in order of first appearance.

    Strategy "leaf": each input term (except splat/iota constants) becomes one leaf, a poly
    broadcast keeps its broadcast over a leaf. Strategy "skeleton": poly inputs keep the
    elementwise/linear structure above their broadcasts (what widening a poly dim needs),
    cut into leaves below it.
    """

    def __init__(self, strategy: str) -> None:
        self.strategy = strategy
        self.leaf_of: dict[int, Term] = {}
        self.original: dict[int, Term] = {}

    def leaf(self, term: Term) -> Term:
        found = self.leaf_of.get(term.serial)
        if found is None:
            found = make_arg(ABSTRACT_BASE + len(self.leaf_of), term.shape, term.dtype)
            self.leaf_of[term.serial] = found
            self.original[found.serial] = term
        return found

    def abstract(self, rel: Rel) -> Rel | None:
        term = rel.term
        if term.op in ("splat", "iota"):
            return rel
        if term.op == "broadcast" and rel.poly:
            (dims,) = term.attrs
            return replace(rel, term=make_broadcast(self.leaf(term.args[0]), dims, term.shape))
        rolled = next(((d, parts) for d in range(len(term.shape))
                       if (parts := roll_parts(term, d)) is not None), None)
        if rolled is not None and not rel.poly:
            dim, (base, shift) = rolled
            return replace(rel, term=make_roll(self.leaf(base), dim, shift))
        if self.strategy == "skeleton" and rel.poly:
            cuts: dict[int, Term] = {}
            if not self._cut(term, cuts, [0]):
                return None
            return replace(rel, term=substitute(term, cuts))
        return replace(rel, term=self.leaf(term))

    def abstract_index(self, rel: Rel) -> Rel:
        """An index or mask operand: its data movement kept over a leaf, so that the rule
        still recognises the same index in differently moved operands."""
        base = rel.term
        while base.op in ("broadcast", "reshape", "transpose"):
            base = base.args[0]
        if base.op in ("splat", "iota"):
            return rel
        return replace(rel, term=substitute(rel.term, {base.serial: self.leaf(base)}))

    def _cut(self, term: Term, cuts: dict[int, Term], count: list[int]) -> bool:
        """Choose the leaves under the structural top of a poly term (False: too big)."""
        if term.serial in cuts or term.op in ("splat", "iota"):
            return True
        count[0] += 1
        if count[0] > SKELETON_LIMIT:
            return False
        if term.op == "broadcast":
            operand = term.args[0]
            if operand.op not in ("splat", "iota"):
                cuts[operand.serial] = self.leaf(operand)
            return True
        structural = term.op in ARITHMETIC_TERM_OPS or (
            term.op in ELEMENTWISE_OPS and all(a.shape == term.shape for a in term.args))
        if not structural:
            cuts[term.serial] = self.leaf(term)
            return True
        return all(self._cut(a, cuts, count) for a in term.args)


ABSTRACTION_STRATEGIES = ("leaf", "skeleton")


def abstract_instance(info: OpInfo, ins: Sequence[Value], outs: Sequence[Value],
                      mesh: Mesh | None, ctx: RuleContext
                      ) -> tuple[list[Value], list[Value]] | None:
    """(abstract inputs, abstract outputs) when the rule's output is generic in its inputs.

    The rule is re-run on fresh leaves; the abstraction is valid when substituting the real
    input terms back into the abstract outputs gives exactly the real outputs. Proving the
    abstract instance then proves the real one (it holds for all values of the leaves).
    Strategies are tried in order (see `_Abstractor`).
    """
    return _abstract_instance(info, ins, outs, mesh, ctx)[0]


def _abstract_instance(info: OpInfo, ins: Sequence[Value], outs: Sequence[Value],
                       mesh: Mesh | None, ctx: RuleContext
                       ) -> tuple[tuple[list[Value], list[Value]] | None, str]:
    """`abstract_instance` and the name of the strategy that found it ("" if none did)."""
    for strategy in ABSTRACTION_STRATEGIES:
        if strategy == "skeleton" and not any(isinstance(v, Rel) and v.poly for v in ins):
            break
        found = _try_abstraction(info, ins, outs, mesh, ctx, _Abstractor(strategy))
        if found is not None:
            return found, strategy
    return None, ""


def _try_abstraction(info: OpInfo, ins: Sequence[Value], outs: Sequence[Value],
                     mesh: Mesh | None, ctx: RuleContext, abstractor: _Abstractor
                     ) -> tuple[list[Value], list[Value]] | None:
    if abstractor.strategy == "leaf" and any(isinstance(v, Reordered) for v in ins) and any(
            isinstance(v, Rel) and v.poly and v.term.op != "broadcast" for v in ins):
        return None  # a leaf would lose the constancy along the poly dim the order rule reads
    abstract_ins: list[Value] = []
    for v in ins:
        if isinstance(v, Masked):
            a = abstractor.abstract(v.rel)
            if a is None:
                return None
            abstract_ins.append(replace(v, rel=a, pred=replace(
                v.pred, rel=abstractor.abstract_index(v.pred.rel))))
        elif isinstance(v, InBlock | BlockIndex | Shifted):
            abstract_ins.append(replace(v, rel=abstractor.abstract_index(v.rel)))
        elif isinstance(v, Rel | Permuted | Windowed | Reordered | Returning):
            a = abstractor.abstract(v if isinstance(v, Rel) else v.rel)
            if a is None:
                return None
            abstract_ins.append(a if isinstance(v, Rel) else replace(v, rel=a))
        else:
            abstract_ins.append(v)
    abstract_outs = _run_rule(info, abstract_ins, mesh, ctx, outs)
    if abstract_outs is None or len(abstract_outs) != len(outs):
        return None
    if not _outputs_are_instances(abstract_outs, outs, dict(abstractor.original)):
        return None
    return abstract_ins, abstract_outs


def _outputs_are_instances(abstract_outs: Sequence[Value], outs: Sequence[Value],
                           mapping: dict[int, Term]) -> bool:
    """Each real output has the abstract output's layout and its term is the abstract term
    with the leaves replaced per `mapping` (leaf serial -> real input term): literally
    (`_literal_instance`) or after rebuilding with the canonicalizing constructors."""
    memo: dict[int, Term] = {}
    for a, o in zip(abstract_outs, outs):
        if not _same_layout(a, o):
            return False
        for a_rel, o_rel in zip(_rels_of(a), _rels_of(o)):
            if _literal_instance(a_rel.term, o_rel.term, mapping):
                continue
            try:
                rebuilt = substitute(a_rel.term, mapping, memo)
            except Exception:  # noqa: BLE001 - an unexpected term shape disables the abstraction
                return False
            if rebuilt is not o_rel.term and not _completed_sum(rebuilt, o_rel.term):
                return False
    return True


def _completed_sum(rebuilt: Term, real: Term) -> bool:
    """`real` is the sums in `rebuilt` in the form `rules.window.sum_out` gives them (the sum of a
    micro-batch's rows completed over the block, pushed through the movement, constant
    factors and batch dims of the tensor summed: canonical forms, tests/test_lemmas.py)."""
    forms = completed_sums(rebuilt) + completed_sums(rebuilt, frozenset(
        t.serial for t in subterms([real])))
    return any(form is real for form in forms)


def _literal_instance(abstract: Term, real: Term, mapping: dict[int, Term]) -> bool:
    """`real` is `abstract` with each leaf replaced by its `mapping` term, node for node.

    Sound without trusting any constructor: a term's value is a function of its node and its
    arguments' values, so the abstract instance's proof (for all leaf values) covers it."""
    leaf = mapping.get(abstract.serial)
    if leaf is not None:
        return leaf is real
    if abstract is real:
        return True
    if (abstract.op != real.op or abstract.attrs != real.attrs or abstract.shape != real.shape
            or abstract.dtype != real.dtype or len(abstract.args) != len(real.args)
            or not abstract.args):
        return False
    return all(_literal_instance(a, r, mapping) for a, r in zip(abstract.args, real.args))


def substitute(term: Term, mapping: dict[int, Term], memo: dict[int, Term] | None = None
               ) -> Term:
    """Rebuild `term` with the canonicalizing constructors, leaves replaced per `mapping`
    (term serial -> term)."""
    memo = {} if memo is None else memo
    if term.serial in mapping:
        return mapping[term.serial]
    if term.serial in memo:
        return memo[term.serial]
    if not term.args:
        return term
    args = tuple(substitute(a, mapping, memo) for a in term.args)
    out = rebuild(term, args)
    memo[term.serial] = out
    return out


# ----- reduced shapes -------------------------------------------------------------------------

def _cap(size: int, cap: int = REDUCED_LOCAL) -> int:
    return size if size <= 1 else min(size, cap)


_SAME_SHAPE_COLLECTIVES = ("stablehlo.all_reduce", "stablehlo.collective_permute")


def _reduced_types(info: OpInfo, cap: int) -> tuple[list[tuple[int, ...]],
                                                     list[tuple[int, ...]]] | None:
    """New local operand and result shapes for a shape-uniform op, else None."""
    ops = [tuple(t.shape) for t in info.operand_types]
    res = [tuple(t.shape) for t in info.result_types]
    name, a = info.name, info.attrs
    c = lambda s: _cap(s, cap)
    if name in ELEMENTWISE_OPS or name in _SAME_SHAPE_COLLECTIVES:
        if name in ELEMENTWISE_OPS:
            new_res = [tuple(c(s) for s in res[0])]
            rank = len(res[0])
            new_ops = [new_res[0] if len(o) == rank else o for o in ops]
            if any(len(o) == rank and o != res[0] for o in ops):
                return None
            return new_ops, new_res
        new_ops = [tuple(c(s) for s in o) for o in ops]
        return new_ops, list(new_ops)
    if name == "stablehlo.gather" and len(ops) == 2:
        return _reduced_gather(info, ops, res, c)
    if name == "stablehlo.scatter" and len(ops) == 3:
        return _reduced_scatter(info, ops, c)
    if name == "chlo.top_k" and len(ops) == 1 and ops[0]:
        lead = tuple(c(s) for s in ops[0][:-1])
        return [lead + ops[0][-1:]], [lead + r[-1:] for r in res]
    if name == "stablehlo.iota" or name == "stablehlo.constant" and a.get("splat"):
        return [], [tuple(c(size) for size in res[0])]
    if name == "stablehlo.reshape":
        pairs = _reduced_reshape(ops[0], res[0], c)
        return None if pairs is None else ([pairs[0]], [pairs[1]])
    if name == "stablehlo.slice":
        return _reduced_slice(a, ops[0], res[0], c)
    if name == "stablehlo.pad" and len(ops) == 2:
        return _reduced_pad(a, ops, res, c)
    if name == "stablehlo.concatenate":
        dim = a["dimension"]
        new_ops = [tuple(c(size) for size in o) for o in ops]
        if any(len(o) != len(res[0]) for o in ops):
            return None
        out = list(new_ops[0])
        out[dim] = sum(o[dim] for o in new_ops)
        return new_ops, [tuple(out)]
    if name == "stablehlo.transpose":
        perm = a["permutation"]
        new_op = tuple(c(s) for s in ops[0])
        return [new_op], [tuple(new_op[p] for p in perm)]
    if name == "stablehlo.broadcast_in_dim":
        dims = a["broadcast_dimensions"]
        new_res = tuple(c(s) for s in res[0])
        new_op = tuple(new_res[d] if ops[0][i] == res[0][d] else ops[0][i]
                       for i, d in enumerate(dims))
        if any(ops[0][i] not in (1, res[0][d]) for i, d in enumerate(dims)):
            return None
        return [new_op], [new_res]
    if name == "stablehlo.dot_general":
        lb, rb, lc, rc = a.get("lhs_batch", ()), a.get("rhs_batch", ()), a["lhs_contract"], \
            a["rhs_contract"]
        lhs = tuple(c(s) for s in ops[0])
        rhs = [c(s) for s in ops[1]]
        for x, y in zip(tuple(lb) + tuple(lc), tuple(rb) + tuple(rc)):
            rhs[y] = lhs[x]
        lf = [d for d in range(len(lhs)) if d not in lb and d not in lc]
        rf = [d for d in range(len(rhs)) if d not in rb and d not in rc]
        out = tuple(lhs[d] for d in lb) + tuple(lhs[d] for d in lf) + tuple(rhs[d] for d in rf)
        return [lhs, tuple(rhs)], [out]
    if name == "stablehlo.reduce":
        if len(ops) != 2:
            return None
        dims = a["dimensions"]
        x = tuple(c(s) for s in ops[0])
        return [x, ops[1]], [tuple(s for d, s in enumerate(x) if d not in dims)]
    if name == "stablehlo.all_gather":
        dim = a["all_gather_dim"]
        new_ops, new_res = [], []
        for o, r in zip(ops, res):
            x = tuple(c(s) for s in o)
            factor = r[dim] // o[dim] if o[dim] else 0
            new_ops.append(x)
            new_res.append(x[:dim] + (x[dim] * factor,) + x[dim + 1:])
        return new_ops, new_res
    if name == "stablehlo.reduce_scatter":
        dim = a["scatter_dimension"]
        r = tuple(c(s) for s in res[0])
        factor = ops[0][dim] // res[0][dim] if res[0][dim] else 0
        return [r[:dim] + (r[dim] * factor,) + r[dim + 1:]], [r]
    if name == "stablehlo.all_to_all":
        split, concat = a["split_dimension"], a["concat_dimension"]
        count = a.get("split_count")
        new_ops, new_res = [], []
        for o in ops:
            if not count or o[split] % count:
                return None
            x = [c(s) for s in o]
            x[split] = c(o[split] // count) * count
            y = list(x)
            y[split] //= count
            y[concat] *= count
            new_ops.append(tuple(x))
            new_res.append(tuple(y))
        return new_ops, new_res
    return None


def _segments(start: int, stop: int, size: int, c) -> tuple[int, int, int]:
    """A cut [start, stop) of a dim of `size` as (before, inside, after), each capped: the
    reduced dim keeps which of the three parts exist and shrinks each to at most `cap`."""
    return c(start), c(stop - start), c(size - stop)


def _reduced_slice(attrs: dict, operand: tuple[int, ...], result: tuple[int, ...], c):
    """Dims the slice takes whole shrink (their limit with them); a dim it cuts with stride 1
    keeps its three parts (before, inside, after the window), each shrunk, so the reduced
    slice still drops rows on the same sides (a layer of a stacked weight, RoPE's halves).
    Other dims keep their size and window."""
    starts, limits = tuple(attrs["start_indices"]), tuple(attrs["limit_indices"])
    strides = tuple(attrs.get("strides") or (1,) * len(starts))
    new_op, new_res, new_starts, new_limits = [], [], [], []
    for d, size in enumerate(operand):
        if (starts[d], limits[d], strides[d]) == (0, size, 1):
            new_op.append(c(size))
            new_res.append(c(size))
            new_starts.append(0)
            new_limits.append(c(size))
        elif strides[d] == 1 and 0 <= starts[d] <= limits[d] <= size:
            before, inside, after = _segments(starts[d], limits[d], size, c)
            new_op.append(before + inside + after)
            new_res.append(inside)
            new_starts.append(before)
            new_limits.append(before + inside)
        else:
            new_op.append(size)
            new_res.append(result[d])
            new_starts.append(starts[d])
            new_limits.append(limits[d])
    return [tuple(new_op)], [tuple(new_res)], {"start_indices": tuple(new_starts),
                                               "limit_indices": tuple(new_limits)}


def _reduced_pad(attrs: dict, ops, res, c):
    """Dims padded without interior padding keep their three parts (low padding, data, high
    padding), each shrunk; other dims keep their size and padding."""
    low, high = list(attrs["edge_padding_low"]), list(attrs["edge_padding_high"])
    interior = tuple(attrs["interior_padding"])
    new_op, new_res = [], []
    for d, size in enumerate(ops[0]):
        if interior[d] == 0 and low[d] >= 0 and high[d] >= 0:
            low[d], high[d] = c(low[d]), c(high[d])
            new_op.append(c(size))
            new_res.append(low[d] + c(size) + high[d])
        else:
            new_op.append(size)
            new_res.append(res[0][d])
    return ([tuple(new_op), ops[1]], [tuple(new_res)],
            {"edge_padding_low": tuple(low), "edge_padding_high": tuple(high)})


def _reduced_gather(info: OpInfo, ops, res, c):
    """Indexed operand dims and full windows shrink; partial windows keep their size."""
    dims = dimension_numbers(info.attrs, "dimension_numbers")
    sizes = tuple(info.attrs["slice_sizes"])
    operand, indices = ops
    ivd = dims.get("index_vector_dim", len(indices))
    if len(res[0]) != len(dims.get("offset_dims", ())) + (
            len(indices) - (1 if ivd < len(indices) else 0)):
        return None
    new_operand, new_sizes = list(operand), list(sizes)
    batching = dims.get("operand_batching_dims", ())
    for d, (size, window) in enumerate(zip(operand, sizes)):
        if d in batching:
            new_operand[d] = c(size)
        elif window == size:
            new_operand[d] = new_sizes[d] = c(size)
        elif d in dims.get("start_index_map", ()) and window <= c(size):
            new_operand[d] = c(size)
    new_indices = tuple(size if d == ivd else c(size) for d, size in enumerate(indices))
    batch = [size for d, size in enumerate(new_indices) if d != ivd]
    windows = [new_sizes[d] for d in range(len(operand))
               if d not in dims.get("collapsed_slice_dims", ())]
    out, batch_iter, window_iter = [], iter(batch), iter(windows)
    for d in range(len(res[0])):
        out.append(next(window_iter) if d in dims.get("offset_dims", ()) else next(batch_iter))
    return [tuple(new_operand), new_indices], [tuple(out)], {"slice_sizes": tuple(new_sizes)}


def _reduced_scatter(info: OpInfo, ops, c):
    """Scattered operand dims, the updates' scatter dims and full windows shrink."""
    dims = dimension_numbers(info.attrs, "scatter_dimension_numbers")
    operand, indices, updates = ops
    ivd = dims.get("index_vector_dim", len(indices))
    window_dims = dims.get("update_window_dims", ())
    batching = dims.get("input_batching_dims", ())
    operand_window = [d for d in range(len(operand))
                      if d not in dims.get("inserted_window_dims", ()) and d not in batching]
    new_operand, new_updates = list(operand), list(updates)
    for k, d in enumerate(operand_window):
        u = window_dims[k]
        if updates[u] == operand[d]:
            new_operand[d] = new_updates[u] = c(operand[d])
    for d in tuple(dims.get("inserted_window_dims", ())) + tuple(batching):
        new_operand[d] = c(operand[d])
    scatter_dims = [d for d in range(len(updates)) if d not in window_dims]
    batch = [d for d in range(len(indices)) if d != ivd]
    if len(scatter_dims) != len(batch):
        return None
    new_indices = list(indices)
    for u, i in zip(scatter_dims, batch):
        new_updates[u] = new_indices[i] = c(updates[u])
    return ([tuple(new_operand), tuple(new_indices), tuple(new_updates)],
            [tuple(new_operand)])


def _reduced_reshape(src: tuple[int, ...], dst: tuple[int, ...], c
                     ) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    """A reshape at a reduced shape when every dim group is a pure merge or a pure split
    (row-major structure kept: merged dims shrink, the merged dim is their product)."""
    groups = reshape_groups(src, dst)
    if groups is None:
        return None
    new_src, new_dst = list(src), list(dst)
    for src_dims, dst_dims in groups:
        big_src = [d for d in src_dims if src[d] != 1]
        big_dst = [d for d in dst_dims if dst[d] != 1]
        if len(big_src) > 1 and len(big_dst) > 1:
            return None
        if len(big_src) <= 1 and len(big_dst) <= 1:
            for d in big_src:
                new_src[d] = c(src[d])
            for d in big_dst:
                new_dst[d] = c(dst[d])
        elif len(big_src) > 1:
            for d in big_src:
                new_src[d] = c(src[d])
            new_dst[big_dst[0]] = math.prod(new_src[d] for d in big_src)
        else:
            for d in big_dst:
                new_dst[d] = c(dst[d])
            new_src[big_src[0]] = math.prod(new_dst[d] for d in big_dst)
    return tuple(new_src), tuple(new_dst)


def _resize_term(term: Term, shape: tuple[int, ...], leaves: dict[int, Term]) -> Term | None:
    """An abstract input term at a new global shape (leaves resized consistently)."""
    if term.op == "splat":
        return make_splat(term.attrs[0], shape, term.dtype)
    if term.op == "iota":
        return make_iota(shape, term.attrs[0], term.dtype)
    if term.op == "arg" and term.attrs[0] >= ABSTRACT_BASE:
        leaf = make_arg(term.attrs[0], shape, term.dtype)
        previous = leaves.setdefault(term.attrs[0], leaf)
        return leaf if previous is leaf else None
    if term.op == "reshape" and _unit_reshape(term.args[0].shape, term.shape):
        kept = iter(s for s in shape if s != 1) if shape else iter(())
        big = [s for s in term.shape if s != 1]
        if len(big) != len([s for s in shape if s != 1]):
            return None
        inner_shape = tuple(next(kept) if s != 1 else 1 for s in term.args[0].shape)
        inner = _resize_term(term.args[0], inner_shape, leaves)
        return None if inner is None else make_reshape(inner, shape)
    if term.op == "transpose":
        (perm,) = term.attrs
        inner_shape = [0] * len(perm)
        for i, p in enumerate(perm):
            inner_shape[p] = shape[i]
        inner = _resize_term(term.args[0], tuple(inner_shape), leaves)
        return None if inner is None else make_transpose(inner, perm)
    if term.op == "broadcast" and term.args[0].op in ("arg", "reshape"):
        (dims,) = term.attrs
        operand = term.args[0]
        op_shape = tuple(shape[d] if operand.shape[i] == term.shape[d] else operand.shape[i]
                         for i, d in enumerate(dims))
        inner = _resize_term(operand, op_shape, leaves)
        return None if inner is None else make_broadcast(inner, dims, shape)
    same_shape = all(a.shape == term.shape for a in term.args)
    if term.args and same_shape and (term.op in ARITHMETIC_TERM_OPS
                                     or term.op in ELEMENTWISE_OPS):
        args = [_resize_term(a, shape, leaves) for a in term.args]
        if any(a is None for a in args):
            return None
        if term.op == "lin":
            constant, coefs = term.attrs
            return make_lin(list(zip(coefs, args)), constant, shape, term.dtype)
        if term.op == "mul":
            return _fold(make_mul, args)
        if term.op == "div":
            return make_div(*args)
        return make_elementwise(term.op, tuple(args), term.attrs, term.dtype)
    return None


def _resized_rel(rel: Rel, local_shape, mesh: Mesh | None, leaves: dict[int, Term]
                 ) -> Rel | None:
    if len(rel.tiling) != len(local_shape):
        return None
    shape = tuple(local * (1 if d in rel.poly or rel.scope == GLOBAL or not axes else
                           mesh.group_size(axes) if mesh else 1)
                  for d, (local, axes) in enumerate(zip(local_shape, rel.tiling)))
    term = _resize_term(rel.term, shape, leaves)
    return None if term is None else replace(rel, term=term)


def _with_length(value: Value, length: int) -> Value | None:
    """A device mask over blocks of `length` rows instead (a gather's or scatter's indexed
    dim at a reduced shape); None when it does not fit."""
    if isinstance(value, BlockIndex):
        return replace(value, length=length) if value.fill < length and not value.add else None
    if isinstance(value, InBlock):
        if (value.lo, value.hi) != (0, value.length):
            return None
        return replace(value, length=length, hi=length)
    if isinstance(value, Masked):
        pred = _with_length(value.pred, length)
        return None if pred is None else replace(value, pred=pred)
    return value


def _indexed_dim(info: OpInfo) -> int | None:
    """The operand dim a single-component gather or scatter index addresses."""
    key = "dimension_numbers" if info.name == "stablehlo.gather" else \
        "scatter_dimension_numbers"
    try:
        dims = dimension_numbers(info.attrs, key)
    except Exception:  # noqa: BLE001 - unreadable attributes: no reduction
        return None
    index_map = dims.get("start_index_map", dims.get("scatter_dims_to_operand_dims"))
    return index_map[0] if index_map and len(index_map) == 1 else None


def _unit_reshape(src: tuple[int, ...], dst: tuple[int, ...]) -> bool:
    """A reshape that only adds or drops dims of size 1."""
    return [s for s in src if s != 1] == [s for s in dst if s != 1]


def reduced_info(info: OpInfo, in_values: Sequence[Value], mesh: Mesh | None,
                 cap: int = REDUCED_LOCAL) -> tuple[OpInfo, list[Value]] | None:
    """The op and its (abstract) input relations at a reduced shape, or None.

    Every local dim of size > 1 becomes min(size, cap) (dims tied by the op's attributes stay
    tied; gathers/scatters keep their factor), and each relation's global dim is the new local
    size times its number of blocks. Only shape-uniform ops are reduced, and only abstract
    inputs (fresh leaves, splats, iotas, broadcasts of leaves) can be resized.
    """
    types = _reduced_types(info, cap)
    if types is None:
        return None
    new_ops, new_res = types[0], types[1]
    overrides = types[2] if len(types) > 2 else {}
    leaves: dict[int, Term] = {}
    new_ins: list[Value] = []
    for value, old, new in zip(in_values, info.operand_types, new_ops):
        if isinstance(value, Rel):
            if len(value.tiling) != len(new):
                return None
            shape = []
            for d, (local, axes) in enumerate(zip(new, value.tiling)):
                blocks = 1 if d in value.poly or value.scope == GLOBAL or not axes else (
                    mesh.group_size(axes) if mesh else 1)
                shape.append(local * blocks)
            term = _resize_term(value.term, tuple(shape), leaves)
            if term is None:
                return None
            new_ins.append(replace(value, term=term))
        elif isinstance(value, DeviceScalar):
            if tuple(old.shape) != tuple(new):
                return None
            new_ins.append(value)
        elif isinstance(value, Windowed):
            window = _reduced_window(value, tuple(new), mesh, leaves, cap)
            if window is None:
                return None
            new_ins.append(window)
        elif isinstance(value, Reordered):
            rel = _resized_rel(value.rel, new, mesh, leaves)
            if rel is None or new[value.dim] % len(value.orders[0]):
                return None
            new_ins.append(replace(value, rel=rel))
        elif isinstance(value, Permuted | Returning):
            return None
        elif isinstance(value, Shifted):
            rel = _resized_rel(value.rel, new, mesh, leaves)
            if rel is None:
                return None
            new_ins.append(replace(value, rel=rel))
        elif isinstance(value, DEVICE_BLOCK_VALUES):
            resized = [_resized_rel(rel, new, mesh, leaves) for rel in _rels_of(value)]
            if any(r is None for r in resized):
                return None
            if info.name in ("stablehlo.gather", "stablehlo.scatter"):
                indexed = _indexed_dim(info)
                if indexed is None:
                    return None
                value = _with_length(value, new_ops[0][indexed])
                if value is None:
                    return None
            if isinstance(value, Masked):
                new_ins.append(replace(value, rel=resized[0],
                                       pred=replace(value.pred, rel=resized[1])))
            else:
                new_ins.append(replace(value, rel=resized[0]))
        else:
            new_ins.append(value)
    attrs = {**info.attrs, **overrides}
    if info.name == "stablehlo.scatter" and not (attrs.get("reducer") or attrs.get("update")):
        # the reduced OpInfo has no MLIR op to read the update region from
        attrs["reducer"] = scatter_kind(info)
    if info.name == "stablehlo.constant":
        value = np.asarray(attrs["value"])
        attrs["value"] = np.full(new_res[0], value.reshape(-1)[0] if value.size else 0,
                                 dtype=value.dtype)
    new_info = replace(info, attrs=attrs,
                       operand_types=[TensorType(tuple(s), t.dtype)
                                      for s, t in zip(new_ops, info.operand_types)],
                       result_types=[TensorType(tuple(s), t.dtype)
                                     for s, t in zip(new_res, info.result_types)],
                       op=None)
    return new_info, new_ins


def _reduced_window(window: Windowed, local: tuple[int, ...], mesh: Mesh | None,
                    leaves: dict[int, Term], cap: int) -> Windowed | None:
    """A micro-batch window at a reduced shape: rows [j*L, (j+1)*L) of blocks of m*L rows
    become rows [j*L', (j+1)*L') of blocks of m*L' rows (L' = L capped), every other dim as for
    a relation (summed dims other than the window's capped). Only windows aligned that way,
    without zero rows or per-device starts; None otherwise."""
    rel, dim, length = window.rel, window.dim, window.length
    if mesh is None or window.holes or window.starts or not rel.tiling[dim]:
        return None
    count = mesh.group_size(rel.tiling[dim])
    block = rel.term.shape[dim] // count
    if block % length or window.offset % length or window.offset + length > block:
        return None
    new_length = _cap(length, cap)
    kept = [d for d in range(len(rel.term.shape)) if d not in window.summed]
    if len(kept) != len(local) or (not window.summed and local[dim] != new_length):
        return None
    local_of = dict(zip(kept, local))
    shape = []
    for d, axes in enumerate(rel.tiling):
        if d == dim:
            shape.append(block // length * new_length * count)
            continue
        blocks = 1 if d in rel.poly or rel.scope == GLOBAL or not axes else mesh.group_size(axes)
        shape.append(local_of.get(d, _cap(rel.term.shape[d] // blocks, cap)) * blocks)
    term = _resize_term(rel.term, tuple(shape), leaves)
    if term is None:
        return None
    return replace(window, rel=replace(rel, term=term), length=new_length,
                   offset=window.offset // length * new_length)


def _skeleton(term: Term, memo: dict[int, tuple]) -> tuple:
    """The term without its shapes (ranks kept): equal skeletons = same computation.

    Operands of commutative terms are ordered by serial number, which depends on creation
    order; the skeleton sorts them instead (with their coefficients for `lin`).
    """
    found = memo.get(term.serial)
    if found is None:
        children = [_skeleton(a, memo) for a in term.args]
        if term.op == "arg":
            found = ("arg", term.attrs[0], len(term.shape))
        elif term.op == "lin":
            constant, coefs = term.attrs
            pairs = tuple(sorted(zip(coefs, children), key=repr))
            found = ("lin", constant, len(term.shape), term.dtype, pairs)
        elif term.op == "stablehlo.gather":
            operand = term.args[0].shape
            attrs = tuple((k, tuple("full" if w == n else w for w, n in zip(v, operand)))
                          if k == "slice_sizes" else (k, v) for k, v in term.attrs)
            found = (term.op, attrs, len(term.shape), term.dtype, tuple(children))
        elif term.op in ("slice", "pad"):
            found = (term.op, _window_skeleton(term), len(term.shape), term.dtype,
                     tuple(children))
        elif term.op == "mul" or term.op in COMMUTATIVE:
            found = (term.op, term.attrs, len(term.shape), term.dtype,
                     tuple(sorted(children, key=repr)))
        else:
            found = (term.op, term.attrs, len(term.shape), term.dtype, tuple(children))
        memo[term.serial] = found
    return found


def _window_skeleton(term: Term) -> tuple:
    """A slice's or pad's attributes as the reduced shapes keep them (`_reduced_slice`,
    `_reduced_pad`): per dim, which parts exist, capped, where the reduction shrinks it."""
    c = _cap
    size = term.args[0].shape
    if term.op == "slice":
        out = []
        for start, stop, stride, n in zip(*term.attrs, size):
            if (start, stop, stride) == (0, n, 1):
                out.append("whole")
            elif stride == 1 and 0 <= start <= stop <= n:
                out.append(("cut", *_segments(start, stop, n, c)))
            else:
                out.append((start, stop, stride))
        return tuple(out)
    return tuple(("pad", c(lo), c(hi)) if inner == 0 and lo >= 0 and hi >= 0 else (lo, hi, inner)
                 for lo, hi, inner in zip(*term.attrs))


def _reduced_instance(info: OpInfo, ins: list[Value], outs: list[Value], mesh: Mesh | None,
                      ctx: RuleContext) -> tuple[OpInfo, list[Value], list[Value]] | str:
    """The instance at a reduced shape, or why it cannot be reduced."""
    blocks = [len(v.orders[0]) for v in list(ins) + list(outs) if isinstance(v, Reordered)]
    reduced = reduced_info(info, ins, mesh, max([REDUCED_LOCAL, *blocks]))
    if reduced is None:
        return f"{info.name} or its input terms cannot be shape-reduced"
    r_info, r_ins = reduced
    r_outs = _run_rule(r_info, r_ins, mesh, ctx, outs)
    if r_outs is None or len(r_outs) != len(outs):
        return "the rule fails at the reduced shape"
    memo_a: dict[int, tuple] = {}
    memo_r: dict[int, tuple] = {}
    for a, r in zip(outs, r_outs):
        if isinstance(a, Rel) and isinstance(r, Rel):
            pairs, same_extra = [(a, r)], True
        elif isinstance(a, DEVICE_BLOCK_VALUES) and type(a) is type(r):
            if _blank(a) != _blank(r):
                return "the rule gives another device mask at the reduced shape"
            pairs, same_extra = list(zip(_rels_of(a), _rels_of(r))), True
        elif isinstance(a, Windowed) and isinstance(r, Windowed):
            pairs = [(a.rel, r.rel)]
            same_extra = (a.dim, a.summed, a.holes, a.starts) == (
                r.dim, r.summed, r.holes, r.starts) and a.offset * r.length == r.offset * a.length
        elif isinstance(a, Reordered) and isinstance(r, Reordered):
            pairs, same_extra = [(a.rel, r.rel)], (a.dim, a.orders) == (r.dim, r.orders)
        elif isinstance(a, Shifted) and isinstance(r, Shifted):
            pairs, same_extra = [(a.rel, r.rel)], a.offsets == r.offsets
        else:
            pairs, same_extra = None, True
        if pairs is not None:
            if not same_extra:
                return "the rule gives another layout at the reduced shape"
            for x, y in pairs:
                if (x.tiling, x.partial, x.kind, x.poly, x.scope) != (
                        y.tiling, y.partial, y.kind, y.poly, y.scope):
                    return "the rule gives another layout at the reduced shape"
                if _skeleton(x.term, memo_a) != _skeleton(y.term, memo_r):
                    return "the rule builds another term at the reduced shape"
        elif not _same_layout(a, r):
            return "the rule gives another layout at the reduced shape"
    return r_info, r_ins, r_outs


def _blank(value: Value) -> Value:
    """A device mask without its relations, and its block length blanked (reducing a
    gather's indexed dim shortens the blocks)."""
    if isinstance(value, BlockIndex):
        return replace(value, rel=None, length=0)
    if isinstance(value, InBlock):
        ends = ["L" if end == value.length else end for end in (value.lo, value.hi)]
        return replace(value, rel=None, length=0, lo=ends[0], hi=ends[1])
    if isinstance(value, Masked):
        return replace(value, rel=None, pred=_blank(value.pred))
    return value


def _reduced_shifted_scatter(info: OpInfo, ins: list[Value], outs: list[Value],
                             mesh: Mesh | None, ctx: RuleContext):
    """A scatter whose indices are shifted per device (rules/gather_scatter
    ._scatter_into_blocks) at a smaller shape: the scattered operand dim keeps its size (the
    device offsets are multiples of its block), every other dim and the number of updates
    shrink to REDUCED_LOCAL, and operand, ids and updates become fresh leaves. Only when the
    claimed output is exactly the rule's output on the real inputs (so proving the rule,
    which is generic in those terms, at the smaller shape proves the claim), and the rule
    gives the same layout there."""
    operand, indices, updates = ins
    if not (isinstance(operand, Rel) and isinstance(indices, Shifted)
            and isinstance(updates, Rel)) or len(outs) != 1 or not isinstance(outs[0], Rel):
        return None
    claimed = _run_rule(info, list(ins), mesh, ctx)
    if (not claimed or len(claimed) != 1 or not isinstance(claimed[0], Rel)
            or claimed[0].term is not outs[0].term or not _same_layout(claimed[0], outs[0])):
        return None   # the claim is not the rule's output: check it as it is
    dims = dimension_numbers(info.attrs, "scatter_dimension_numbers")
    to_operand = tuple(dims.get("scatter_dims_to_operand_dims", ()))
    window_dims = dims.get("update_window_dims", ())
    ivd = dims.get("index_vector_dim", len(info.operand_types[1].shape))
    o_shape, i_shape, u_shape = (tuple(t.shape) for t in info.operand_types)
    operand_window = [d for d in range(len(o_shape)) if d not in dims.get(
        "inserted_window_dims", ())]
    new_o = [n if d in to_operand else _cap(n) for d, n in enumerate(o_shape)]
    new_u = list(u_shape)
    for k, d in enumerate(operand_window):
        if k >= len(window_dims) or u_shape[window_dims[k]] != o_shape[d]:
            return None
        new_u[window_dims[k]] = new_o[d]
    scatter_dims = [d for d in range(len(u_shape)) if d not in window_dims]
    batch = [d for d in range(len(i_shape)) if d != ivd]
    if len(scatter_dims) != len(batch):
        return None
    new_i = list(i_shape)
    for u, i in zip(scatter_dims, batch):
        new_u[u] = new_i[i] = _cap(u_shape[u])

    def leaf(rel: Rel, local: list[int], k: int) -> Rel:
        shape = tuple(n * (mesh.group_size(axes) if mesh and axes else 1)
                      for n, axes in zip(local, rel.tiling))
        return replace(rel, term=make_arg(ABSTRACT_BASE + k, shape, rel.term.dtype),
                       poly=frozenset())

    r_ins = [leaf(operand, new_o, 0), Shifted(leaf(indices.rel, new_i, 1), indices.offsets),
             leaf(updates, new_u, 2)]
    r_info = replace(info, operand_types=[TensorType(tuple(s), t.dtype) for s, t in zip(
        (new_o, new_i, new_u), info.operand_types)], result_types=[
        TensorType(tuple(new_o), info.result_types[0].dtype)], op=None,
        attrs={**info.attrs, "reducer": scatter_kind(info)})
    r_outs = _run_rule(r_info, r_ins, mesh, ctx)
    if not r_outs or len(r_outs) != 1 or not isinstance(r_outs[0], Rel):
        return None
    a, r = outs[0], r_outs[0]
    if (a.tiling, a.partial, a.kind, a.scope) != (r.tiling, r.partial, r.kind, r.scope):
        return None
    return r_info, r_ins, r_outs


# ----- building and running the query ---------------------------------------------------------

_SORTS: dict = {}
"""(kind, z3 context pointer) -> (sort, its ast), kept alive with the sort."""


class _Symbolic:
    """Fresh z3 variables; partial max/min constraints as hypotheses."""

    concrete = False

    def __init__(self) -> None:
        self.hypotheses: list[z3.BoolRef] = []

    def scalar(self, name: str, dtype: str):
        """`z3.Bool/Int/Real(name)`, built directly on a cached sort (twice as fast: a
        512-device check creates about 13000 of them)."""
        kind = "bool" if is_bool_dtype(dtype) else "int" if is_int_dtype(dtype) else "real"
        ctx = z3.main_ctx()
        cached = _SORTS.get((kind, ctx.ref().value))
        if cached is None:
            sort = {"bool": z3.BoolSort, "int": z3.IntSort, "real": z3.RealSort}[kind](ctx)
            cached = _SORTS[(kind, ctx.ref().value)] = (sort, sort.ast)
        made = z3.Z3_mk_const(ctx.ref(), z3.to_symbol(name, ctx), cached[1])
        if kind == "bool":
            return z3.BoolRef(made, ctx)
        var = z3.ArithRef(made, ctx)
        limits = int_limits(dtype) if kind == "int" else None
        if limits is not None:  # a value of its dtype (integer ops wrap into this range)
            self.hypotheses.append(var >= limits[0])
            self.hypotheses.append(var <= limits[1])
        return var

    def tensor(self, name: str, shape: tuple[int, ...], dtype: str) -> np.ndarray:
        out = np.empty(shape, dtype=object)
        for idx in np.ndindex(shape):
            out[idx] = self.scalar(f"{name}[{','.join(map(str, idx))}]", dtype)
        return out

    def split(self, kind: str, block: np.ndarray, count: int, name: str, dtype: str
              ) -> list[np.ndarray]:
        """`count` local values whose `kind`-reduction is `block` (every such split)."""
        if kind == "sum":
            locals_ = [self.tensor(f"{name}.{j}", block.shape, dtype) for j in range(count - 1)]
            # integers: the last piece is the one value of the dtype congruent mod 2^N
            rest = apply(lambda b, *xs: wrap_int(sub(b, sum_list(list(xs))), dtype),
                         block, *locals_)
            return locals_ + [rest]
        if kind in ("max", "min"):
            locals_ = [self.tensor(f"{name}.{j}", block.shape, dtype) for j in range(count)]
            for idx in np.ndindex(block.shape):
                b = to_z3(block[idx])
                xs = [to_z3(x[idx]) for x in locals_]
                bound = [(x <= b) if kind == "max" else (x >= b) for x in xs]
                self.hypotheses.extend(bound)
                self.hypotheses.append(z3.Or([x == b for x in xs]))
            return locals_
        raise SemanticsError(f"unknown partial kind {kind!r}")


class _Concrete:
    """Random exact rationals; partial splits built to satisfy their constraints."""

    concrete = True

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.hypotheses: list = []

    def scalar(self, name: str, dtype: str):
        if is_bool_dtype(dtype):
            return self.rng.random() < 0.5
        if is_int_dtype(dtype):
            return self.rng.randint(-5, 5)
        return Fraction(self.rng.randint(-40, 40), self.rng.choice((1, 2, 3, 7)))

    def tensor(self, name: str, shape: tuple[int, ...], dtype: str) -> np.ndarray:
        out = np.empty(shape, dtype=object)
        for idx in np.ndindex(shape):
            out[idx] = self.scalar(name, dtype)
        return out

    def split(self, kind: str, block: np.ndarray, count: int, name: str, dtype: str
              ) -> list[np.ndarray]:
        """Local values whose sum (max, min) is `block`. Only exact values split exactly: a
        float (an infinity, or a random function's value at one) would make the pieces' sum
        differ from `block` by rounding, a false counterexample, so the trial is dropped."""
        if any(isinstance(v, float) for v in np.ravel(block)):
            raise _Failure("unknown", "a partial split of a value that is not exact")
        if kind == "sum":
            locals_ = [self.tensor(name, block.shape, dtype) for _ in range(count - 1)]
            # integers: the last piece is the one value of the dtype congruent mod 2^N
            rest = apply(lambda b, *xs: wrap_int(sub(b, sum_list(list(xs))), dtype),
                         block, *locals_)
            return locals_ + [rest]
        locals_ = [np.empty(block.shape, dtype=object) for _ in range(count)]
        for idx in np.ndindex(block.shape):
            owner = self.rng.randrange(count)
            for j in range(count):
                gap = 0 if j == owner else self.rng.randint(0, 5)
                b = block[idx]
                locals_[j][idx] = b - gap if kind == "max" else b + gap
        return locals_


@dataclass
class _Failure(Exception):
    status: str
    reason: str


def _leaf_args(terms: Sequence[Term]) -> dict[int, Term]:
    found: dict[int, Term] = {}
    for term in subterms(terms):
        if term.op == "arg":
            found.setdefault(term.attrs[0], term)
    return found


def _opaque_resolver(source):
    """Loop variables and loop results as unconstrained tensors (one per term): a proof then
    holds for every value they may take."""
    values: dict[int, np.ndarray] = {}

    def resolve(term: Term) -> np.ndarray:
        if term.serial not in values:
            label = "_".join(str(a) for a in term.attrs[:2])
            values[term.serial] = source.tensor(f"{term.op}{label}.{term.serial}", term.shape,
                                                term.dtype)
        return values[term.serial]

    return resolve


def _leaf_name(index: int) -> str:
    return f"A{index - ABSTRACT_BASE}" if index >= ABSTRACT_BASE else f"arg{index}"


def _derived_local(global_value: np.ndarray, value: Permuted | Windowed | Shifted | Reordered,
                   mesh: Mesh, device: int) -> np.ndarray:
    """Device `device`'s local value of a value derived from a Rel whose global value is
    `global_value`: another device's block, a halo window, the block plus a device constant, or the
    blocks of a dim in the device's order."""
    if isinstance(value, Permuted):
        return _block(global_value, value.rel, mesh, value.sources[device], False)
    if isinstance(value, Reordered):
        whole = _block(global_value, value.rel, mesh, device, False)
        order = value.orders[device]
        size = whole.shape[value.dim] // len(order)
        return np.concatenate([np.take(whole, range(b * size, (b + 1) * size), axis=value.dim)
                               for b in order], axis=value.dim)
    if isinstance(value, Windowed):
        return _window_rows(global_value, value, mesh, device)
    block = _block(global_value, value.rel, mesh, device, False)
    dtype = value.rel.term.dtype  # the device adds in its dtype: integers wrap around
    return apply(lambda x, o=value.offsets[device]: wrap_shift(x, o, dtype), block)


def _block_local(value: Value, env: dict, memo: dict, mesh: Mesh, device: int,
                 junk: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """(local value, where it is defined) on `device` of an `InBlock`, `BlockIndex` or
    `Masked` value (layout.py gives their exact meaning). A masked value that is unspecified
    outside its predicate takes `junk` there (an input), or is left open (a result: only the
    defined positions are claimed)."""
    def test(pred: InBlock) -> np.ndarray:
        x = _block(evaluate_term(pred.rel.term, env, memo), pred.rel, mesh, device, False)
        start = mesh.block_index(pred.axes, device) * pred.length

        def holds(v):
            y = sub(v, start)
            conds = ([compare(y, pred.lo, "GE")] if pred.lo is not None else []) + (
                [compare(y, pred.hi, "LT")] if pred.hi is not None else [])
            if any(is_z3(c) for c in conds):
                both = z3.And(*[to_z3(c) for c in conds])
                return z3.Not(both) if pred.negated else both
            return all(conds) != pred.negated
        return apply(holds, x)

    if isinstance(value, InBlock):
        out = test(value)
        return out, full(out.shape, True)
    if isinstance(value, BlockIndex):
        x = _block(evaluate_term(value.rel.term, env, memo), value.rel, mesh, device, False)
        start = mesh.block_index(value.axes, device) * value.length
        inside = test(InBlock(value.rel, value.axes, value.length, 0, value.length))
        dtype = value.rel.term.dtype  # inside the block x - start does not wrap: the same
        out = apply(lambda v, p: add(select(  # value, spelled as the device computes it
            p, wrap_shift(v, -start, dtype), value.fill), value.add), x, inside)
        return out, full(out.shape, True)
    assert isinstance(value, Masked)
    block = _block(evaluate_term(value.rel.term, env, memo), value.rel, mesh, device, False)
    pred = test(value.pred)
    if value.zero:
        out = apply(lambda p, v: select(p, v, 0), pred, block)
        return out, full(out.shape, True)
    if junk is not None:
        return apply(select, pred, block, junk), full(block.shape, True)
    return block, pred


def _window_rows(value: np.ndarray, window: Windowed, mesh: Mesh, device: int) -> np.ndarray:
    """Device `device`'s rows of a halo window (the other dims blocked as in its relation),
    starting at its own start when the window has one per device, zeros in its holes, summed
    over the window's `summed` dims."""
    dim, axes = window.dim, window.rel.tiling[window.dim]
    others = list(window.rel.tiling)
    others[dim] = ()
    block = _block(value, replace(window.rel, tiling=tuple(others)), mesh, device, False)
    size = value.shape[dim]
    start = (window.starts[device] if window.starts else
             mesh.block_index(axes, device) * (size // mesh.group_size(axes)) + window.offset)
    rows = [(start + i) % size for i in range(window.length)]
    out = np.take(block, rows, axis=dim)
    for hole_device, a, b in window.holes:
        if hole_device == device:
            index = [slice(None)] * out.ndim
            index[dim] = slice(a, b)
            out[tuple(index)] = full(out[tuple(index)].shape, 0)
    if window.summed:
        return reduce_dims(out, window.summed, "sum")
    return out


def _block(value: np.ndarray, rel: Rel, mesh: Mesh | None, device: int, single: bool
           ) -> np.ndarray:
    """Device `device`'s block of a global value under `rel`'s tiling (poly dims whole)."""
    if single:
        return value
    index = []
    for dim, axes in enumerate(rel.tiling):
        if not axes or dim in rel.poly:
            index.append(slice(None))
            continue
        count = mesh.group_size(axes)
        if value.shape[dim] % count:
            raise _Failure("unknown", f"dim {dim} of size {value.shape[dim]} is not split "
                           f"evenly into {count} blocks")
        size = value.shape[dim] // count
        b = mesh.block_index(axes, device)
        index.append(slice(b * size, (b + 1) * size))
    return take(value, tuple(index))


class _LazyLeaves(dict):
    """The leaves' global tensors for `evaluate_term`, their variables created element by
    element on demand (named by global position, as `source.tensor` names them): a claim about
    a few devices' blocks of a value on 512 devices needs only those blocks' variables."""

    def __init__(self, source, leaves: dict[int, Term]) -> None:
        super().__init__()
        self.source = source
        self.leaves = leaves
        self.values: dict[int, np.ndarray] = {}

    def __contains__(self, key) -> bool:
        return key in self.leaves or super().__contains__(key)

    def __getitem__(self, key):
        if key in self.leaves:
            leaf = self.leaves[key]
            return self.region(key, tuple((0, n) for n in leaf.shape))
        return super().__getitem__(key)

    def region(self, index: int, region: tuple[tuple[int, int], ...]) -> np.ndarray:
        leaf = self.leaves[index]
        values = self.values.get(index)
        if values is None:
            values = self.values[index] = np.empty(leaf.shape, dtype=object)
        window = tuple(slice(lo, hi) for lo, hi in region)
        part = values[window] if values.ndim else values
        name = _leaf_name(index)
        for idx in np.ndindex(part.shape):
            if part[idx] is None:
                position = ",".join(str(lo + i) for (lo, _), i in zip(region, idx))
                part[idx] = self.source.scalar(f"{name}[{position}]", leaf.dtype)
        return part.copy()


def _block_region(rel: Rel, mesh: Mesh, device: int) -> tuple[tuple[int, int], ...]:
    """The [start, stop) ranges of `device`'s block of `rel`'s global value (`_block`)."""
    region = []
    for dim, (n, axes) in enumerate(zip(rel.term.shape, rel.tiling)):
        if not axes or dim in rel.poly:
            region.append((0, n))
            continue
        count = mesh.group_size(axes)
        if n % count:
            raise _Failure("unknown", f"dim {dim} of size {n} is not split evenly into "
                           f"{count} blocks")
        size = n // count
        b = mesh.block_index(axes, device)
        region.append((b * size, (b + 1) * size))
    return tuple(region)


_REGION_REDUCTIONS = {"reduce_sum": "sum", "reduce_max": "max", "reduce_min": "min",
                      "reduce_and": "and", "reduce_or": "or"}


def _region_value(term: Term, region: tuple[tuple[int, int], ...], env: dict, memo: dict,
                  regions: dict) -> np.ndarray:
    """`evaluate_term(term)[region]`, computed from the regions of the operands it reads:
    a leaf's variables in the region; an elementwise op on its operands' same region; a
    broadcast, transpose, dot_general or reduction on the operand positions those output
    positions read (whole contracted and reduced dims); a reshape on the smallest box of
    operand positions holding the window's elements (row-major). Anything else, and a whole
    region, is evaluated in full and sliced. Each rule restates the op's definition on a
    window."""
    shape = term.shape
    if all(r == (0, n) for r, n in zip(region, shape)):
        return evaluate_term(term, env, memo)
    key = (term.serial, region)
    found = regions.get(key)
    if found is not None:
        return found
    op, args = term.op, term.args
    sub = [hi - lo for lo, hi in region]
    if op == "arg" and isinstance(env, _LazyLeaves) and term.attrs[0] in env.leaves:
        value = env.region(term.attrs[0], region)
    elif op in ARITHMETIC_TERM_OPS or (op in ELEMENTWISE_STABLEHLO and all(
            a.shape == shape for a in args)):
        values = [_region_value(a, region, env, memo, regions) for a in args]
        window = Term()
        window.op, window.args, window.attrs = op, args, term.attrs
        window.shape, window.dtype, window.serial = tuple(sub), term.dtype, -1
        value = evaluate_node(window, values, env)
    elif op == "broadcast":
        (dims,) = term.attrs
        operand = args[0]
        inner = tuple(region[d] if operand.shape[i] == shape[d] else (0, operand.shape[i])
                      for i, d in enumerate(dims))
        value = broadcast_in_dim(_region_value(operand, inner, env, memo, regions), dims,
                                 tuple(sub))
    elif op == "reshape" and args[0].shape and all(sub):
        operand = args[0]
        wanted = np.indices(sub).reshape(len(sub), -1) + np.array(
            [lo for lo, _ in region]).reshape(-1, 1)
        read = np.unravel_index(np.ravel_multi_index(tuple(wanted), shape), operand.shape)
        box = tuple((int(p.min()), int(p.max()) + 1) for p in read)
        part = _region_value(operand, box, env, memo, regions)
        value = part[tuple(p - lo for p, (lo, _) in zip(read, box))].reshape(sub)
    elif op == "transpose":
        (perm,) = term.attrs
        inner = [None] * len(perm)
        for k, p in enumerate(perm):
            inner[p] = region[k]
        value = transpose(_region_value(args[0], tuple(inner), env, memo, regions), perm)
    elif op == "stablehlo.dot_general" and len(args) == 2:
        lb, rb, lc, rc = term.attrs
        lhs, rhs = args
        lhs_free = [d for d in range(len(lhs.shape)) if d not in lb and d not in lc]
        rhs_free = [d for d in range(len(rhs.shape)) if d not in rb and d not in rc]
        left = [(0, n) for n in lhs.shape]
        right = [(0, n) for n in rhs.shape]
        position = 0
        for x, y in zip(lb, rb):
            left[x] = right[y] = region[position]
            position += 1
        for d in lhs_free:
            left[d] = region[position]
            position += 1
        for d in rhs_free:
            right[d] = region[position]
            position += 1
        value = dot_general(_region_value(lhs, tuple(left), env, memo, regions),
                            _region_value(rhs, tuple(right), env, memo, regions),
                            lb, rb, lc, rc)
    elif op in _REGION_REDUCTIONS and len(args) == 1:
        dims = term.attrs[0]
        kept = iter(region)
        inner = tuple((0, n) if d in dims else next(kept) for d, n in enumerate(args[0].shape))
        value = reduce_dims(_region_value(args[0], inner, env, memo, regions), dims,
                            _REGION_REDUCTIONS[op])
    else:
        whole = evaluate_term(term, env, memo)
        value = take(whole, tuple(slice(lo, hi) for lo, hi in region))
    if op in WRAPPED_OPS and int_limits(term.dtype) is not None:
        value = wrap_node(term, value)  # the window of an integer sum wraps like the whole
    if tuple(value.shape) != tuple(sub):
        raise _Failure("unknown", f"internal: {op} evaluated on a window gave shape "
                       f"{value.shape}, not {tuple(sub)}")
    regions[key] = value
    return value


def _local_claims(results: dict, j: int, expected: dict) -> list:
    """Result `j` on each device of `expected` equals its expected local value, element for
    element (a local shape that differs refutes the claim outright)."""
    claims = []
    for d, expect in expected.items():
        if tuple(results[d][j].shape) != tuple(expect.shape):
            raise _Failure("refuted", f"result {j} has local shape {results[d][j].shape} on "
                           f"device {d}")
        claims.extend(equal(x, y) for x, y in zip(results[d][j].reshape(-1),
                                                  expect.reshape(-1)))
    return claims


def _partial_groups(rel: Rel, mesh: Mesh | None, single: bool) -> list[list[int]]:
    if single:
        return [[0]]
    if not rel.partial:
        return [[d] for d in range(mesh.num_devices)]
    if set(rel.partial) & set(rel.tiled_axes):
        raise _Failure("unknown", "a relation is both split and partial over the same axis")
    return mesh.groups_for(tuple(rel.partial))


def _build(info: OpInfo, ins: list[Value], outs: list[Value], mesh: Mesh | None,
           ctx: RuleContext, source) -> list:
    """The claim's conjuncts (z3 BoolRefs or Python bools), hypotheses go to `source`."""
    single = ctx.is_global or mesh is None
    devices = 1 if single else mesh.num_devices
    terms = [r.term for v in list(ins) + list(outs) for r in _rels_of(v)]
    env: dict = _LazyLeaves(source, _leaf_args(terms))
    dense: dict[bytes, np.ndarray] = {}
    if info.name == "stablehlo.constant":
        for v in outs:
            if not isinstance(v, Rel):
                continue
            value = OP_SEMANTICS["stablehlo.constant"](info, [])[0]
            if v.term.op == "dense":
                dense[v.term.attrs[0]] = value
            elif v.term.op == "broadcast" and v.term.args[0].op == "dense" and value.size:
                scalar = v.term.args[0]  # a splat kept whole, e.g. -0.0 (rules/movement.py)
                dense[scalar.attrs[0]] = value.reshape(-1)[:1].reshape(scalar.shape)

    def resolve(term: Term) -> np.ndarray:
        key = term.attrs[0]
        if key not in dense:
            known = DENSE_VALUES.get(key)
            dense[key] = (obj_array([int(v) for v in np.asarray(known).reshape(-1)],
                                    term.shape) if known is not None else
                          source.tensor(f"dense{key.hex()[:8]}", term.shape, term.dtype))
        return dense[key].reshape(term.shape)

    env["dense"] = resolve
    env["opaque"] = _opaque_resolver(source)
    memo: dict[int, np.ndarray] = {}
    with collect_divisors() as divisors:
        claims = _build_claims(info, ins, outs, mesh, single, devices, env, memo, source)
    if any(not is_z3(d) for d in divisors):
        raise _Failure("skip-trial", "a division by zero")
    source.hypotheses.extend(to_z3(d) != 0 for d in divisors if is_z3(d))
    return claims


def _build_claims(info: OpInfo, ins: list[Value], outs: list[Value], mesh: Mesh | None,
                  single: bool, devices: int, env: dict, memo: dict, source) -> list:

    checked = _distinct_devices(info, ins, outs, mesh, single, devices)
    needed = set(checked)
    regions: dict[tuple, np.ndarray] = {}

    def block_of(rel: Rel, device: int) -> np.ndarray:
        """Device `device`'s block of `rel`'s global value, computed on that block only."""
        if single:
            return evaluate_term(rel.term, env, memo)
        return _region_value(rel.term, _block_region(rel, mesh, device), env, memo, regions)

    pieces: dict[object, dict[int, np.ndarray]] = {}

    def pieces_of(value: Reordered | Returning, name: str, dtype: str) -> dict[int, np.ndarray]:
        """Every device's piece of the partial value `value.pieces` names (one symbolic split
        per partial value, shared by every operand and result of the instance naming it)."""
        key = _pieces_key(value) if value.pieces is not None else ("fresh", name)
        if key not in pieces:
            found: dict[int, np.ndarray] = {}
            for g, group in enumerate(_partial_groups(value.rel, mesh, single)):
                parts = source.split(value.rel.kind, block_of(value.rel, group[0]), len(group),
                                     f"{name}.g{g}", dtype)
                found.update(zip(group, parts))
            pieces[key] = found
        return pieces[key]

    local: list[list[np.ndarray]] = [[None] * len(ins) for _ in range(devices)]
    for i, value in enumerate(ins):
        want = tuple(info.operand_types[i].shape) if i < len(info.operand_types) else None
        dtype = info.operand_types[i].dtype if i < len(info.operand_types) else "f32"
        if isinstance(value, Rel):
            for g, group in enumerate(_partial_groups(value, mesh, single)):
                if needed.isdisjoint(group):
                    continue  # no device of this group is checked
                block = block_of(value, group[0])
                if value.partial:
                    parts = source.split(value.kind, block, len(group), f"p{i}.g{g}", dtype)
                    for device, part in zip(group, parts):
                        local[device][i] = part
                else:
                    local[group[0]][i] = block
        elif isinstance(value, DeviceScalar):
            for d in range(devices):
                local[d][i] = full(tuple(value.shape), value.values[d] if not single
                                   else value.values[0])
        elif isinstance(value, Reordered | Returning) and value.rel.partial and not single:
            parts = pieces_of(value, f"p{i}", dtype)
            for d in range(devices):
                local[d][i] = _piece_local(value, parts, d, mesh)
        elif isinstance(value, Permuted | Windowed | Shifted | Reordered) and \
                not value.rel.partial and not single:
            global_value = evaluate_term(value.rel.term, env, memo)
            for d in range(devices):
                local[d][i] = _derived_local(global_value, value, mesh, d)
        elif isinstance(value, DEVICE_BLOCK_VALUES) and not value.rel.partial and not single:
            for d in range(devices):
                junk = source.tensor(f"o{i}.d{d}", want or (), dtype)
                local[d][i], _ = _block_local(value, env, memo, mesh, d, junk)
        else:
            for d in range(devices):
                local[d][i] = source.tensor(f"o{i}.d{d}", want or (), dtype)
        for d in checked:
            if want is not None and tuple(local[d][i].shape) != want:
                raise _Failure("unknown", f"operand {i}'s relation gives local shape "
                               f"{local[d][i].shape}, the op's type is {want}")

    results = _run_devices(info, local, checked, mesh, single)

    claims: list = []
    for j, value in enumerate(outs):
        if isinstance(value, Opaque):
            continue
        if isinstance(value, DeviceScalar):
            for d in checked:
                got = results[d][j]
                if tuple(got.shape) != tuple(value.shape):
                    raise _Failure("refuted", f"result {j} has shape {got.shape}, the device "
                                   f"scalar {value.shape}")
                expect = value.values[d] if not single else value.values[0]
                claims.extend(equal(x, expect) for x in got.reshape(-1))
            continue
        if isinstance(value, DEVICE_BLOCK_VALUES):
            if value.rel.partial or single:
                raise _Failure("unknown", "a partial device mask cannot be checked")
            for d in checked:
                expect, defined = _block_local(value, env, memo, mesh, d, None)
                got = results[d][j]
                if tuple(got.shape) != tuple(expect.shape):
                    raise _Failure("refuted", f"result {j} has local shape {got.shape} on "
                                   f"device {d}")
                for x, y, ok in zip(got.reshape(-1), expect.reshape(-1), defined.reshape(-1)):
                    claims.append(equal(x, y) if ok is True else
                                  z3.Or(z3.Not(to_z3(ok)), to_z3(equal(x, y))))
            continue
        if isinstance(value, Reordered) and value.rel.partial and not single:
            claims.extend(_reordered_partial_claims(value, j, results, block_of, mesh))
            continue
        if isinstance(value, Returning):
            if single:
                raise _Failure("unknown", "pieces of a partial sum outside a mesh")
            if value.pieces is None or _pieces_key(value) not in pieces:
                raise _Failure("unknown", "pieces of a partial sum that no operand holds")
            split = pieces[_pieces_key(value)]
            claims.extend(_local_claims(results, j, {
                d: _piece_local(value, split, d, mesh) for d in checked}))
            continue
        if isinstance(value, Permuted | Windowed | Shifted | Reordered):
            if value.rel.partial or single:
                raise _Failure("unknown", f"a {type(value).__name__.lower()} partial value "
                               "cannot be checked")
            global_value = evaluate_term(value.rel.term, env, memo)
            claims.extend(_local_claims(results, j, {
                d: _derived_local(global_value, value, mesh, d) for d in checked}))
            continue
        for group in _partial_groups(value, mesh, single):
            if group[0] not in results:
                if any(m in results for m in group):
                    raise _Failure("unknown", "a partial group is checked in part")
                continue  # a device with the same claim as one checked
            block = block_of(value, group[0])
            for device in group:
                if not single and _block_index(value, mesh, device) != _block_index(
                        value, mesh, group[0]):
                    raise _Failure("unknown", "devices of one partial group hold different "
                                   "blocks")
                if tuple(results[device][j].shape) != tuple(block.shape):
                    raise _Failure("refuted", f"result {j} has local shape "
                                   f"{results[device][j].shape} on device {device}, the "
                                   f"relation says {block.shape}")
            if value.partial:
                kind = value.kind
                reduced = apply(lambda *xs, kind=kind: combine(kind, list(xs)),
                                *(results[m][j] for m in group))
                if kind == "sum":  # the all_reduce that completes it sums in the dtype
                    reduced = wrap_node_dtype(reduced, value.term.dtype)
            else:
                reduced = results[group[0]][j]
            claims.extend(equal(x, y) for x, y in zip(reduced.reshape(-1),
                                                      block.reshape(-1)))
    return claims


def _pieces_key(value: Reordered | Returning) -> tuple:
    """Which partial value's pieces a value holds: the value that made them and its relation
    (values naming one partial value under other relations get unrelated pieces)."""
    return (id(value.pieces), _value_key(value.rel))


def _piece_local(value: Reordered | Returning, parts: dict[int, np.ndarray], device: int,
                 mesh: Mesh) -> np.ndarray:
    """Device `device`'s local value of pieces of a partial sum (`layout.Reordered.pieces`,
    `layout.Returning`): its piece with the blocks in its order, or the sum over its sources
    of the block of their pieces it holds (n blocks, n the partial group's size)."""
    if isinstance(value, Reordered):
        order = value.orders[device]
        blocks = np.split(parts[device], len(order), axis=value.dim)
        return np.concatenate([blocks[b] for b in order], axis=value.dim)
    count = mesh.group_size(tuple(value.rel.partial))
    chosen = [np.split(parts[q], count, axis=value.dim)[value.blocks[device]]
              for q in sorted(value.sources[device])]
    if not chosen:
        raise _Failure("unknown", "pieces of a partial sum from no device")
    return apply(lambda *xs: sum_list(list(xs)), *chosen) if len(chosen) > 1 else chosen[0].copy()


def _reordered_partial_claims(value: Reordered, j: int, results: dict, block_of, mesh: Mesh
                              ) -> list:
    """Each partial group's un-reordered results add up to the block of the term."""
    claims = []
    for group in _partial_groups(value.rel, mesh, False):
        if any(m not in results for m in group):
            raise _Failure("unknown", "a partial group is checked in part")
        block = block_of(value.rel, group[0])
        natural = []
        for m in group:
            order = value.orders[m]
            got = results[m][j]
            if tuple(got.shape) != tuple(block.shape):
                raise _Failure("refuted", f"result {j} has local shape {got.shape} on device "
                               f"{m}, the relation says {block.shape}")
            blocks = np.split(got, len(order), axis=value.dim)
            natural.append(np.concatenate([blocks[order.index(b)] for b in range(len(order))],
                                          axis=value.dim))
        reduced = apply(lambda *xs, kind=value.rel.kind: combine(kind, list(xs)), *natural)
        claims.extend(equal(x, y) for x, y in zip(reduced.reshape(-1), block.reshape(-1)))
    return claims


def _distinct_devices(info: OpInfo, ins: list[Value], outs: list[Value], mesh: Mesh | None,
                      single: bool, devices: int) -> list[int]:
    """One device per distinct claim. An op outside the collectives computes each device's
    result from that device's operands alone, so two devices holding the same block of every
    (non-partial) operand and result, and the same device-table entries, make the same claim:
    checking one checks both. Replicated values on 8 devices are one claim, not 8. Along a
    mesh axis the instance is symmetric in (`_symmetric_axes`), only the devices at
    coordinate 0 are checked: every other device's claim is one of theirs with the variables
    renamed."""
    everyone = list(range(devices))
    if single:
        return everyone
    if info.name in COLLECTIVE_SEMANTICS:
        grouped = _collective_axes(info, mesh)
        if grouped is None:
            return everyone
        symmetric = [a for a in _symmetric_axes(ins, outs, mesh) if a not in grouped]
        return [d for d in everyone if not any(mesh.coords(d)[a] for a in symmetric)]
    symmetric = _symmetric_axes(ins, outs, mesh)
    candidates = [d for d in everyone
                  if not any(mesh.coords(d)[a] for a in symmetric)] if symmetric else everyone
    first: dict[tuple, int] = {}
    for d in candidates:
        key = []
        for value in list(ins) + list(outs):
            if isinstance(value, Rel) and not value.partial:
                key.append(_block_index(value, mesh, d))
            elif isinstance(value, DeviceScalar):
                key.append(value.values[d])
            elif isinstance(value, Shifted) and not value.rel.partial:
                key.append((_block_index(value.rel, mesh, d), value.offsets[d]))
            else:  # partial values and unconstrained operands differ per device
                return candidates
        first.setdefault(tuple(key), d)
    return sorted(first.values())


_GROUP_COLLECTIVES = ("stablehlo.all_reduce", "stablehlo.all_gather",
                      "stablehlo.reduce_scatter", "stablehlo.all_to_all")
"""Collectives whose result on a device depends only on its replica group's operands and its
position in the group."""


def _collective_axes(info: OpInfo, mesh: Mesh) -> tuple[str, ...] | None:
    """The mesh axes whose groups (ordered by block index) are exactly the collective's
    replica groups, else None. A symmetric axis outside them maps every group to a group,
    member k to member k, so the renaming argument of `_symmetric_axes` holds for the
    collective too."""
    if info.name not in _GROUP_COLLECTIVES:
        return None
    try:
        groups = replica_groups(info, mesh)
    except SemanticsError:
        return None
    axes = mesh.axes_of_groups(groups)
    if axes is None or sorted(map(tuple, groups)) != sorted(
            map(tuple, mesh.groups_for(axes))):
        return None
    return axes


def _run_devices(info: OpInfo, local: list[list[np.ndarray]], checked: list[int],
                 mesh: Mesh | None, single: bool) -> dict[int, list[np.ndarray]]:
    """The results of the checked devices. A collective checked on whole replica groups only
    (`_distinct_devices`) runs on those groups, renumbered, as a mesh of their own."""
    if single or info.name not in COLLECTIVE_SEMANTICS or len(checked) == mesh.num_devices:
        return dict(zip(checked, run_op(info, [local[d] for d in checked],
                                        None if single else mesh)))
    index = {d: k for k, d in enumerate(checked)}
    groups = [g for g in replica_groups(info, mesh) if g[0] in index]
    if sum(len(g) for g in groups) != len(checked) or any(m not in index for g in groups
                                                           for m in g):
        raise _Failure("unknown", "the checked devices are not whole replica groups")
    # the renumbered groups are device ids of a one-replica mesh: read them as such
    # (flattened ids, or partition ids for all_to_all; groups.py)
    attrs = {**info.attrs, "replica_groups": [[index[m] for m in g] for g in groups],
             "channel_handle": "#stablehlo.channel_handle<handle = 1, type = 1>"}
    if GROUPED[info.name][0] is not None:
        attrs["use_global_device_ids"] = True
    renumbered = replace(info, attrs=attrs)
    results = run_op(renumbered, [local[d] for d in checked],
                     Mesh((("checked", len(checked)),)))
    return dict(zip(checked, results))


_ANY = "any"
"""Tag of a dim a term is constant along: any permutation of it leaves the value unchanged."""
_ID = "id"
"""Tag of a dim only the identity is known to act on."""
_REDUCTIONS = ("reduce_sum", "reduce_max", "reduce_min", "reduce_and", "reduce_or")


def _symmetric_axes(ins: Sequence[Value], outs: Sequence[Value], mesh: Mesh) -> tuple[str, ...]:
    """The mesh axes the instance's claim is symmetric in: for such an axis `a`, the claim
    of a device at coordinate i along `a` is the claim of the device at coordinate 0 (same
    other coordinates) with the global variables renamed, so proving the latter proves it.

    The argument. Let sigma permute the coordinates of `a` (the transposition (0 i)). It
    acts on a global tensor dim tiled over axes T containing `a` (and not poly) by moving
    block b to the block whose `a` coordinate is permuted (a fixed permutation of the dim's
    positions, determined by its size and T); on other dims it acts as the identity. Choose
    the renaming pi of the leaf variables as that action on each leaf that is itself an input
    term or that an input broadcasts (with that input's tiling, `_leaf_tags`), the identity on
    other leaves (any choice is sound: what follows checks it). If every input and output
    term t commutes with it, t(pi L) = sigma_T t(L) for its own tiling T, then the block device
    d_0 (coordinate 0) holds of t(pi L) is the block d_i holds of t(L). The op runs the same
    local program on every device (no device-dependent values; a collective only when its
    replica groups are those of mesh axes not containing `a`, `_collective_axes`: sigma then
    maps d_i's group to d_0's, member k to member k, and the collective computes each device's
    result from its group's operands and its position in the group), so device
    d_i's claim `op(blocks of inputs at d_i) == block of output at d_i` over L is exactly
    d_0's claim over pi L; the claim is proved for all values of the variables (and the
    hypotheses it assumes at pi L are those of d_i at L: divisors of d_i's computation and
    the global terms', permuted). Partial values over other axes group devices that differ
    only in those axes, so sigma maps a group to a group and its fresh split variables to
    theirs; a value partial over `a` makes `a` not symmetric.

    Commuting is established per term node by tags (`_dim_tags`): a dim is ANY (the term is
    constant along it), ID (only the identity is known to commute) or (size, T) (sigma_T
    commutes). Leaves take their input's tags; elementwise ops need equal tags (ANY matches
    anything); broadcast, transpose and reshapes that keep a tagged dim whole carry them; a
    dot_general or reduction over permuted dims is invariant (a sum, max or product over
    all positions does not depend on their order); iota is ID along its dim (it is the
    position). Any other node commutes only when its operands are unchanged (every tag ID or
    ANY); otherwise the axis is not symmetric and every device is checked."""
    values = list(ins) + list(outs)
    if any(not isinstance(v, Rel) for v in ins) or any(
            not isinstance(v, Rel | Opaque) for v in outs):
        return ()
    rels = [v for v in values if isinstance(v, Rel)]
    symmetric = []
    for axis, size in mesh.axes:
        if size == 1 or any(axis in r.partial for r in rels):
            continue
        leaves: dict[int, tuple] = {}
        consistent = True
        for rel in ins:
            found = _leaf_tags(rel, axis)
            if found is not None and leaves.setdefault(*found) != found[1]:
                consistent = False
        if not consistent:
            continue
        memo: dict[int, tuple | None] = {}
        try:
            ok = all(_compatible(_dim_tags(r.term, leaves, memo), _expected_tags(r, axis))
                     for r in rels)
        except RecursionError:
            ok = False
        if ok:
            symmetric.append(axis)
    return tuple(symmetric)


def _leaf_tags(rel: Rel, axis: str) -> tuple[int, tuple] | None:
    """(leaf serial, tags) choosing the renaming on a leaf an input is, or broadcasts (a poly
    broadcast keeps its operand): the input's own action on the dims the leaf fills. Only a
    choice: every term is then checked against its own tiling."""
    expected = _expected_tags(rel, axis)
    term = rel.term
    if term.op == "arg":
        return term.serial, expected
    if term.op == "broadcast" and term.args[0].op == "arg":
        (dims,) = term.attrs
        operand = term.args[0]
        return operand.serial, tuple(expected[d] if operand.shape[i] == term.shape[d] else _ID
                                     for i, d in enumerate(dims))
    return None


def _expected_tags(rel: Rel, axis: str) -> tuple:
    """The action sigma has on `rel`'s global tensor, per dim (see `_symmetric_axes`)."""
    return tuple((n, axes) if axis in axes and d not in rel.poly else _ID
                 for d, (n, axes) in enumerate(zip(rel.term.shape, rel.tiling)))


def _compatible(found: tuple | None, expected: tuple) -> bool:
    return found is not None and len(found) == len(expected) and all(
        f == _ANY or f == e for f, e in zip(found, expected))


def _unify(tags: Sequence) -> object | None:
    """One tag for positions that must move together (None: they do not)."""
    known = {t for t in tags if t != _ANY}
    if not known:
        return _ANY
    return known.pop() if len(known) == 1 else None


def _dim_tags(term: Term, leaves: dict[int, tuple], memo: dict) -> tuple | None:
    """Per dim, how the renaming acts on `term`'s value (see `_symmetric_axes`); None when
    the term is not known to commute with it."""
    if term.serial in memo:
        return memo[term.serial]
    memo[term.serial] = None
    rank = len(term.shape)
    op = term.op
    found: tuple | None
    if op == "arg":
        found = leaves.get(term.serial, (_ID,) * rank)
    elif op == "splat":
        found = (_ANY,) * rank
    elif not term.args:
        found = (_ID,) * rank
    else:
        args = [_dim_tags(a, leaves, memo) for a in term.args]
        found = None if any(a is None for a in args) else _node_tags(term, args)
    memo[term.serial] = found
    return found


def _node_tags(term: Term, args: list[tuple]) -> tuple | None:
    op, rank = term.op, len(term.shape)
    if op in ARITHMETIC_TERM_OPS or (op in ELEMENTWISE_STABLEHLO and all(
            a.shape == term.shape for a in term.args)):
        out = tuple(_unify([a[d] for a in args]) for d in range(rank))
        return None if None in out else out
    if op == "broadcast":
        (dims,) = term.attrs
        operand = term.args[0]
        out = [_ANY] * rank
        for i, d in enumerate(dims):
            if operand.shape[i] == term.shape[d]:
                out[d] = args[0][i]
        return tuple(out)
    if op == "transpose":
        return tuple(args[0][p] for p in term.attrs[0])
    if op == "reshape":
        return _reshape_tags(term.args[0].shape, term.shape, args[0])
    if op == "stablehlo.dot_general" and len(args) == 2:
        lb, rb, lc, rc = term.attrs
        lhs, rhs = args
        batch = [_unify([lhs[x], rhs[y]]) for x, y in zip(lb, rb)]
        if None in batch or any(_unify([lhs[x], rhs[y]]) is None for x, y in zip(lc, rc)):
            return None
        lhs_free = [lhs[d] for d in range(len(lhs)) if d not in lb and d not in lc]
        rhs_free = [rhs[d] for d in range(len(rhs)) if d not in rb and d not in rc]
        return tuple(batch + lhs_free + rhs_free)
    if op in _REDUCTIONS and len(args) == 1:
        dims = term.attrs[0]
        return tuple(t for d, t in enumerate(args[0]) if d not in dims)
    if all(t in (_ID, _ANY) for a in args for t in a):
        return (_ID,) * rank
    return None


def _reshape_tags(src: tuple[int, ...], dst: tuple[int, ...], tags: tuple) -> tuple | None:
    """A reshape carries the tag of a dim it keeps whole; dims it merges or splits must be
    unchanged (ID or ANY)."""
    groups = reshape_groups(src, dst)
    if groups is None:
        return None
    out = [_ANY] * len(dst)
    for src_dims, dst_dims in groups:
        real_src = [d for d in src_dims if src[d] != 1]
        real_dst = [d for d in dst_dims if dst[d] != 1]
        if len(real_src) == 1 and len(real_dst) == 1:
            out[real_dst[0]] = tags[real_src[0]]
            continue
        group = [tags[d] for d in real_src]
        if any(t not in (_ID, _ANY) for t in group):
            return None
        for d in real_dst:
            out[d] = _ANY if all(t == _ANY for t in group) else _ID
    return tuple(out)


def _block_index(rel: Rel, mesh: Mesh, device: int) -> tuple[int, ...]:
    return tuple(mesh.block_index(axes, device) if axes else 0 for axes in rel.tiling)


def run_check(info: OpInfo, ins: list[Value], outs: list[Value], mesh: Mesh | None,
              ctx: RuleContext, name: str = "instance",
              timeout_ms: int = DEFAULT_TIMEOUT_MS) -> ProofResult:
    """Build the symbolic instance and prove it (no cache, no abstraction, no reduction)."""
    start = time.perf_counter()
    source = _Symbolic()
    try:
        claims = _build(info, ins, outs, mesh, ctx, source)
    except _Failure as failure:
        status = failure.status if failure.status in ("refuted", "unknown") else "unknown"
        return ProofResult(status, None, time.perf_counter() - start, name, failure.reason)
    except (SemanticsError, z3.Z3Exception, IndexError, KeyError, TypeError,
            ValueError) as err:
        return ProofResult("unknown", None, time.perf_counter() - start, name,
                           f"cannot build the query: {type(err).__name__}: {err}")
    symbolic = []
    for k, claim in enumerate(claims):
        if isinstance(claim, (bool, np.bool_)):
            if not claim:
                return ProofResult("refuted", {"element": str(k)},
                                   time.perf_counter() - start, name,
                                   "a result element differs for every input")
            continue
        symbolic.append(claim)
    if not symbolic:
        return ProofResult("proved", None, time.perf_counter() - start, name)
    result = prove(z3.And(symbolic), source.hypotheses, name=name, timeout_ms=timeout_ms)
    if result.status == "proved" and source.hypotheses:
        vacuous = prove(z3.BoolVal(False), source.hypotheses, name=f"{name}.vacuity",
                        timeout_ms=timeout_ms)
        if vacuous.status != "refuted":
            result = ProofResult("unknown", None, 0.0, name,
                                 "the assumptions (nonzero divisors, partial max/min splits) "
                                 f"may be contradictory: {vacuous.status}")
    if result.status == "unknown":
        witness = find_counterexample(info, ins, outs, mesh, ctx)
        if witness is not None:
            result = ProofResult("refuted", witness, 0.0, name,
                                 "concrete counterexample (Z3 said unknown: "
                                 f"{result.reason})")
    result.seconds = time.perf_counter() - start
    return result


def find_counterexample(info: OpInfo, ins: list[Value], outs: list[Value], mesh: Mesh | None,
                        ctx: RuleContext, trials: int = CONCRETE_TRIALS) -> dict | None:
    """Look for a concrete violation with exact rationals (None if none found)."""
    for seed in range(trials):
        source = _Concrete(seed)
        try:
            with random_functions(seed):
                claims = _build(info, ins, outs, mesh, ctx, source)
        except (_Failure, SemanticsError, ArithmeticError, TypeError, ValueError):
            continue
        for k, claim in enumerate(claims):
            if isinstance(claim, (bool, np.bool_)) and not claim:
                return {"seed": str(seed), "element": str(k)}
    return None


# ----- the fallback term-equality check -----------------------------------------------------------

def check_term_equality(a: Term, b: Term, name: str = "terms.equal",
                        timeout_ms: int = DEFAULT_TIMEOUT_MS,
                        max_cost: int = MAX_TERM_COST) -> ProofResult:
    """Prove two reference terms equal for every value of their arguments.

    For terms the canonicalizer does not identify (algebra it does not know): both are
    evaluated over the same fresh symbolic arguments and compared elementwise. Large terms
    are "skipped" (no shape reduction here: terms carry their shapes).
    """
    start = time.perf_counter()
    if a is b:
        return ProofResult("proved", None, 0.0, name, "identical terms")
    if a.shape != b.shape:
        return ProofResult("refuted", None, 0.0, name, f"shapes {a.shape} vs {b.shape}")
    cost = _term_cost([a, b])
    if cost > max_cost:
        return ProofResult("skipped", None, 0.0, name,
                           f"terms too large to evaluate ({cost} elements)")
    source = _Symbolic()
    env: dict = {}
    for index, leaf in _leaf_args([a, b]).items():
        env[index] = source.tensor(_leaf_name(index), leaf.shape, leaf.dtype)
    dense: dict[bytes, np.ndarray] = {}

    def resolve(term: Term) -> np.ndarray:
        key = term.attrs[0]
        if key not in dense:
            dense[key] = source.tensor(f"dense{key.hex()[:8]}", term.shape, term.dtype)
        return dense[key]

    env["dense"] = resolve
    env["opaque"] = _opaque_resolver(source)
    memo: dict[int, np.ndarray] = {}
    try:
        with collect_divisors() as divisors:
            left = evaluate_term(a, env, memo)
            right = evaluate_term(b, env, memo)
    except (SemanticsError, z3.Z3Exception, ValueError, TypeError) as err:
        return ProofResult("unknown", None, time.perf_counter() - start, name,
                           f"cannot evaluate: {err}")
    if any(not is_z3(d) for d in divisors):
        return ProofResult("unknown", None, time.perf_counter() - start, name,
                           "a division by zero")
    hypotheses = [to_z3(d) != 0 for d in divisors]
    claims = [equal(x, y) for x, y in zip(left.reshape(-1), right.reshape(-1))]
    if any(c is False for c in claims):
        return ProofResult("refuted", None, time.perf_counter() - start, name,
                           "an element differs for every input")
    symbolic = [c for c in claims if not isinstance(c, bool)]
    if not symbolic:
        return ProofResult("proved", None, time.perf_counter() - start, name)
    result = prove(z3.And(symbolic), hypotheses, name=name, timeout_ms=timeout_ms)
    if result.status == "proved" and hypotheses:
        vacuous = prove(z3.BoolVal(False), hypotheses, name=f"{name}.vacuity",
                        timeout_ms=timeout_ms)
        if vacuous.status != "refuted":
            result = ProofResult("unknown", None, 0.0, name,
                                 "the nonzero-divisor assumptions may be contradictory")
    result.seconds = time.perf_counter() - start
    return result
