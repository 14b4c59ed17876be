"""The general tier's own term constructions, grounded in the semantics: each collective's
per-device terms (`expand.collective`) evaluated on random values equal what
`semantics/collectives.py` computes from the same values device by device, on a 2 x 2 mesh
with groups over either axis and both; a `dynamic_update_slice` at concrete offsets
(`expand.update_slice`) equals the op's semantics; a concrete integer array's term
(`expand.concrete_term`) evaluates to it. Each has a wrong variant that must differ."""

from __future__ import annotations

import random
from fractions import Fraction

import numpy as np
import pytest

from entangle_mlir.analysis.general.expand import (
    Local,
    NotExpanded,
    collective,
    concrete_term,
    scatter_box,
    update_slice,
)
from entangle_mlir.core.mesh import Mesh
from entangle_mlir.core.normal_form import slice_term
from entangle_mlir.core.terms import make_arg, make_lin
from entangle_mlir.mlir.opinfo import OpInfo, TensorType
from entangle_mlir.semantics.collectives import COLLECTIVE_SEMANTICS
from entangle_mlir.semantics.evaluate import evaluate_term
from entangle_mlir.semantics.tensor import dynamic_update_slice, scatter

MESH = Mesh((("x", 2), ("y", 2)))
GROUPS = {"x": [[0, 2], [1, 3]], "y": [[0, 1], [2, 3]], "xy": [[0, 1, 2, 3]],
          "yx": [[0, 2, 1, 3]]}


def _values(shape, seed: int) -> np.ndarray:
    rng = random.Random(seed)
    out = np.empty(shape, dtype=object)
    for idx in np.ndindex(shape):
        out[idx] = Fraction(rng.randint(-20, 20), rng.choice((1, 2, 3)))
    return out


def _info(name: str, attrs: dict, shape, result_shape) -> OpInfo:
    return OpInfo(name, {"channel_handle": 1, "use_global_device_ids": True, **attrs},
                  [TensorType(shape, "f32")], [TensorType(result_shape, "f32")])


def _run(info: OpInfo, shape) -> tuple[list, list]:
    """(per-device values of the combined terms, per-device values of the semantics)."""
    n = MESH.num_devices
    args = [make_arg(d, shape, "f32") for d in range(n)]
    env = {d: _values(shape, d) for d in range(n)}
    terms = collective(info, [[Local("f32", shape, term=a) for a in args]], MESH)[0]
    got = [evaluate_term(local.term, env) for local in terms]
    want = [r[0] for r in COLLECTIVE_SEMANTICS[info.name](info, MESH,
                                                          [[env[d]] for d in range(n)])]
    return got, want


def _same(got, want) -> bool:
    return all(g.shape == w.shape and all(a == b for a, b in zip(g.flat, w.flat))
               for g, w in zip(got, want))


CASES = [
    ("stablehlo.all_reduce", {"reducer": "add"}, (2, 3), (2, 3)),
    ("stablehlo.all_reduce", {"reducer": "max"}, (2, 3), (2, 3)),
    ("stablehlo.all_reduce", {"reducer": "min"}, (3,), (3,)),
    ("stablehlo.all_gather", {"all_gather_dim": 0}, (2, 3), None),
    ("stablehlo.all_gather", {"all_gather_dim": 1}, (2, 3), None),
    ("stablehlo.reduce_scatter", {"reducer": "add", "scatter_dimension": 0}, (4, 3), None),
    ("stablehlo.all_to_all", {"split_dimension": 0, "concat_dimension": 1}, (4, 2), None),
    ("stablehlo.all_to_all", {"split_dimension": 1, "concat_dimension": 0}, (2, 4), None),
]


def _result_shape(name, attrs, shape, count):
    shape = list(shape)
    if name == "stablehlo.all_gather":
        shape[attrs["all_gather_dim"]] *= count
    elif name == "stablehlo.reduce_scatter":
        shape[attrs["scatter_dimension"]] //= count
    elif name == "stablehlo.all_to_all":
        shape[attrs["split_dimension"]] //= count
        shape[attrs["concat_dimension"]] *= count
    return tuple(shape)


@pytest.mark.parametrize("groups", list(GROUPS))
@pytest.mark.parametrize("name,attrs,shape,_", CASES)
def test_collective_terms_match_the_semantics(groups, name, attrs, shape, _) -> None:
    replica_groups = GROUPS[groups]
    count = len(replica_groups[0])
    if name == "stablehlo.all_to_all":
        attrs = {**attrs, "split_count": count}
    attrs = {**attrs, "replica_groups": replica_groups}
    info = _info(name, attrs, shape, _result_shape(name, attrs, shape, count))
    got, want = _run(info, shape)
    assert _same(got, want)


@pytest.mark.parametrize("name,attrs,shape,_", CASES)
def test_collective_terms_must_fail_on_other_groups(name, attrs, shape, _) -> None:
    """The terms for groups over 'x' do not compute the semantics of groups over 'y'."""
    if name == "stablehlo.all_to_all":
        attrs = {**attrs, "split_count": 2}
    result = _result_shape(name, attrs, shape, 2)
    ours = _info(name, {**attrs, "replica_groups": GROUPS["x"]}, shape, result)
    theirs = _info(name, {**attrs, "replica_groups": GROUPS["y"]}, shape, result)
    n = MESH.num_devices
    args = [make_arg(d, shape, "f32") for d in range(n)]
    env = {d: _values(shape, d) for d in range(n)}
    terms = collective(ours, [[Local("f32", shape, term=a) for a in args]], MESH)[0]
    got = [evaluate_term(local.term, env) for local in terms]
    want = [r[0] for r in COLLECTIVE_SEMANTICS[name](theirs, MESH, [[env[d]] for d in range(n)])]
    assert not _same(got, want)


def test_collective_permute_terms() -> None:
    pairs = [[0, 1], [1, 2], [2, 3]]
    info = OpInfo("stablehlo.collective_permute",
                  {"channel_handle": 1, "source_target_pairs": pairs},
                  [TensorType((2,), "f32")], [TensorType((2,), "f32")])
    got, want = _run(info, (2,))
    assert _same(got, want)
    assert all(v == 0 for v in got[0].flat)  # nobody sends to device 0
    wrong = OpInfo(info.name, {**info.attrs, "source_target_pairs": [[1, 0], [2, 1], [3, 2]]},
                   info.operand_types, info.result_types)
    got_wrong, _ = _run(wrong, (2,))
    assert not _same(got_wrong, want)


def test_bad_groups_are_not_expanded() -> None:
    info = _info("stablehlo.all_reduce", {"reducer": "add", "replica_groups": [[0, 1], [1, 2]]},
                 (2,), (2,))
    with pytest.raises(NotExpanded):
        _run(info, (2,))


@pytest.mark.parametrize("shape,update,starts", [((6,), (2,), (3,)), ((4, 5), (2, 3), (1, 2)),
                                                 ((4, 5), (4, 2), (0, 3)),
                                                 ((3, 4, 2), (1, 4, 1), (2, 0, 1))])
def test_update_slice_is_dynamic_update_slice(shape, update, starts) -> None:
    x, u = make_arg(0, shape, "f32"), make_arg(1, update, "f32")
    env = {0: _values(shape, 0), 1: _values(update, 1)}
    got = evaluate_term(update_slice(x, u, starts), env)
    want = dynamic_update_slice(env[0], env[1], list(starts))
    assert _same([got], [want])
    moved = [s - 1 if s else s + 1 for s in starts]
    assert not _same([got], [dynamic_update_slice(env[0], env[1], moved)])


@pytest.mark.parametrize("values,dtype", [
    ([3, 3, 3], "i32"), ([8, 9, 10, 11], "i32"), ([12, 8, 4, 0], "ui32"),
    ([[4, 4], [5, 5], [6, 6]], "i32"), ([1, 5, 2], "i32"), ([True, False, True], "i1"),
    ([120, 121, 122, 123, 124, 125, 126, 127], "i8")])
def test_concrete_terms_hold_their_values(values, dtype) -> None:
    array = np.array(values, dtype=object)
    term = concrete_term(array, dtype)
    if term.op == "dense":
        from entangle_mlir.core.terms import DENSE_VALUES

        got = np.asarray(DENSE_VALUES[term.attrs[0]])
    else:
        got = evaluate_term(term, {})
    assert [int(v) for v in np.ravel(got)] == [int(v) for v in array.flat]
    assert term.shape == array.shape and term.dtype == dtype


def _scatter_info(index_vector_dim: int = 1) -> OpInfo:
    """A scatter of rows (update window dim 1) into a (4, 3) operand at row indices."""
    return OpInfo("stablehlo.scatter", {"update_window_dims": (1,),
                                        "inserted_window_dims": (0,),
                                        "scatter_dims_to_operand_dims": (0,),
                                        "index_vector_dim": index_vector_dim,
                                        "reducer": "add"},
                  [TensorType((4, 3), "f32")], [TensorType((4, 3), "f32")])


def test_a_scatter_at_concrete_indices_is_an_update_of_one_box() -> None:
    """Rows 1 and 2 written in order are the box [1, 3) (and the update slice it builds
    equals the scatter's semantics); rows written twice, out of order, or apart are no
    box (None: the scatter's own rule reads them)."""
    info = _scatter_info()
    rows = np.array([[1], [2]], dtype=object)
    assert scatter_box(info, (4, 3), rows, (2, 3)) == ([1, 0], (2, 3))
    x, u = make_arg(0, (4, 3), "f32"), make_arg(1, (2, 3), "f32")
    env = {0: _values((4, 3), 1), 1: _values((2, 3), 2)}
    placed = update_slice(x, make_lin([(Fraction(1), slice_term(x, 0, 1, 3)),
                                       (Fraction(1), u)], Fraction(0), (2, 3), "f32"), [1, 0])
    want = scatter(env[0], rows, env[1], {"update_window_dims": (1,),
                                          "inserted_window_dims": (0,),
                                          "scatter_dims_to_operand_dims": (0,),
                                          "index_vector_dim": 1}, "add")
    assert _same([evaluate_term(placed, env)], [want])
    for wrong in ([[1], [1]], [[2], [1]], [[0], [2]]):
        assert scatter_box(info, (4, 3), np.array(wrong, dtype=object), (2, 3)) is None
