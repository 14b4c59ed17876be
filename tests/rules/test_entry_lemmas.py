"""Z3 lemmas of one entry of each device's block (rules/kinds/entries.py): device b holds
R[b*L + i] along one dim. Each rule's output is checked by the instance checker on several
shapes (local blocks of 2, 3 and 4 entries, meshes of 2, 3 and 4 devices), and the nearest
wrong claims (another entry, a block of another size, entries skipped or summed out of place,
two entries' dims contracted instead of batched) are refuted or not made."""

from __future__ import annotations

from dataclasses import replace

import pytest

from entangle_mlir.core import intervals
from entangle_mlir.core import terms as T
from entangle_mlir.core.mesh import Mesh
from entangle_mlir.core.relations import InBlock, Masked, Opaque, Rel, Value, Windowed
from entangle_mlir.mlir.opinfo import OpInfo, TensorType
from entangle_mlir.rules import RULES
from entangle_mlir.rules.kinds.entries import make_entry
from entangle_mlir.rules.kinds.window import is_entry
from tests.rules.test_lemmas import Lemma, _checker, arg, local_type, rel, splat

SHAPES = [(Mesh((("tp", 2),)), 2), (Mesh((("tp", 3),)), 3), (Mesh((("tp", 4),)), 2),
          (Mesh((("tp", 2),)), 4)]
IDS = [f"tp{m.size('tp')}-L{n}" for m, n in SHAPES]


def _entry(shape: tuple[int, ...], dim: int, index: int) -> Windowed:
    """Entry `index` of each device's block of a fresh argument split over tp along `dim`."""
    tiling = [()] * len(shape)
    tiling[dim] = ("tp",)
    return make_entry(Rel(arg(shape), tuple(tiling)), dim, index)


def _mask(length: int, index: int, tokens: int = 3) -> InBlock:
    """`ids == L*b + index` of replicated int ids."""
    ids = Rel(arg((tokens,), "i32"), ((),))
    return InBlock(ids, ("tp",), length, intervals.interval(index, index + 1))


def _info(op: str, ins: list[Value], mesh: Mesh, results, attrs=None) -> OpInfo:
    types = [TensorType((3,), "i1") if isinstance(v, InBlock) else local_type(v, mesh)
             for v in ins]
    return OpInfo(op, dict(attrs or {}), types, [TensorType(tuple(s), d) for s, d in results])


def _run(op: str, ins: list[Value], mesh: Mesh, results, attrs=None) -> tuple[OpInfo, list]:
    lemma = Lemma("entry", op, ins, results=results, attrs=attrs or {}, mesh=mesh)
    info = _info(op, ins, mesh, results, attrs)
    return info, RULES[op](info, list(ins), lemma.context())


def _proved(op: str, ins: list[Value], mesh: Mesh, results, attrs=None) -> list[Value]:
    info, outs = _run(op, ins, mesh, results, attrs)
    assert outs and not any(isinstance(v, Opaque) for v in outs), outs
    ctx = Lemma("entry", op, ins, results=results, mesh=mesh).context()
    result = _checker().check(info, ins, outs, mesh, ctx)
    assert result.status == "proved", result.describe()
    return outs


def _refuted(op: str, ins: list[Value], outs: list[Value], mesh: Mesh, results,
             attrs=None) -> None:
    info = _info(op, ins, mesh, results, attrs)
    ctx = Lemma("entry", op, ins, results=results, mesh=mesh).context()
    result = _checker().check(info, ins, outs, mesh, ctx)
    assert result.status == "refuted", result.describe()


def _other_entry(value: Windowed, index: int) -> Windowed:
    return replace(value, offset=index)


@pytest.mark.parametrize(("mesh", "length"), SHAPES, ids=IDS)
def test_one_value_mask_is_an_entry_of_the_one_hot(mesh: Mesh, length: int) -> None:
    """`convert(ids == L*b + i)` is entry i of the block of `one_hot(ids)` (as numbers); the
    entry one off and the entry of a one-hot cut in blocks of another size are refuted."""
    for index in (0, length - 1):
        mask = _mask(length, index)
        (out,) = _proved("stablehlo.convert", [mask], mesh, [((3,), "f32")])
        assert is_entry(out) and out.offset == index
        _refuted("stablehlo.convert", [mask], [_other_entry(out, (index + 1) % length)], mesh,
                 [((3,), "f32")])
        wider = T.make_broadcast(mask.rel.term, (0,), (3, (length + 1) * mesh.size("tp")))
        hot = T.make_elementwise("stablehlo.compare", (wider, T.make_iota(
            wider.shape, 1, "i32")), ("EQ",), "i1")
        bigger = make_entry(Rel(T.indicator(hot, "f32"), ((), ("tp",))), 1, index)
        _refuted("stablehlo.convert", [mask], [bigger], mesh, [((3,), "f32")])


@pytest.mark.parametrize(("mesh", "length"), SHAPES, ids=IDS)
def test_select_on_a_one_value_mask(mesh: Mesh, length: int) -> None:
    """`where(ids == L*b + i, v, 0)` for a replicated v: entry i of `where(one_hot, v, 0)`."""
    mask, value = _mask(length, length - 1), rel(arg((3,)))
    (out,) = _proved("stablehlo.select", [mask, value, splat(0, (3,))], mesh, [((3,), "f32")])
    _refuted("stablehlo.select", [mask, value, splat(0, (3,))], [_other_entry(out, 0)], mesh,
             [((3,), "f32")])


@pytest.mark.parametrize(("mesh", "length"), SHAPES, ids=IDS)
def test_elementwise_of_entries(mesh: Mesh, length: int) -> None:
    """Entries of one index at different dims of their tensors, and a value that does not
    depend on the index: the entry of the op on the aligned tensors. Two entries of different
    indices are not combined, nor an entry with a value split over the entry's axes (each
    device's own block of it: a block on the diagonal)."""
    n = length * mesh.size("tp")
    a, b = _entry((3, n, 2), 1, 1 % length), _entry((n, 3, 2), 0, 1 % length)
    (out,) = _proved("stablehlo.multiply", [a, b], mesh, [((3, 2), "f32")])
    _refuted("stablehlo.multiply", [a, b], [_other_entry(out, (1 + 1) % length)], mesh,
             [((3, 2), "f32")])
    _proved("stablehlo.add", [a, rel(arg((3, 2)))], mesh, [((3, 2), "f32")])
    _proved("stablehlo.tanh", [a], mesh, [((3, 2), "f32")])
    _, outs = _run("stablehlo.multiply", [a, _other_entry(b, 0 if length > 1 else 1)], mesh,
                   [((3, 2), "f32")])
    assert isinstance(outs[0], Opaque), outs
    split = rel(arg((3 * mesh.size("tp"), 2)), "tp")
    _, outs = _run("stablehlo.multiply", [a, split], mesh, [((3, 2), "f32")])
    assert isinstance(outs[0], Opaque), outs


@pytest.mark.parametrize(("mesh", "length"), SHAPES, ids=IDS)
def test_reduce_of_an_entry_over_other_dims(mesh: Mesh, length: int) -> None:
    n = length * mesh.size("tp")
    a = _entry((3, 2, n), 2, length - 1)
    attrs = {"dimensions": (1,), "reducer": "add"}
    (out,) = _proved("stablehlo.reduce", [a, splat(0, (), "f32")], mesh, [((3,), "f32")], attrs)
    _refuted("stablehlo.reduce", [a, splat(0, (), "f32")], [_other_entry(out, 0)], mesh,
             [((3,), "f32")], attrs)
    _proved("stablehlo.reduce", [a, splat(float("-inf"), (), "f32")], mesh, [((3,), "f32")],
            {"dimensions": (1,), "reducer": "max"})


@pytest.mark.parametrize(("mesh", "length"), SHAPES, ids=IDS)
def test_dot_of_entries(mesh: Mesh, length: int) -> None:
    """One entry: its dim a free dim of the dot (either side). Two entries of one index: their
    dims the first batch dim; the claim that contracts them instead is refuted."""
    n = length * mesh.size("tp")
    x, w = rel(arg((3, 4))), _entry((n, 4, 2), 0, length - 1)
    contract = {"lhs_batch": (), "rhs_batch": (), "lhs_contract": (1,), "rhs_contract": (0,)}
    (out,) = _proved("stablehlo.dot_general", [x, w], mesh, [((3, 2), "f32")], contract)
    assert is_entry(out) and out.dim == 1
    _proved("stablehlo.dot_general", [w, rel(arg((2, 5)))], mesh, [((4, 5), "f32")],
            {"lhs_batch": (), "rhs_batch": (), "lhs_contract": (1,), "rhs_contract": (0,)})
    h = _entry((3, n, 4), 1, length - 1)
    (both,) = _proved("stablehlo.dot_general", [h, w], mesh, [((3, 2), "f32")], contract)
    assert both.dim == 0
    summed = T.make_dot(h.rel.term, w.rel.term, ((), (), (1, 2), (0, 1)), (3, 2), "f32")
    wrong = Rel(summed, ((), ()), ("tp",), "sum")
    _refuted("stablehlo.dot_general", [h, w], [wrong], mesh, [((3, 2), "f32")], contract)


@pytest.mark.parametrize(("mesh", "length"), SHAPES, ids=IDS)
def test_slice_of_one_row_reshaped_is_an_entry(mesh: Mesh, length: int) -> None:
    n = length * mesh.size("tp")
    w = Windowed(rel(arg((n, 4)), "tp"), 0, length - 1, 1)
    (out,) = _proved("stablehlo.reshape", [w], mesh, [((4,), "f32")])
    assert is_entry(out)
    _refuted("stablehlo.reshape", [w], [_other_entry(out, 0)], mesh, [((4,), "f32")])


@pytest.mark.parametrize(("mesh", "length"), SHAPES, ids=IDS)
def test_entries_of_a_product_sum_to_the_contraction(mesh: Mesh, length: int) -> None:
    """The loop re-rolled: entries 0..L-1 of `c * y` (c [T, E], y [E, T, D]) added in order
    are the block's partial sum, in the reference's form `dot_general(c, y)` contracting E
    when the reference computes it; with an entry left out the sum is no partial sum (a
    window of the block) and claiming the partial sum is refuted."""
    n = length * mesh.size("tp")
    c, y = arg((3, n)), arg((n, 3, 2))
    dot = T.make_dot(c, y, ((0,), (1,), (1,), (0,)), (3, 2), "f32")
    product = T.make_mul(T.make_broadcast(c, (1, 0), (n, 3, 2)), y)
    entries = [make_entry(Rel(product, (("tp",), (), ())), 0, i) for i in range(length)]
    mesh_ctx = Lemma("entry", "stablehlo.add", [], mesh=mesh).context()
    ctx = replace(mesh_ctx, reference=frozenset({dot.serial}))
    total: Value = entries[0]
    for e in entries[1:]:
        info = _info("stablehlo.add", [total, e], mesh, [((3, 2), "f32")])
        (joined,) = RULES["stablehlo.add"](info, [total, e], ctx)
        result = _checker().check(info, [total, e], [joined], mesh, ctx)
        assert result.status == "proved", result.describe()
        total = joined
    assert isinstance(total, Rel) and total.term is dot and total.partial == ("tp",), total
    if length > 2:
        first, last = entries[0], entries[-1]
        info = _info("stablehlo.add", [first, last], mesh, [((3, 2), "f32")])
        (gap,) = RULES["stablehlo.add"](info, [first, last], ctx)
        assert not isinstance(gap, Rel), gap
        _refuted("stablehlo.add", [first, last], [Rel(dot, ((), ()), ("tp",), "sum")], mesh,
                 [((3, 2), "f32")])


def test_products_sum_to_the_dot_only_in_the_reference_form() -> None:
    """`sum(a * b)` over a dim both vary along becomes the dot_general only where the reference
    computes that dot_general (an exact identity; otherwise the sum is kept as written)."""
    from entangle_mlir.rules.kinds.window import sum_out

    a, b = arg((3, 4)), arg((3, 4))
    product = T.make_mul(a, b)
    dot = T.make_dot(a, b, ((0,), (0,), (1,), (1,)), (3,), "f32")
    assert sum_out(product, (1,), "f32", frozenset({dot.serial})) is dot
    kept = sum_out(product, (1,), "f32", frozenset())
    assert kept.op == "reduce_sum"
    masked = T.make_elementwise("stablehlo.select", (
        T.make_elementwise("stablehlo.compare", (arg((3, 4), "i32"), T.make_splat(
            0, (3, 4), "i32")), ("EQ",), "i1"), a, T.make_splat(0, (3, 4), "f32")), ())
    hot = T.indicator(masked.args[0], "f32")
    masked_dot = T.make_dot(a, hot, ((0,), (0,), (1,), (1,)), (3,), "f32")
    assert sum_out(masked, (1,), "f32", frozenset({masked_dot.serial})) is masked_dot


@pytest.mark.parametrize(("mesh", "length"), [(Mesh((("tp", 4),)), 1), *SHAPES],
                         ids=["tp4-L1", *IDS])
def test_sum_of_a_value_masked_by_one_entry(mesh: Mesh, length: int) -> None:
    """`sum(where(ids == L*b + i, v, 0), -1)` (with L = 1 the test is the device's whole
    block, a `Masked` value): entry i of the sum of `where(one_hot(ids), v, 0)`; the entry
    one off is refuted."""
    ids = Rel(arg((3, 2), "i32"), ((), ()))
    pred = InBlock(ids, ("tp",), length, intervals.interval(length - 1, length))
    masked = Masked(rel(arg((3, 2))), pred, zero=True)
    attrs = {"dimensions": (1,), "reducer": "add"}
    ins = [masked, splat(0, (), "f32")]
    info = OpInfo("stablehlo.reduce", attrs, [TensorType((3, 2), "f32"), TensorType((), "f32")],
                  [TensorType((3,), "f32")])
    ctx = Lemma("entry", "stablehlo.reduce", [], mesh=mesh).context()
    (out,) = RULES["stablehlo.reduce"](info, ins, ctx)
    assert is_entry(out) and out.offset == length - 1, out
    assert _checker().check(info, ins, [out], mesh, ctx).status == "proved"
    if length > 1:
        wrong = _other_entry(out, 0)
        assert _checker().check(info, ins, [wrong], mesh, ctx).status == "refuted"
