"""The values of the general tier's per-device expansion: `Local` (one device's value, a term
or a concrete integer array), `concrete_term` (such an array as a term), and `NotExpanded`
(the expansion's refusal). Shared by `expand.py` and `loops.py`."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator, Sequence
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


class Local:
    """One device's value: a term over the global inputs at the local shape, or a concrete
    integer array (device ids and what is computed from them), or both (a small integer
    constant: its term is the reference's spelling of it).

    A value the symmetry argument gives as its representative's renamed (`symmetry.py`) is
    kept as that renaming (`renaming`: a function building the term) until its term is
    first read: most such terms (partial sums a flattening `lin` absorbs, intermediates no
    output holds) are never read. Whenever it is built, the term is the renaming, a true
    fact (`Symmetry.rename` reads only true facts).

    A float result of an op an expansion computes only where read (`Later`) is computed
    when first read; it has no concrete values (only integers have them)."""

    __slots__ = ("_renaming", "_term", "dtype", "shape", "values")

    def __init__(self, dtype: str, shape: tuple[int, ...], term: Term | None = None,
                 values: np.ndarray | None = None,
                 renaming: Renaming | Later | LaterResult | None = None):
        self.dtype = dtype
        self.shape = shape
        self.values = values
        self._term = term
        self._renaming = renaming

    def _resolve(self) -> None:
        """Take a later op's computed value as this value's own (a renaming stays unbuilt)."""
        pending = self._renaming
        while pending is not None and type(pending) is not Renaming:
            local = pending.local()
            self._term, self._renaming, self.values = local._term, local._renaming, local.values
            pending = self._renaming

    @property
    def later(self) -> Later | None:
        """The op whose computation this value waits for, if any."""
        pending = self._renaming
        if pending is None or type(pending) is Renaming:
            return None
        found = pending if type(pending) is Later else pending.later
        return found if found.results is None else None

    @property
    def term(self) -> Term | None:
        if self._renaming is not None:
            if type(self._renaming) is not Renaming:
                self._resolve()
            if self._renaming is not None:
                self._term = self._renaming.build()
                self._renaming = None
        return self._term

    def renamed_from(self, rep: Term, gamma: tuple[int, ...]) -> bool:
        """Whether this value is `rep` renamed by the rotation `gamma`, its term not built."""
        self._resolve()
        renaming = self._renaming
        return renaming is not None and renaming.rep is rep and gamma in renaming.gammas

    def also_renamed(self, rep: Term, gamma: tuple[int, ...]) -> bool:
        """Note that this value, `rep` renamed and its term not built, is also `rep` renamed
        by `gamma` (the caller has established it); False (nothing noted) when it is not
        such a value."""
        self._resolve()
        renaming = self._renaming
        if renaming is None or renaming.rep is not rep:
            return False
        if gamma not in renaming.gammas:
            renaming.gammas.append(gamma)
        return True

    def key(self) -> tuple:
        """Equal for equal values: the term's serial, the renaming not yet built (the
        representative's term and the rotation), or the concrete values."""
        self._resolve()
        if self._renaming is not None:
            return ("r", self._renaming.rep.serial, self._renaming.gammas[0])
        if self._term is not None:
            return ("t", self._term.serial)
        return ("c", self.dtype, self.shape, tuple(self.values.flat))

    def as_term(self) -> Term:
        """The value as a term (a concrete value as the constant it is)."""
        term = self.term
        if term is not None:
            return term
        return concrete_term(self.values, self.dtype)

    def __repr__(self) -> str:
        return f"Local({self.dtype}, {self.shape}, term={self.term!r}, values={self.values!r})"


class Renaming:
    """`rep` renamed by each rotation of `gammas` (one term: the facts were established),
    built by the first (`Symmetry.rename`), the others recorded then (`Symmetry.remember`)."""

    __slots__ = ("gammas", "rep", "symmetry")

    def __init__(self, rep: Term, gamma: tuple[int, ...], symmetry):
        self.rep = rep
        self.gammas = [gamma]
        self.symmetry = symmetry

    def build(self) -> Term:
        term = self.symmetry.rename(self.rep, self.gammas[0])
        for gamma in self.gammas[1:]:
            self.symmetry.remember(self.rep, term, gamma)
        return term


class LaterOp:
    """An op of an expansion that computes only what is read (`Expansion.lazy`): what each
    device's results read (`reads`) and how they are computed (`compute`). `order`: when it
    was made, so its devices' results are older than those of every op made after it, even
    when they are made later (`DeviceValues`)."""

    _orders = itertools.count()

    def __init__(self) -> None:
        self.order = next(LaterOp._orders)

    def reads(self, d: int) -> list[Local]:
        raise NotImplementedError

    def compute(self, d: int) -> list[Local]:
        raise NotImplementedError


DEVICE_SPAN = 1 << 24
"""More than any mesh's devices: `Later.serial` orders by op, then device."""


class Later:
    """Device `device`'s results of `op` (a `LaterOp`), computed when first read. Computing
    them first computes every later result they read that is not yet computed, oldest
    first, so no chain of reads recurses (a stack's values are read a step after they are
    made)."""

    __slots__ = ("device", "op", "results", "serial")

    def __init__(self, op: LaterOp, device: int):
        self.op = op
        self.device = device
        self.results: list[Local] | None = None
        self.serial = op.order * DEVICE_SPAN + device

    def get(self) -> list[Local]:
        if self.results is None:
            pending, stack, seen = [], [self], set()
            while stack:
                later = stack.pop()
                if later.results is not None or later.serial in seen:
                    continue
                seen.add(later.serial)
                pending.append(later)
                for local in later.op.reads(later.device):
                    found = local.later
                    if found is not None:
                        stack.append(found)
            for later in sorted(pending, key=lambda x: x.serial):
                if later.results is None:
                    later.results = later.op.compute(later.device)
        return self.results

    def local(self) -> Local:
        return self.get()[0]

    def locals_(self, types: list[tuple[str, tuple[int, ...]]]) -> list[Local]:
        """A value for each result (of `types`: (dtype, shape))."""
        if len(types) == 1:
            return [Local(types[0][0], types[0][1], renaming=self)]
        return [Local(dtype, shape, renaming=LaterResult(self, k))
                for k, (dtype, shape) in enumerate(types)]


class DeviceValues(Sequence):
    """One result's values on every device, each made (`make(d)`) when first indexed: most
    devices' values of an op computed where read are never read (a pipeline's 64 devices
    of which a few are read through the templates), so their objects are never made."""

    __slots__ = ("_made", "_make")

    def __init__(self, count: int, make: Callable[[int], Local]):
        self._made: list[Local | None] = [None] * count
        self._make = make

    def __len__(self) -> int:
        return len(self._made)

    def __getitem__(self, d):
        if isinstance(d, slice):
            return [self[i] for i in range(*d.indices(len(self._made)))]
        if d < 0:
            d += len(self._made)
        local = self._made[d]
        if local is None:
            local = self._made[d] = self._make(d)
        return local

    def __iter__(self) -> Iterator[Local]:
        return (self[d] for d in range(len(self._made)))


class LaterResult:
    """Result `index` (of several) of a `Later`."""

    __slots__ = ("index", "later")

    def __init__(self, later: Later, index: int):
        self.later = later
        self.index = index

    def local(self) -> Local:
        return self.later.get()[self.index]


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
