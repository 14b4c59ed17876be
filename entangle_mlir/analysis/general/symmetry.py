"""Symmetric mesh axes in the per-device expansion: a device's value computed as a renaming of
its representative's instead of by the rules (issue 21: 64 devices of dp x pp x tp).

The argument. Let S be a set of mesh axes (`Symmetry.axes`), rep(d) the device with d's
coordinates along S set to 0, and gamma_d d's coordinates along S (a rotation of S's
coordinates: gamma . rep(d) = d). A rotation gamma acts on the leaves of the terms
(`sigma_gamma`): a global argument tiled over axes T is replaced by its blocks permuted so that
the block at the coordinates c of T holds the block at c rotated by gamma (T's axes outside S
stay put); a loop's leaf L[k, d] (carry k on device d, `loops.py`) by L[k, gamma d]; every
other leaf is kept. The rotations of S form an abelian group acting on devices and leaves
alike: sigma_gamma . sigma_delta = sigma_(gamma + delta).

A device's value v_d is COHERENT when v_d = v_rep(d)[sigma_gamma_d] as functions of the leaves
(both concrete and equal, or the fact recorded in `memo`). The expansion keeps `memo[gamma]`
(term serial -> term) holding only true facts `t[sigma_gamma] = memo[gamma][t]`: those
`instantiate` computes (a substitution rebuilt through the term builders: exact), the loop
leaves' pairs (the definition of sigma on them) and the collectives' results (below).

* A local op on d whose operands are all coherent: the op is one function on every device (a
  manual computation runs one body; device ids enter only as concrete values, which coherence
  compares by value), so op(v_rep[sigma]) = op(v_rep)[sigma]: d's result is the
  representative's result renamed (no rule runs, no rule instance is recorded for d: it is
  the renaming of the representative's instance, which holds for every value of its leaves).
* A collective whose operands are coherent on EVERY device, when gamma maps each replica group
  to a replica group member by member (an all_reduce: as a set, its reducers being
  commutative), or maps each collective_permute pair to a pair: the result on gamma . r is
  computed from the members gamma . m of gamma . G(r) at the same positions, whose values are
  v_m[sigma_gamma] (coherence of m and of gamma . m and the group law), so it is
  result_r[sigma_gamma]; that fact is recorded.
* A term t = u[sigma_delta] (a renaming's result, or a recorded fact) renamed by gamma is
  u[sigma_(gamma + delta)] (the group law), taken from memo[gamma + delta] when u's renaming
  by the sum is known, u itself when the sum is the identity (`Symmetry._composed`): a tp
  all_reduce's total holds its members' renamed partials, and renaming the total by a dp
  rotation would otherwise rebuild each of them. The term taken computes what the walk
  builds; it may spell it more simply (the walk rebuilds rotated blocks as slices of
  concatenations), never as another function of the leaves.
* Anything else (a device id that differs along S reaching a term op, a value read from
  outside the body that the renaming changes, a collective moving data along S in a rotated
  order) leaves d's value to the rules as before: a device that is not coherent costs its
  own expansion, never a wrong term.

Every device's term is still built (the results are assembled and compared whole); what the
argument saves is the rules and their instances on all devices but the representatives.
"""

from __future__ import annotations

import numpy as np
from jaxlib.mlir import ir

from entangle_mlir.analysis.general.loops import instantiate
from entangle_mlir.analysis.general.values import Local, Renaming
from entangle_mlir.core.mesh import Mesh
from entangle_mlir.core.normal_form import make_concat, slice_term
from entangle_mlir.core.terms import Term
from entangle_mlir.mlir.opinfo import describe
from entangle_mlir.semantics.groups import GroupError, permute_pairs


class Symmetry:
    """The symmetric axes of one manual computation, the representatives and the renamings
    (see the module docstring)."""

    def __init__(self, mesh: Mesh, axes: tuple[str, ...]):
        self.mesh = mesh
        self.axes = axes
        n = mesh.num_devices
        self.rep: list[int] = []
        self.gamma: list[tuple[int, ...]] = []
        for d in range(n):
            coords = mesh.coords(d)
            self.rep.append(mesh.device({a: (0 if a in axes else c) for a, c in coords.items()}))
            self.gamma.append(tuple(coords[a] for a in axes))
        self.memo: dict[tuple[int, ...], dict[int, Term]] = {}
        self.subst: dict[tuple[int, ...], dict[int, Term]] = {}
        self.origin: dict[int, tuple[Term, tuple[int, ...]]] = {}
        """serial of a term t -> (u, delta) with t = u[sigma_delta] (a renaming's result, a
        recorded fact): t renamed by gamma is u renamed by gamma + delta (`_composed`)."""
        self._moved: dict[tuple[int, ...], list[int]] = {}
        self._gammas = sorted(set(self.gamma) - {(0,) * len(axes)})
        """The rotations other than the identity."""

    def identity(self, d: int) -> bool:
        return self.rep[d] == d

    def _memo(self, gamma: tuple[int, ...]) -> dict[int, Term]:
        found = self.memo.get(gamma)
        if found is None:
            found = self.memo[gamma] = {}
            self.subst[gamma] = {}
        return found

    def permute_argument(self, leaf: Term, tiling) -> None:
        """Define sigma on a global argument tiled by `tiling` (per dim, its mesh axes)."""
        for gamma in self._gammas:
            self._memo(gamma)
            term = leaf
            for dim, axes in enumerate(tiling):
                if not any(a in self.axes for a in axes):
                    continue
                count = self.mesh.group_size(axes)
                size = leaf.shape[dim] // count
                pieces = []
                for b in range(count):
                    source = self._rotated_block(axes, b, gamma)
                    pieces.append(slice_term(term, dim, source * size, (source + 1) * size))
                term = make_concat(pieces, dim)
            self.subst[gamma][leaf.serial] = term

    def permute_rows(self, leaf: Term, dim: int, blocks: int, axes: tuple[str, ...]) -> None:
        """Define sigma on a leaf whose dim `dim` is cut into `blocks` blocks in runs, one
        block per coordinate of `axes` in each run (a layer template's leaf: the stream's
        rows, micro-batch by micro-batch, each split over the data axes): a rotation permutes
        the blocks of every run alike, as `permute_argument` permutes an argument's, so
        sigma_gamma . sigma_delta = sigma_(gamma + delta). (Any substitution keeps the
        renaming exact, coherence being checked op by op; this one makes a device's block of
        the leaf its representative's renamed.)"""
        count = self.mesh.group_size(axes)
        if count < 2 or blocks % count or leaf.shape[dim] % blocks:
            return
        size = leaf.shape[dim] // blocks
        for gamma in self._gammas:
            self._memo(gamma)
            pieces = []
            for b in range(blocks):
                run = b - b % count
                source = run + self._rotated_block(axes, b % count, gamma)
                pieces.append(slice_term(leaf, dim, source * size, (source + 1) * size))
            self.subst[gamma][leaf.serial] = make_concat(pieces, dim)

    def _rotated_block(self, axes: tuple[str, ...], b: int, gamma: tuple[int, ...]) -> int:
        """The block index along `axes` of block b's coordinates rotated by gamma."""
        coords, rest = {}, b
        for axis in reversed(axes):
            coords[axis] = rest % self.mesh.size(axis)
            rest //= self.mesh.size(axis)
        index = 0
        for axis in axes:
            c = coords[axis]
            if axis in self.axes:
                c = (c + gamma[self.axes.index(axis)]) % self.mesh.size(axis)
            index = index * self.mesh.size(axis) + c
        return index

    def rename(self, term: Term, gamma: tuple[int, ...]) -> Term:
        """term[sigma_gamma]: the leaves substituted and the term rebuilt, except where a
        subterm is itself a renaming whose renaming by the sum is known (`_composed`)."""
        if not any(gamma):
            return term
        memo = self._memo(gamma)
        built: list[tuple[Term, Term]] = []
        out = instantiate(term, self.subst[gamma], 0, memo, in_order=True,
                          known=lambda t: self._composed(t, gamma), built=built)
        for source, result in built:
            self._note(source, result, gamma)
        return out

    def _composed(self, term: Term, gamma: tuple[int, ...]) -> Term | None:
        """term[sigma_gamma] when `term` is u[sigma_delta] and u[sigma_(gamma + delta)] is
        known (the group law: sigma_gamma . sigma_delta = sigma_(gamma + delta)); u itself
        when gamma + delta is the identity. None otherwise (the caller walks the term)."""
        origin = self.origin.get(term.serial)
        if origin is None:
            return None
        source, delta = origin
        total = self._sum(gamma, delta)
        if not any(total):
            return source
        memo = self.memo.get(total)
        return None if memo is None else memo.get(source.serial)

    def _sum(self, gamma: tuple[int, ...], delta: tuple[int, ...]) -> tuple[int, ...]:
        return tuple((g + e) % self.mesh.size(a) for g, e, a in zip(gamma, delta, self.axes))

    def _note(self, source: Term, term: Term, gamma: tuple[int, ...]) -> None:
        """Note term = source[sigma_gamma] for `_composed` (the first fact noted stays)."""
        if term is not source:
            self.origin.setdefault(term.serial, (source, gamma))

    def coherent(self, rep: Local, local: Local, d: int) -> bool:
        """Whether d's value `local` is its representative's `rep` renamed."""
        if rep is local and (rep.term is None or not any(self.gamma[d])):
            return True
        if rep.values is not None or local.values is not None:
            return (rep.values is not None and local.values is not None
                    and rep.shape == local.shape and rep.dtype == local.dtype
                    and (rep.values is local.values
                         or np.array_equal(rep.values.ravel(), local.values.ravel())))
        gamma = self.gamma[d]
        if not any(gamma):
            return rep.term is local.term
        if local.renamed_from(rep.term, gamma):
            return True
        found = self._memo(gamma).get(rep.term.serial)
        if found is not None:
            return found is local.term
        return self.rename(rep.term, gamma) is local.term

    def all_coherent(self, values: list[Local]) -> bool:
        return all(self.coherent(values[self.rep[d]], values[d], d)
                   for d in range(len(values)) if self.rep[d] != d)

    def renamed_local(self, rep: Local, d: int) -> Local:
        """d's value when it is coherent with `rep` (the representative's); its term is
        built when first read (`values.Local`)."""
        if rep.term is None:
            return rep
        gamma = self.gamma[d]
        if not any(gamma):
            return rep
        return Local(rep.dtype, rep.shape, values=rep.values,
                     renaming=Renaming(rep.term, gamma, self))

    def record(self, rep: Local, local: Local, d: int) -> None:
        """Record the fact local = rep[sigma_gamma_d] (the caller has established it); on
        `local` itself while its term is not built (`Local.also_renamed`)."""
        gamma = self.gamma[d]
        if rep.term is None or not any(gamma) or local.also_renamed(rep.term, gamma):
            return
        if local.term is not None:
            self.remember(rep.term, local.term, gamma)

    def remember(self, rep: Term, term: Term, gamma: tuple[int, ...]) -> None:
        """Record the fact term = rep[sigma_gamma] (a fact recorded first stays)."""
        self._memo(gamma).setdefault(rep.serial, term)
        self._note(rep, term, gamma)

    def pair_leaves(self, leaves: list[Local]) -> None:
        """Fresh per-device leaves (a loop's carries at its symbolic step): sigma_gamma maps
        device d's leaf to device gamma . d's."""
        n = len(leaves)
        for gamma in self._gammas:
            memo = self._memo(gamma)
            for d in range(n):
                memo.setdefault(leaves[d].term.serial, leaves[self.moved(d, gamma)].term)

    def moved(self, d: int, gamma: tuple[int, ...]) -> int:
        """gamma . d."""
        table = self._moved.get(gamma)
        if table is None:
            table = self._moved[gamma] = [self._move(e, gamma)
                                          for e in range(self.mesh.num_devices)]
        return table[d]

    def _move(self, d: int, gamma: tuple[int, ...]) -> int:
        coords = dict(self.mesh.coords(d))
        for axis, g in zip(self.axes, gamma):
            coords[axis] = (coords[axis] + g) % self.mesh.size(axis)
        return self.mesh.device(coords)

    def groups_move(self, groups: list[list[int]], as_sets: bool) -> bool:
        """Whether every rotation maps each group to a group (member k to member k, or as a
        set)."""
        keys = {tuple(sorted(g)) if as_sets else tuple(g) for g in groups}
        for gamma in self._gammas:
            for group in groups:
                moved = [self.moved(m, gamma) for m in group]
                if (tuple(sorted(moved)) if as_sets else tuple(moved)) not in keys:
                    return False
        return True

    def pairs_move(self, pairs: list[tuple[int, int]]) -> bool:
        found = set(pairs)
        return all((self.moved(s, gamma), self.moved(t, gamma)) in found
                   for gamma in self._gammas for s, t in pairs)


def symmetric_axes(body: ir.Block, mesh: Mesh) -> tuple[str, ...]:
    """The axes to try the argument on: every axis of size > 1 that no collective_permute of
    the body moves data along (a pipeline's stage axis: its stages run different code by their
    index). Any choice is sound (coherence is checked op by op); this one is for speed."""
    moving: set[str] = set()

    def visit(block) -> None:
        for op in block.operations:
            op = op.operation
            if op.name == "stablehlo.collective_permute":
                try:
                    pairs = permute_pairs(describe(op, "").attrs, mesh.replicas,
                                          mesh.partitions)
                except (GroupError, KeyError, ValueError):
                    moving.update(mesh.names)
                    continue
                for s, t in pairs:
                    cs, ct = mesh.coords(s), mesh.coords(t)
                    moving.update(a for a in mesh.names if cs[a] != ct[a])
            for region in op.regions:
                for inner in region.blocks:
                    visit(inner)

    visit(body)
    return tuple(a for a in mesh.names if mesh.size(a) > 1 and a not in moving)

