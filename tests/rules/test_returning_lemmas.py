"""Lemmas for contributions sent back to the owners of their blocks around a ring
(`Returning`, `rules/kinds/returning.py`; ring attention's dK/dV), TASO-style as in
test_reordered_lemmas.py: each rule output on small symbolic tensors over a 4-device ring is
proved by Z3 per device (the pieces of the partial sum are one symbolic split shared by the
instance's operands and results); the wrong claims (a forward permute where the reverse one is
due, a contribution counted twice or missing, pieces of another partial sum) are refuted; and
the rules refuse them."""

from __future__ import annotations

from dataclasses import replace

from entangle_mlir.core import terms as T
from entangle_mlir.core.relations import Opaque, Rel, Reordered, Returning, Value
from tests.rules.test_reordered_lemmas import N, arg, check, info, ring_orders, run, tiled

REVERSE = [[1, 0], [2, 1], [3, 2], [0, 3]]
FORWARD = [[0, 1], [1, 2], [2, 3], [3, 0]]
DOT = {"lhs_batch": (), "rhs_batch": (), "lhs_contract": (0,), "rhs_contract": (0,)}


class _Value:
    """A stand-in for the walk's record of the op that made a partial value (its identity)."""


def partial_keys(t: T.Term, token: object) -> Reordered:
    """T (keys x d) as a partial sum over cp, the keys in the ring's arrival order."""
    rel = Rel(t, ((), ()), ("cp",), "sum")
    return Reordered(rel, 0, ring_orders(1), pieces=token)


def slice_info(x: Value, j: int) -> object:
    return info("stablehlo.slice", [x], (2, 2), {"start_indices": (2 * j, 0),
                                                 "limit_indices": (2 * j + 2, 2),
                                                 "strides": (1, 1)})


def local_info(op: str, ins: list[Value], attrs: dict) -> object:
    """An op on (2, 2) local values (`Returning` values: one block of the keys)."""
    from entangle_mlir.mlir.opinfo import OpInfo, TensorType

    return OpInfo(op, attrs, [TensorType((2, 2), "f32") for _ in ins],
                  [TensorType((2, 2), "f32")])


def permute_info(x: Value, pairs) -> object:
    return local_info("stablehlo.collective_permute", [x], {"source_target_pairs": pairs,
                                                                "channel_handle": 1})


def add_info(a: Value, b: Value) -> object:
    return local_info("stablehlo.add", [a, b], {})


def step(y: Reordered, j: int) -> Value:
    (out,) = run(slice_info(y, j), [y])
    return out


def test_contraction_of_split_rows_with_reordered_keys_is_a_reordered_partial_sum() -> None:
    """dK = dS^T Q: each device contracts its own query rows against the keys in its
    arrival order: its piece of the partial sum, the keys reordered."""
    ds, q = arg((N, N)), arg((N, 2))
    ins: list[Value] = [Reordered(tiled(ds), 1, ring_orders(1)), tiled(q)]
    op_info = info("stablehlo.dot_general", ins, (N, 2), DOT)
    (out,) = run(op_info, ins)
    assert isinstance(out, Reordered) and out.rel.partial == ("cp",) and out.dim == 0
    assert check(op_info, ins, [out]) == "proved"
    assert check(op_info, ins, [replace(out, orders=ring_orders(-1))]) == "refuted"


def test_a_slice_of_one_block_is_the_devices_own_piece_of_that_block() -> None:
    token = _Value()
    y = partial_keys(arg((N, 2)), token)
    for j in range(4):
        out = step(y, j)
        assert isinstance(out, Returning) and out.pieces is token
        assert out.blocks == tuple((d - j) % 4 for d in range(4))
        assert check(slice_info(y, j), [y], [out]) == "proved"
        wrong = replace(out, blocks=tuple((d + j + 1) % 4 for d in range(4)))
        assert check(slice_info(y, j), [y], [wrong]) == "refuted"


def test_reverse_hops_bring_the_pieces_home_and_forward_hops_do_not() -> None:
    token = _Value()
    y = partial_keys(arg((N, 2)), token)
    x = step(y, 1)
    (back,) = run(permute_info(x, REVERSE), [x])
    assert isinstance(back, Returning) and back.blocks == (0, 1, 2, 3)
    assert back.sources == tuple(frozenset({(d + 1) % 4}) for d in range(4))
    assert check(permute_info(x, REVERSE), [x], [back]) == "proved"
    (ahead,) = run(permute_info(x, FORWARD), [x])
    assert isinstance(ahead, Returning) and ahead.blocks == (2, 3, 0, 1)
    assert check(permute_info(x, FORWARD), [x], [back]) == "refuted"


def _ring_sum(y: Reordered, pairs, skip: int = -1, twice: int = -1) -> Value:
    """acc = step n-1; acc = step i + permute(acc) down to step 0 (as jax's transpose of the
    ring writes it); `skip` leaves a step out, `twice` adds a step's slice again."""
    acc = step(y, 3)
    for i in (2, 1, 0):
        if isinstance(acc, Opaque):
            return acc
        (acc,) = run(permute_info(acc, pairs), [acc])
        if i == skip:
            continue
        (acc,) = run(add_info(acc, step(y, i)), [acc, step(y, i)])
        if i == twice:
            (acc,) = run(add_info(acc, step(y, i)), [acc, step(y, i)])
    return acc


def test_every_step_arriving_once_completes_the_partial_sum() -> None:
    t = arg((N, 2))
    y = partial_keys(t, _Value())
    total = _ring_sum(y, REVERSE)
    assert total == Rel(t, (("cp",), ()))
    last = step(y, 3)
    (moved,) = run(permute_info(last, REVERSE), [last])
    (two,) = run(add_info(moved, step(y, 2)), [moved, step(y, 2)])
    assert isinstance(two, Returning) and check(add_info(moved, step(y, 2)), [moved, step(y, 2)],
                                                [two]) == "proved"
    (three,) = run(permute_info(two, REVERSE), [two])
    (done,) = run(add_info(three, step(y, 1)), [three, step(y, 1)])
    (four,) = run(permute_info(done, REVERSE), [done])
    final = add_info(four, step(y, 0))
    assert check(final, [four, step(y, 0)], [total]) == "proved"


def test_wrong_owners_a_missing_step_and_a_double_count_are_refused_and_refuted() -> None:
    t = arg((N, 2))
    y = partial_keys(t, _Value())
    forward = _ring_sum(y, FORWARD)
    assert isinstance(forward, Opaque) and "different blocks" in forward.reason
    missing = _ring_sum(y, REVERSE, skip=1)
    assert isinstance(missing, Returning)  # never complete: an error where it leaves
    twice = _ring_sum(y, REVERSE, twice=1)
    assert isinstance(twice, Opaque) and "twice" in twice.reason
    # the claims the rules refuse to make are false: Z3 refutes them
    last = step(y, 3)
    (moved,) = run(permute_info(last, REVERSE), [last])
    (two,) = run(add_info(moved, step(y, 2)), [moved, step(y, 2)])
    (three,) = run(permute_info(two, REVERSE), [two])
    (done,) = run(add_info(three, step(y, 1)), [three, step(y, 1)])
    (four,) = run(permute_info(done, REVERSE), [done])
    whole = Rel(t, (("cp",), ()))
    assert check(add_info(four, step(y, 1)), [four, step(y, 1)], [whole]) == "refuted"
    assert check(add_info(four, four), [four, four], [whole]) == "refuted"
    (ahead,) = run(permute_info(done, FORWARD), [done])
    assert check(add_info(ahead, step(y, 0)), [ahead, step(y, 0)], [whole]) == "refuted"


def test_pieces_of_another_partial_sum_do_not_complete_it() -> None:
    """Two partial values of the same term split differently: their pieces do not add up."""
    t = arg((N, 2))
    y, other = partial_keys(t, _Value()), partial_keys(t, _Value())
    acc = step(y, 3)
    for i in (2, 1):
        (acc,) = run(permute_info(acc, REVERSE), [acc])
        (acc,) = run(add_info(acc, step(y, i)), [acc, step(y, i)])
    (acc,) = run(permute_info(acc, REVERSE), [acc])
    (mixed,) = run(add_info(acc, step(other, 0)), [acc, step(other, 0)])
    assert isinstance(mixed, Opaque) and "different partial sums" in mixed.reason
    claim = Rel(t, (("cp",), ()))
    assert check(add_info(acc, step(other, 0)), [acc, step(other, 0)], [claim]) != "proved"


def test_blocks_not_matching_the_partial_group_are_refused() -> None:
    """Eight blocks of a partial sum over four devices: a block index is not an owner."""
    y = partial_keys(arg((N, 2)), _Value())
    eighths = replace(y, orders=tuple(tuple(range(8)) for _ in range(4)))
    op_info = info("stablehlo.slice", [eighths], (1, 2), {"start_indices": (0, 0),
                                                          "limit_indices": (1, 2),
                                                          "strides": (1, 1)})
    (out,) = run(op_info, [eighths])
    assert isinstance(out, Opaque)
