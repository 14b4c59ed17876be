"""`pieces.first_slices` reads the slices of subterms asked before instead of walking them
again: it must still give the first slices of `subterms`' pre-order walk, whatever was asked
before and in whichever order (DAGs with shared subterms, counts that cut the walk short)."""

from __future__ import annotations

import itertools
import random

import pytest

from entangle_mlir.core.normal_form import pieces
from entangle_mlir.core.terms import Term, intern, make_arg, subterms


def _walked(term: Term, count: int) -> tuple[Term, ...]:
    return tuple(itertools.islice((u for u in subterms([term]) if u.op == "slice"), count))


def _dag(rng: random.Random, size: int) -> list[Term]:
    """Terms over a few leaves: rows of earlier terms (slices at random starts) and n-ary
    nodes over earlier terms, many shared."""
    terms = [make_arg(900_000 + rng.randrange(10**6), (8,), "f32") for _ in range(3)]
    for _ in range(size):
        if rng.random() < 0.4:
            base = rng.choice(terms)
            start = rng.randrange(8)
            terms.append(intern("slice", (base,), ((start,), (start + 1,), (1,)), (1,),
                                "f32"))
        else:
            args = tuple(rng.choice(terms[-12:] if rng.random() < 0.7 else terms)
                         for _ in range(rng.randrange(1, 4)))
            terms.append(intern("test_node", args, (rng.randrange(10**9),), (1,), "f32"))
    return terms


@pytest.mark.parametrize("seed", range(6))
def test_first_slices_is_the_walks_prefix(seed: int):
    rng = random.Random(seed)
    terms = _dag(rng, 120)
    asked = terms[:]
    rng.shuffle(asked)
    for term in asked * 2:
        count = rng.choice((1, 2, 3, 5, 8, 64, 4096))
        assert pieces.first_slices(term, count) == _walked(term, count)


def test_a_known_subterm_cut_short_is_walked_again():
    """A subterm whose known slices are fewer than asked and not all of them is walked."""
    x = make_arg(900_001, (8,), "f32")
    rows = [intern("slice", (x,), ((i,), (i + 1,), (1,)), (1,), "f32") for i in range(6)]
    inner = intern("test_node", tuple(rows[:4]), (1,), (1,), "f32")
    outer = intern("test_node", (rows[5], inner, rows[4]), (2,), (1,), "f32")
    assert pieces.first_slices(inner, 2) == _walked(inner, 2)
    assert pieces.first_slices(outer, 5) == _walked(outer, 5)
    assert len(pieces.first_slices(outer, 5)) == 5
