"""The elementwise ops and their traits: the one table every consumer reads.

`ELEMENTWISE_OPS` maps each elementwise op entangle handles to its `Traits`. The rule table
(`rules/elementwise.py`), the term builders (`core/terms.py`), the rewrites before the walk
(`normalize/`) and the instance checker (`analysis/instance/`) derive the sets of ops they
act on from its fields; none keeps a list of its own. An op's exact semantics
(`semantics/ops.py` `ELEMENTWISE`) and range (`normalize/bounds.py` `ELEMENTWISE_BOUNDS`) are
functions and stay with their analyses; `tests/core/test_traits.py` checks that their keys match
this table. Adding an op: `docs/adding-an-op.md`.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Traits:
    """What the consumers need to know of an elementwise op; each field names who reads it."""

    arity: int
    """The number of operands."""
    term: str | None = None
    """The arithmetic term node (`core.terms.ARITHMETIC_TERM_OPS`: "lin", "mul" or "div") the
    term builder makes of the op (`terms.make_elementwise`); None: the op is a term node of its
    own name (`terms.ELEMENTWISE_STABLEHLO`)."""
    commutes: bool = False
    """Commutative and associative: the term builder flattens and sorts the operands of such
    an op that is its own node (`terms.COMMUTATIVE`)."""
    concat: bool = False
    """The online-softmax rewrite moves a concatenation of blocks down through the op
    (`normalize/idioms.py`, `_sink_concat`)."""
    transpose: bool = False
    """The online softmax's backward moves a transpose down through the op
    (`normalize/online_backward.py`, `_transposed`)."""
    bounds: bool = False
    """The interval analysis knows the op's range from its operands' ranges
    (`normalize/bounds.py` `ELEMENTWISE_BOUNDS`); without it the result is unbounded (an
    integer result: its dtype's range)."""


ELEMENTWISE_OPS: dict[str, Traits] = {
    # unary
    "stablehlo.abs": Traits(1, transpose=True, bounds=True),
    "stablehlo.cbrt": Traits(1),
    "stablehlo.ceil": Traits(1),
    "stablehlo.cosine": Traits(1, bounds=True),
    "stablehlo.exponential": Traits(1, concat=True, transpose=True, bounds=True),
    "stablehlo.exponential_minus_one": Traits(1, bounds=True),
    "stablehlo.floor": Traits(1),
    "stablehlo.is_finite": Traits(1),
    "stablehlo.log": Traits(1, transpose=True, bounds=True),
    "stablehlo.log_plus_one": Traits(1),
    "stablehlo.logistic": Traits(1, concat=True, bounds=True),
    "stablehlo.negate": Traits(1, "lin", concat=True, transpose=True, bounds=True),
    "stablehlo.round_nearest_afz": Traits(1),
    "stablehlo.round_nearest_even": Traits(1),
    "stablehlo.rsqrt": Traits(1, concat=True, transpose=True, bounds=True),
    "stablehlo.sign": Traits(1, bounds=True),
    "stablehlo.sine": Traits(1, bounds=True),
    "stablehlo.sqrt": Traits(1, concat=True, transpose=True, bounds=True),
    "stablehlo.tan": Traits(1),
    "stablehlo.tanh": Traits(1, concat=True, bounds=True),
    # binary
    "stablehlo.add": Traits(2, "lin", commutes=True, concat=True, transpose=True, bounds=True),
    "stablehlo.atan2": Traits(2),
    "stablehlo.divide": Traits(2, "div", concat=True, transpose=True, bounds=True),
    "stablehlo.maximum": Traits(2, commutes=True, concat=True, transpose=True, bounds=True),
    "stablehlo.minimum": Traits(2, commutes=True, concat=True, transpose=True, bounds=True),
    "stablehlo.multiply": Traits(2, "mul", commutes=True, concat=True, transpose=True, bounds=True),
    "stablehlo.power": Traits(2, bounds=True),
    "stablehlo.remainder": Traits(2),
    "stablehlo.subtract": Traits(2, "lin", concat=True, transpose=True, bounds=True),
    # logical
    "stablehlo.and": Traits(2, commutes=True),
    "stablehlo.not": Traits(1),
    "stablehlo.or": Traits(2, commutes=True),
    "stablehlo.xor": Traits(2, commutes=True),
    # comparison and selection
    "stablehlo.clamp": Traits(3, bounds=True),
    "stablehlo.compare": Traits(2, concat=True),
    "stablehlo.select": Traits(3, concat=True, bounds=True),
    # conversion
    "stablehlo.convert": Traits(1, concat=True, bounds=True),
    "stablehlo.reduce_precision": Traits(1),
    # chlo (jax lowers these without decomposing them)
    "chlo.erf": Traits(1, bounds=True),
    "chlo.square": Traits(1, "mul", bounds=True),
}
"""Elementwise op -> its traits, one line per op, grouped as in StableHLO's op definitions."""
