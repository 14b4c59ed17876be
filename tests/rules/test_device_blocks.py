"""Vocab-parallel masks and local indices (`rules/kinds/device_blocks.py`,
`analysis/valid_indices.py`).

Every rule step is a lemma Z3 proves for all token values (including out-of-range ones) on
several meshes and widths; must-fail lemmas show the check is not vacuous (the bug Z3 found
while this was written, a scatter of dp-split tokens claimed complete, is one of them). The
valid-index assumption is tested on terms, and the whole chain on a real jax program whose
numbers are compared by execution (grounded) in tests/examples/test_real_grounded.py.
"""

from __future__ import annotations

import pytest

from entangle_mlir.analysis.instance.checker import InstanceChecker
from entangle_mlir.analysis.valid_indices import Simplifier, ValidIndices, index_ranges
from entangle_mlir.core import terms as T
from entangle_mlir.core.mesh import Mesh
from entangle_mlir.core.relations import BlockIndex, InBlock, Masked, Opaque, Rel, Shifted
from entangle_mlir.core.terms import splat_value
from entangle_mlir.mlir.opinfo import OpInfo, TensorType
from entangle_mlir.rules import RULES
from entangle_mlir.rules.base import RuleContext
from tests.rules.test_lemmas import (
    _EMBED,
    _SCATTER_ROWS,
    _TAKE_ALONG,
    _TAKE_ALONG_GRAD,
    _checker,
    arg,
)

TP2 = Mesh((("tp", 2),))
TP3 = Mesh((("tp", 3),))
DP_TP = Mesh((("dp", 2), ("tp", 2)))
MESHES = [TP2, TP3, DP_TP]


def rel(term: T.Term, *tiling) -> Rel:
    tiles = [(t,) if isinstance(t, str) else tuple(t) for t in tiling]
    return Rel(term, tuple(tiles + [()] * (len(term.shape) - len(tiles))))


def offsets(mesh: Mesh, length: int, k: int = 0) -> tuple[int, ...]:
    return tuple(mesh.block_index(("tp",), d) * length + k for d in range(mesh.num_devices))


def local_shape(value, mesh: Mesh) -> tuple[int, ...]:
    r = value if isinstance(value, Rel) else value.rel
    return tuple(s if d in r.poly else s // mesh.group_size(axes)
                 for d, (s, axes) in enumerate(zip(r.term.shape, r.tiling)))


def run(op: str, ins: list, mesh: Mesh, result, attrs=None, dtype="f32"):
    """The rule's output and Z3's verdict on it."""
    info = OpInfo(op, dict(attrs or {}),
                  [TensorType(local_shape(v, mesh), _dtype(v)) for v in ins],
                  [TensorType(tuple(result), dtype)])
    ctx = RuleContext(mesh=mesh, manual_axes=mesh.names)
    outs = RULES[op](info, list(ins), ctx)
    return outs, info, ctx


def _dtype(value) -> str:
    r = value if isinstance(value, Rel) else value.rel
    return r.term.dtype


def prove(op: str, ins: list, mesh: Mesh, result, attrs=None, dtype="f32"):
    outs, info, ctx = run(op, ins, mesh, result, attrs, dtype)
    assert outs and not any(isinstance(v, Opaque) for v in outs), outs
    verdict = _checker().check(info, ins, outs, mesh, ctx)
    assert verdict.status == "proved", verdict.describe()
    return outs[0]


def refute(op: str, ins: list, claim, mesh: Mesh, result, attrs=None, dtype="f32") -> None:
    _, info, ctx = run(op, ins, mesh, result, attrs, dtype)
    verdict = _checker().check(info, ins, [claim], mesh, ctx)
    assert verdict.status == "refuted", verdict.describe()


def zeros(shape, dtype="f32", value=0) -> Rel:
    """A splat constant built at the local shape (as jax's constants are)."""
    return Rel(T.make_splat(value, shape, dtype), ((),) * len(shape),
               poly=frozenset(range(len(shape))))


def chain(mesh: Mesh, length: int, n_tokens: int = 4):
    """The embedding's mask and local index for tokens t (replicated or split over dp)."""
    t = arg((n_tokens,), "i32")
    tokens = rel(t, "dp") if "dp" in mesh.names else rel(t)
    local = (n_tokens // mesh.group_size(("dp",)),) if "dp" in mesh.names else (n_tokens,)
    start = Shifted(zeros(local, "i32"), offsets(mesh, length))
    end = Shifted(zeros(local, "i32"), offsets(mesh, length, length))
    below = prove("stablehlo.compare", [tokens, start], mesh, local,
                  {"comparison_direction": "LT"}, "i1")
    above = prove("stablehlo.compare", [tokens, end], mesh, local,
                  {"comparison_direction": "GE"}, "i1")
    outside = prove("stablehlo.or", [below, above], mesh, local, dtype="i1")
    shifted = Shifted(tokens, tuple(-o for o in offsets(mesh, length)))
    index = prove("stablehlo.select", [outside, zeros(local, "i32"), shifted], mesh, local,
                  dtype="i32")
    return tokens, outside, index, local


# ----- the lemmas, in the order the embedding uses them -------------------------------------

@pytest.mark.parametrize("mesh", MESHES, ids=["tp2", "tp3", "dp2xtp2"])
def test_mask_and_local_index(mesh: Mesh) -> None:
    _, outside, index, _ = chain(mesh, 2)
    assert isinstance(outside, InBlock) and outside.outside
    assert isinstance(index, BlockIndex) and (index.fill, index.add) == (0, 0)


@pytest.mark.parametrize("mesh", MESHES, ids=["tp2", "tp3", "dp2xtp2"])
def test_jax_index_normalization_folds(mesh: Mesh) -> None:
    """jnp.take's `where(i < 0, i + V, i)` and bounds check on a local index are constants."""
    _, _, index, local = chain(mesh, 2)
    negative = prove("stablehlo.compare", [index, zeros(local, "i32")], mesh, local,
                     {"comparison_direction": "LT"}, "i1")
    assert T.splat_value(negative.term) == 0
    plus = prove("stablehlo.add", [index, zeros(local, "i32", 2)], mesh, local, dtype="i32")
    assert isinstance(plus, BlockIndex) and plus.add == 2


@pytest.mark.parametrize("mesh", MESHES, ids=["tp2", "tp3", "dp2xtp2"])
@pytest.mark.parametrize("width", [1, 3])
def test_embedding_lookup_is_a_partial_sum(mesh: Mesh, width: int) -> None:
    length = 2
    vocab = length * mesh.group_size(("tp",))
    tokens, outside, index, local = chain(mesh, length)
    x = index.rel
    column = prove("stablehlo.broadcast_in_dim", [index], mesh, local + (1,),
                   {"broadcast_dimensions": (0,)}, "i32")
    table = rel(arg((vocab, width)), "tp")
    found = prove("stablehlo.gather", [table, column], mesh, local + (width,),
                  {**_EMBED, "slice_sizes": (1, width)})
    assert isinstance(found, Masked) and not found.zero
    wide = prove("stablehlo.broadcast_in_dim", [outside], mesh, local + (width,),
                 {"broadcast_dimensions": (0,)}, "i1")
    summed = prove("stablehlo.select", [wide, zeros(local + (width,)), found], mesh,
                   local + (width,))
    assert isinstance(summed, Rel) and summed.partial == ("tp",)
    assert x.term is tokens.term


@pytest.mark.parametrize("mesh", MESHES, ids=["tp2", "tp3", "dp2xtp2"])
def test_embedding_gradient_scatters_into_blocks(mesh: Mesh) -> None:
    length, width = 2, 2
    _, outside, index, local = chain(mesh, length)
    column = prove("stablehlo.broadcast_in_dim", [index], mesh, local + (1,),
                   {"broadcast_dimensions": (0,)}, "i32")
    dp = "dp" if "dp" in mesh.names else ()
    cotangent = rel(arg((index.rel.term.shape[0], width)), dp)
    wide = prove("stablehlo.broadcast_in_dim", [outside], mesh, local + (width,),
                 {"broadcast_dimensions": (0,)}, "i1")
    masked = prove("stablehlo.select", [wide, zeros(local + (width,)), cotangent], mesh,
                   local + (width,))
    assert isinstance(masked, Masked) and masked.zero
    grad = prove("stablehlo.scatter", [zeros((length, width)), column, masked], mesh,
                 (length, width), {**_SCATTER_ROWS, "reducer": "add"})
    assert isinstance(grad, Rel) and grad.tiling[0] == ("tp",)
    assert grad.partial == (("dp",) if dp else ())


@pytest.mark.parametrize("mesh", [TP2, DP_TP], ids=["tp2", "dp2xtp2"])
def test_cross_entropy_target_logit(mesh: Mesh) -> None:
    """take_along_axis of vocab-split logits at the local index (gather with batching dims)
    and its gradient."""
    length = 2
    vocab = length * mesh.group_size(("tp",))
    rows = 4
    dp = "dp" if "dp" in mesh.names else ()
    _, outside, index, local = chain(mesh, length, rows)
    column = prove("stablehlo.reshape", [index], mesh, local + (1, 1), dtype="i32")
    logits = rel(arg((rows, vocab)), dp, "tp")
    picked = prove("stablehlo.gather", [logits, column], mesh, local + (1,), dict(_TAKE_ALONG))
    flat = prove("stablehlo.reshape", [picked], mesh, local)
    target = prove("stablehlo.select", [outside, zeros(local), flat], mesh, local)
    assert isinstance(target, Rel) and target.partial == ("tp",)
    cotangent = rel(arg((rows,)), dp)
    masked = prove("stablehlo.select", [outside, zeros(local), cotangent], mesh, local)
    column_ct = prove("stablehlo.reshape", [masked], mesh, local + (1,))
    grad = prove("stablehlo.scatter", [zeros(local + (length,)), column, column_ct], mesh,
                 local + (length,), {**_TAKE_ALONG_GRAD, "reducer": "add"})
    assert isinstance(grad, Rel) and grad.tiling[1] == ("tp",) and not grad.partial


def test_bounds_check_of_squeezed_indices_is_checked_reduced() -> None:
    """jax's bounds check on take_along_axis's indices with one sequence per device reads them
    through a transpose of unit dims (`unit_dims._unit_moves_as_transpose`): on a dp 2 x tp 8
    mesh with 128 tokens a device, the instance is checked at a reduced shape (at its real
    shape Z3 timed out), proved, and a wrong claim is refuted."""
    mesh = Mesh((("dp", 2), ("tp", 8)))
    length, rows = 16032, 128
    index = BlockIndex(rel(T.make_reshape(arg((2, rows), "i32"), (2, rows, 1)), "dp"), ("tp",),
                       length)
    moved = prove("stablehlo.transpose", [index], mesh, (rows, 1, 1), {"permutation": (1, 0, 2)},
                  "i32")
    assert isinstance(moved, BlockIndex) and moved.rel.tiling == ((), ("dp",), ())
    last = zeros((rows, 1, 1), "i32", length - 1)
    info_ins = [moved, last]
    outs, info, ctx = run("stablehlo.compare", info_ins, mesh, (rows, 1, 1),
                          {"comparison_direction": "LE"}, "i1")
    checker = InstanceChecker()  # the defaults `entangle check` uses
    verdict = checker.check(info, info_ins, outs, mesh, ctx)
    assert verdict.status == "proved" and "reduced" in verdict.details["mode"], verdict.describe()
    always = outs[0]
    assert splat_value(always.term) == 1
    wrong = zeros((rows, 1, 1), "i32", length - 2)
    _, info, ctx = run("stablehlo.compare", [moved, wrong], mesh, (rows, 1, 1),
                       {"comparison_direction": "LE"}, "i1")
    verdict = checker.check(info, [moved, wrong], [always], mesh, ctx)
    assert verdict.status == "refuted", verdict.describe()


# ----- must-fail ------------------------------------------------------------------------------

def test_refutes_lookup_without_the_range_test() -> None:
    """Out-of-range tokens give zeros on every device: the sum is NOT the plain lookup."""
    mesh, length, width = TP2, 2, 2
    _, outside, index, local = chain(mesh, length)
    column = prove("stablehlo.broadcast_in_dim", [index], mesh, local + (1,),
                   {"broadcast_dimensions": (0,)}, "i32")
    table = rel(arg((4, width)), "tp")
    found = prove("stablehlo.gather", [table, column], mesh, local + (width,),
                  {**_EMBED, "slice_sizes": (1, width)})
    wide = prove("stablehlo.broadcast_in_dim", [outside], mesh, local + (width,),
                 {"broadcast_dimensions": (0,)}, "i1")
    plain = Rel(found.rel.term, found.rel.tiling, ("tp",), "sum")
    refute("stablehlo.select", [wide, zeros(local + (width,)), found], plain, mesh,
           local + (width,))


def test_refutes_dp_split_gradient_claimed_complete() -> None:
    mesh, length, width = DP_TP, 2, 2
    _, outside, index, local = chain(mesh, length)
    column = prove("stablehlo.broadcast_in_dim", [index], mesh, local + (1,),
                   {"broadcast_dimensions": (0,)}, "i32")
    cotangent = rel(arg((index.rel.term.shape[0], width)), "dp")
    wide = prove("stablehlo.broadcast_in_dim", [outside], mesh, local + (width,),
                 {"broadcast_dimensions": (0,)}, "i1")
    masked = prove("stablehlo.select", [wide, zeros(local + (width,)), cotangent], mesh,
                   local + (width,))
    grad = prove("stablehlo.scatter", [zeros((length, width)), column, masked], mesh,
                 (length, width), {**_SCATTER_ROWS, "reducer": "add"})
    refute("stablehlo.scatter", [zeros((length, width)), column, masked],
           Rel(grad.term, grad.tiling), mesh, (length, width),
           {**_SCATTER_ROWS, "reducer": "add"})


@pytest.mark.parametrize("mesh", MESHES, ids=["tp2", "tp3", "dp2xtp2"])
def test_device_offsets_are_checked_at_a_reduced_shape(mesh: Mesh) -> None:
    """`tokens - start` and `where(outside, 0, tokens - start)` on many tokens are elementwise
    in values offset per device: the default checker proves them at a reduced shape (the real
    one cost Z3 half a second per op on Llama's 256 tokens), and still refutes a claim whose
    offsets are one off."""
    length, n = 2, 384
    tokens, outside, _, local = chain(mesh, length, n)
    checker = InstanceChecker()
    start = Shifted(zeros(local, "i32"), offsets(mesh, length))
    outs, info, ctx = run("stablehlo.subtract", [tokens, start], mesh, local, dtype="i32")
    assert isinstance(outs[0], Shifted)
    verdict = checker.check(info, [tokens, start], outs, mesh, ctx)
    assert (verdict.status, verdict.details["mode"]) == ("proved", "reduced (device offsets)")
    wrong = Shifted(outs[0].rel, tuple(o - 1 for o in outs[0].offsets))
    assert checker.check(info, [tokens, start], [wrong], mesh, ctx).status == "refuted"

    shifted = outs[0]
    ins = [outside, zeros(local, "i32"), shifted]
    outs, info, ctx = run("stablehlo.select", ins, mesh, local, dtype="i32")
    assert isinstance(outs[0], BlockIndex)
    verdict = checker.check(info, ins, outs, mesh, ctx)
    assert (verdict.status, verdict.details["mode"]) == ("proved", "reduced (device mask)")
    wrong = [outside, zeros(local, "i32"), wrong]
    assert checker.check(info, wrong, outs, mesh, ctx).status == "refuted"


def test_off_by_one_mask_is_not_a_block() -> None:
    """`tokens > start + V_local` (instead of >=): the test is not the device's block, and
    the local index built from it is refused."""
    mesh, length = TP2, 2
    t = arg((3,), "i32")
    tokens = rel(t)
    below = prove("stablehlo.compare", [tokens, Shifted(zeros((3,), "i32"),
                                                        offsets(mesh, length))],
                  mesh, (3,), {"comparison_direction": "LT"}, "i1")
    above = prove("stablehlo.compare", [tokens, Shifted(zeros((3,), "i32"),
                                                        offsets(mesh, length, length))],
                  mesh, (3,), {"comparison_direction": "GT"}, "i1")
    outside = prove("stablehlo.or", [below, above], mesh, (3,), dtype="i1")
    assert not outside.is_block
    shifted = Shifted(tokens, tuple(-o for o in offsets(mesh, length)))
    outs, _, _ = run("stablehlo.select", [outside, zeros((3,), "i32"), shifted], mesh, (3,),
                     dtype="i32")
    assert isinstance(outs[0], Opaque)


# ----- the valid-index assumption ---------------------------------------------------------------

def _take_reference(table: T.Term, t: T.Term) -> T.Term:
    """jnp.take(table, t) as jax lowers it: wrap negative ids, gather, NaN where out of range."""
    size = table.shape[0]
    lt = T.make_elementwise("stablehlo.compare", (t, T.make_splat(0, t.shape, t.dtype)),
                            ("LT",), "i1")
    wrapped = T.make_elementwise("stablehlo.select", (lt, T.make_lin(
        [(1, t)], size, t.shape, t.dtype), t), (), t.dtype)
    column = T.make_reshape(wrapped, t.shape + (1,))
    ok = T.make_elementwise("stablehlo.and", (
        T.make_elementwise("stablehlo.compare", (column, T.make_splat(0, column.shape, "i32")),
                           ("GE",), "i1"),
        T.make_elementwise("stablehlo.compare", (column, T.make_splat(size - 1, column.shape,
                                                                      "i32")), ("LE",), "i1")),
        (), "i1")
    ok = T.intern("reduce_and", (ok,), ((1,),), t.shape, "i1")
    from entangle_mlir.rules.gather_scatter import make_gather

    found = make_gather(table, column, {**_EMBED, "operand_batching_dims": (),
                                        "start_indices_batching_dims": ()},
                        (1, table.shape[1]), t.shape + (table.shape[1],), table.dtype)
    wide = T.make_broadcast(ok, (0,), found.shape)
    return T.make_elementwise("stablehlo.select", (wide, found, T.make_splat(
        float("nan"), found.shape, found.dtype)), (), found.dtype), found


def test_valid_indices_make_take_the_plain_lookup() -> None:
    table, t = arg((4, 2)), arg((3,), "i32")
    reference, lookup = _take_reference(table, t)
    assert set(index_ranges([reference])) == {t.serial}
    assumed = ValidIndices([reference]).equal(reference, lookup)
    assert assumed == [(f"input #{t.attrs[0]} holds valid indices, 0 <= value < 4 (it "
                        "indexes a dim of size 4)")]


def test_no_assumption_without_a_lookup() -> None:
    """An integer input that indexes nothing gets no range: its compares stay."""
    t = arg((3,), "i32")
    lt = T.make_elementwise("stablehlo.compare", (t, T.make_splat(0, t.shape, "i32")),
                            ("LT",), "i1")
    assert index_ranges([lt]) == {}
    assert Simplifier({}).simplify(lt) is lt


def test_assumption_does_not_equate_different_lookups() -> None:
    table, t = arg((4, 2)), arg((3,), "i32")
    reference, lookup = _take_reference(table, t)
    other, _ = _take_reference(table, arg((3,), "i32"))
    assert ValidIndices([reference]).equal(reference, T.scale(lookup, 2)) is None
    assert ValidIndices([reference]).equal(reference, other) is None


# ----- grounded: the jax programs, run on simulated devices, and their verdicts -----------------

def _embed_variant(kind: str):
    """Megatron's vocab-parallel embedding, correct or with one realistic mistake."""
    import jax.numpy as jnp
    from jax import lax

    def body(w, t):
        vl = w.shape[0]
        start = lax.axis_index("tp") * vl + (1 if kind == "start_off_by_one" else 0)
        end = start + vl
        above = (t > end) if kind == "upper_bound_off_by_one" else (t >= end)
        outside = (t < start) | above
        local = jnp.where(outside, 0, t - start)
        found = jnp.take(w, local, axis=0)
        if kind != "no_final_mask":
            found = jnp.where(outside[..., None], 0.0, found)
        return lax.psum(found, "tp")
    return body


@pytest.mark.parametrize("kind", ["correct", "start_off_by_one", "upper_bound_off_by_one",
                                  "no_final_mask"])
def test_vocab_parallel_embedding_verdict_matches_execution(kind: str) -> None:
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import PartitionSpec as P

    from entangle_mlir.driver import check_texts
    from examples.real.catalog import custom, lower_pair, run_pair
    from examples.real.repro import _f

    ex = custom(f"embed_{kind}", (("tp", 4),), lambda w, t: jnp.take(w, t, axis=0),
                _embed_variant(kind), (_f("w", (16, 4), P("tp", None), "weight"),
                                       _f("t", (8,), kind="tokens", high=16)), P(), kind)
    ref, shd = run_pair(ex)
    same = all(np.allclose(a, b, atol=1e-5) for a, b in zip(ref, shd))
    assert same is (kind == "correct")
    report = check_texts(*lower_pair(ex))
    assert report.proven is same, report.render_text()
    if same:
        assert any("holds valid indices" in note for note in report.notes)
    expected = {"start_off_by_one": "the mask is not the device's block",
                "upper_bound_off_by_one": "the mask is not the device's block",
                "no_final_mask": "never zeroed"}.get(kind)
    if expected:
        assert expected in report.diagnostics[0].message, report.render_text()


@pytest.mark.parametrize("mesh", [TP2, TP3], ids=["tp2", "tp3"])
def test_one_hot_of_the_local_index(mesh: Mesh) -> None:
    """`(local[:, None] == arange(L)) & inside[:, None]` is the block of one_hot(ids, V)."""
    length = 2
    _, outside, index, local = chain(mesh, length)
    rows = prove("stablehlo.broadcast_in_dim", [index], mesh, local + (length,),
                 {"broadcast_dimensions": (0,)}, "i32")
    positions = Rel(T.make_iota((local[0], length), 1, "i32"), ((), ()))
    hits = prove("stablehlo.compare", [rows, positions], mesh, local + (length,),
                 {"comparison_direction": "EQ"}, "i1")
    assert isinstance(hits, Masked) and not hits.zero
    inside = prove("stablehlo.not", [outside], mesh, local, dtype="i1")
    wide = prove("stablehlo.broadcast_in_dim", [inside], mesh, local + (length,),
                 {"broadcast_dimensions": (0,)}, "i1")
    one_hot = prove("stablehlo.and", [hits, wide], mesh, local + (length,), dtype="i1")
    assert isinstance(one_hot, Rel) and one_hot.tiling[1] == ("tp",)
    wrong = prove("stablehlo.broadcast_in_dim", [outside], mesh, local + (length,),
                  {"broadcast_dimensions": (0,)}, "i1")
    outs, _, _ = run("stablehlo.and", [hits, wrong], mesh, local + (length,), dtype="i1")
    assert isinstance(outs[0], Opaque)


def test_narrowing_convert_keeps_its_compares() -> None:
    """ids < 300 converted to i8 wrap around: the assumption does not decide compares there."""
    table, t = arg((300, 2)), arg((3,), "i32")
    _, lookup = _take_reference(table, t)
    narrow = T.make_elementwise("stablehlo.convert", (t,), (), "i8")
    test = T.make_elementwise("stablehlo.compare", (narrow, T.make_splat(0, t.shape, "i8")),
                              ("GE",), "i1")
    simplifier = Simplifier(index_ranges([lookup]))
    assert simplifier.simplify(test) is test
    wide = T.make_elementwise("stablehlo.convert", (t,), (), "i64")
    decided = T.make_elementwise("stablehlo.compare", (wide, T.make_splat(0, t.shape, "i64")),
                                 ("GE",), "i1")
    assert T.splat_value(simplifier.simplify(decided)) == 1
