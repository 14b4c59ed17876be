"""Exact converts and boolean arithmetic as Z3 lemmas: a term's dtype is its op's result dtype.

A convert that keeps every value (i1 -> f32, bf16 -> f32, i8 -> i32) gives a term that carries
the result dtype (`terms.make_convert`): a boolean becomes its 0/1 `indicator` in the target
type and adds as a number there, never as the boolean term itself (on i1, StableHLO's add is
logical or and multiply logical and: `terms.BOOLEAN_MEANING`). A convert whose operand is an
exact convert of a value the target holds is exact too (bf16 -> f32 -> bf16, i8 -> f32 -> i32,
i1 -> f32 -> i1). A select of two constants is the affine image of the indicator.

Each rule instance is proved by Z3 at several shapes and layouts; its nearest wrong reading
(the boolean sum read as a number, a wrap ignored, a rounding taken for the identity) is
refuted.
"""

from __future__ import annotations

from fractions import Fraction

import pytest

from entangle_mlir.core import terms as T
from entangle_mlir.core.mesh import Mesh
from tests.rules.test_lemmas import M1, M2, M3, Lemma, _checker, _layouts, arg, prove_lemma, rel

SHAPES = ((4,), (6, 4), (2, 2))


def _compare(x: T.Term) -> T.Term:
    """`x > 0`: a boolean computed from a float input."""
    zero = T.make_splat(0, x.shape, x.dtype)
    return T.make_elementwise("stablehlo.compare", (x, zero), ("GT",), dtype="i1")


def _cases():
    """(shape tag, mesh, layout) over the shapes and their layouts (`test_lemmas._layouts`)."""
    for shape in SHAPES:
        for k, (mesh, lay) in enumerate(_layouts(shape)):
            if mesh is M3 and shape[0] % 3:
                continue
            yield f"{shape}-{k}", shape, mesh, lay


def _lemmas() -> list[Lemma]:
    out = []
    for tag, shape, mesh, lay in _cases():
        mask = lay(arg(shape, "i1"))
        for target in ("f32", "bf16", "i32", "i8", "ui8"):
            out.append(Lemma(f"convert-i1-{target}-{tag}", "stablehlo.convert", [mask],
                             results=[(None, target)], mesh=mesh))
        for op in T.BOOLEAN_MEANING:
            out.append(Lemma(f"{op}-i1-{tag}", op, [mask, lay(arg(shape, "i1"))], mesh=mesh))
        out.append(Lemma(f"convert-bf16-f32-{tag}", "stablehlo.convert",
                         [lay(arg(shape, "bf16"))], results=[(None, "f32")], mesh=mesh))
        out.append(Lemma(f"convert-i8-i32-{tag}", "stablehlo.convert",
                         [lay(arg(shape, "i8"))], results=[(None, "i32")], mesh=mesh))
        round_trips = (("bf16", "f32", "bf16"), ("i8", "f32", "i32"), ("i1", "f32", "i1"),
                       ("i1", "i8", "f32"), ("f16", "f32", "bf16"))
        for source, middle, target in round_trips:
            inner = T.make_convert(arg(shape, source), middle)
            if source == "f16" and target == "bf16":
                continue  # f16 -> bf16 rounds: a must-fail lemma below
            out.append(Lemma(f"convert-{source}-{middle}-{target}-{tag}", "stablehlo.convert",
                             [lay(inner)], results=[(None, target)], mesh=mesh))
        pred = lay(_compare(arg(shape)))
        for on_true, on_false in ((3, -1), (Fraction(1, 4), 0), (0, 1), (2, 2)):
            out.append(Lemma(f"select-{on_true}-{on_false}-{tag}", "stablehlo.select",
                             [pred, _splat_like(on_true, shape, mesh, lay),
                              _splat_like(on_false, shape, mesh, lay)],
                             results=[(None, "f32")], mesh=mesh))
    for lemma in out:
        dtypes = [dtype for _, dtype in lemma.results] if lemma.results else [
            lemma.ins[0].term.dtype]
        lemma.results = None
        shape = lemma.info().operand_types[-1].shape
        lemma.results = [(shape, dtype) for dtype in dtypes]
    return out


def _splat_like(value, shape, mesh: Mesh | None, lay):
    """A constant of `shape` laid out like the other operands."""
    return lay(T.make_splat(value, shape, "f32"))


LEMMAS = _lemmas()


@pytest.mark.parametrize("lemma", LEMMAS, ids=[lemma.name for lemma in LEMMAS])
def test_exact_convert_lemma(lemma: Lemma) -> None:
    prove_lemma(lemma)


def test_a_converted_boolean_carries_the_result_dtype() -> None:
    """The term of `convert(m)` is m's indicator in the result dtype, whichever spelling:
    `select(m, 1, 0)`, a chain through i8, the convert placed before a broadcast or after."""
    m = _compare(arg((4,)))
    ind = T.make_convert(m, "f32")
    assert ind.dtype == "f32" and T.is_indicator(ind)
    assert ind is T.make_elementwise("stablehlo.select", (m, T.make_splat(1, (4,), "f32"),
                                                          T.make_splat(0, (4,), "f32")),
                                     dtype="f32")
    assert T.make_convert(T.make_convert(m, "i8"), "f32") is ind
    wide = T.make_broadcast(m, (0,), (4, 3))
    assert T.make_convert(wide, "f32") is T.make_broadcast(ind, (0,), (4, 3))
    assert T.make_elementwise("stablehlo.add", (ind, ind), dtype="f32") is T.scale(ind, 2)
    assert T.make_elementwise("stablehlo.add", (m, m), dtype="i1") is m


def _refuted(op: str, ins, outs, results, mesh: Mesh = M1, attrs=None) -> None:
    lemma = Lemma("must-fail", op, ins, results=results, attrs=attrs or {}, mesh=mesh)
    result = _checker().check(lemma.info(), ins, outs, mesh, lemma.context())
    assert result.status == "refuted", result.describe()


@pytest.mark.parametrize("shape", [(4,), (2, 2)])
def test_boolean_add_read_as_a_number_is_refuted(shape) -> None:
    """add on i1 is or: reading `m + m'` as the number `ind(m) + ind(m')` is refuted (both
    true: 1 against 2), and so is xor for or."""
    m, n = arg(shape, "i1"), arg(shape, "i1")
    numeric = T.make_lin([(1, T.indicator(m, "f32")), (1, T.indicator(n, "f32"))], 0, shape,
                         "f32")
    _refuted("stablehlo.add", [rel(m, "tp"), rel(n, "tp")], [rel(numeric, "tp")],
             [(tuple(s // 2 if d == 0 else s for d, s in enumerate(shape)), "i1")])
    xor = T.make_elementwise("stablehlo.xor", (m, n), dtype="i1")
    _refuted("stablehlo.add", [rel(m, "tp"), rel(n, "tp")], [rel(xor, "tp")],
             [(tuple(s // 2 if d == 0 else s for d, s in enumerate(shape)), "i1")])


@pytest.mark.parametrize("mesh", [M1, M2], ids=["tp2", "dp2xtp2"])
def test_a_wrapping_i8_sum_of_indicators_is_refuted(mesh: Mesh) -> None:
    """`ind_i8(m) * 100 + ind_i8(m') * 100` wraps in i8 (200 is -56): reading it as the f32
    sum is refuted; the i8 sum itself is proved."""
    shape = (4,)
    lay = (lambda t: rel(t, "tp")) if mesh is M1 else (lambda t: rel(t, ("dp", "tp")))
    m, n = arg(shape, "i1"), arg(shape, "i1")
    hundred = T.make_splat(100, shape, "i8")
    a = T.make_elementwise("stablehlo.multiply", (T.make_convert(m, "i8"), hundred), dtype="i8")
    b = T.make_elementwise("stablehlo.multiply", (T.make_convert(n, "i8"), hundred), dtype="i8")
    local = (shape[0] // mesh.num_devices,)
    prove_lemma(Lemma("i8-sum", "stablehlo.add", [lay(a), lay(b)], results=[(local, "i8")],
                      mesh=mesh))
    as_f32 = T.make_lin([(100, T.indicator(m, "f32")), (100, T.indicator(n, "f32"))], 0,
                        shape, "f32")
    _refuted("stablehlo.add", [lay(a), lay(b)], [lay(as_f32)], [(local, "i8")], mesh=mesh)


@pytest.mark.parametrize("chain", [("f32", "bf16"), ("f16", "bf16"), ("i32", "f32")])
def test_a_rounding_round_trip_is_not_the_identity(chain) -> None:
    """f32 -> bf16, f16 -> bf16 (bf16 lacks f16's precision), i32 -> f32 round: the convert
    back is not the identity on the original value; claiming it is, is refuted."""
    source, middle = chain
    x = arg((4,), source)
    there = T.make_elementwise("stablehlo.convert", (x,), (source,), dtype=middle)
    assert there is not x and there.dtype == middle
    _refuted("stablehlo.convert", [rel(there, "tp")], [rel(x, "tp")], [((2,), source)])


def test_select_of_constants_with_the_wrong_offset_is_refuted() -> None:
    """`select(p, 3, -1)` is `-1 + 4 * ind(p)`; `-1 + 3 * ind(p)` is refuted."""
    p = _compare(arg((4,)))
    wrong = T.make_lin([(3, T.indicator(p, "f32"))], -1, (4,), "f32")
    _refuted("stablehlo.select", [rel(p, "tp"), rel(T.make_splat(3, (4,), "f32"), "tp"),
                                  rel(T.make_splat(-1, (4,), "f32"), "tp")],
             [rel(wrong, "tp")], [((2,), "f32")])
