"""Lemma of `rewrite._normal_long_sum`: a long `lin` whose first parts (same coefficients,
same constant) are a long `lin` normalized before is that normal form plus the remaining
parts (a residual stream: layer l's flat sum holds layer l - 1's parts and its own tp
partials). The path is taken; the form is the one the plain rebuild of every part gives;
Z3 proves the stream equal to its form. Must fail: a middle layer's contribution added
twice or dropped, a prefix part's coefficient or the constant changed (the prefix must not
be read where the parts match but the coefficients or constants do not)."""

from __future__ import annotations

from fractions import Fraction

import pytest

from entangle_mlir.analysis.instance.term_equality import check_term_equality
from entangle_mlir.core.normal_form import normal_form, rewrite, slice_term
from entangle_mlir.core.terms import Term, make_arg, make_dot, make_elementwise, make_lin

F32 = "f32"
PRODUCT = ((), (), (1,), (0,))
ONE, ZERO = Fraction(1), Fraction(0)
ACTIVATION = "stablehlo.abs"
"""The layers' nonlinearity: piecewise linear, which Z3 decides (it gave up on nested tanh)."""


def _partials(x: Term, a: Term, w: Term, tp: int) -> list[Term]:
    """A layer's tp-partial contributions: `tanh(x @ a[:, block t]) @ w[block t rows]`."""
    width = a.shape[1] // tp
    out = []
    for t in range(tp):
        lo, hi = t * width, (t + 1) * width
        h = make_elementwise(ACTIVATION, (make_dot(x, slice_term(a, 1, lo, hi), PRODUCT,
                                                         (x.shape[0], width), F32),))
        out.append(make_dot(h, slice_term(w, 0, lo, hi), PRODUCT, x.shape, F32))
    return out


def _stream(layers: int, tp: int, rows: int, width: int, scale: dict[int, int] | None = None
            ) -> list[Term]:
    """The residual stream after each layer, each a flat `lin` (the layer below's parts, then
    this layer's partials times `scale[l]`, 1 by default: 2 adds layer l twice, 0 drops it)."""
    scale = scale or {}
    x = make_arg(0, (rows, 3), F32)
    streams = [x]
    for layer in range(layers):
        a = make_arg(1 + 2 * layer, (3, tp * width), F32)
        w = make_arg(2 + 2 * layer, (tp * width, 3), F32)
        k = Fraction(scale.get(layer, 1))
        parts = [(k, p) for p in _partials(streams[-1], a, w, tp)]
        streams.append(make_lin([(ONE, streams[-1]), *parts], ZERO, x.shape, F32))
    return streams


def _used(monkeypatch) -> list:
    """What `_normal_prefix` returns, call by call."""
    found: list = []
    original = rewrite._normal_prefix

    def spy(term, serials, coef_keys, memo):
        found.append(original(term, serials, coef_keys, memo))
        return found[-1]
    monkeypatch.setattr(rewrite, "_normal_prefix", spy)
    return found


@pytest.mark.parametrize("layers, tp, rows, width", [(3, 4, 2, 1), (3, 4, 1, 2), (4, 3, 2, 1)])
def test_a_stream_is_its_normalized_prefix_plus_its_own_parts(layers, tp, rows, width,
                                                                  monkeypatch) -> None:
    streams = _stream(layers, tp, rows, width)
    top = streams[-1]
    monkeypatch.setattr(rewrite, "_normal_prefix", lambda *args: None)
    plain = normal_form(top)
    monkeypatch.undo()
    rewrite._SUM_PREFIXES.clear()
    found = _used(monkeypatch)
    form = normal_form(top)
    assert any(f is not None for f in found)
    assert form is plain
    assert check_term_equality(top, form, "long_sum.lemma").status == "proved"


@pytest.mark.parametrize("scale", [{1: 2}, {1: 0}])
def test_the_top_layer_added_twice_or_dropped_is_refuted(scale, monkeypatch) -> None:
    """Must fail: two layers of tp 8 (the first one's stream is long), the second layer's
    partials times 2 (added twice) or 0 (dropped): the form read through the first stream
    is not the stream's, and Z3 refutes the two equal."""
    good = _stream(2, 8, 1, 1)[-1]
    found = _used(monkeypatch)
    wrong = _stream(2, 8, 1, 1, scale)[-1]
    assert normal_form(wrong) is not normal_form(good)
    assert any(f is not None for f in found)
    assert check_term_equality(wrong, good, "long_sum.top_must_fail").status == "refuted"


@pytest.mark.parametrize("scale", [{1: 2}, {1: 0}])
def test_a_middle_layer_added_twice_or_dropped_does_not_meet(scale, monkeypatch) -> None:
    """Must fail: three layers, the middle one's partials times 2 (added twice) or 0
    (dropped), the layer above built on that stream (read through its prefix): the forms do
    not meet and the two are not proven equal (Z3 does not decide the nested products of
    free weights in time; the top layer's twin above is refuted)."""
    good = _stream(3, 4, 1, 1)[-1]
    found = _used(monkeypatch)
    wrong = _stream(3, 4, 1, 1, scale)[-1]
    assert normal_form(wrong) is not normal_form(good)
    assert any(f is not None for f in found)
    assert check_term_equality(wrong, good, "long_sum.middle_must_fail",
                               timeout_ms=2000).status != "proved"


@pytest.mark.parametrize("change", ["coefficient", "constant"])
def test_a_prefix_with_another_coefficient_or_constant_is_not_read(change, monkeypatch) -> None:
    """Must fail: layer 2's sum whose parts are layer 1's stream's parts and its own, with
    one of layer 1's coefficients doubled (or a constant added), after layer 1's stream was
    normalized: the prefix is not that stream, and the form is not the stream's."""
    streams = _stream(3, 4, 2, 1)
    below, top = streams[-2], streams[-1]
    normal_form(below)
    form = normal_form(top)
    _, coefs = top.attrs
    pairs = list(zip(coefs, top.args))
    constant = ZERO
    if change == "coefficient":
        pairs[1] = (2 * pairs[1][0], pairs[1][1])
    else:
        constant = ONE
    wrong = make_lin(pairs, constant, top.shape, F32)
    found = _used(monkeypatch)
    assert normal_form(wrong) is not form
    assert found and all(f is None or f[0] is not below for f in found)
    assert check_term_equality(wrong, top, "long_sum.prefix_must_fail").status == "refuted"
