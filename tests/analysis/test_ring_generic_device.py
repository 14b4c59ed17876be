"""Ring instances checked for one generic device (issue 21; `instance/devices.py`): where
every table of the instance moves with the rotation of the ring (block orders, returning
blocks and sources, a collective_permute's pairs, rolls), the claim of device d is device 0's
with the variables renamed, so device 0 alone is checked; a sum over the ring is checked on
one block (`one_block`); the pieces of the partial sums are made per part of what the claim
sums (`claims._Pieces`). The nearest wrong claims stay refuted: one device's table off
(the symmetry then does not hold and every device is checked), the other ring direction,
a block off by one, a contribution counted twice, a permute with one pair off."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from entangle_mlir.analysis.instance import devices
from entangle_mlir.core import terms as T
from entangle_mlir.core.mesh import Mesh
from entangle_mlir.core.relations import Rel, Reordered, Returning
from tests.rules.test_reordered_lemmas import (
    CP,
    N,
    arg,
    check,
    info,
    ring_blocks,
    ring_orders,
    run,
    tiled,
    whole,
)
from tests.rules.test_returning_lemmas import (
    DOT,
    REVERSE,
    _Value,
    add_info,
    partial_keys,
    permute_info,
    step,
)


def _exp(x: Reordered) -> tuple:
    op_info = info("stablehlo.exponential", [x], (N, 2), {})
    (out,) = run(op_info, [x])
    return op_info, out


def _one_order_off(orders: tuple, device: int) -> tuple:
    """`orders` with two blocks of one device's order swapped, block 0 left in place (a
    claim on block 0 alone would not see it)."""
    changed = list(orders[device])
    i, j = [k for k, b in enumerate(changed) if b != 0][:2]
    changed[i], changed[j] = changed[j], changed[i]
    return tuple(tuple(changed) if d == device else o for d, o in enumerate(orders))


def test_an_elementwise_op_in_the_ring_order_is_checked_on_device_0_alone() -> None:
    x = Reordered(whole(arg((N, 2))), 0, ring_orders(1))
    op_info, out = _exp(x)
    assert devices._symmetric_axes([x], [out], CP) == ("cp",)
    assert devices.distinct_devices(op_info, [x], [out], CP, False, 4) == [0]
    assert check(op_info, [x], [out]) == "proved"


def test_one_device_out_of_the_ring_order_is_checked_everywhere_and_refuted() -> None:
    """Device 2 claims another order: the tables no longer move with the rotation, every
    device is checked, and device 2's claim is false (device 0's alone holds)."""
    x = Reordered(whole(arg((N, 2))), 0, ring_orders(1))
    op_info, out = _exp(x)
    wrong = replace(out, orders=_one_order_off(out.orders, 2))
    assert devices._symmetric_axes([x], [wrong], CP) == ()
    assert devices.distinct_devices(op_info, [x], [wrong], CP, False, 4) == [0, 1, 2, 3]
    assert check(op_info, [x], [wrong]) == "refuted"


def test_the_other_ring_direction_is_refuted_on_the_generic_device() -> None:
    """Every device's claim wrong alike (the orders still move with the rotation): device 0's
    is false too."""
    x = Reordered(whole(arg((N, 2))), 0, ring_orders(1))
    op_info, out = _exp(x)
    wrong = replace(out, orders=ring_orders(-1))
    assert devices._symmetric_axes([x], [wrong], CP) == ("cp",)
    assert check(op_info, [x], [wrong]) == "refuted"


def test_returning_pieces_one_device_and_a_block_off_by_one() -> None:
    y = partial_keys(arg((N, 2)), _Value())
    x = step(y, 1)
    op_info = permute_info(x, REVERSE)
    (back,) = run(op_info, [x])
    assert isinstance(back, Returning)
    assert devices.distinct_devices(op_info, [x], [back], CP, False, 4) == [0]
    assert check(op_info, [x], [back]) == "proved"
    off = replace(back, blocks=tuple((b + 1) % 4 for b in back.blocks))
    assert devices.distinct_devices(op_info, [x], [off], CP, False, 4) == [0]
    assert check(op_info, [x], [off]) == "refuted"
    one_off = replace(back, sources=tuple(frozenset({(d + 2) % 4}) if d == 3 else s
                                          for d, s in enumerate(back.sources)))
    assert devices.distinct_devices(op_info, [x], [one_off], CP, False, 4) == [0, 1, 2, 3]
    assert check(op_info, [x], [one_off]) == "refuted"


def test_a_contribution_counted_twice_is_refuted_with_the_pieces_in_parts() -> None:
    """An add of the same piece to itself claimed as two devices' pieces: the parts of what
    the claim sums keep the two devices apart."""
    y = partial_keys(arg((N, 2)), _Value())
    mine = step(y, 0)
    twice = replace(mine, sources=tuple(frozenset({d, (d + 1) % 4}) for d in range(4)))
    assert check(add_info(mine, mine), [mine, mine], [twice]) == "refuted"


def test_a_permute_with_one_pair_off_is_checked_everywhere() -> None:
    """K's blocks passed around the ring: the pairs move with the rotation (device 0 and its
    source checked); with two targets swapped they do not, and the ring's claim is refuted
    on the devices that receive another block."""
    _, blocks = ring_blocks()
    ring = [[0, 1], [1, 2], [2, 3], [3, 0]]
    swapped = [[0, 2], [1, 1], [2, 3], [3, 0]]
    for pairs, expected, verdict in ((ring, [0], "proved"), (swapped, [0, 1, 2, 3], "refuted")):
        op_info = info("stablehlo.collective_permute", [blocks[0]], (2, 2),
                       {"source_target_pairs": pairs, "channel_handle": 1})
        assert devices.distinct_devices(op_info, [blocks[0]], [blocks[1]], CP, False,
                                         4) == expected
        assert check(op_info, [blocks[0]], [blocks[1]]) == verdict


def test_a_sum_over_the_ring_is_checked_on_one_block_and_a_wrong_order_refuted() -> None:
    """dK = dS^T Q: each device's piece, the keys in its arrival order; the sum over the ring
    is claimed on block 0 alone (the other blocks are its rotations). The other direction
    (still moving with the rotation) and one device's order off are refuted."""
    ds, q = arg((N, N)), arg((N, 2))
    ins = [Reordered(tiled(ds), 1, ring_orders(1)), tiled(q)]
    op_info = info("stablehlo.dot_general", ins, (N, 2), DOT)
    (out,) = run(op_info, ins)
    assert devices.one_block(ins, [out], CP) == ("cp",)
    assert check(op_info, ins, [out]) == "proved"
    wrong = replace(out, orders=ring_orders(-1))
    assert devices.one_block(ins, [wrong], CP) == ("cp",)
    assert check(op_info, ins, [wrong]) == "refuted"
    one_off = replace(out, orders=_one_order_off(out.orders, 1))
    assert devices.one_block(ins, [one_off], CP) == ()
    assert check(op_info, ins, [one_off]) == "refuted"


def test_a_roll_commutes_with_the_rotation_of_its_major_axis_only() -> None:
    """A roll of a dim split over (major, minor): rotating the major coordinate shifts the
    whole dim (two cyclic shifts commute); rotating the minor one shifts within chunks."""
    mesh = Mesh((("a", 2), ("b", 2)))
    x = arg((8, 2))
    leaf = Rel(x, (("a", "b"), ()))
    rolled = Rel(T.make_roll(x, 0, 2), (("a", "b"), ()))
    assert devices._symmetric_axes([leaf], [rolled], mesh) == ("a",)


_MASK = """
module attributes {mhlo.num_partitions = 4 : i32} {
  func.func @main(%x: tensor<2x4xf32>) -> tensor<2x4xf32> {
    %pid = stablehlo.partition_id : tensor<ui32>
    %p = stablehlo.convert %pid : (tensor<ui32>) -> tensor<i32>
    %c3 = stablehlo.constant dense<3> : tensor<i32>
    %c4 = stablehlo.constant dense<4> : tensor<i32>
    %c2 = stablehlo.constant dense<2> : tensor<i32>
    %back = stablehlo.add %p, %c3 : tensor<i32>
    %src = stablehlo.remainder %back, %c4 : tensor<i32>
    %start = stablehlo.multiply %src, %c2 : tensor<i32>
    %mine = stablehlo.multiply %p, %c2 : tensor<i32>
    %kb = stablehlo.broadcast_in_dim %start, dims = [] : (tensor<i32>) -> tensor<4xi32>
    %qb = stablehlo.broadcast_in_dim %mine, dims = [] : (tensor<i32>) -> tensor<2xi32>
    %kiota = stablehlo.iota dim = 0 : tensor<4xi32>
    %qiota = stablehlo.iota dim = 0 : tensor<2xi32>
    %k = stablehlo.add %kiota, %kb : tensor<4xi32>
    %q = stablehlo.add %qiota, %qb : tensor<2xi32>
    %kk = stablehlo.broadcast_in_dim %k, dims = [1] : (tensor<4xi32>) -> tensor<2x4xi32>
    %qq = stablehlo.broadcast_in_dim %q, dims = [0] : (tensor<2xi32>) -> tensor<2x4xi32>
    %mask = stablehlo.compare GE, %qq, %kk, SIGNED : (tensor<2x4xi32>, tensor<2x4xi32>) -> tensor<2x4xi1>
    %t = stablehlo.transpose %mask, dims = [1, 0] : (tensor<2x4xi1>) -> tensor<4x2xi1>
    %both = stablehlo.concatenate %t, %t, dim = 1 : (tensor<4x2xi1>, tensor<4x2xi1>) -> tensor<4x4xi1>
    %flat = stablehlo.reshape %both : (tensor<4x4xi1>) -> tensor<16xi1>
    %ninf = stablehlo.constant dense<0xFF800000> : tensor<2x4xf32>
    %s = stablehlo.select %mask, %x, %ninf : tensor<2x4xi1>, tensor<2x4xf32>
    return %s : tensor<2x4xf32>
  }
}"""


def test_device_masks_are_evaluated_on_every_device_at_once() -> None:
    """A causal mask of a ring step (query rows of this device against the keys of the one
    before it): evaluated for all devices in one pass, as each device computes it, and
    different on each device (the per-device numbers written out with numpy)."""
    from entangle_mlir.mlir.ir import context, parse_module
    from entangle_mlir.normalize.finite import _on_every_device

    with context():
        module = parse_module(_MASK)
        body = module.body.operations[0].regions[0].blocks[0]
        ops = {op.operation.name: op.operation for op in body.operations}
        at = ops["stablehlo.select"]
        for name in ("stablehlo.compare", "stablehlo.reshape"):
            found = _on_every_device(ops[name].results[0], at)
            assert found is not None and found.shape[0] == 4
            for d in range(4):
                start = ((d + 3) % 4) * 2
                want = (np.arange(2)[:, None] + 2 * d) >= (np.arange(4)[None, :] + start)
                if name == "stablehlo.reshape":
                    want = np.concatenate([want.T, want.T], axis=1).reshape(16)
                np.testing.assert_array_equal(found[d], want)
        masks = _on_every_device(ops["stablehlo.compare"].results[0], at)
        assert not all((masks[d] == masks[0]).all() for d in range(4))
