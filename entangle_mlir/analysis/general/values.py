"""The values of the general tier's per-device expansion: `Local` (one device's value, a term
or a concrete integer array), `concrete_term` (such an array as a term), and `NotExpanded`
(the expansion's refusal). Shared by `expand.py` and `loops.py`."""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from entangle_mlir.core.diagnostics import SourceLoc
from entangle_mlir.core.ranges import fits
from entangle_mlir.core.terms import Term, make_broadcast, make_iota, make_lin, make_splat
from entangle_mlir.rules.movement import constant_term
from entangle_mlir.semantics.element import is_bool_dtype, is_int_dtype
from entangle_mlir.semantics.evaluate import evaluate_term

MAX_CONCRETE = 1 << 14
"""The most elements of an integer value evaluated concretely on each device."""


class NotExpanded(Exception):
    """The program (or an op of it) is outside what the general tier expands: not proven,
    with the reason and where."""

    def __init__(self, reason: str, loc: SourceLoc | None = None):
        super().__init__(reason)
        self.reason = reason
        self.loc = loc


@dataclass(frozen=True)
class Local:
    """One device's value: a term over the global inputs at the local shape, or a concrete
    integer array (device ids and what is computed from them), or both (a small integer
    constant: its term is the reference's spelling of it)."""

    dtype: str
    shape: tuple[int, ...]
    term: Term | None = None
    values: np.ndarray | None = None

    def key(self) -> tuple:
        """Equal for equal values: the term's serial, or the concrete values."""
        if self.term is not None:
            return ("t", self.term.serial)
        return ("c", self.dtype, self.shape, tuple(self.values.flat))

    def as_term(self) -> Term:
        """The value as a term (a concrete value as the constant it is)."""
        if self.term is not None:
            return self.term
        return concrete_term(self.values, self.dtype)


def concrete_term(values: np.ndarray, dtype: str) -> Term:
    """A concrete integer (or boolean) array as a term: a splat, an affine iota along one dim
    (the form the builders give a window of an iota), else a dense constant keyed as the
    `stablehlo.constant` rule keys it (equal contents, one term)."""
    shape = tuple(values.shape)
    flat = [int(v) for v in values.flat]
    if not flat or len(set(flat)) == 1:
        return make_splat(flat[0] if flat else 0, shape, dtype)
    affine = _affine_iota(values, dtype)
    if affine is not None:
        return affine
    return constant_term(np.array(values.tolist(), dtype=numpy_dtype(dtype)).reshape(shape),
                         shape, dtype)


def _affine_iota(values: np.ndarray, dtype: str) -> Term | None:
    """`start + step * iota` along one dim (broadcast along the others), when `values` is one."""
    if is_bool_dtype(dtype):
        return None
    ints = np.array([int(v) for v in values.flat], dtype=object).reshape(values.shape)
    varying = [d for d in range(ints.ndim)
               if ints.shape[d] > 1 and np.any(np.diff(ints, axis=d) != 0)]
    if len(varying) != 1:
        return None
    (dim,) = varying
    line = [int(v) for v in np.moveaxis(ints, dim, 0).reshape(ints.shape[dim], -1)[:, 0]]
    step = line[1] - line[0]
    n = len(line)
    if any(b - a != step for a, b in itertools.pairwise(line)) or not fits(
            Fraction(0), Fraction(n - 1), dtype):
        return None  # not affine, or the iota itself would wrap around in the dtype
    iota = make_iota((n,), 0, dtype)
    affine = make_lin([(Fraction(step), iota)], Fraction(line[0]), (n,), dtype)
    if ints.ndim > 1:
        affine = make_broadcast(affine, (dim,), tuple(ints.shape))
    made = evaluate_term(affine, {})
    if [int(v) for v in made.flat] != [int(v) for v in ints.flat]:
        return None
    return affine


_NUMPY_DTYPES = {"i1": np.bool_, "i8": np.int8, "i16": np.int16, "i32": np.int32,
                 "i64": np.int64, "ui8": np.uint8, "ui16": np.uint16, "ui32": np.uint32,
                 "ui64": np.uint64, "si8": np.int8, "si16": np.int16, "si32": np.int32,
                 "si64": np.int64}


def numpy_dtype(dtype: str):
    """The numpy dtype holding values of an integer (or boolean) element type."""
    if dtype not in _NUMPY_DTYPES:
        raise NotExpanded(f"no concrete values of element type {dtype}")
    return _NUMPY_DTYPES[dtype]


def integral(dtype: str) -> bool:
    return is_int_dtype(dtype) or is_bool_dtype(dtype)
