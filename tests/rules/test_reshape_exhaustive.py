"""Every reshape the movement rule relates, on small tensors over a 2 x 2 mesh, is proved by
Z3: all tilings of each global shape (each dim split over none, one or both axes, in either
order) reshaped to every local shape of one, two or three dims. The rule's refusals (opaque)
are not checked here; what it claims must hold. Merges of several split dims (the scaling
book's O[B, K_Y, M_Z, H] -> O[B, N_YZ, H]) are among the claims."""

from __future__ import annotations

import itertools
import math

import pytest

from entangle_mlir.core.relations import Opaque, Rel
from entangle_mlir.rules import RULES
from tests.rules.test_lemmas import M2, Lemma, _checker, arg, rel

_AXES = [(), ("dp",), ("tp",), ("dp", "tp"), ("tp", "dp")]


def _factorizations(n: int, k: int):
    if k == 1:
        yield (n,)
        return
    for d in range(1, n + 1):
        if n % d == 0:
            for rest in _factorizations(n // d, k - 1):
                yield (d, *rest)


def _tilings(shape: tuple[int, ...]):
    for tiling in itertools.product(_AXES, repeat=len(shape)):
        used = [a for t in tiling for a in t]
        if used and len(used) == len(set(used)) and all(
                n % 2 ** len(t) == 0 for n, t in zip(shape, tiling, strict=True)):
            yield tiling


@pytest.mark.parametrize("shape", [(2, 2, 3), (2, 4, 2), (4, 2, 2), (2, 2, 4), (4, 4)])
def test_every_related_reshape_is_proved(shape: tuple[int, ...]) -> None:
    related = merged = 0
    for tiling in _tilings(shape):
        local = [n // 2 ** len(t) for n, t in zip(shape, tiling, strict=True)]
        outs = {out for k in (1, 2, 3) for out in _factorizations(math.prod(local), k)}
        for out in sorted(outs):
            lemma = Lemma("reshape", "stablehlo.reshape", [rel(arg(shape), *tiling)],
                          results=[(out, "f32")], mesh=M2)
            (result,) = RULES[lemma.op](lemma.info(), list(lemma.ins), lemma.context())
            if isinstance(result, Opaque):
                continue
            assert isinstance(result, Rel)
            check = _checker().check(lemma.info(), lemma.ins, [result], M2, lemma.context())
            assert check.status == "proved", (tiling, out, result, check.describe())
            related += 1
            merged += any(len(t) == 2 for t in result.tiling) and not any(
                len(t) == 2 for t in tiling)
    assert related
    if shape == (2, 2, 3):
        assert merged   # (dp, local 1) x (tp, local 1) merged is split over (dp, tp)
