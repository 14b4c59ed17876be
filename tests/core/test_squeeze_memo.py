"""`squeeze._SQUEEZED`: every squeeze walk shares one memo (a stack's backward keeps a unit
batch row through each layer's reductions, `unit_kept_reduction`, and a walk of its own for
each walked every layer below again). The answers are the ones a fresh walk gives; a walk
kept apart (`_KeptApart`: a dot's unit batch dim under a reduction) is remembered as such,
and only under a reduction: the same dot squeezed outside one still squeezes."""

from __future__ import annotations

from fractions import Fraction

from entangle_mlir.analysis.instance.term_equality import check_term_equality
from entangle_mlir.core.normal_form import squeeze as squeeze_module
from entangle_mlir.core.normal_form.squeeze import squeeze, unit_kept_reduction
from entangle_mlir.core.terms import (
    Term,
    make_arg,
    make_dot,
    make_elementwise,
    make_lin,
    make_op,
    make_reshape,
)

F32 = "f32"
PRODUCT = ((), (), (2,), (0,))


def _layers(count: int) -> list[Term]:
    """One batch row through `count` layers, `x + tanh(x @ w_l)`, each (1, 4, 3)."""
    x = make_arg(0, (1, 4, 3), F32)
    out = [x]
    for layer in range(count):
        w = make_arg(1 + layer, (3, 3), F32)
        h = make_elementwise("stablehlo.tanh", (make_dot(out[-1], w, PRODUCT, (1, 4, 3), F32),))
        out.append(make_lin([(Fraction(1), out[-1]), (Fraction(1), h)], Fraction(0),
                            (1, 4, 3), F32))
    return out


def _row_sum(x: Term) -> Term:
    """`reduce_sum(x, dim 2)` keeping the unit batch row: (1, 4)."""
    return make_op("reduce_sum", (x,), ((2,),), (1, 4), F32, linear_in=0)


def _steps(monkeypatch) -> list:
    """The terms `_squeeze_step` is asked for, in order."""
    asked: list = []
    step = squeeze_module._squeeze_step

    def spy(term, *args):
        asked.append(term)
        return step(term, *args)
    monkeypatch.setattr(squeeze_module, "_squeeze_step", spy)
    return asked


def test_a_layer_above_walks_only_its_own_terms(monkeypatch) -> None:
    layers = _layers(4)
    below, top = _row_sum(layers[3]), _row_sum(layers[4])
    unit_kept_reduction(below, below.args[0])
    asked = _steps(monkeypatch)
    shared = unit_kept_reduction(top, top.args[0])
    walked = len(asked)
    monkeypatch.undo()
    squeeze_module._SQUEEZED.clear()
    asked = _steps(monkeypatch)
    fresh = unit_kept_reduction(top, top.args[0])
    assert shared is fresh
    assert 0 < walked < len(asked)
    assert check_term_equality(top, shared, "squeeze_memo.lemma").status == "proved"


def test_a_batch_dim_kept_apart_is_remembered_under_a_reduction_only(monkeypatch) -> None:
    """Must fail (stay unsqueezed): a dot's unit batch dim under a reduction, asked twice,
    after the same dot was squeezed outside a reduction; a memo without the `reduced` flag
    in its key would hand the squeezed dot to the reduction."""
    q, k = make_arg(0, (1, 4, 3), F32), make_arg(1, (1, 5, 3), F32)
    scores = make_dot(q, k, ((0,), (0,), (2,), (2,)), (1, 4, 5), F32)
    outside = squeeze(scores, (4, 5))
    assert outside is not None and check_term_equality(
        make_reshape(scores, (4, 5)), outside, "squeeze_memo.outside").status == "proved"
    top = make_op("reduce_max", (scores,), ((2,),), (1, 4), F32)
    assert unit_kept_reduction(top, scores) is None
    asked = _steps(monkeypatch)
    assert unit_kept_reduction(top, scores) is None
    assert asked == []
