"""Where the query's values come from: fresh z3 variables (`Symbolic`, for the proof) or
random exact rationals (`Concrete`, for the counterexample search); the leaves' tensors created
on demand (`LazyLeaves`), loop variables and results unconstrained."""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction

import numpy as np
import z3

from entangle_mlir.analysis.instance.common import ABSTRACT_BASE
from entangle_mlir.core.terms import Term, subterms
from entangle_mlir.semantics.element import (
    SemanticsError,
    int_limits,
    is_bool_dtype,
    is_int_dtype,
    range_periods,
    sub,
    sum_list,
    to_z3,
    wrap_int,
)
from entangle_mlir.semantics.tensor import apply

_SORTS: dict = {}
"""(kind, z3 context pointer) -> (sort, its ast), kept alive with the sort."""


class Symbolic:
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
            # integers: the last piece is the one value of the dtype congruent mod 2^N (the
            # block minus count - 1 values of the dtype: within a few of its ranges)
            limits = int_limits(dtype)
            periods = None if limits is None else range_periods(
                dtype, limits[0] - (count - 1) * limits[1], limits[1] - (count - 1) * limits[0])
            rest = apply(lambda b, *xs: wrap_int(sub(b, sum_list(list(xs))), dtype, periods),
                         block, *locals_)
            return locals_ + [rest]
        if kind in ("max", "min"):
            locals_ = [self.tensor(f"{name}.{j}", block.shape, dtype) for j in range(count)]
            for idx in np.ndindex(block.shape):
                b = to_z3(block[idx])
                xs = [to_z3(x[idx]) for x in locals_]
                if is_bool_dtype(dtype):  # false < true: max is or, min is and
                    b = b if isinstance(b, z3.BoolRef) else b != 0
                    bound = [z3.Implies(x, b) if kind == "max" else z3.Implies(b, x)
                             for x in xs]
                else:
                    bound = [(x <= b) if kind == "max" else (x >= b) for x in xs]
                self.hypotheses.extend(bound)
                self.hypotheses.append(z3.Or([x == b for x in xs]))
            return locals_
        raise SemanticsError(f"unknown partial kind {kind!r}")


class Concrete:
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
            raise Failure("unknown", "a partial split of a value that is not exact")
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
                b = block[idx]
                if is_bool_dtype(dtype):  # max is or, min is and: the others may be anything
                    other = self.rng.random() < 0.5  # on the side the block allows
                    locals_[j][idx] = b if j == owner else (
                        bool(b) and other if kind == "max" else bool(b) or other)
                    continue
                gap = 0 if j == owner else self.rng.randint(0, 5)
                locals_[j][idx] = b - gap if kind == "max" else b + gap
        return locals_


@dataclass
class Failure(Exception):
    """The query cannot be built, or a concrete trial is dropped: `status` is "refuted" (a
    result's local shape contradicts the claim), "unknown" or "skip-trial" (a proof reports
    both as unknown), `reason` says why."""

    status: str
    reason: str


def leaf_args(terms: Sequence[Term]) -> dict[int, Term]:
    """The argument leaves of `terms`, by argument index."""
    found: dict[int, Term] = {}
    for term in subterms(terms):
        if term.op == "arg":
            found.setdefault(term.attrs[0], term)
    return found


def opaque_resolver(source):
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


def leaf_name(index: int) -> str:
    """A leaf's variable name: `A<k>` for the k-th abstract leaf, `arg<i>` for an argument."""
    return f"A{index - ABSTRACT_BASE}" if index >= ABSTRACT_BASE else f"arg{index}"


class LazyLeaves(dict):
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
        name = leaf_name(index)
        for idx in np.ndindex(part.shape):
            if part[idx] is None:
                position = ",".join(str(lo + i) for (lo, _), i in zip(region, idx))
                part[idx] = self.source.scalar(f"{name}[{position}]", leaf.dtype)
        return part.copy()
