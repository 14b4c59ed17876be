"""Which non-finite values (-inf, +inf, NaN) a float IR value may hold.

`nonfinite_kinds(value)` is a set of bits (`NEG`, `POS`, `NAN`) read off the constants and
ops that compute the value: program inputs are finite (DESIGN.md, "Semantics policy"), masks
and logs of zero build infinities, and an exp, a sum or a product of finite values may
overflow where its range (`bounds.interval`) is not finite.
`rows_finite` tells that every row a max reduces holds an element above -inf on every
device, evaluating the masks that device ids and constants compute.

Overflow (issue 16): a sum or product of finite values (`a + b`, `a * b`, `q @ k.T`, a sum
over a dim) is finite only where its range is, like an exp. That refuses every ring attention
whose scores are unbounded, rightly: a score `q . k` that overflows to -inf empties a row of
the first ring block, whose max is then -inf, and the program outputs NaN where the
reference's softmax is finite (tests/normalize/test_exact_ring_overflow.py). A user who
accepts real-number behaviour there passes `--assume-no-overflow` (`Finiteness`): sums and
products of finite values are then taken as finite, and a proof that relied on it lists
`NO_OVERFLOW` among its assumptions. Each consumer judges through `judge`, which records
both: in the default (strict) mode a check refused only because of a possible overflow
(`Refusal`, reported when the program is not proven), and under the assumption a check that
held only because of it (listed when the rewrite fired). What the consumers need finite:

* `idioms._rescaled_exp_sum`, `_shifted_lse`: the shift m finite and the shifted terms
  normal, both taken from ranges (`idioms._unshifted_exact`): the assumption does not reach
  them;
* `idioms._online_sum`: every row of the earlier blocks above -inf (`rows_finite`) and their
  shift their own row max (`idioms._row_max_of`);
* `online_backward.py`: the shifts finite (`finite_shift`) and a score never +inf (their
  order is proven apart, `order.at_most`);
* `max_cotangent.py`, `polynomial.py`: atoms finite, and a zero folds through a product
  only with finite operands (the cotangent's own products unchecked);
* `online_backward._reassociated` (`overflow=False`): no infinity the program builds.
"""

from __future__ import annotations

import contextlib
import contextvars
import itertools
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np
from jaxlib.mlir import ir

from entangle_mlir.core import precision
from entangle_mlir.core.rounding import DTYPE_NAMES
from entangle_mlir.core.traits import ELEMENTWISE_OPS
from entangle_mlir.mlir.ir import op_key
from entangle_mlir.mlir.opinfo import (
    ARRAY_COMPARISONS,
    compare_type,
    constant_value,
    describe,
    reducer_kind,
)
from entangle_mlir.normalize.bounds import interval
from entangle_mlir.normalize.int_ranges import decided
from entangle_mlir.normalize.match import (
    MAX_INDEX,
    Memo,
    attr_names,
    defining_op,
    finite_test,
    i64s,
    max_reduce,
    operands_first,
    remembered,
    root_of,
    shape_of,
)
from entangle_mlir.semantics.groups import GroupError, process_groups

NEG, POS, NAN = 1, 2, 4
ANY = NEG | POS | NAN
"""Which non-finite values a float tensor may hold (bits): -inf, +inf, NaN."""

_CARRY = frozenset({
    "stablehlo.broadcast_in_dim", "stablehlo.reshape", "stablehlo.transpose",
    "stablehlo.slice", "stablehlo.dynamic_slice", "stablehlo.concatenate", "stablehlo.pad",
    "stablehlo.reverse", "stablehlo.convert", "stablehlo.collective_permute",
    "stablehlo.all_gather", "stablehlo.all_to_all", "stablehlo.select"})
"""Ops whose result holds only values of their operands (the non-finite ones too)."""


NO_OVERFLOW = ("no intermediate overflow: sums and products of finite values computed by the "
               "programs stay finite (--assume-no-overflow)")
"""How a proof that relied on `--assume-no-overflow` names what it assumed."""


class Kinds(Memo):
    """A memo of `nonfinite_kinds` for one mode (values -> kinds; "bounds": the ranges
    `bounds.interval` computed on the way; "ranges": `int_ranges.decided`'s), kept across
    rewrites (`Memo`).
    `assume_no_overflow`: sums and products of finite values are taken as finite. A plain
    dict is a memo of the strict mode."""

    def __init__(self, assume_no_overflow: bool = False) -> None:
        super().__init__()
        self.assume_no_overflow = assume_no_overflow
        self["bounds"] = Memo()
        self["ranges"] = Memo()

    def forget_erased(self, erased: set[int]) -> None:
        super().forget_erased(erased)
        self["bounds"].forget_erased(erased)
        self["ranges"].forget_erased(erased)

    def forget_downstream(self, ops: list[ir.Operation]) -> None:
        super().forget_downstream(ops)
        self["bounds"].forget_downstream(ops)
        self["ranges"].forget_downstream(ops)


@dataclass(frozen=True)
class Refusal:
    """A rewrite refused only because a sum or product of finite values may overflow (it
    would fire under `--assume-no-overflow`): `message` says why at the op `location`
    (an MLIR location's text) of the program in `file`. `root`: the refusal the others
    follow from (an online softmax's fold, whose backward and max cotangent are refused for
    the same scores). `guard`: a guard kept where it could have been dropped (jax's
    `select(is_finite(m), m, 0)`): keeping it proves nothing wrong, so it is not reported as
    the reason on its own; the driver checks the pair again under the assumption and says
    so only where that proves it (`driver.check_program`)."""

    file: str
    location: str
    message: str
    root: bool = False
    guard: bool = False


class Finiteness:
    """How one normalization judges finiteness (strict, or assuming no overflow), and what
    that decided: `refusals` (strict mode) and `used`, the (file, location) of the rewrites
    that fired relying on the assumption. One memo per mode is shared by every check: the
    rewrites ask about the same cones again for each candidate op and after each rewrite.
    It forgets the values of the ops a rewrite erased (`forget_erased`), or everything
    (`forget`) where erasures are not tracked. Rewrite drivers call `attempt` before trying
    a rewrite and `fired` when it changed the module; `judge` records what each check
    cost."""

    def __init__(self, assume_no_overflow: bool = False) -> None:
        self.assume_no_overflow = assume_no_overflow
        self.file = ""
        self.used: list[tuple[str, str]] = []
        self.refusals: list[Refusal] = []
        self._pending: list[tuple[str, str]] = []
        self._memos: dict[bool, Kinds] = {}
        self.cones: Memo | None = None
        """`_cone_key`'s numbers of the values named so far, within `tracked_cones` (a
        rewrite driver that reports every edit: forgotten downstream of every op a rewrite
        changed and with the ops it erased); None elsewhere (each question names its cone
        afresh)."""

    def memo(self, assume_no_overflow: bool | None = None) -> Kinds:
        """The shared memo of a mode (by default this normalization's)."""
        mode = self.assume_no_overflow if assume_no_overflow is None else assume_no_overflow
        if mode not in self._memos:
            self._memos[mode] = Kinds(mode)
        return self._memos[mode]

    def forget(self) -> None:
        """Ops were erased untracked: drop the memos (an erased value's key could be
        reused)."""
        self._memos = {}
        if self.cones is not None:
            self.cones = Memo()

    @contextlib.contextmanager
    def tracked_cones(self) -> Iterator[None]:
        """Within the block, keep `_cone_key`'s numbers across questions (`cones`): for a
        rewrite driver that reports every op it changes (`fired`) or erases
        (`forget_erased`) before it asks again (`rewrites.Worklist`: a rewrite decides before
        it edits)."""
        self.cones = Memo()
        try:
            yield
        finally:
            self.cones = None

    def forget_erased(self, erased: set[int]) -> None:
        """Drop what the memos hold of the ops whose keys are in `erased`
        (`match.erasures`)."""
        for memo in self._memos.values():
            memo.forget_erased(erased)
        if self.cones is not None:
            self.cones.forget_erased(erased)

    def attempt(self) -> None:
        """A rewrite is about to be tried: what its checks relied on is pending."""
        self._pending = []

    def fired(self, changed: list[ir.Operation] | None = None) -> None:
        """The rewrite tried since `attempt` changed the module: what it relied on is used.
        Under the assumption the strict kinds of values downstream of the rewrite are
        recomputed (the rewritten values equal the old ones only under the assumption; the
        strict memo only tells which checks relied on it): those computed from the ops
        given other operands or attributes (`changed`, when the rewrite driver tracks them:
        the values of erased ops are forgotten already), else all of them."""
        self.used += [p for p in self._pending if p not in self.used]
        self._pending = []
        if self.cones is not None:
            if changed is None:
                self.cones = Memo()
            else:
                self.cones.forget_downstream(changed)
        if self.assume_no_overflow:
            if changed is None:
                self._memos.pop(False, None)
            elif False in self._memos:
                self._memos[False].forget_downstream(changed)

    def root_refusals(self) -> int:
        """How many root refusals (`Refusal.root`) were recorded so far."""
        return sum(r.root for r in self.refusals)

    def judge(self, test: Callable[[Kinds], bool], at: ir.Operation,
              refusal: str | None = None, memo: Kinds | None = None,
              root: bool = False, guard: bool = False) -> bool:
        """`test(memo)` in this mode (`memo`, else the shared one). Under the assumption, a
        test that holds only because of it is pending at `at` (used if the rewrite fires);
        in the strict mode, a test that fails only because of a possible overflow records
        `refusal` at `at` (when given: the callers whose test is the rewrite's last check,
        so that the rewrite would otherwise fire; `root`, `guard`: see `Refusal`)."""
        held = test(memo if memo is not None else self.memo())
        if held and self.assume_no_overflow and not test(self.memo(False)):
            self._pending.append((self.file, str(at.location)))
        elif not held and not self.assume_no_overflow and refusal is not None and test(
                self.memo(True)):
            found = Refusal(self.file, str(at.location), refusal, root, guard)
            if found not in self.refusals:
                self.refusals.append(found)
        return held


_ACTIVE: contextvars.ContextVar[Finiteness | None] = contextvars.ContextVar(
    "finiteness", default=None)


@contextlib.contextmanager
def judging(finiteness: Finiteness | None = None) -> Iterator[Finiteness]:
    """Judge finiteness as `finiteness` says within the block (entangle-normalize sets it
    for both programs); by default as the active judge does, or, outside one, as a fresh
    strict one (a rewrite driver run on its own: its memos then live through its rewrites)."""
    chosen = finiteness if finiteness is not None else _ACTIVE.get() or Finiteness()
    token = _ACTIVE.set(chosen)
    try:
        yield chosen
    finally:
        _ACTIVE.reset(token)


def active() -> Finiteness:
    """The judge of the running normalization (a fresh strict one outside `judging`, whose
    memos and records last for one call)."""
    found = _ACTIVE.get()
    return found if found is not None else Finiteness()


def judge(test: Callable[[Kinds], bool], at: ir.Operation, refusal: str | None = None,
          memo: Kinds | None = None, root: bool = False, guard: bool = False) -> bool:
    """`Finiteness.judge` by the active judge."""
    return active().judge(test, at, refusal, memo, root, guard)


def overflow_words(value) -> str:
    """Why a finite program can hold an infinity, in a message: `a sum or product of finite
    inputs, such as q . k, can overflow float32`, in `value`'s dtype."""
    element = str(ir.RankedTensorType(value.type).element_type)
    return ("a sum or product of finite inputs, such as q . k, can overflow "
            f"{DTYPE_NAMES.get(element, element)}")


def nonfinite_kinds(value, memo: dict, overflow: bool = True) -> int:
    """The non-finite values `value` may hold, from the constants and ops that compute it
    (program inputs are finite, a shard_map body's arguments are what it is given; a
    division, rsqrt or power is taken at arguments where it is defined, as in the verifier's
    real-number semantics; log may give -inf). Iterative: the cone of a layer's scores is
    the whole program before it. `overflow`: also the infinities an exp, a sum or a product
    of finite values may overflow to where its range is not finite (`_overflow`; under
    `--assume-no-overflow`, a `Kinds` memo that says so, only an exp and arithmetic with a
    constant); without it only those the program builds (masks, log of zero), for the guards
    of the online softmax's backward (`online_backward.py`, whose telescoped forms are left
    unchecked for overflow)."""
    strict = not getattr(memo, "assume_no_overflow", False)
    for top, op, outer in operands_first(value, memo):
        memo[top] = memo[outer] if outer is not None else _kinds_of(top, op, memo)
        if overflow and op is not None and op.name in _OVERFLOWING and not memo[top] & (
                NEG | POS) and (
                op.name in _EXPONENTIALS or strict and _sum_or_product(op)
                or op.name in _ELEMENTWISE_ARITHMETIC and any(
                    _constant(v) for v in op.operands[
                        1 if op.name == "stablehlo.divide" else 0:])):
            memo[top] |= _overflow(top, memo, strict)
    return memo[value]


def finite_shift(m_value, memo: dict | None = None) -> bool:
    """The shift `m` holds no infinity, so exp(x - m) is defined and the rewrite is exact in
    floating point too. (A shard's own max over a row its mask hides throughout is -inf:
    exp(-inf - -inf) = NaN, which the unshifted form would turn into 0.) NaN is not
    tracked: the NaNs programs hold are jnp.take's fill for out-of-range indices, which the
    verifier assumes do not occur, and a NaN reaches both forms alike. In the active judge's
    mode (`memo`, else its shared one), nothing recorded: callers that rely on it alone judge
    it (`online_backward._finite`); `idioms._unshifted_exact` also takes m's finiteness from
    ranges, which the assumption does not reach."""
    return not nonfinite_kinds(m_value, active().memo() if memo is None else memo) & (NEG | POS)


def _may_overflow(op: ir.Operation) -> bool:
    """A convert to a float type whose range is smaller than its source's (f32 -> f16,
    i32 -> f8): a finite value can round to +-inf."""
    source = str(ir.RankedTensorType(op.operands[0].type).element_type)
    target = str(ir.RankedTensorType(op.results[0].type).element_type)
    if not precision.rounds(source, target):
        return False
    if source in precision.INT_BITS:
        width, signed = precision.INT_BITS[source]
        limit = precision.FLOAT_FORMATS.get(target, (0, 0, 0))[2]
        return (width - 1 if signed else width) > limit
    wide, narrow = precision.FLOAT_FORMATS.get(source), precision.FLOAT_FORMATS.get(target)
    return wide is None or narrow is None or wide[2] > narrow[2]


def _precision_kept(op: ir.Operation) -> bool:
    """A reduce_precision that keeps every value (else a finite value may round to +-inf:
    past the format's exponent range, or the dtype's largest value rounded up)."""
    dtype = str(ir.RankedTensorType(op.results[0].type).element_type)
    return precision.reduce_precision_is_identity(
        dtype, ir.IntegerAttr(op.attributes["exponent_bits"]).value,
        ir.IntegerAttr(op.attributes["mantissa_bits"]).value)


_OVERFLOWING = frozenset({
    "stablehlo.add", "stablehlo.subtract", "stablehlo.multiply", "stablehlo.divide",
    "stablehlo.power", "stablehlo.dot_general", "stablehlo.exponential",
    "stablehlo.exponential_minus_one", "chlo.square", "stablehlo.reduce",
    "stablehlo.all_reduce", "stablehlo.reduce_scatter", "stablehlo.convert"})
"""Ops whose result may overflow although their operands are finite: a sum, product or exp
of finite values is finite only where their ranges say so (`bounds.interval`)."""


_ELEMENTWISE_ARITHMETIC = frozenset(op for op, traits in ELEMENTWISE_OPS.items()
                                    if traits.term is not None and traits.arity == 2)
"""Binary arithmetic: add, subtract, multiply, divide."""
_EXPONENTIALS = frozenset({"stablehlo.exponential", "stablehlo.exponential_minus_one",
                           "stablehlo.power"})


def _sum_or_product(op: ir.Operation) -> bool:
    """A sum or product of any values (add, subtract, multiply, square, dot_general, a sum
    reduction or psum): it may overflow wherever its range is not finite."""
    if op.name in ("stablehlo.add", "stablehlo.subtract", "stablehlo.multiply",
                   "stablehlo.dot_general", "chlo.square"):
        return True
    return op.name in ("stablehlo.reduce", "stablehlo.all_reduce",
                       "stablehlo.reduce_scatter") and reducer_kind(op) == "add"


def _constant(value) -> bool:
    """`value` is a constant, possibly broadcast or reshaped."""
    root, _ = root_of(value)
    op = defining_op(root)
    return op is not None and op.name == "stablehlo.constant"


def _positive(value, memo: dict) -> bool:
    """`value` is bounded away from zero from above (`bounds.interval`)."""
    return interval(value, memo.setdefault("bounds", {}))[0] > 0


def _overflow(value, memo: dict, strict: bool) -> int:
    """The infinities `value` may overflow to, from its range in its dtype (`bounds.py`).
    An exponential, and (`strict`) a sum or product, may overflow wherever its range is not
    finite; arithmetic with a constant (`m * 1e38`) where its operands' ranges are finite
    and its own is not."""
    element = ir.RankedTensorType(value.type).element_type
    if isinstance(element, ir.IntegerType):
        return 0
    ranges = memo.setdefault("bounds", {})
    lo, hi = interval(value, ranges)
    op = defining_op(value)
    if op is not None and op.name not in _EXPONENTIALS and not (
            strict and _sum_or_product(op)) and not all(
            -math.inf < interval(v, ranges)[0] and interval(v, ranges)[1] < math.inf
            for v in op.operands):
        return 0
    return (NEG if lo == -math.inf else 0) | (POS if hi == math.inf else 0)


def _kinds_of(value, op: ir.Operation | None, memo: dict) -> int:
    element = ir.RankedTensorType(value.type).element_type
    if isinstance(element, ir.IntegerType):
        return 0
    if op is None:
        return 0 if _program_input(value) else ANY
    name = op.name
    args = [memo[v] for v in op.operands]
    if name == "stablehlo.constant":
        array, _ = constant_value(op.attributes["value"])
        try:
            array = array.astype(float)
        except (TypeError, ValueError):
            return ANY
        return ((NEG if np.any(array == -np.inf) else 0) | (POS if np.any(array == np.inf)
                else 0) | (NAN if np.any(np.isnan(array)) else 0))
    if name == "stablehlo.iota":
        return 0
    if name == "stablehlo.select" and finite_test(op.operands[0], op.operands[1]):
        return args[2]
    if name == "stablehlo.select" and args[1] != args[2]:
        picked = decided(op.operands[0], memo.get("ranges") if isinstance(memo, Kinds)
                         else None)  # jax's take: a NaN fill no index reaches
        if picked is not None:
            return args[1] if picked else args[2]
    if name == "stablehlo.convert" and _may_overflow(op):
        return _union(args) | NEG | POS
    if name == "stablehlo.reduce_precision":
        return _union(args) | (0 if _precision_kept(op) else NEG | POS)
    if name in _CARRY:
        return _union(args[1:] if name == "stablehlo.select" else args)
    if name in ("chlo.top_k", "mhlo.topk"):
        return args[0]
    if name in ("stablehlo.gather", "stablehlo.dynamic_update_slice"):
        return _union([args[0], *args[1:2]] if name == "stablehlo.dynamic_update_slice"
                      else args[:1])
    if name == "stablehlo.scatter" and len(op.operands) == 3 and (
            reducer_kind(op) in ("add", "max", "min") or _replaces(op)):
        both = args[0] | args[2]
        return both | (NAN if both & NEG and both & POS else 0)
    if name == "chlo.square":
        return (args[0] & NAN) | (POS if args[0] & (NEG | POS) else 0)
    if name == "stablehlo.negate":
        return _negated(args[0])
    if name in ("stablehlo.add", "stablehlo.subtract"):
        a, b = args[0], args[1] if name == "stablehlo.add" else _negated(args[1])
        mixed = (a & NEG and b & POS) or (a & POS and b & NEG)
        return a | b | (NAN if mixed else 0)
    if name == "stablehlo.divide" and not args[0] & (NEG | POS) and args[1] & (
            NEG | POS) == POS and _positive(op.operands[1], memo):
        return (args[0] | args[1]) & NAN  # x / +inf = 0: sigmoid as 1 / (1 + exp(-x))
    if name in ("stablehlo.multiply", "stablehlo.divide", "stablehlo.power",
                "stablehlo.dot_general"):
        both = _union(args)
        return ANY if both & (NEG | POS) else both
    if name in ("stablehlo.maximum", "stablehlo.minimum"):
        low, high = (NEG, POS) if name == "stablehlo.maximum" else (POS, NEG)
        both = _union(args)
        return (both & (high | NAN)) | (low if all(a & low for a in args) else 0)
    if name in ("stablehlo.exponential", "stablehlo.exponential_minus_one"):
        return args[0] & (POS | NAN)
    if name in ("stablehlo.tanh", "stablehlo.logistic"):
        return args[0] & NAN
    if name in ("stablehlo.sine", "stablehlo.cosine"):
        return NAN if args[0] else 0
    if name in ("stablehlo.sqrt", "stablehlo.rsqrt"):
        return (args[0] & NAN) | (NAN if args[0] & NEG else 0) | (
            args[0] & POS if name == "stablehlo.sqrt" else 0)
    if name == "stablehlo.abs":
        return (args[0] & NAN) | (POS if args[0] & (NEG | POS) else 0)
    if name == "stablehlo.reduce" and len(op.operands) == 2:
        return _reduced_kinds(op, args, memo)
    if name == "stablehlo.reduce_scatter" and len(op.operands) == 1 and reducer_kind(op) in (
            "add", "max", "min"):
        return args[0] | (NAN if args[0] & NEG and args[0] & POS else 0)
    if name == "stablehlo.all_reduce" and len(op.operands) == 1 and reducer_kind(op) in (
            "add", "max", "min"):
        if reducer_kind(op) == "max" and args[0] & NEG and _gathered_max_finite(op, memo):
            return args[0] & (POS | NAN)
        return args[0] | (NAN if args[0] & NEG and args[0] & POS else 0)
    return ANY


def _replaces(scatter: ir.Operation) -> bool:
    """The scatter's update computation returns the update (a plain write)."""
    return reducer_kind(scatter) == "replace"


def _union(kinds: list[int]) -> int:
    out = 0
    for k in kinds:
        out |= k
    return out


def _negated(kinds: int) -> int:
    return (kinds & NAN) | (POS if kinds & NEG else 0) | (NEG if kinds & POS else 0)


def _reduced_kinds(op: ir.Operation, args: list[int], memo: dict) -> int:
    """A sum keeps its terms' non-finite values (and +inf + -inf is NaN); a max over rows
    that each hold an element above -inf is not -inf (`rows_finite`)."""
    kind = reducer_kind(op)
    values, init = args
    if kind == "add":
        both = values | init
        return both | (NAN if both & NEG and both & POS else 0)
    if kind == "max":
        dims = i64s(op, "dimensions")
        empty = any(shape_of(op.operands[0])[d] == 0 for d in dims)
        witnesses = None if empty or not values & NEG else _row_witnesses(
            op.operands[0], tuple(dims), memo)
        negative = init & NEG and (empty or values & NEG and not (
            witnesses is True or witnesses is not None and all(w.all() for w in witnesses)))
        return ((values | init) & (POS | NAN)) | (NEG if negative else 0)
    return ANY


def _program_input(value) -> bool:
    """`value` is an argument of a function (an input of the program, finite by assumption),
    not a value a loop carries."""
    owner = value.owner
    op = owner.owner if isinstance(owner, ir.Block) else None
    return op is not None and op.operation.name == "func.func"


def rows_finite(value, dim: int, at: ir.Operation, refusal: str | None = None) -> bool:
    """Every row of `value` along `dim` holds an element above -inf, on every device, and no
    element is +inf (`_row_witnesses`; NaN is not tracked, see `finite_shift`). The kept
    elements of a mask are taken as above -inf when `nonfinite_kinds` says so: scores that
    are a product of two inputs are not (they may overflow to -inf), unless under
    `--assume-no-overflow`. Judged at `at` (`judge`), recording `refusal` (a root one: the
    scores an online softmax's fold, backward and max cotangent all depend on)."""
    def test(memo: Kinds) -> bool:
        found = _row_witnesses(value, (dim,), memo)
        return found is True or found is not None and all(bool(w.all()) for w in found)

    return judge(test, at, refusal, root=True)


def _row_witnesses(value, dims: tuple[int, ...], memo: dict):
    """Per device, for each row of `value` over `dims` (the reduced shape), whether it holds
    an element above -inf; True when every row on every device does (the value holds no
    -inf); None when unknown or when the value may hold +inf. Known for a
    concatenation along one of `dims` (a row is witnessed by any block) and for
    `select(mask, x, -inf)` with x finite and a mask computed from device ids and constants
    alone (evaluated on every device)."""
    kinds = nonfinite_kinds(value, memo)
    if kinds & POS:
        return None
    if not kinds & NEG:
        return True
    op = defining_op(value)
    if op is None:
        return None
    if op.name == "stablehlo.concatenate" and ir.IntegerAttr(
            op.attributes["dimension"]).value in dims:
        found = [_row_witnesses(v, dims, memo) for v in op.operands]
        if any(f is True for f in found):
            return True
        known = [f for f in found if f is not None]
        if not known:
            return None
        return np.logical_or.reduce(known)
    if op.name != "stablehlo.select" or shape_of(op.operands[0]) != shape_of(value):
        return None
    kept = [taken for taken, branch in ((True, 1), (False, 2))
            if not nonfinite_kinds(op.operands[branch], memo) & (NEG | POS)]
    if not kept:
        return None
    masks = _on_every_device(op.operands[0], op)
    if masks is None:
        return None
    return np.any(masks == kept[0], axis=tuple(d + 1 for d in dims))


def _gathered_max_finite(op: ir.Operation, memo: dict) -> bool:
    """`op`, an all_reduce max of `reduce_max(y)`, holds no -inf: every row of y is
    witnessed (`_row_witnesses`) on some device of every replica group."""
    inner = defining_op(op.operands[0])
    if inner is None or max_reduce(inner) is None:
        return False
    found = _row_witnesses(inner.operands[0], tuple(max_reduce(inner)), memo)
    if found is True:
        return True
    if found is None:
        return False
    groups = _device_groups(op, len(found))
    if groups is None:
        return False
    for members in groups:
        if any(d >= len(found) for d in members) or not np.logical_or.reduce(
                [found[d] for d in members]).all():
            return False
    return True


def _device_groups(op: ir.Operation, devices: int) -> list[list[int]] | None:
    """The groups of device ids (partition ids, or replica ids in a program run as replicas)
    a collective combines, as StableHLO defines them (`groups.process_groups`); None when
    the grid is not one of those two."""
    module = op
    while module is not None and module.name != "builtin.module":
        module = module.parent
        module = module.operation if module is not None else None
    attrs = module.attributes if module is not None else {}
    replicas = ir.IntegerAttr(attrs["mhlo.num_replicas"]).value \
        if "mhlo.num_replicas" in attrs else 1
    if replicas not in (1, devices):
        return None
    try:
        return process_groups(op.name, describe(op).attrs, replicas, devices // replicas)
    except GroupError:
        return None


def _on_every_device(value, at: ir.Operation) -> np.ndarray | None:
    """`value` evaluated on every device (the first dim: the partition id, or the replica id
    in a program run as replicas), when it is computed from device ids, iotas and constants
    alone by the ops `_evaluate` knows; else None. (Remembered across rewrite attempts while
    the ops it read stand: naming the cone walks all of it.)"""
    return remembered(("on_every_device", value), lambda: _evaluated_value(value, at))


def _evaluated_value(value, at: ir.Operation) -> np.ndarray | None:
    """`_on_every_device`, computed (by the value's cone: `_DEVICE_VALUES`)."""
    module = at.operation
    while module is not None and module.name != "builtin.module":
        module = module.parent
        module = module.operation if module is not None else None
    if module is None:
        return None
    attrs = module.attributes
    counts = {name: ir.IntegerAttr(attrs[name]).value if name in attrs else 1
              for name in ("mhlo.num_partitions", "mhlo.num_replicas")}
    if min(counts.values()) > 1:
        return None  # device ids would mix partitions and replicas
    cone = _cone_key(value)
    if cone is None:
        return None
    key = (cone, counts["mhlo.num_partitions"], counts["mhlo.num_replicas"])
    if key not in _DEVICE_VALUES:
        if len(_DEVICE_VALUES) > 4096:
            _DEVICE_VALUES.clear()
        _DEVICE_VALUES[key] = _evaluated_on_devices(value, counts)
    return _DEVICE_VALUES[key]


_DEVICE_VALUES: dict = {}
"""`_on_every_device`'s results by the value's whole cone (`_cone_key`): the online-softmax
rewrites ask for the same masks again after every rewrite."""


_CONE_KEYS: dict = {}
_MAX_CONE = 4096


def _cone_key(value) -> int | None:
    """A number naming the computation of `value` completely (ops, attributes, types, and
    the same for every operand), so equal numbers mean equal values on every device. None
    when the cone reads a block argument or holds more than `_evaluate`'s depth allows in
    values: `_evaluate` gives up on those. The numbers of the values named before are the
    active judge's (`Finiteness.cones`, kept while the ops above them stand: a ring's masks
    share most of their cones)."""
    if len(_CONE_KEYS) > 1 << 16:
        _CONE_KEYS.clear()  # numbers are never reused (`_CONE_NUMBERS`): old ones stay apart
        _DEVICE_VALUES.clear()
    keys = active().cones
    if keys is None:
        keys = Memo()
    printed: dict = {}
    stack = [value]
    walked = 0
    while stack:
        top = stack[-1]
        if top in keys:
            stack.pop()
            continue
        op = defining_op(top)
        if op is None or walked > _MAX_CONE:
            return None
        waiting = [v for v in op.operands if v not in keys]
        if waiting:
            stack.extend(waiting)
            continue
        stack.pop()
        walked += 1
        result = next(i for i, r in enumerate(op.results) if r == top)
        key = (op.name, _printed(top.type, printed), result,
               tuple(keys[v] for v in op.operands),
               tuple((n, _printed(op.attributes[n], printed)) for n in sorted(attr_names(op))),
               str(op) if op.regions else "")
        number = _CONE_KEYS.get(key)
        if number is None:
            number = _CONE_KEYS[key] = next(_CONE_NUMBERS)
        keys[top] = number
        keys.own(top, op_key(op))
    return keys[value]


_CONE_NUMBERS = itertools.count()
"""`_cone_key`'s numbers, never reused (a memo may hold one after `_CONE_KEYS` is cleared)."""


def _printed(thing, printed: dict) -> str:
    """`str(thing)` of a type or attribute, printed once per cone (`printed`: types and
    attributes are uniqued, so the same object prints alike; a cone repeats a few)."""
    found = printed.get(thing)
    if found is None:
        found = printed[thing] = str(thing)
    return found


def _evaluated_on_devices(value, counts: dict) -> np.ndarray | None:
    """`value` on every device: an array whose first dim is the device (partition ids, or
    replica ids in a program run as replicas). Evaluated once for all devices: every
    intermediate value carries the devices as a leading dim, of size 1 where it reads no
    device id (the same on every device, broadcast as numpy broadcasts)."""
    devices = counts["mhlo.num_partitions"] * counts["mhlo.num_replicas"]
    chunk = max(1, MAX_INDEX // max(1, math.prod(shape_of(value))))  # bounded memory
    parts = []
    for start in range(0, devices, chunk):
        some = np.arange(start, min(devices, start + chunk))
        none = np.zeros(len(some), dtype=np.int64)
        ids = {"stablehlo.partition_id": some if counts["mhlo.num_partitions"] > 1 else none,
               "stablehlo.replica_id": some if counts["mhlo.num_replicas"] > 1 else none}
        found = _evaluate(value, ids, {}, 64)
        if found is None:
            return None
        if found.shape[0] == 1:  # reads no device id: the same on every device
            return np.broadcast_to(found, (devices, *found.shape[1:]))
        parts.append(found)
    return parts[0] if len(parts) == 1 else np.concatenate(parts)


_NUMPY_TYPES = {"i1": np.bool_, "i8": np.int8, "i16": np.int16, "i32": np.int32,
                "i64": np.int64, "ui8": np.uint8, "ui16": np.uint16, "ui32": np.uint32,
                "ui64": np.uint64, "f32": np.float32, "f64": np.float64}
_BINARY = {"stablehlo.add": np.add, "stablehlo.subtract": np.subtract,
           "stablehlo.multiply": np.multiply, "stablehlo.maximum": np.maximum,
           "stablehlo.minimum": np.minimum, "stablehlo.and": np.logical_and,
           "stablehlo.or": np.logical_or}


def _evaluate(value, ids: dict[str, np.ndarray], memo: dict, depth: int
              ) -> np.ndarray | None:
    """The value of a device-id/constant computation on every device at once (None if it
    reads anything else or uses an op not modelled here): the result's shape with a leading
    dim of devices (1 where the value does not depend on the device)."""
    found = memo.get(value)
    if found is not None:
        return found
    element = str(ir.RankedTensorType(value.type).element_type)
    dtype = _NUMPY_TYPES.get(element)
    op = defining_op(value)
    if op is None or dtype is None or depth == 0 or math.prod(shape_of(value)) > MAX_INDEX:
        return None
    args = []
    if op.name not in ("stablehlo.constant", "stablehlo.iota", *ids):
        for operand in op.operands:
            found = _evaluate(operand, ids, memo, depth - 1)
            if found is None:
                return None
            args.append(found)
    shape = shape_of(value)
    with np.errstate(all="ignore"):
        result = _apply(op, args, ids, shape, dtype)
    if result is None:
        return None
    result = np.asarray(result).astype(dtype)
    result = result.reshape((result.shape[0], *shape))
    memo[value] = result
    return result


def _apply(op: ir.Operation, args: list[np.ndarray], ids: dict[str, np.ndarray],
           shape: tuple[int, ...], dtype) -> np.ndarray | None:
    """One op on arrays whose first dim is the devices (`_evaluate`)."""
    name = op.name
    rank = len(shape)
    if name in ids:
        devices = ids[name]
        return np.broadcast_to(devices.reshape((len(devices),) + (1,) * rank),
                               (len(devices), *shape))
    if name == "stablehlo.constant":
        array, _ = constant_value(op.attributes["value"])
        return np.broadcast_to(array, shape)[None] if array.dtype.kind in "biuf" else None
    if name == "stablehlo.iota":
        dim = ir.IntegerAttr(op.attributes["iota_dimension"]).value
        index = [1] * len(shape)
        index[dim] = shape[dim]
        return np.broadcast_to(np.arange(shape[dim]).reshape(index), shape)[None]
    if name in _BINARY:
        return _BINARY[name](*args)
    if name == "stablehlo.divide" and np.issubdtype(dtype, np.integer):
        a, b = args
        if np.any(b == 0):
            return None
        quotient = np.abs(a.astype(np.int64)) // np.abs(b.astype(np.int64))
        return np.where((a < 0) != (b < 0), -quotient, quotient)
    if name == "stablehlo.remainder" and np.issubdtype(dtype, np.integer):
        return None if np.any(args[1] == 0) else np.fmod(*args)
    if name == "stablehlo.negate":
        return np.negative(args[0])
    if name == "stablehlo.not":
        return np.logical_not(args[0]) if dtype is np.bool_ else np.invert(args[0])
    if name == "stablehlo.convert":
        return args[0]
    if name == "stablehlo.select":
        pred, on_true, on_false = args
        if pred.ndim == 1 and rank:  # a scalar predicate picks whole operands
            pred = pred.reshape((len(pred),) + (1,) * rank)
        return np.where(pred, on_true, on_false)
    if name == "stablehlo.compare":
        direction = str(op.attributes["comparison_direction"]).split()[-1].rstrip(">")
        if compare_type(op) == "TOTALORDER":
            return None  # numpy compares floats as FLOAT does
        compared = ARRAY_COMPARISONS.get(direction)
        return None if compared is None else compared(*args)
    if name == "stablehlo.broadcast_in_dim":
        dims = i64s(op, "broadcast_dimensions")
        operand = args[0]
        expanded = [operand.shape[0]] + [1] * rank
        for i, d in enumerate(dims):
            expanded[d + 1] = operand.shape[i + 1]
        order = [0] + [1 + i for i in sorted(range(len(dims)), key=lambda i: dims[i])]
        return np.broadcast_to(operand.transpose(order).reshape(expanded),
                               (operand.shape[0], *shape))
    if name == "stablehlo.reshape":
        return args[0].reshape((args[0].shape[0], *shape))
    if name == "stablehlo.transpose":
        return args[0].transpose([0] + [1 + p for p in i64s(op, "permutation")])
    if name == "stablehlo.concatenate":
        lead = max(a.shape[0] for a in args)
        parts = [np.broadcast_to(a, (lead, *a.shape[1:])) for a in args]
        return np.concatenate(parts, 1 + ir.IntegerAttr(op.attributes["dimension"]).value)
    return None
