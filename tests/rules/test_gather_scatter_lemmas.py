"""Lemmas for the gather / scatter / dynamic_update_slice rules (rules/gather_scatter.py).

* `GATHER_SCATTER_LEMMAS`: rule instances Z3 must prove on small symbolic tensors (indices are
  symbolic integers, so every index value is covered, out-of-range ones included), on 1-D and
  2-D meshes. `tests/rules/test_lemmas.py` can add them to `ALL_LEMMAS` (see the bottom of this
  file).
* must-fail lemmas: wrong relations built by hand (the naive rules a partitioner bug or a sloppy
  rule would give) that Z3 must refute;
* refusals: inputs the rules must leave opaque;
* canonical forms of the terms the rules build;
* grounding: the semantics the proofs use for gather, scatter and dynamic_update_slice agree
  with XLA on random inputs, out-of-bounds indices included (gather clamps, scatter skips).
"""

from __future__ import annotations

import os
from fractions import Fraction

import numpy as np
import pytest

from entangle_mlir.core import terms as T
from entangle_mlir.core.mesh import Mesh
from entangle_mlir.core.relations import DeviceScalar, Opaque, Rel
from entangle_mlir.rules import RULES
from entangle_mlir.rules import gather_scatter as G
from entangle_mlir.rules.base import RuleContext
from entangle_mlir.semantics.evaluate import evaluate_term
from entangle_mlir.semantics.ops import OP_SEMANTICS
from entangle_mlir.semantics.tensor import obj_array
from tests.rules.test_lemmas import M1, M2, Lemma, _checker, arg, prove_lemma, refute, rel, splat

GATHER = "stablehlo.gather"
SCATTER = "stablehlo.scatter"
DUS = "stablehlo.dynamic_update_slice"

ROWS = {"offset_dims": (1,), "collapsed_slice_dims": (0,), "start_index_map": (0,),
        "index_vector_dim": 1}
"""jnp `table[ids]`: gather rows of a 2-D table with ids of shape (n, 1)."""
POINTS = {"offset_dims": (), "collapsed_slice_dims": (0, 1), "start_index_map": (0, 1),
          "index_vector_dim": 1}
"""`x[i, j]` for a list of (i, j) pairs: a 2-D index vector."""
SCATTER_ROWS = {"update_window_dims": (1,), "inserted_window_dims": (0,),
                "scatter_dims_to_operand_dims": (0,), "index_vector_dim": 1}
M4 = Mesh((("tp", 4),))


def gather_lemmas() -> list[Lemma]:
    out = []
    for rows, width in ((4, 4), (3, 6)):
        table, ids = arg((rows, width)), arg((4, 1), "i32")
        out += [
            Lemma(f"gs-gather-hidden-split-{rows}x{width}", GATHER,
                  [rel(table, (), "tp"), rel(ids)], results=[((4, width // 2), "f32")],
                  attrs={**ROWS, "slice_sizes": (1, width // 2)}),
            Lemma(f"gs-gather-ids-split-{rows}x{width}", GATHER,
                  [rel(table), rel(ids, "tp")], results=[((2, width), "f32")],
                  attrs={**ROWS, "slice_sizes": (1, width)}),
            Lemma(f"gs-gather-partial-max-{rows}x{width}", GATHER,
                  [rel(table, partial=("tp",), kind="max"), rel(ids)],
                  results=[((4, width), "f32")], attrs={**ROWS, "slice_sizes": (1, width)}),
        ]
    # A 2-D index vector (points), indices split over a 2-D mesh.
    out.append(Lemma("gs-gather-points-2d", GATHER,
                     [rel(arg((3, 2))), rel(arg((4, 2), "i32"), ("dp", "tp"))],
                     results=[((1,), "f32")], attrs={**POINTS, "slice_sizes": (1, 1)}, mesh=M2))
    # Windows of two rows; the window's columns split over tp, ids over dp.
    out.append(Lemma("gs-gather-window-2d", GATHER,
                     [rel(arg((4, 4)), (), "tp"), rel(arg((2, 1), "i32"), "dp")],
                     results=[((1, 2, 2), "f32")],
                     attrs={"offset_dims": (1, 2), "collapsed_slice_dims": (),
                            "start_index_map": (0,), "index_vector_dim": 1,
                            "slice_sizes": (2, 2)}, mesh=M2))
    # index_vector_dim past the last dim (implicit index vector of size 1).
    out.append(Lemma("gs-gather-implicit-vector", GATHER,
                     [rel(arg((4, 4)), (), "tp"), rel(arg((3,), "i32"))],
                     results=[((3, 2), "f32")],
                     attrs={"offset_dims": (1,), "collapsed_slice_dims": (0,),
                            "start_index_map": (0,), "index_vector_dim": 1,
                            "slice_sizes": (1, 2)}))
    return out


def scatter_lemmas() -> list[Lemma]:
    out = []
    for kind in ("add", "replace"):
        out.append(Lemma(f"gs-scatter-{kind}-window-split", SCATTER,
                         [rel(arg((3, 4)), (), "tp"), rel(arg((2, 1), "i32")),
                          rel(arg((2, 4)), (), "tp")], results=[((3, 2), "f32")],
                         attrs={**SCATTER_ROWS, "reducer": kind}))
    out += [
        # Updates split over tp into a replicated operand: the operand counts twice.
        Lemma("gs-scatter-add-tokens-into-replicated", SCATTER,
              [rel(arg((3, 2))), rel(arg((4, 1), "i32"), "tp"), rel(arg((4, 2)), "tp")],
              results=[((3, 2), "f32")], attrs={**SCATTER_ROWS, "reducer": "add"}),
        # Partial updates into a replicated operand (the operand counts twice).
        Lemma("gs-scatter-add-partial-updates", SCATTER,
              [rel(arg((3, 2))), rel(arg((2, 1), "i32")), rel(arg((2, 2)), partial=("tp",))],
              results=[((3, 2), "f32")], attrs={**SCATTER_ROWS, "reducer": "add"}),
        # Replace is jointly linear in (operand, updates) at fixed indices: partial operand
        # and partial updates alike, or a partial operand with replicated updates (counted
        # |tp| times by the sum, once by a max).
        Lemma("gs-scatter-replace-partial", SCATTER,
              [rel(arg((3, 2)), partial=("tp",)), rel(arg((2, 1), "i32")),
               rel(arg((2, 2)), partial=("tp",))],
              results=[((3, 2), "f32")], attrs={**SCATTER_ROWS, "reducer": "replace"}),
        Lemma("gs-scatter-replace-partial-operand", SCATTER,
              [rel(arg((3, 2)), partial=("tp",)), rel(arg((2, 1), "i32")), rel(arg((2, 2)))],
              results=[((3, 2), "f32")], attrs={**SCATTER_ROWS, "reducer": "replace"}),
        Lemma("gs-scatter-replace-partial-max", SCATTER,
              [rel(arg((3, 2)), partial=("tp",), kind="max"), rel(arg((2, 1), "i32")),
               rel(arg((2, 2)))],
              results=[((3, 2), "f32")], attrs={**SCATTER_ROWS, "reducer": "replace"}),
        # 2-D mesh: tokens over dp, columns over tp.
        Lemma("gs-scatter-add-2d", SCATTER,
              [splat(0, (3, 2)), rel(arg((4, 1), "i32"), "dp"), rel(arg((4, 4)), "dp", "tp")],
              results=[((3, 2), "f32")], attrs={**SCATTER_ROWS, "reducer": "add"}, mesh=M2),
    ]
    return out


def dus_lemmas() -> list[Lemma]:
    return [
        # Blocks placed after a constant base (the zero-padded form of an all_gather into a
        # larger buffer).
        Lemma("gs-dus-placed-with-base", DUS,
              [splat(0, (7, 2)), rel(arg((4, 2)), "tp"), DeviceScalar((1, 3), ()),
               splat(0, (), "i32")], results=[((7, 2), "f32")]),
        Lemma("gs-dus-placed-4", DUS,
              [splat(0, (4, 2)), rel(arg((4, 2)), "tp"), DeviceScalar((0, 1, 2, 3), ()),
               splat(0, (), "i32")], results=[((4, 2), "f32")], mesh=M4),
        # Offsets clamped into range (7 -> 2 for a 2-row update into 4 rows).
        Lemma("gs-dus-clamped", DUS,
              [rel(arg((4, 4)), (), "tp"), rel(arg((2, 4)), (), "tp"), splat(7, (), "i32"),
               splat(0, (), "i32")], results=[((4, 2), "f32")]),
        Lemma("gs-dus-partial-max", DUS,
              [rel(arg((4, 3)), partial=("tp",), kind="max"), rel(arg((2, 3))),
               splat(1, (), "i32"), splat(0, (), "i32")], results=[((4, 3), "f32")]),
        # Pieces of a partial sum over dp placed by their tp block: a partial sum over both.
        Lemma("gs-dus-placed-partial", DUS,
              [splat(0, (4, 2)), rel(arg((4, 2)), "tp", partial=("dp",)),
               DeviceScalar((0, 2, 0, 2), ()), splat(0, (), "i32")],
              results=[((4, 2), "f32")], mesh=M2),
        Lemma("gs-dus-2d-rows-dp", DUS,
              [rel(arg((4, 4)), "dp"), rel(arg((4, 2)), "dp"), splat(0, (), "i32"),
               splat(1, (), "i32")], results=[((2, 4), "f32")], mesh=M2),
    ]


GATHER_SCATTER_LEMMAS = gather_lemmas() + scatter_lemmas() + dus_lemmas()


@pytest.mark.parametrize("lemma", GATHER_SCATTER_LEMMAS,
                         ids=[lemma.name for lemma in GATHER_SCATTER_LEMMAS])
def test_gather_scatter_lemma(lemma: Lemma) -> None:
    prove_lemma(lemma)


@pytest.mark.parametrize("lemma", GATHER_SCATTER_LEMMAS,
                         ids=[lemma.name for lemma in GATHER_SCATTER_LEMMAS])
def test_gather_scatter_lemma_is_not_vacuous(lemma: Lemma) -> None:
    """Doubling the proved output term must be refuted."""
    info = lemma.info()
    ctx = lemma.context()
    outs = RULES[lemma.op](info, list(lemma.ins), ctx)
    wrong = [v.with_term(T.scale(v.term, 2)) if isinstance(v, Rel) else v for v in outs]
    result = _checker().check(info, lemma.ins, wrong, lemma.mesh, ctx)
    assert result.status == "refuted", f"{lemma.name}: {result.describe()}"


def test_every_gather_scatter_rule_has_lemmas() -> None:
    covered = {lemma.op for lemma in GATHER_SCATTER_LEMMAS}
    assert covered == set(G.GATHER_SCATTER_RULES)


# ----- must-fail lemmas ---------------------------------------------------------------------

def _gather_term(table: T.Term, ids: T.Term, sizes, shape) -> T.Term:
    return G.make_gather(table, ids, {**ROWS, "operand_batching_dims": (),
                                      "start_indices_batching_dims": ()}, sizes, shape, "f32")


def _scatter_term(x: T.Term, ids: T.Term, upd: T.Term, kind: str = "add") -> T.Term:
    dims = {**SCATTER_ROWS, "input_batching_dims": (), "scatter_indices_batching_dims": ()}
    return G.make_scatter(x, ids, upd, dims, kind)


def test_refutes_gather_from_row_split_table_as_a_tiling() -> None:
    """The naive rule: every device gathers from its own rows with the global ids."""
    table, ids = arg((4, 2)), arg((3, 1), "i32")
    claim = rel(_gather_term(table, ids, (1, 2), (3, 2)))
    refute(GATHER, [rel(table, "tp"), rel(ids)], [claim], [((3, 2), "f32")],
           {**ROWS, "slice_sizes": (1, 2)})


def test_refutes_gather_from_row_split_table_as_a_partial_sum() -> None:
    """Without the mask and the offset, the per-device gathers do not add up to the gather."""
    table, ids = arg((4, 2)), arg((3, 1), "i32")
    claim = rel(_gather_term(table, ids, (1, 2), (3, 2)), partial=("tp",))
    refute(GATHER, [rel(table, "tp"), rel(ids)], [claim], [((3, 2), "f32")],
           {**ROWS, "slice_sizes": (1, 2)})


def test_refutes_scatter_add_of_split_tokens_without_all_reduce() -> None:
    x, ids, upd = arg((3, 2)), arg((4, 1), "i32"), arg((4, 2))
    claim = rel(_scatter_term(x, ids, upd))
    refute(SCATTER, [rel(x), rel(ids, "tp"), rel(upd, "tp")], [claim], [((3, 2), "f32")],
           {**SCATTER_ROWS, "reducer": "add"})


def test_refutes_scatter_add_partial_updates_with_operand_counted_once() -> None:
    x, ids, upd = arg((3, 2)), arg((2, 1), "i32"), arg((2, 2))
    claim = rel(_scatter_term(x, ids, upd), partial=("tp",))
    refute(SCATTER, [rel(x), rel(ids), rel(upd, partial=("tp",))], [claim], [((3, 2), "f32")],
           {**SCATTER_ROWS, "reducer": "add"})


def test_refutes_scatter_replace_of_partial_with_updates_counted_once() -> None:
    x, ids, upd = arg((3, 2)), arg((2, 1), "i32"), arg((2, 2))
    claim = rel(_scatter_term(x, ids, upd, "replace"), partial=("tp",))
    refute(SCATTER, [rel(x, partial=("tp",)), rel(ids), rel(upd)], [claim], [((3, 2), "f32")],
           {**SCATTER_ROWS, "reducer": "replace"})


def test_refutes_scatter_replace_into_row_split_operand() -> None:
    x, ids, upd = arg((4, 2)), arg((2, 1), "i32"), arg((2, 2))
    claim = rel(_scatter_term(x, ids, upd, "replace"), "tp")
    refute(SCATTER, [rel(x, "tp"), rel(ids), rel(upd)], [claim], [((2, 2), "f32")],
           {**SCATTER_ROWS, "reducer": "replace"})


def test_refutes_placed_blocks_into_a_nonzero_buffer() -> None:
    buf, upd = arg((4, 2)), arg((4, 2))
    claim = rel(upd, partial=("tp",))
    refute(DUS, [rel(buf), rel(upd, "tp"), DeviceScalar((0, 2), ()), splat(0, (), "i32")],
           [claim], [((4, 2), "f32")])


def test_refutes_placed_blocks_with_a_wrong_offset_table() -> None:
    upd = arg((4, 2))
    claim = rel(upd, partial=("tp",))
    refute(DUS, [splat(0, (4, 2)), rel(upd, "tp"), DeviceScalar((2, 0), ()), splat(0, (), "i32")],
           [claim], [((4, 2), "f32")])


# ----- refusals -------------------------------------------------------------------------------

def _run(op: str, ins, results, attrs, mesh=M1):
    lemma = Lemma("refusal", op, ins, results=results, attrs=attrs, mesh=mesh)
    return RULES[op](lemma.info(), list(ins), lemma.context())


@pytest.mark.parametrize("case", [
    ("gather table rows split", GATHER,
     lambda: [rel(arg((4, 2)), "tp"), rel(arg((3, 1), "i32"))], [((3, 2), "f32")],
     {**ROWS, "slice_sizes": (1, 2)}, "each device would index its own block"),
    ("gather partial indices", GATHER,
     lambda: [rel(arg((4, 2))), rel(arg((3, 1), "i32"), partial=("tp",))], [((3, 2), "f32")],
     {**ROWS, "slice_sizes": (1, 2)}, "missing all_reduce"),
    ("gather index vector split", GATHER,
     lambda: [rel(arg((3, 2))), rel(arg((4, 2), "i32"), (), "tp")], [((4,), "f32")],
     {**POINTS, "slice_sizes": (1, 1)}, "index vector dim 1 is split"),
    ("scatter replace of split updates", SCATTER,
     lambda: [rel(arg((3, 2))), rel(arg((4, 1), "i32"), "tp"), rel(arg((4, 2)), "tp")],
     [((3, 2), "f32")], {**SCATTER_ROWS, "reducer": "replace"}, "overwrites its own copy"),
    ("scatter updates split, indices not", SCATTER,
     lambda: [rel(arg((3, 2))), rel(arg((4, 1), "i32")), rel(arg((4, 2)), "tp")],
     [((3, 2), "f32")], {**SCATTER_ROWS, "reducer": "add"}, "matching indices dim 0"),
    ("scatter max", SCATTER,
     lambda: [rel(arg((3, 2))), rel(arg((2, 1), "i32")), rel(arg((2, 2)))],
     [((3, 2), "f32")], {**SCATTER_ROWS, "reducer": "max"}, "'max' update computation"),
    ("dus replicated update at device offsets", DUS,
     lambda: [splat(0, (4, 2)), rel(arg((2, 2))), DeviceScalar((0, 2), ()),
              splat(0, (), "i32")], [((4, 2), "f32")], {}, "update replicated along it"),
    ("dus split dim at an offset", DUS,
     lambda: [rel(arg((4, 2)), "tp"), rel(arg((1, 2)), "tp"), splat(1, (), "i32"),
              splat(0, (), "i32")], [((2, 2), "f32")], {}, "at offset 1"),
], ids=lambda c: c[0] if isinstance(c, tuple) else "")
def test_refusals(case) -> None:
    _, op, ins, results, attrs, reason = case
    outs = _run(op, ins(), results, attrs)
    assert all(isinstance(v, Opaque) for v in outs), outs
    assert reason in outs[0].reason, outs[0].reason


def test_scatter_kind_from_the_region() -> None:
    """add / replace / max read off the update region of a parsed scatter."""
    from entangle_mlir.mlir.ir import parse_module
    from entangle_mlir.mlir.opinfo import describe

    body = {"add": "%s = stablehlo.add %a, %b : tensor<f32>\n stablehlo.return %s : tensor<f32>",
            "replace": "stablehlo.return %b : tensor<f32>",
            "max": "%s = stablehlo.maximum %b, %a : tensor<f32>\n stablehlo.return %s : "
                   "tensor<f32>",
            "other": "%s = stablehlo.subtract %a, %b : tensor<f32>\n stablehlo.return %s : "
                     "tensor<f32>"}
    for kind, region in body.items():
        module = parse_module(f"""
func.func @main(%x: tensor<4x2xf32>, %i: tensor<1x1xi32>, %u: tensor<1x2xf32>) -> tensor<4x2xf32> {{
  %0 = "stablehlo.scatter"(%x, %i, %u) <{{scatter_dimension_numbers = #stablehlo.scatter<update_window_dims = [1], inserted_window_dims = [0], scatter_dims_to_operand_dims = [0], index_vector_dim = 1>}}> ({{
  ^bb0(%a: tensor<f32>, %b: tensor<f32>):
    {region}
  }}) : (tensor<4x2xf32>, tensor<1x1xi32>, tensor<1x2xf32>) -> tensor<4x2xf32>
  return %0 : tensor<4x2xf32>
}}""")
        op = next(o.operation for o in module.body.operations[0].regions[0].blocks[0].operations)
        assert G.scatter_kind(describe(op)) == kind


# ----- canonical forms ------------------------------------------------------------------------

def test_scatter_add_is_operand_plus_scatter_into_zeros() -> None:
    x, ids, upd = arg((3, 2)), arg((2, 1), "i32"), arg((2, 2))
    direct = _scatter_term(x, ids, upd)
    split = T.make_add(x, _scatter_term(T.make_splat(0, (3, 2), "f32"), ids, upd))
    assert direct is split
    doubled = _scatter_term(T.scale(x, 2), ids, T.scale(upd, 2))
    assert doubled is T.scale(direct, 2)


def test_gather_pulls_scalars_but_not_sums_out_of_the_operand() -> None:
    """Scalars come out of linear ops; sums are not distributed (see terms._single_term)."""
    a, b, ids = arg((4, 2)), arg((4, 2)), arg((3, 1), "i32")
    assert _gather_term(T.scale(a, 3), ids, (1, 2), (3, 2)) is T.scale(
        _gather_term(a, ids, (1, 2), (3, 2)), 3)
    summed = _gather_term(T.make_add(T.scale(a, 3), b), ids, (1, 2), (3, 2))
    assert summed.args[0] is T.make_add(T.scale(a, 3), b)


def test_dynamic_update_slice_clamps_constant_offsets() -> None:
    x, u = arg((4, 3)), arg((2, 3))
    seven = T.make_splat(7, (), "i32")
    two = T.make_splat(2, (), "i32")
    zero = T.make_splat(0, (), "i32")
    assert G.make_dynamic_update_slice(x, u, [seven, zero]) is \
        G.make_dynamic_update_slice(x, u, [two, zero])
    assert G.make_dynamic_update_slice(x, arg((4, 3)), [zero, zero]).op == "arg"


def test_terms_evaluate_by_the_op_semantics() -> None:
    """A gather term's value is what the op computes (the evaluate_term hook)."""
    table, ids = arg((4, 2)), arg((3, 1), "i32")
    term = _gather_term(table, ids, (1, 2), (3, 2))
    t = np.arange(8).reshape(4, 2)
    i = np.array([[3], [-5], [9]])
    got = evaluate_term(term, {table.attrs[0]: t, ids.attrs[0]: i})
    assert [list(r) for r in got] == [[6, 7], [0, 1], [6, 7]]
    assert G.term_info(term).attrs["slice_sizes"] == (1, 2)


# ----- grounding against XLA ------------------------------------------------------------------

if "--xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                               + " --xla_force_host_platform_device_count=8")

GROUNDING = {
    "gather_rows": ("""
func.func @main(%t: tensor<5x3xf32>, %i: tensor<6x1xi32>) -> tensor<6x3xf32> {
  %0 = "stablehlo.gather"(%t, %i) <{dimension_numbers = #stablehlo.gather<offset_dims = [1], collapsed_slice_dims = [0], start_index_map = [0], index_vector_dim = 1>, indices_are_sorted = false, slice_sizes = array<i64: 1, 3>}> : (tensor<5x3xf32>, tensor<6x1xi32>) -> tensor<6x3xf32>
  return %0 : tensor<6x3xf32>
}""", [((5, 3), "f"), ((6, 1), "i")]),
    "gather_windows": ("""
func.func @main(%t: tensor<5x4xf32>, %i: tensor<3x2xi32>) -> tensor<3x2x3xf32> {
  %0 = "stablehlo.gather"(%t, %i) <{dimension_numbers = #stablehlo.gather<offset_dims = [1, 2], start_index_map = [0, 1], index_vector_dim = 1>, indices_are_sorted = false, slice_sizes = array<i64: 2, 3>}> : (tensor<5x4xf32>, tensor<3x2xi32>) -> tensor<3x2x3xf32>
  return %0 : tensor<3x2x3xf32>
}""", [((5, 4), "f"), ((3, 2), "i")]),
    "scatter_add_rows": ("""
func.func @main(%x: tensor<5x3xf32>, %i: tensor<6x1xi32>, %u: tensor<6x3xf32>) -> tensor<5x3xf32> {
  %0 = "stablehlo.scatter"(%x, %i, %u) <{indices_are_sorted = false, scatter_dimension_numbers = #stablehlo.scatter<update_window_dims = [1], inserted_window_dims = [0], scatter_dims_to_operand_dims = [0], index_vector_dim = 1>, unique_indices = false}> ({
  ^bb0(%a: tensor<f32>, %b: tensor<f32>):
    %s = stablehlo.add %a, %b : tensor<f32>
    stablehlo.return %s : tensor<f32>
  }) : (tensor<5x3xf32>, tensor<6x1xi32>, tensor<6x3xf32>) -> tensor<5x3xf32>
  return %0 : tensor<5x3xf32>
}""", [((5, 3), "f"), ((6, 1), "i"), ((6, 3), "f")]),
    "scatter_add_windows": ("""
func.func @main(%x: tensor<5x4xf32>, %i: tensor<3x1xi32>, %u: tensor<3x2x4xf32>) -> tensor<5x4xf32> {
  %0 = "stablehlo.scatter"(%x, %i, %u) <{indices_are_sorted = false, scatter_dimension_numbers = #stablehlo.scatter<update_window_dims = [1, 2], scatter_dims_to_operand_dims = [0], index_vector_dim = 1>, unique_indices = false}> ({
  ^bb0(%a: tensor<f32>, %b: tensor<f32>):
    %s = stablehlo.add %a, %b : tensor<f32>
    stablehlo.return %s : tensor<f32>
  }) : (tensor<5x4xf32>, tensor<3x1xi32>, tensor<3x2x4xf32>) -> tensor<5x4xf32>
  return %0 : tensor<5x4xf32>
}""", [((5, 4), "f"), ((3, 1), "i"), ((3, 2, 4), "f")]),
    "scatter_default_index_vector_dim": ("""
func.func @main(%x: tensor<4x6xf32>, %i: tensor<1xi32>, %u: tensor<4x2xf32>) -> tensor<4x6xf32> {
  %0 = "stablehlo.scatter"(%x, %i, %u) <{indices_are_sorted = true, scatter_dimension_numbers = #stablehlo.scatter<update_window_dims = [0, 1], scatter_dims_to_operand_dims = [1]>, unique_indices = true}> ({
  ^bb0(%a: tensor<f32>, %b: tensor<f32>):
    stablehlo.return %b : tensor<f32>
  }) : (tensor<4x6xf32>, tensor<1xi32>, tensor<4x2xf32>) -> tensor<4x6xf32>
  return %0 : tensor<4x6xf32>
}""", [((4, 6), "f"), ((1,), "i"), ((4, 2), "f")]),
    "gather_default_index_vector_dim": ("""
func.func @main(%t: tensor<4x6xf32>, %i: tensor<1xi32>) -> tensor<4x2xf32> {
  %0 = "stablehlo.gather"(%t, %i) <{dimension_numbers = #stablehlo.gather<offset_dims = [0, 1], start_index_map = [1]>, indices_are_sorted = true, slice_sizes = array<i64: 4, 2>}> : (tensor<4x6xf32>, tensor<1xi32>) -> tensor<4x2xf32>
  return %0 : tensor<4x2xf32>
}""", [((4, 6), "f"), ((1,), "i")]),
    "scatter_replace_unique": ("""
func.func @main(%x: tensor<5x3xf32>, %i: tensor<2x1xi32>, %u: tensor<2x3xf32>) -> tensor<5x3xf32> {
  %0 = "stablehlo.scatter"(%x, %i, %u) <{indices_are_sorted = false, scatter_dimension_numbers = #stablehlo.scatter<update_window_dims = [1], inserted_window_dims = [0], scatter_dims_to_operand_dims = [0], index_vector_dim = 1>, unique_indices = true}> ({
  ^bb0(%a: tensor<f32>, %b: tensor<f32>):
    stablehlo.return %b : tensor<f32>
  }) : (tensor<5x3xf32>, tensor<2x1xi32>, tensor<2x3xf32>) -> tensor<5x3xf32>
  return %0 : tensor<5x3xf32>
}""", [((5, 3), "f"), ((2, 1), "u"), ((2, 3), "f")]),
    "dynamic_update_slice": ("""
func.func @main(%x: tensor<5x4xf32>, %u: tensor<2x3xf32>, %a: tensor<i32>, %b: tensor<i32>) -> tensor<5x4xf32> {
  %0 = stablehlo.dynamic_update_slice %x, %u, %a, %b : (tensor<5x4xf32>, tensor<2x3xf32>, tensor<i32>, tensor<i32>) -> tensor<5x4xf32>
  return %0 : tensor<5x4xf32>
}""", [((5, 4), "f"), ((2, 3), "f"), ((), "i"), ((), "i")]),
}


def _inputs(specs, rng) -> list[np.ndarray]:
    out = []
    for shape, kind in specs:
        if kind == "f":
            out.append(rng.integers(-9, 9, shape).astype(np.float32))
        elif kind == "u":    # distinct in-range rows (replace with unique indices)
            out.append(rng.permutation(5)[:shape[0]].reshape(shape).astype(np.int32))
        else:                # out-of-range on both sides included
            out.append(rng.integers(-4, 8, shape).astype(np.int32))
    return out


GROUNDING_XFAIL: dict = {}
"""Cases whose semantics disagree with XLA (none: out-of-bounds update windows are skipped
whole, and a dimension-numbers attribute without index_vector_dim has it at 0)."""


@pytest.mark.parametrize("name", [pytest.param(n, marks=GROUNDING_XFAIL[n])
                                  if n in GROUNDING_XFAIL else n for n in sorted(GROUNDING)])
def test_semantics_agree_with_xla(name: str) -> None:
    jax = pytest.importorskip("jax")
    from jax._src import xla_bridge
    from jax._src.lib import xla_client

    from entangle_mlir.mlir.ir import parse_module
    from entangle_mlir.mlir.opinfo import describe

    text, specs = GROUNDING[name]
    backend = xla_bridge.get_backend("cpu")
    device = backend.devices()[0]
    exe = backend.compile_and_load(text, xla_client.DeviceList((device,)),
                                   xla_client.CompileOptions())
    module = parse_module(text)
    main = module.body.operations[0]
    op = next(o.operation for o in main.regions[0].blocks[0].operations)
    info = describe(op)
    rng = np.random.default_rng(7)
    for _ in range(12):
        args = _inputs(specs, rng)
        theirs = exe.execute_sharded([jax.device_put(a, device) for a in args])
        want = np.asarray(theirs.disassemble_into_single_device_arrays()[0][0])
        ours = OP_SEMANTICS[info.name](info, [obj_array(a) for a in args])[0]
        got = np.array([[float(v) for v in np.ravel(ours)]]).reshape(want.shape)
        np.testing.assert_array_equal(got, want, err_msg=f"{name} on {args}")


# ----- registering these lemmas in tests/rules/test_lemmas.py -----------------------------------
# test_lemmas.ALL_LEMMAS can include these cases with
#     from tests.rules.test_gather_scatter_lemmas import GATHER_SCATTER_LEMMAS
#     ALL_LEMMAS = (... + GATHER_SCATTER_LEMMAS)
# (they are proved here too; the names start with "gs-").
_ = (Fraction, Mesh, RuleContext, Rel)
