"""Write the inputs of lit_tests/regressions/loop_fill.mlir: `python -m examples.loop_fill_lit`.

A loop that stacks, layer by layer, the all_gather'd shards of stacked FSDP weights rebuilds
the stacked weights: what jax's scan saves as a residual for the backward pass of FSDP over
scanned layers (the held-out `scanned_fsdp_grads`), which the reference reads from its input.
Spelled as scan's stacked outputs, a fori_loop writing slot i, and one writing slot 2 - i;
and two wrong ones: a fori_loop that stops a trip early (the last slot keeps its zeros), and
one that writes layer i into slot 2 - i (the layers reversed). Every program returns twice the
stack, so the fill is compared through an op.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

from examples.generate_lit import REPO, relative_paths
from examples.heldout.corpus import by_name, f32, lower_pair, program
from examples.heldout.training_steps import FSDP4

INPUTS = REPO / "lit_tests" / "regressions" / "Inputs"
LAYERS = 3


def _gather(w):
    return lax.all_gather(w, "fsdp", axis=0, tiled=True)


def reference(ws):
    return ws * 2


def scanned(ws):
    _, stacked = lax.scan(lambda c, w: (c, _gather(w)), None, ws)
    return stacked * 2


def _fori(trips: int, slot):
    def body(ws):
        full = (LAYERS, ws.shape[1] * 4, ws.shape[2])
        put = lambda i, b: b.at[slot(i)].set(_gather(ws[slot(i)]))
        return lax.fori_loop(0, trips, put, jnp.zeros(full, ws.dtype)) * 2
    return body


def _reading(slot_read, slot_write):
    def body(ws):
        full = (LAYERS, ws.shape[1] * 4, ws.shape[2])
        put = lambda i, b: b.at[slot_write(i)].set(_gather(ws[slot_read(i)]))
        return lax.fori_loop(0, LAYERS, put, jnp.zeros(full, ws.dtype)) * 2
    return body


PROGRAMS = {
    "scan": scanned,
    "fori": _fori(LAYERS, lambda i: i),
    "fori_reversed": _fori(LAYERS, lambda i: LAYERS - 1 - i),
    "fori_short": _fori(LAYERS - 1, lambda i: i),
    "fori_layers_reversed": _reading(lambda i: i, lambda i: LAYERS - 1 - i),
}
"""Input name -> the sharded program (the first three correct, the last two wrong)."""

HELD_OUT = {"scanned_fsdp_grads_fsdp4": "scanned_fsdp_grads",
            "scanned_fsdp_grads_loss_psummed_not_pmeaned_fsdp4":
            "scanned_fsdp_grads_loss_psummed"}
"""The held-out pair the fill was missing for (examples/heldout/training_steps.py) -> input."""


def main() -> None:
    with jax.default_device(jax.devices("cpu")[0]):
        for name, body in PROGRAMS.items():
            ex = program("loop_fill", name, FSDP4, reference, body,
                         (f32((LAYERS, 16, 8), P(None, "fsdp", None)),), P(), name,
                         check_vma=False)
            ref, sharded = lower_pair(ex)
            (INPUTS / "loop_fill.ref.mlir").write_text(relative_paths(ref))
            (INPUTS / f"loop_fill_{name}.sharded.mlir").write_text(relative_paths(sharded))
        for example, sharded_name in HELD_OUT.items():
            ref, sharded = lower_pair(by_name(example))
            (INPUTS / "scanned_fsdp_grads.ref.mlir").write_text(relative_paths(ref))
            (INPUTS / f"{sharded_name}.sharded.mlir").write_text(relative_paths(sharded))


if __name__ == "__main__":
    main()
