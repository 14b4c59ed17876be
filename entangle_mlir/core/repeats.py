"""Canonical spelling of data movement that repeats elements: chains of reshapes, transposes
and broadcasts over one tensor.

Such a chain reads, at every position of its result, one element of its base: an index map.
Two chains over the same base with the same index map are the same tensor, however they are
spelled: `jnp.repeat(k, 4, axis=2)` on the reference's K/V heads and, on a device that holds
one K/V head of a coarser split, the block picked by its dynamic_slice (its heads repeated
twice) repeated twice more locally. The term builders (`terms.make_reshape`) bring nested
chains to the spelling `movement_plan` returns, so both intern alike.

The map is evaluated on element positions (numpy, like `terms._moves_no_element`) and read
as digits: each result dim is split into maximal digits along which the base index moves by
a constant stride (0 for a repeat). The canonical spelling is reshape(base, the moving
digits by decreasing stride), transpose to their result order, broadcast the repeating
digits in, reshape to the result shape. It is returned only when it reproduces the map
exactly (checked), so it is an identity, never a guess. Pure: no terms, no MLIR.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

Step = tuple[str, tuple]
"""("reshape", shape) | ("transpose", perm) | ("broadcast", (dims, shape)), as StableHLO's."""

MAX_ELEMENTS = 1 << 20
"""Chains whose result has more elements than this are left as spelled."""


@dataclass(frozen=True)
class Plan:
    """reshape(base, split) -> transpose(perm) -> broadcast_in_dim(dims, wide) ->
    reshape(out): `split` the moving digits by decreasing stride, `perm` their result order,
    `dims` their positions among all digits (`wide`, result order), `counts` the number of
    digits of each result dim (0 for a unit dim)."""

    split: tuple[int, ...]
    perm: tuple[int, ...]
    dims: tuple[int, ...]
    wide: tuple[int, ...]
    out: tuple[int, ...]
    counts: tuple[int, ...]


def index_map(base_shape: tuple[int, ...], steps: tuple[Step, ...]):
    """The base's flat element index at each position of the chain's result (numpy array)."""
    import numpy as np  # lazy: core is pure Python until a chain is canonicalized

    positions = np.arange(math.prod(base_shape)).reshape(base_shape)
    for kind, attr in steps:
        if kind == "reshape":
            positions = positions.reshape(attr)
        elif kind == "transpose":
            positions = np.transpose(positions, attr)
        else:
            dims, shape = attr
            order = sorted(range(len(dims)), key=lambda i: dims[i])
            moved = np.transpose(positions, order)
            expanded = [1] * len(shape)
            for i in order:
                expanded[dims[i]] = positions.shape[i]
            positions = np.broadcast_to(moved.reshape(expanded), shape)
    return positions


def _digits(line) -> list[tuple[int, int]] | None:
    """Maximal digits (size, stride), major first, with line[i] == sum of digit(i) * stride;
    None when the line is not such a sum."""
    n = len(line)
    digits: list[tuple[int, int]] = []
    block = 1
    while block < n:
        stride = int(line[block])
        count = n // block
        size = 2
        for k in range(count, 1, -1):
            if count % k == 0 and all(int(line[j * block]) == j * stride for j in range(k)):
                size = k
                break
        digits.append((size, stride))
        block *= size
    digits.reverse()
    value = [0] * n
    inner = n
    for size, stride in digits:
        inner //= size
        for i in range(n):
            value[i] += (i // inner) % size * stride
    return digits if all(int(v) == w for v, w in zip(line, value)) else None


def plan_of(base_shape: tuple[int, ...], steps: tuple[Step, ...]) -> Plan | None:
    """The canonical spelling of the chain `steps` over a base of `base_shape`, or None when
    its map is no such chain (a slice, an offset) or is too large to evaluate (decided from
    the shapes alone, before any array is made)."""
    if result_size(base_shape, steps) > MAX_ELEMENTS:
        return None
    return _plan_of(tuple(base_shape), tuple(steps))


def result_size(base_shape: tuple[int, ...], steps: tuple[Step, ...]) -> int:
    """The number of elements of the chain's result: its last reshape's or broadcast's shape
    (a transpose keeps the size), else the base's. No step shrinks a tensor, so no array
    `index_map` makes on the way is larger than this."""
    size = math.prod(base_shape)
    for kind, attr in steps:
        if kind == "reshape":
            size = math.prod(attr)
        elif kind == "broadcast":
            size = math.prod(attr[1])
    return size


@functools.lru_cache(maxsize=4096)
def _plan_of(base_shape: tuple[int, ...], steps: tuple[Step, ...]) -> Plan | None:
    import numpy as np  # lazy: see index_map

    total = math.prod(base_shape)
    positions = index_map(base_shape, steps)
    if positions.size > MAX_ELEMENTS or positions.size == 0 or int(positions.flat[0]) != 0:
        return None
    out = tuple(positions.shape)
    separable = np.zeros(out, dtype=np.int64)
    digits: list[tuple[int, int]] = []
    counts: list[int] = []
    for dim, size in enumerate(out):
        index = [0] * len(out)
        index[dim] = slice(None)
        line = positions[tuple(index)]
        found = _digits(line) if size > 1 else []
        if found is None:
            return None
        digits += found
        counts.append(len(found))
        shape = [1] * len(out)
        shape[dim] = size
        separable = separable + np.asarray(line).reshape(shape)
    if not np.array_equal(separable, positions):
        return None
    moving = [i for i, (_, stride) in enumerate(digits) if stride]
    by_stride = sorted(moving, key=lambda i: -digits[i][1])
    split = tuple(digits[i][0] for i in by_stride)
    if math.prod(split) != total:
        return None
    expected = total
    for i in by_stride:
        expected //= digits[i][0]
        if digits[i][1] != expected:
            return None
    perm = tuple(by_stride.index(i) for i in moving)
    wide = tuple(size for size, _ in digits)
    return Plan(split, perm, tuple(moving), wide, out, tuple(counts))
