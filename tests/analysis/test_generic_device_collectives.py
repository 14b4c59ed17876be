"""All_to_all and top_k instances checked for one generic device (issue 21; `instance/devices.py`
`all_to_all_axes`, `_node_tags`' top_k): the DeepSeek-V3-like row's routers' top_k over 256
experts and its all_to_alls over 64 devices, which no reduced shape made small enough while
every device was checked (64 devices x the reduced local shape). An all_to_all over its own
group axis is symmetric in it by the chunk rotation (`all_to_all_axes` states the argument):
only the device at coordinate 0 is checked, its operands holding only the chunks it receives
(`devices.chunk_reads`; any other position is UNREAD, which the check refuses to read). A
top_k moves its rows with the rotation (its claim is per row), its sorted dim kept whole.

The nearest wrong claims stay refuted at the reduced shape on the generic device: the chunk
off by one, the concatenation in another order, split and concat dims swapped, the top_k
reading k+1 entries from the second on, its rows off by one, along the wrong dim (not
symmetric: every device checked); a chunk not filled is never read as proved."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import z3

from entangle_mlir.analysis.instance import claims, devices
from entangle_mlir.analysis.instance.checker import InstanceChecker
from entangle_mlir.analysis.instance.local_values import region_value
from entangle_mlir.analysis.instance.solve import run_check
from entangle_mlir.core import terms as T
from entangle_mlir.core.mesh import Mesh
from entangle_mlir.core.relations import Rel
from entangle_mlir.core.selection import make_top_k
from entangle_mlir.mlir.opinfo import OpInfo, TensorType
from entangle_mlir.rules import RULES
from entangle_mlir.rules.base import RuleContext
from entangle_mlir.semantics.element import equal, is_z3
from entangle_mlir.semantics.evaluate import evaluate_term

EP64 = Mesh((("ep", 64),))
EP4 = Mesh((("ep", 4),))
_next_arg = iter(range(40_000, 1_000_000))


def arg(shape: tuple[int, ...], dtype: str = "f32") -> T.Term:
    return T.make_arg(next(_next_arg), shape, dtype)


def rel(term: T.Term, *tiled: int) -> Rel:
    return Rel(term, tuple(("ep",) if d in tiled else () for d in range(len(term.shape))))


def local(value: Rel, mesh: Mesh) -> tuple[int, ...]:
    return tuple(n // mesh.group_size(axes) for n, axes in zip(value.term.shape, value.tiling))


def a2a_info(x: Rel, mesh: Mesh, split: int, concat: int) -> OpInfo:
    n = mesh.num_devices
    shape = list(local(x, mesh))
    out = list(shape)
    out[split] //= n
    out[concat] *= n
    return OpInfo("stablehlo.all_to_all", {
        "split_dimension": split, "concat_dimension": concat, "split_count": n,
        "replica_groups": [list(range(n))],
        "channel_handle": "#stablehlo.channel_handle<handle = 1, type = 1>"},
        [TensorType(tuple(shape), "f32")], [TensorType(tuple(out), "f32")])


def topk_info(x: Rel, mesh: Mesh, k: int) -> OpInfo:
    rows = local(x, mesh)[:-1]
    return OpInfo("chlo.top_k", {"k": k}, [TensorType(local(x, mesh), "f32")],
                  [TensorType(rows + (k,), "f32"), TensorType(rows + (k,), "i32")])


def run(info: OpInfo, ins: list, mesh: Mesh) -> list:
    return RULES[info.name](info, ins, RuleContext(mesh=mesh, manual_axes=mesh.names))


def check(info: OpInfo, ins: list, outs: list, mesh: Mesh, **limits) -> object:
    """As the driver checks it: the default reduction and size limits unless given."""
    ctx = RuleContext(mesh=mesh, manual_axes=mesh.names)
    return InstanceChecker(timeout_ms=20_000, **limits).check(info, ins, outs, mesh, ctx)


def check_as_is(info: OpInfo, ins: list, outs: list, mesh: Mesh) -> str:
    """The query at the shape given, as the checker runs it once it has chosen the form
    (`solve.run_check`: no abstraction, no reduction, no size limit): a wrong claim is not
    the rule's output, so the checker would not reduce it (at the row's real shape it is too
    large and stays not checked); the tests write it at the shape the row's instance is
    reduced to."""
    return run_check(info, ins, outs, mesh, RuleContext(mesh=mesh, manual_axes=mesh.names),
                     timeout_ms=20_000).status


def dispatch(mesh: Mesh, experts: int, tokens: int) -> tuple[OpInfo, Rel, Rel]:
    """MoE dispatch: (experts, local tokens, d) -> (local experts, every token, d)."""
    x = rel(arg((experts, tokens * mesh.num_devices, 2)), 1)
    info = a2a_info(x, mesh, 0, 1)
    (out,) = run(info, [x], mesh)
    return info, x, out


# ----- all_to_all --------------------------------------------------------------------------

def test_the_deepseek_dispatch_at_64_devices_is_checked_on_one_device() -> None:
    """The row's shape (256 experts, 16 tokens a device): too large at 64 devices even
    reduced, checked reduced on device 0 alone."""
    info, x, out = dispatch(EP64, 256, 16)
    assert out.tiling == (("ep",), (), ())
    assert devices.all_to_all_axes(info, [x], [out], EP64, ("ep",)) == ["ep"]
    assert devices.distinct_devices(info, [x], [out], EP64, False, 64) == [0]
    result = check(info, [x], [out], EP64)
    assert (result.status, result.details["mode"]) == ("proved", "reduced")


def test_the_return_all_to_all_is_checked_on_one_device() -> None:
    y = rel(arg((256, 16 * 64, 2)), 0)
    info = a2a_info(y, EP64, 1, 0)
    (out,) = run(info, [y], EP64)
    assert devices.distinct_devices(info, [y], [out], EP64, False, 64) == [0]
    assert check(info, [y], [out], EP64).status == "proved"


def reduced_dispatch() -> tuple[OpInfo, Rel, Rel]:
    """The row's dispatch at the shape its instance is reduced to: 2 experts a device, 2
    tokens a device, d 2 (local (128, 2, 2) -> (2, 128, 2); 32768 elements globally)."""
    return dispatch(EP64, 128, 2)


def test_the_reduced_dispatch_is_what_the_row_checks() -> None:
    info, x, out = reduced_dispatch()
    assert check_as_is(info, [x], [out], EP64) == "proved"


def test_a_chunk_off_by_one_is_refuted_on_the_generic_device() -> None:
    """Every device claiming the next device's chunk (a roll by one block of the split
    dim): symmetric, device 0 alone checked, and its claim is false."""
    info, x, out = reduced_dispatch()
    wrong = replace(out, term=T.make_roll(out.term, 0, 2))
    assert devices.distinct_devices(info, [x], [wrong], EP64, False, 64) == [0]
    assert check_as_is(info, [x], [wrong], EP64) == "refuted"


def test_the_concatenation_in_another_order_is_refuted_on_the_generic_device() -> None:
    """The received chunks claimed one member further along the concat dim."""
    info, x, out = reduced_dispatch()
    wrong = replace(out, term=T.make_roll(out.term, 1, 2))
    assert devices.distinct_devices(info, [x], [wrong], EP64, False, 64) == [0]
    assert check_as_is(info, [x], [wrong], EP64) == "refuted"


def test_split_and_concat_swapped_is_refuted() -> None:
    """The dispatch's claim on an all_to_all that splits the tokens and concatenates the
    experts instead."""
    info, x, out = dispatch(EP4, 8, 4)
    assert check(info, [x], [out], EP4).status == "proved"
    attrs = {**info.attrs, "split_dimension": 1, "concat_dimension": 0}
    swapped = replace(info, attrs=attrs, result_types=[TensorType((32, 1, 2), "f32")])
    assert check(swapped, [x], [out], EP4).status == "refuted"


def test_a_claim_the_rotation_does_not_cover_is_checked_everywhere() -> None:
    """The chunks claimed in reverse order (a reverse of the split dim does not commute
    with the rotation): every device is checked; refuted on 4 devices, and at 64 devices
    it stays not checked, with the reason (too large)."""
    for mesh, expected in ((EP4, "refuted"), (EP64, "skipped")):
        info, x, out = dispatch(mesh, 2 * mesh.num_devices, 2)
        wrong = replace(out, term=T.make_op("stablehlo.reverse", (out.term,), ((0,),),
                                            out.term.shape, "f32"))
        assert devices.distinct_devices(info, [x], [wrong], mesh, False,
                                        mesh.num_devices) == list(range(mesh.num_devices))
        result = check(info, [x], [wrong], mesh)
        assert result.status == expected
        if expected == "skipped":
            assert "too large" in result.reason


def test_a_chunk_the_check_did_not_fill_is_never_proved(monkeypatch) -> None:
    """Were the chunks read from the members the wrong ones (the device's position off by
    one), the received chunk would be UNREAD: unknown, never proved."""
    info, x, out = dispatch(EP4, 8, 4)
    right = devices.chunk_reads

    def off_by_one(*args):
        found = right(*args)
        return found and {d: ([(p + 1) % n for p in ps], n) for d, (ps, n) in found.items()}

    monkeypatch.setattr(devices, "chunk_reads", off_by_one)
    monkeypatch.setattr(claims, "chunk_reads", off_by_one)
    result = check(info, [x], [out], EP4, reduce_above=10**9, max_elements=10**6)
    assert result.status == "unknown" and "did not fill" in result.reason


# ----- top_k -------------------------------------------------------------------------------

def router(mesh: Mesh, rows: int, experts: int) -> Rel:
    return rel(arg((rows * mesh.num_devices, experts)), 0)


def test_the_deepseek_router_top_k_is_checked_on_one_device() -> None:
    """16 tokens a device over 64 devices, 256 experts, top 8: reduced to 2 rows a device
    (the claim is per row), the sorted dim kept whole, on device 0 alone (512 elements)."""
    x = router(EP64, 16, 256)
    info = topk_info(x, EP64, 8)
    outs = run(info, [x], EP64)
    assert devices._symmetric_axes([x], outs, EP64) == ("ep",)
    result = check(info, [x], outs, EP64)
    assert (result.status, result.details["mode"]) == ("proved", "reduced")


def _wrong_top_k(claim) -> str:
    x = router(EP4, 2, 8)
    info = topk_info(x, EP4, 3)
    values, indices = run(info, [x], EP4)
    return check(info, [x], [replace(values, term=claim(x.term)), indices], EP4).status


def test_top_k_reading_k_plus_1_from_the_second_is_refuted() -> None:
    def claim(x: T.Term) -> T.Term:
        wider = make_top_k(x, 4, 0, "f32")
        return T.make_op("slice", (wider,), ((0, 1), (8, 4), (1, 1)), (8, 3), "f32")

    assert _wrong_top_k(claim) == "refuted"


def test_top_k_of_the_next_rows_is_refuted_on_the_generic_device() -> None:
    x = router(EP4, 2, 8)
    wrong = make_top_k(T.make_roll(x.term, 0, 1), 3, 0, "f32")
    info = topk_info(x, EP4, 3)
    _, indices = run(info, [x], EP4)
    assert devices._symmetric_axes([x], [rel(wrong, 0), indices], EP4) == ("ep",)
    assert _wrong_top_k(lambda t: make_top_k(T.make_roll(t, 0, 1), 3, 0, "f32")) == "refuted"


def test_top_k_along_the_wrong_dim_is_not_symmetric_and_refuted() -> None:
    """The top k of each column (4 x 4, rows split): the rotation moves the selected dim,
    so every device is checked, and the claim is false."""
    x = router(EP4, 1, 4)
    column = T.make_transpose(make_top_k(T.make_transpose(x.term, (1, 0)), 4, 0, "f32"),
                              (1, 0))
    info = topk_info(x, EP4, 4)
    values, indices = run(info, [x], EP4)
    wrong = replace(values, term=column)
    assert devices._symmetric_axes([x], [wrong, indices], EP4) == ()
    assert check(info, [x], [wrong, indices], EP4).status == "refuted"


def test_a_top_k_window_is_the_window_of_the_top_k() -> None:
    """`region_value`'s top_k (the window's rows, whole along the selected dim) against the
    whole top_k sliced, on values with ties (the lower index first), z3 leaves and the
    indices result included."""
    leaf = arg((6, 7))
    values = np.array([[3, 1, 3, 2, 2, 0, 3], [0, 0, 0, 0, 0, 0, 0], [5, 4, 3, 2, 1, 0, -1],
                       [1, 2, 3, 4, 5, 6, 7], [2, 7, 2, 7, 1, 1, 7], [4, 4, 9, 4, 4, 9, 4]])
    symbolic = np.array([[z3.Real(f"x{r}_{c}") for c in range(7)] for r in range(6)])
    for data in (values, symbolic):
        for result in (0, 1):
            term = make_top_k(leaf, 3, result, "f32" if result == 0 else "i32")
            whole = evaluate_term(term, {leaf.attrs[0]: data})
            for region in (((1, 4), (0, 3)), ((0, 6), (1, 3)), ((5, 6), (2, 3))):
                got = region_value(term, region, {leaf.attrs[0]: data}, {}, {})
                want = whole[tuple(slice(lo, hi) for lo, hi in region)]
                assert got.shape == want.shape
                for a, b in zip(got.reshape(-1), want.reshape(-1)):
                    same = equal(a, b)
                    assert z3.is_true(z3.simplify(same)) if is_z3(same) else same
