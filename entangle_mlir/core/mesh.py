"""Device meshes: named axes, row-major device order, and replica groups as sets of axes."""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

MAX_DEVICES = 1 << 22
"""The most devices a program may run on (4194304). Tensors and layouts are symbolic in the
device, but some facts are tables over every device (partition_id's values, permutations,
the tiles of a per-device program's shardings): a bigger mesh is bad input, not gigabytes."""


_COORDS_KEPT = 1 << 16
"""Devices whose coordinates a mesh keeps (`Mesh.coords`)."""


def too_many_devices(count: int) -> str | None:
    """The bad-input message for a mesh of `count` devices, None if it is within the limit."""
    if count <= MAX_DEVICES:
        return None
    return f"a mesh of {count} devices exceeds the supported {MAX_DEVICES}"


@dataclass(frozen=True)
class Mesh:
    """Named axes with sizes; device ids are row-major over the axes (jax's default order).
    `replicas` > 1 for a program run as replicas (one partition, `mhlo.num_replicas` devices):
    device ids are then replica ids, which decides how collectives read their groups
    (`groups.py`)."""

    axes: tuple[tuple[str, int], ...]
    replicas: int = 1

    @property
    def partitions(self) -> int:
        return self.num_devices // self.replicas

    @property
    def names(self) -> tuple[str, ...]:
        return self._names

    @property
    def num_devices(self) -> int:
        return math.prod(size for _, size in self.axes)

    def __post_init__(self) -> None:
        # size() and names are on every op's path
        object.__setattr__(self, "_sizes", dict(self.axes))
        object.__setattr__(self, "_names", tuple(name for name, _ in self.axes))
        object.__setattr__(self, "_axes_of_groups", {})  # every collective of every layer
        object.__setattr__(self, "_coords", {})  # every rule instance's devices
        object.__setattr__(self, "_groups", {})  # groups_for, per axes

    def size(self, axis: str) -> int:
        return self._sizes[axis]

    def group_size(self, axes) -> int:
        if not axes:
            return 1
        sizes = self._sizes
        return math.prod(sizes[a] for a in axes)

    def coords(self, device: int) -> dict[str, int]:
        """Coordinates of a device id along each axis (one dict per device, kept: read it,
        do not change it)."""
        found = self._coords.get(device)
        if found is None:
            found, rest = {}, device
            for name, size in reversed(self.axes):
                found[name] = rest % size
                rest //= size
            if len(self._coords) < _COORDS_KEPT:
                self._coords[device] = found
        return found

    def device(self, coords: dict[str, int]) -> int:
        device = 0
        for name, size in self.axes:
            device = device * size + coords[name]
        return device

    def block_index(self, axes: tuple[str, ...], device: int) -> int:
        """The block index of a device along `axes`, major first (as a dim tiled by `axes`)."""
        coords = self.coords(device)
        index = 0
        for axis in axes:
            index = index * self.size(axis) + coords[axis]
        return index

    def groups_for(self, axes: tuple[str, ...]) -> list[list[int]]:
        """The replica groups a collective over `axes` uses, each group ordered by block index.
        (Kept per axes: a ring's rules ask for every device's group; each call gets its own
        lists.)"""
        found = self._groups.get(tuple(axes))
        if found is None:
            found = self._groups[tuple(axes)] = self._groups_for(tuple(axes))
        return [list(group) for group in found]

    def _groups_for(self, axes: tuple[str, ...]) -> tuple[tuple[int, ...], ...]:
        others = [a for a in self.names if a not in axes]
        groups = []
        for fixed in itertools.product(*(range(self.size(a)) for a in others)):
            base = dict(zip(others, fixed))
            group = []
            for idx in itertools.product(*(range(self.size(a)) for a in axes)):
                group.append(self.device({**base, **dict(zip(axes, idx))}))
            groups.append(tuple(group))
        return tuple(groups)

    def axes_of_groups(self, groups: list[list[int]], ordered: bool = True
                       ) -> tuple[str, ...] | None:
        """The ordered mesh axes whose collective uses exactly these groups, or None.

        Group order matters for gathers and scatters, so the axes order must reproduce the order
        of devices inside each group; the order of the groups themselves does not matter. Cost
        is linear in the device count (times the orderings of the axes one group spans).
        """
        try:
            key = (tuple(tuple(g) for g in groups), ordered)
        except TypeError:
            return self._find_axes_of_groups(groups, ordered)
        found = self._axes_of_groups.get(key, self)
        if found is self:
            found = self._axes_of_groups[key] = self._find_axes_of_groups(groups, ordered)
        return found

    def _find_axes_of_groups(self, groups: list[list[int]], ordered: bool
                             ) -> tuple[str, ...] | None:
        if not groups or not groups[0]:
            return None
        n = self.num_devices
        flat = [d for g in groups for d in g]
        if sorted(flat) != list(range(n)) or len({len(g) for g in groups}) != 1:
            return None
        coords = [self.coords(d) for d in range(n)]
        first = groups[0]
        varying = [a for a in self.names if len({coords[d][a] for d in first}) > 1]
        if self.group_size(varying) != len(first):
            return None
        fixed = [a for a in self.names if a not in varying]
        candidates = itertools.permutations(varying) if ordered else [tuple(varying)]
        for axes in candidates:
            if all(self._is_group(g, axes, fixed, coords, ordered) for g in groups):
                return axes
        return None

    def _is_group(self, group, axes, fixed, coords, ordered: bool) -> bool:
        base = coords[group[0]]
        if any(coords[d][a] != base[a] for d in group for a in fixed):
            return False
        if ordered:
            return all(self.block_index(axes, d) == i for i, d in enumerate(group))
        return len({self.block_index(axes, d) for d in group}) == len(group)

    def describe(self) -> str:
        return " x ".join(f"{name}={size}" for name, size in self.axes)


def axes_str(axes) -> str:
    """`'tp'` or `('dp', 'tp')` as a distributed-training engineer writes them."""
    axes = tuple(axes)
    if len(axes) == 1:
        return f"'{axes[0]}'"
    return "(" + ", ".join(f"'{a}'" for a in axes) + ")"
