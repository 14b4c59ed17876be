"""Which processes a collective combines, exactly as the StableHLO spec defines it.

A program runs on `replicas x partitions` processes; process (r, p) has the flattened id
`r * partitions + p`, which is the device index the walk uses (a partitioned program has one
replica, so ids are partition ids; a program run as replicas has one partition). A collective
splits the processes into groups by one of four strategies, chosen by the op, whether it has a
channel (`channel_handle` with a handle > 0) and `use_global_device_ids`:

| op | channel, global ids | channel | no channel |
|---|---|---|---|
| all_reduce, all_gather, reduce_scatter | flattened_ids | cross_replica_and_partition | cross_replica |
| all_to_all, collective_broadcast, collective_permute | - | cross_partition | cross_replica |

* cross_replica: each group of replica ids, once per partition (in a partitioned program with
  one replica every group is one process: the collective is a no-op on each partition);
* cross_partition: each group of partition ids, once per replica;
* cross_replica_and_partition: each group of replica ids times every partition (one replica:
  the group `[[0]]` is every partition);
* flattened_ids: the groups are flattened ids.

No groups (an empty `replica_groups`) is one group of everything the strategy ranges over.
What XLA refuses (its HLO verifier, or a crash at run time) is `GroupError`: ids repeated, out
of range, groups that do not cover every id, `use_global_device_ids` without a channel,
all_to_all / reduce_scatter / all_gather groups of different sizes, a permute target twice.
"""

from __future__ import annotations

import re

GROUPED = {
    "stablehlo.all_reduce": ("flattened_ids", "cross_replica_and_partition", "cross_replica"),
    "stablehlo.all_gather": ("flattened_ids", "cross_replica_and_partition", "cross_replica"),
    "stablehlo.reduce_scatter": ("flattened_ids", "cross_replica_and_partition",
                                 "cross_replica"),
    "stablehlo.all_to_all": (None, "cross_partition", "cross_replica"),
    "stablehlo.collective_broadcast": (None, "cross_partition", "cross_replica"),
    "stablehlo.collective_permute": (None, "cross_partition", "cross_replica"),
}
"""op -> its strategy (with channel and global ids, with channel, without channel)."""

_UNIFORM = frozenset({"stablehlo.all_gather", "stablehlo.reduce_scatter", "stablehlo.all_to_all"})
"""Ops whose groups XLA requires to be of one size (all_reduce may mix sizes)."""

_HANDLE = re.compile(r"handle\s*=\s*(-?\d+)")


class GroupError(ValueError):
    """A collective XLA rejects: its message says why."""


def has_channel(attrs: dict) -> bool:
    """A channel id > 0 (the spec's `channel_id > 0`; XLA treats handle 0 as no channel)."""
    handle = attrs.get("channel_handle")
    if handle is None or isinstance(handle, bool):
        return False
    if isinstance(handle, int):
        return handle > 0
    match = _HANDLE.search(str(handle))
    return match is not None and int(match.group(1)) > 0


def strategy(name: str, attrs: dict) -> str:
    """The process-grouping strategy of a collective (table `GROUPED`)."""
    with_global, with_channel, without = GROUPED[name]
    if attrs.get("use_global_device_ids") and with_global is not None:  # else no such attr
        if not has_channel(attrs):
            raise GroupError("use_global_device_ids without a channel_handle (handle > 0): "
                             "XLA rejects it")
        return with_global
    return with_channel if has_channel(attrs) else without


def process_groups(name: str, attrs: dict, replicas: int, partitions: int
                   ) -> list[list[int]]:
    """The groups of flattened process ids a grouped collective combines, in group order."""
    mode = strategy(name, attrs)
    groups = _int_groups(attrs.get("replica_groups"), name)
    span = {"cross_replica": replicas, "cross_replica_and_partition": replicas,
            "cross_partition": partitions, "flattened_ids": replicas * partitions}[mode]
    if not groups:
        if mode == "flattened_ids":
            raise GroupError(f"{_short(name)} with use_global_device_ids needs replica_groups")
        groups = [list(range(span))]
    _check_partition(groups, span, mode, name)
    if name in _UNIFORM and len({len(g) for g in groups}) != 1:
        raise GroupError(f"{_short(name)}: replica groups {_show(groups)} are not all of one "
                         "size")
    if mode == "flattened_ids":
        return groups
    if mode == "cross_replica":
        return [[r * partitions + p for r in g] for g in groups for p in range(partitions)]
    if mode == "cross_partition":
        return [[r * partitions + p for p in g] for g in groups for r in range(replicas)]
    return [[r * partitions + p for p in range(partitions) for r in g] for g in groups]


def permute_pairs(attrs: dict, replicas: int, partitions: int) -> list[tuple[int, int]]:
    """(source, target) pairs of flattened process ids of a collective_permute."""
    mode = strategy("stablehlo.collective_permute", attrs)
    pairs = _int_groups(attrs.get("source_target_pairs"), "stablehlo.collective_permute")
    span = partitions if mode == "cross_partition" else replicas
    what = "partition" if mode == "cross_partition" else "replica"
    sources, targets = set(), set()
    for pair in pairs:
        if len(pair) != 2:
            raise GroupError(f"collective_permute: source_target_pairs {_show(pairs)} are not "
                             "pairs")
        s, t = pair
        for d in pair:
            if not 0 <= d < span:
                raise GroupError(
                    f"collective_permute: {what} id {d} in source_target_pairs "
                    f"{_show(pairs)} is outside the {span} {what}s "
                    f"({'with' if mode == 'cross_partition' else 'without'} a channel, "
                    f"pairs name {what} ids)")
        if s in sources or t in targets:
            raise GroupError(f"collective_permute: {'source' if s in sources else 'target'} "
                             f"{s if s in sources else t} appears twice in {_show(pairs)}")
        sources.add(s)
        targets.add(t)
    if mode == "cross_partition":
        return [(r * partitions + s, r * partitions + t) for r in range(replicas)
                for s, t in pairs]
    return [(s * partitions + p, t * partitions + p) for p in range(partitions)
            for s, t in pairs]


def _int_groups(value, name: str) -> list[list[int]]:
    if value is None:
        return []
    if isinstance(value, str):
        raise GroupError(f"{_short(name)}: groups {value!r} are not a dense list of ids")
    groups = [[int(d) for d in group if int(d) != -1] for group in value]
    return [g for g in groups if g]  # -1 pads groups of unequal sizes in a dense attribute


def _check_partition(groups: list[list[int]], span: int, mode: str, name: str) -> None:
    """The groups name each id of [0, span) exactly once (XLA's verifier and runtime)."""
    seen: set[int] = set()
    what = {"cross_partition": "partition", "flattened_ids": "flattened device"}.get(mode,
                                                                                     "replica")
    for group in groups:
        for d in group:
            if d in seen:
                raise GroupError(f"{_short(name)}: {what} id {d} appears twice in replica "
                                 f"groups {_show(groups)}")
            if not 0 <= d < span:
                raise GroupError(
                    f"{_short(name)}: {what} id {d} in replica groups {_show(groups)} is "
                    f"outside the {span} {what}s ({mode}: "
                    f"{_MODE_WORDS[mode]})")
            seen.add(d)
    if len(seen) != span:
        missing = sorted(set(range(span)) - seen)[:8]
        raise GroupError(f"{_short(name)}: replica groups {_show(groups)} leave out {what} ids "
                         f"{missing} ({mode}: {_MODE_WORDS[mode]})")


_MODE_WORDS = {
    "cross_replica": "no channel_handle, so the groups are replica ids",
    "cross_replica_and_partition": "a channel_handle without use_global_device_ids, so the "
                                   "groups are replica ids",
    "cross_partition": "a channel_handle, so the groups are partition ids",
    "flattened_ids": "use_global_device_ids, so the groups are flattened ids "
                     "replica * num_partitions + partition",
}


def _short(name: str) -> str:
    return name.split(".")[-1]


def _show(groups) -> str:
    text = str([list(g) for g in groups])
    return text if len(text) <= 80 else text[:77] + "..."
