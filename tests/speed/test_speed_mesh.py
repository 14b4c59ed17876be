"""Instance checks on big meshes check one device per symmetric axis
(`instance.devices._symmetric_axes`): a device's claim at coordinate i along an axis the instance is
symmetric in is the claim at coordinate 0 with the variables renamed. These tests pin that
the analysis finds the symmetry of a Megatron matmul, and that claims which hold at
coordinate 0 but not elsewhere (block-permuting or position-dependent terms) are not
symmetric, so every device is checked and the wrong claim is refuted."""

from __future__ import annotations

from fractions import Fraction

from entangle_mlir.analysis.instance import devices
from entangle_mlir.analysis.instance.checker import InstanceChecker, check_instance
from entangle_mlir.analysis.instance.local_values import region_value
from entangle_mlir.analysis.instance.sources import Concrete, LazyLeaves, leaf_args
from entangle_mlir.core import terms as T
from entangle_mlir.core.mesh import Mesh
from entangle_mlir.core.relations import Rel
from entangle_mlir.mlir.opinfo import OpInfo, TensorType
from entangle_mlir.rules import RULES
from entangle_mlir.rules.base import RuleContext

MESH = Mesh((("dp", 4), ("tp", 2)))
_ids = iter(range(970_000, 10**6))


def _arg(shape) -> T.Term:
    return T.make_arg(next(_ids), tuple(shape), "f32")


def _ctx() -> RuleContext:
    return RuleContext(mesh=MESH, manual_axes=MESH.names)


def _matmul():
    x = Rel(_arg((8, 6)), (("dp",), ()), (), "")
    w = Rel(_arg((6, 4)), ((), ("tp",)), (), "")
    info = OpInfo("stablehlo.dot_general", {"lhs_batch": (), "rhs_batch": (),
                                            "lhs_contract": (1,), "rhs_contract": (0,)},
                  [TensorType((2, 6), "f32"), TensorType((6, 2), "f32")],
                  [TensorType((2, 2), "f32")])
    (out,) = RULES[info.name](info, [x, w], _ctx())
    return info, [x, w], out


def test_megatron_matmul_is_symmetric_in_both_axes() -> None:
    info, ins, out = _matmul()
    assert devices._symmetric_axes(ins, [out], MESH) == ("dp", "tp")
    assert devices.distinct_devices(info, ins, [out], MESH, False, MESH.num_devices) == [0]
    result = check_instance(info, ins, [out], MESH, checker=InstanceChecker())
    assert result.status == "proved", result.describe()


def test_a_wrong_claim_is_refuted_with_the_symmetry() -> None:
    """A claim wrong on every device (twice the product) is refuted at device 0 alone."""
    info, ins, out = _matmul()
    wrong = Rel(T.scale(out.term, 2), out.tiling, (), "")
    assert devices._symmetric_axes(ins, [wrong], MESH) == ("dp", "tp")
    result = check_instance(info, ins, [wrong], MESH, checker=InstanceChecker())
    assert result.status == "refuted"


def _copy(x: Rel):
    """`x * 1` on each device: its local result is its block of x."""
    one = Rel(T.make_splat(1, x.term.shape, "f32"), x.tiling, (), "")
    local = (x.term.shape[0] // 4, x.term.shape[1])
    info = OpInfo("stablehlo.multiply", {}, [TensorType(local, "f32")] * 2,
                  [TensorType(local, "f32")])
    return info, [x, one]


def test_swapped_blocks_are_not_symmetric_and_are_refuted() -> None:
    """The claim `blocks 1 and 2 of x swapped` holds at dp coordinate 0 only."""
    x = Rel(_arg((8, 3)), (("dp",), ()), (), "")
    info, ins = _copy(x)
    rows = [T.make_op("slice", (x.term,), ((2 * b, 0), (2 * b + 2, 3), (1, 1)), (2, 3), "f32",
                      linear_in=0) for b in (0, 2, 1, 3)]
    swapped = T.intern("concatenate", tuple(rows), (0,), (8, 3), "f32")
    claim = Rel(swapped, x.tiling, (), "")
    assert "dp" not in devices._symmetric_axes(ins, [claim], MESH)
    result = check_instance(info, ins, [claim], MESH, checker=InstanceChecker())
    assert result.status == "refuted"


def test_position_dependent_claims_are_not_symmetric_and_are_refuted() -> None:
    """`x` on the first block's rows and `2 x` elsewhere (a mask on the row position)."""
    x = Rel(_arg((8, 3)), (("dp",), ()), (), "")
    info, ins = _copy(x)
    rows = T.make_iota((8, 3), 0, "i32")
    first = T.make_elementwise("stablehlo.compare", (rows, T.make_splat(2, (8, 3), "i32")),
                               ("LT",), dtype="i1")
    twice = T.make_lin([(Fraction(2), x.term)], 0, (8, 3), "f32")
    claim = Rel(T.make_elementwise("stablehlo.select", (first, x.term, twice)), x.tiling, (), "")
    assert "dp" not in devices._symmetric_axes(ins, [claim], MESH)
    result = check_instance(info, ins, [claim], MESH, checker=InstanceChecker())
    assert result.status == "refuted"


def test_partial_over_an_axis_breaks_its_symmetry_only() -> None:
    """A row-parallel matmul's partial sum over tp: tp is not symmetric, dp still is."""
    x = Rel(_arg((8, 4)), (("dp",), ("tp",)), (), "")
    w = Rel(_arg((4, 6)), (("tp",), ()), (), "")
    info = OpInfo("stablehlo.dot_general", {"lhs_batch": (), "rhs_batch": (),
                                            "lhs_contract": (1,), "rhs_contract": (0,)},
                  [TensorType((2, 2), "f32"), TensorType((2, 6), "f32")],
                  [TensorType((2, 6), "f32")])
    (out,) = RULES[info.name](info, [x, w], _ctx())
    assert out.partial == ("tp",)
    assert devices._symmetric_axes([x, w], [out], MESH) == ("dp",)
    assert devices.distinct_devices(info, [x, w], [out], MESH, False, 8) == [0, 1]
    assert check_instance(info, [x, w], [out], MESH, checker=InstanceChecker()).proved
    wrong = Rel(T.scale(out.term, 2), out.tiling, out.partial, out.kind)
    assert check_instance(info, [x, w], [wrong], MESH,
                          checker=InstanceChecker()).status == "refuted"


# ----- block-only evaluation -------------------------------------------------------------------

def _window_cases():
    x, y = _arg((4, 6)), _arg((6, 4))
    b, c = _arg((2, 4, 3)), _arg((2, 3, 5))
    row = _arg((6,))
    dot = T.make_dot(x, y, ((), (), (1,), (0,)), (4, 4), "f32")
    batched = T.make_dot(b, c, ((0,), (0,), (2,), (1,)), (2, 4, 5), "f32")
    spread = T.make_broadcast(row, (1,), (4, 6))
    mixed = T.make_lin([(Fraction(1), T.make_mul(x, spread)), (Fraction(-3, 2), x)], 1,
                       (4, 6), "f32")
    exp = T.make_elementwise("stablehlo.exponential", (mixed,))
    summed = T.make_op("reduce_sum", (exp,), ((1,),), (4,), "f32", linear_in=0)
    flipped = T.make_transpose(T.make_elementwise("stablehlo.tanh", (dot,)), (1, 0))
    peak = T.intern("reduce_max", (batched,), ((1,),), (2, 5), "f32")
    sliced = T.make_op("slice", (x,), ((1, 0), (3, 6), (1, 1)), (2, 6), "f32", linear_in=0)
    rotated = T.make_elementwise("stablehlo.negate", (T.make_transpose(b, (1, 2, 0)),))
    merged = T.make_reshape(T.make_elementwise("stablehlo.tanh", (b,)), (8, 3))
    split = T.make_reshape(x, (2, 2, 3, 2))
    strided = T.make_op("slice", (x,), ((0, 1), (4, 6), (2, 2)), (2, 3), "f32", linear_in=0)
    joined = T.intern("concatenate", (x, T.make_elementwise("stablehlo.tanh", (x,)), x),
                      (1,), (4, 18), "f32")
    halves = T.intern("concatenate", (b, b), (0,), (4, 4, 3), "f32")
    cut = T.make_op("slice", (joined,), ((1, 4), (4, 16), (1, 3)), (3, 4), "f32",
                    linear_in=0)
    return [dot, batched, mixed, exp, summed, flipped, peak, sliced, rotated, merged, split,
            strided, joined, halves, cut]


def test_block_values_are_the_blocks_of_the_full_values() -> None:
    """`region_value` (operands read on the window only) equals slicing the full value,
    element for element, on every window of every case (random exact values)."""
    import itertools

    import numpy as np

    from entangle_mlir.semantics.element import equal
    from entangle_mlir.semantics.evaluate import evaluate_term

    for term in _window_cases():
        source = Concrete(seed=term.serial)
        env = LazyLeaves(source, leaf_args([term]))
        full = evaluate_term(term, env, {})
        ranges = [[(lo, hi) for lo in range(n) for hi in range(lo + 1, n + 1)]
                  for n in term.shape]
        for region in itertools.product(*ranges):
            got = region_value(term, tuple(region), env, {}, {})
            want = full[tuple(slice(lo, hi) for lo, hi in region)]
            assert got.shape == want.shape, (T.pretty(term), region)
            assert all(equal(a, b) for a, b in zip(np.reshape(got, -1),
                                                   np.reshape(want, -1))), (
                T.pretty(term), region)


# ----- collectives: symmetric in the axes their replica groups do not span ---------------------

def _collective(name: str, x: Rel, axes: tuple[str, ...], local_in, local_out, **attrs):
    info = OpInfo(name, {"replica_groups": MESH.groups_for(axes), "use_global_device_ids": True, "channel_handle": 1,
                         **attrs},
                  [TensorType(local_in, "f32")], [TensorType(local_out, "f32")])
    (out,) = RULES[name](info, [x], _ctx())
    return info, out


def test_all_reduce_over_tp_is_checked_on_one_tp_group() -> None:
    x = Rel(_arg((8, 4)), (("dp",), ()), ("tp",), "sum")
    info, out = _collective("stablehlo.all_reduce", x, ("tp",), (2, 4), (2, 4), reducer="add")
    assert not out.partial
    assert devices._collective_axes(info, MESH) == ("tp",)
    assert devices.distinct_devices(info, [x], [out], MESH, False, 8) == [0, 1]
    assert check_instance(info, [x], [out], MESH, checker=InstanceChecker()).proved
    wrong = Rel(T.scale(out.term, 2), out.tiling, (), "")
    assert check_instance(info, [x], [wrong], MESH,
                          checker=InstanceChecker()).status == "refuted"


def test_all_gather_over_dp_keeps_every_dp_coordinate() -> None:
    """The gather's groups span dp: dp is not reduced (tp is), and a wrong claim is refuted."""
    x = Rel(_arg((8, 4)), (("dp",), ()), (), "")
    info, out = _collective("stablehlo.all_gather", x, ("dp",), (2, 4), (8, 4),
                            all_gather_dim=0)
    checked = devices.distinct_devices(info, [x], [out], MESH, False, 8)
    assert {MESH.coords(d)["dp"] for d in checked} == {0, 1, 2, 3}
    assert {MESH.coords(d)["tp"] for d in checked} == {0}
    assert check_instance(info, [x], [out], MESH, checker=InstanceChecker()).proved
    rows = [T.make_op("slice", (x.term,), ((2 * b, 0), (2 * b + 2, 4), (1, 1)), (2, 4), "f32",
                      linear_in=0) for b in (0, 2, 1, 3)]
    swapped = Rel(T.intern("concatenate", tuple(rows), (0,), (8, 4), "f32"), out.tiling, (), "")
    assert check_instance(info, [x], [swapped], MESH,
                          checker=InstanceChecker()).status == "refuted"
