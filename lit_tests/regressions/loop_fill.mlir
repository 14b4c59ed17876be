// RUN: entangle check %S/Inputs/scanned_fsdp_grads.ref.mlir %S/Inputs/scanned_fsdp_grads.sharded.mlir | filecheck %s --check-prefix=HELD
// RUN: not entangle check %S/Inputs/scanned_fsdp_grads.ref.mlir %S/Inputs/scanned_fsdp_grads_loss_psummed.sharded.mlir | filecheck %s --check-prefix=PSUM
// RUN: entangle check --no-general-tier %S/Inputs/loop_fill.ref.mlir %S/Inputs/loop_fill_scan.sharded.mlir | filecheck %s
// RUN: entangle check --no-general-tier %S/Inputs/loop_fill.ref.mlir %S/Inputs/loop_fill_fori.sharded.mlir | filecheck %s
// RUN: entangle check --no-general-tier %S/Inputs/loop_fill.ref.mlir %S/Inputs/loop_fill_fori_reversed.sharded.mlir | filecheck %s
// RUN: not entangle check %S/Inputs/loop_fill.ref.mlir %S/Inputs/loop_fill_fori_short.sharded.mlir | filecheck %s --check-prefix=WRONG
// RUN: not entangle check %S/Inputs/loop_fill.ref.mlir %S/Inputs/loop_fill_fori_layers_reversed.sharded.mlir | filecheck %s --check-prefix=WRONG

// FSDP over scanned layers (held-out `scanned_fsdp_grads`, MaxText scan_layers): jax.grad of
// the pmean'd loss, each layer's weight all_gather'd inside lax.scan. The sharded forward scan
// stacks the gathered weights as one more residual, which the reference never stacks (its
// backward scan reads the weights themselves). Two loop facts relate them in the layout tier
// (analysis/loop_slices.py): a loop result is named by the carries it reads (the extra
// residual does not change the others), and a buffer a counted loop fills window by window
// from a loop-invariant x is x. The psum'd-loss twin stays flagged (4x the loss).
// loop_fill_* (examples/loop_fill_lit.py): that fill alone, as scan's stacked outputs, a
// fori_loop (a scatter), a reversed fori_loop; a loop a trip short and one that writes the
// layers into reversed slots are not proven.

// HELD: verified: the sharded program refines the reference on mesh fsdp=4
// PSUM: value is 1/4 x what the reference computes here
// CHECK: verified: the sharded program refines the reference on mesh fsdp=4
// WRONG: confirmed by running both programs on 4 random inputs: result #0 differs from the reference
// WRONG-NOT: verified
