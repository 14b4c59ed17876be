// RUN: entangle check %S/Inputs/ring_attention_grad.ref.mlir %S/Inputs/ring_attention_loop_grad.sharded.mlir | filecheck %s
// RUN: entangle-opt --entangle-normalize %S/Inputs/ring_attention_loop_grad.sharded.mlir | filecheck %s --check-prefix=NORMALIZED

// Ring attention training with the ring in `lax.fori_loop` (examples/real/repro.py
// `ring_attention_loop_grad`). jax's gradient of the loop is two while loops: the forward
// stores each step's residuals into buffers at the counter (dynamic_update_slice), the
// backward reads them back at n - 1 - i (dynamic_slice). entangle-normalize unrolls both, folds
// the counters to constants, forwards every read to the value stored in its slot and drops the
// zero-started carries (entangle_mlir/normalize/unroll.py `forward_residuals`): the program is then the
// Python-unrolled ring's, whose backward online_backward.py folds. The reference is the
// unrolled reproducer's (ring_attention_training.mlir).
// Inputs: the reproducer lowered by examples/real/catalog.lower_pair, repo root stripped.

// CHECK: verified: the sharded program refines the reference on mesh cp=4
// CHECK-NEXT: result#0 = concat over 'cp' along dim 0
// CHECK-NEXT: result#1 = concat over 'cp' along dim 0
// CHECK-NEXT: result#2 = concat over 'cp' along dim 0
// CHECK: rule checks: Z3 checked {{[0-9]+}} rule instances: {{[0-9]+}} proved, 0 refuted, 0 inconclusive

// No loop and no residual buffer is left in the shard_map body.
// NORMALIZED: sdy.manual_computation
// NORMALIZED-NOT: stablehlo.while
// NORMALIZED-NOT: stablehlo.dynamic_update_slice
// NORMALIZED-NOT: stablehlo.dynamic_slice
// NORMALIZED: sdy.return
