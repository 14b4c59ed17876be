"""The one place that routes an op to its rule by the kinds of its operands.

A plain `Rel` operand goes to the op's rule in `RULES`. The other value kinds (rules/kinds/)
are either completed by the op (a window by the slice that cuts it, blocks in a device order
by the sum that forgets the order) or stand for the error they record: `settle` decides which
an op sees, and `apply_rule` chooses between the kind's own rule, the op's rule and "not
proven".
"""

from __future__ import annotations

from entangle_mlir.core.relations import (
    DEVICE_BLOCK_VALUES,
    Masked,
    Opaque,
    Rel,
    Reordered,
    Returning,
    Shifted,
    Value,
)
from entangle_mlir.core.traits import ELEMENTWISE_OPS
from entangle_mlir.mlir.opinfo import OpInfo
from entangle_mlir.rules import RULES
from entangle_mlir.rules.base import RuleContext
from entangle_mlir.rules.common import check_local_shapes
from entangle_mlir.rules.kinds import device_blocks, reordered, returning
from entangle_mlir.rules.kinds.window import settle as settle_window

TRANSPARENT = ("mhlo.copy", "stablehlo.optimization_barrier", "sdy.sharding_constraint",
               "sdy.reshard")
"""Ops that pass their operands through unchanged."""

SHIFT_AWARE = frozenset(ELEMENTWISE_OPS) | {"stablehlo.broadcast_in_dim", "stablehlo.reshape",
                                            "stablehlo.transpose", "stablehlo.scatter",
                                            "stablehlo.gather"}
"""Ops whose rules read a `Shifted` operand."""
BLOCK_AWARE = frozenset(ELEMENTWISE_OPS) | {"stablehlo.broadcast_in_dim", "stablehlo.reshape",
                                            "stablehlo.transpose", "stablehlo.gather",
                                            "stablehlo.scatter", "stablehlo.reduce",
                                            "stablehlo.dot_general"}
"""Ops whose rules read device-block values (`InBlock`, `BlockIndex`, `Masked`)."""
MASK_CARRIERS = frozenset(ELEMENTWISE_OPS) | {"stablehlo.broadcast_in_dim", "stablehlo.reshape",
                                             "stablehlo.transpose", *device_blocks.CARRIERS}
"""Ops that may carry a not-yet-zeroed `Masked` lookup forward (to the `where` that zeroes it)."""
REGION_RULE_OPS = ("stablehlo.reduce", "stablehlo.all_reduce", "stablehlo.reduce_scatter",
                   "stablehlo.scatter", "stablehlo.sort", "stablehlo.reduce_window",
                   "stablehlo.select_and_scatter")
"""Ops with regions whose rules read the region (any other op with regions is unsupported)."""


def settle(value: Value, op_name: str = "") -> Value:
    """What an op sees of `value` (`op_name` empty: leaving a manual computation or a loop).
    Windows and permuted blocks are kept for the ops that complete them
    (`rules.kinds.window.settle`); blocks in a device-dependent order leave a manual
    computation or a loop only as the error they stand for."""
    if isinstance(value, Reordered) and not op_name:
        return Opaque(f"blocks of dim {value.dim} in a device-dependent order leave the "
                      f"computation ({value.describe()[-120:]})", origin=value.origin,
                      category="wrong_order")
    if isinstance(value, Returning) and not op_name:
        return Opaque(f"contributions leave the computation before every one reached the "
                      f"owner of its block ({value.describe()[-160:]})", category="wrong_order")
    return settle_window(value, op_name)


def settle_operands(inputs: list[Value], op_name: str) -> list[Value]:
    """`settle` of every operand (the same list when all are plain `Rel`s, the common case)."""
    for value in inputs:
        if type(value) is not Rel:
            return [settle(v, op_name) for v in inputs]
    return inputs


def apply_rule(info: OpInfo, inputs: list[Value], ctx: RuleContext, has_regions: bool,
               result_count: int) -> list[Value]:
    """The values of an op's results from its settled operands' values (`settle_operands`): by
    the rule of the operands' kind where one is not a plain `Rel`, else by the op's rule; an op
    without a rule, or a kind the op cannot take, is `Opaque` with the reason."""
    plain = all(type(v) is Rel for v in inputs)
    name = info.name
    opaque = None if plain else next((v for v in inputs if isinstance(v, Opaque)), None)
    if opaque is not None:
        return [opaque] * result_count
    if name in TRANSPARENT:
        ctx.note(f"{name} is treated as the identity")
        return list(inputs)
    if name not in RULES:
        return [Opaque(f"unsupported op {name}", category="unsupported")] * result_count
    if name == "stablehlo.concatenate" and (
            ring := reordered.ring_concat(info, inputs, ctx)) is not None:
        return [ring]
    if not plain:
        if any(isinstance(v, Reordered) for v in inputs):
            return reordered.apply(info, inputs, ctx, RULES[name])
        if any(isinstance(v, Returning) for v in inputs):
            return returning.apply(info, inputs, ctx)
        if any(isinstance(v, Masked) and not v.zero for v in inputs) and \
                name not in MASK_CARRIERS:
            return [Opaque(f"{name} uses rows looked up for ids outside this device's "
                           "block (the gather clamped them to another row): they are never "
                           "zeroed (missing `where(outside, 0, ...)` after the lookup)",
                           category="layout_mismatch")] * result_count
        if any(isinstance(v, DEVICE_BLOCK_VALUES) for v in inputs) and name not in BLOCK_AWARE:
            return [device_blocks.unsupported(name)] * result_count
        if any(isinstance(v, Shifted) for v in inputs) and name not in SHIFT_AWARE:
            return [Opaque(f"device-dependent offset tensor used by {name} (not "
                           "supported yet)", category="unsupported")] * result_count
    if has_regions and name not in REGION_RULE_OPS:
        return [Opaque(f"unsupported op {name} (with regions)",
                       category="unsupported")] * result_count
    try:
        outputs = RULES[name](info, inputs, ctx)
    except Exception as err:  # noqa: BLE001 - a rule failure is "not proven"
        outputs = [Opaque(f"internal error in the rule for {name}: {err!r}",
                          category="internal")] * result_count
    return check_local_shapes(info, outputs, ctx)
