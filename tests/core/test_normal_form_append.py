"""Lemma of `concat._unmet_tail`: a concatenation whose first pieces are a concatenation known
not to meet (`_UNMET`: a stack's layers so far) with pieces appended (the next layer's tp
column blocks) joins only the runs the appended pieces make with the last of those pieces,
and so reaches the form the base algorithm reaches lifting all the pieces at once. Z3 proves
the form equal to the raw concatenation of the pieces; the next layer's blocks appended in
the wrong order give another form, which Z3 refutes against the right one."""

from __future__ import annotations

import pytest

from entangle_mlir.core import terms
from entangle_mlir.core.normal_form import concat, make_concat, slice_term
from entangle_mlir.core.terms import Term, make_arg, make_dot, make_elementwise, pretty
from tests.core.raw_terms import F32, proved, raw, raw_concat, refuted

SHAPES = [(2, 3, 2), (1, 2, 2), (3, 2, 3)]
"""(rows, features, columns of a tp block) of the small cases (a block of one column is a
row along the concatenated dim, where runs are not joined)."""

LAYERS = 3
PRODUCT = ((), (), (1,), (0,))


def _blocks(rows: int, features: int, width: int) -> list[list[tuple[Term, Term]]]:
    """Per layer, its two tp column blocks `tanh(x_i @ w_i[:, block])`, each as (built
    through the builders, raw nodes)."""
    out = []
    for i in range(LAYERS):
        x = make_arg(2 * i, (rows, features), F32)
        w = make_arg(2 * i + 1, (features, 2 * width), F32)
        layer = []
        for j in range(2):
            cols = slice_term(w, 1, j * width, (j + 1) * width)
            built = make_elementwise("stablehlo.tanh", (make_dot(x, cols, PRODUCT,
                                                                 (rows, width), F32),))
            raw_cols = raw("slice", (w,), ((0, j * width), (features, (j + 1) * width),
                                           (1, 1)), (features, width))
            plain = raw("stablehlo.tanh", (raw("stablehlo.dot_general", (x, raw_cols),
                                               PRODUCT, (rows, width)),), (), (rows, width))
            layer.append((built, plain))
        out.append(layer)
    return out


def _appended(shape: tuple[int, int, int], swap: bool = False) -> tuple[Term, Term]:
    """(the stack of the first layers with the last layer's blocks appended, the raw
    concatenation of every block); `swap`: the last layer's blocks appended in the wrong
    order."""
    layers = _blocks(*shape)
    below = make_concat([b for layer in layers[:-1] for b, _ in layer], 1)
    last = [b for b, _ in layers[-1]]
    stack = make_concat([below, *(last[::-1] if swap else last)], 1)
    return stack, raw_concat([p for layer in layers for _, p in layer], 1)


@pytest.mark.parametrize("shape", SHAPES)
def test_appended_blocks_join_onto_a_stack_known_not_to_meet(shape, monkeypatch) -> None:
    real, used = concat._unmet_tail, []
    monkeypatch.setattr(concat, "_unmet_tail",
                        lambda pieces, dim: used.append(real(pieces, dim)) or used[-1])
    stack, whole = _appended(shape)
    assert any(u is not None for u in used)
    assert stack.op == "concatenate" and len(stack.args) == LAYERS
    assert proved(whole, stack, "append.lemma")
    # the base algorithm (no shortcut) on fresh terms reaches the same form
    monkeypatch.setattr(concat, "_unmet_tail", lambda pieces, dim: None)
    terms.start_over()
    base, _ = _appended(shape)
    assert pretty(base, 12) == pretty(stack, 12)
    # must fail: the last layer's blocks appended in the wrong order
    monkeypatch.setattr(concat, "_unmet_tail", real)
    terms.start_over()
    wrong, whole = _appended(shape, swap=True)
    right, _ = _appended(shape)
    assert pretty(wrong, 12) != pretty(right, 12)
    assert refuted(whole, wrong, "append.must_fail")
