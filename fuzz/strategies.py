"""Hypothesis strategies over the fuzz generator (hypothesis can shrink the programs).

    from hypothesis import given
    from fuzz.strategies import programs, mutants

    @given(programs())
    def test_something(prog): ...

The generator draws every choice through a `Chooser`; here each choice is a hypothesis draw, so
shrinking moves towards fewer layers, the first mesh, the first construct, smaller shapes.
"""

from __future__ import annotations

from hypothesis import strategies as st

from fuzz.gen import Chooser, GenOptions, Program, generate, mutate


class DrawChooser(Chooser):
    def __init__(self, draw):
        self.draw = draw

    def randint(self, lo: int, hi: int) -> int:
        return self.draw(st.integers(lo, hi))


@st.composite
def programs(draw, opts: GenOptions | None = None) -> Program:
    """A correct-by-construction program."""
    return generate(DrawChooser(draw), opts, seed="hypothesis")


@st.composite
def mutants(draw, opts: GenOptions | None = None) -> Program:
    """A program with one mutation on its sharded side (or the program itself when it has no
    mutation)."""
    prog = draw(programs(opts))
    mut = mutate(prog, DrawChooser(draw))
    return mut if mut is not None else prog


@st.composite
def seeded_programs(draw, opts: GenOptions | None = None) -> Program:
    """A program from a plain random seed (no shrinking of the program, only of the seed)."""
    from fuzz.gen import generate_seed

    return generate_seed(draw(st.integers(0, 2**31 - 1)), opts)
