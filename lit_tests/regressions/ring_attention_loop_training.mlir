// RUN: entangle check --assume-no-overflow %S/Inputs/ring_attention_grad.ref.mlir %S/Inputs/ring_attention_loop_grad.sharded.mlir | filecheck %s
// RUN: entangle-opt --pass-pipeline='builtin.module(entangle-normalize{assume-no-overflow})' %S/Inputs/ring_attention_loop_grad.sharded.mlir | filecheck %s --check-prefix=NORMALIZED
// RUN: not entangle check --no-verify-rules %S/Inputs/ring_attention_grad.ref.mlir %S/Inputs/ring_attention_loop_grad.sharded.mlir | filecheck %s --check-prefix=STRICT

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
// CHECK: - no intermediate overflow: sums and products of finite values computed by the programs stay finite (--assume-no-overflow)
// CHECK: rule checks: Z3 checked {{[0-9]+}} rule instances: {{[0-9]+}} proved, 0 refuted, 0 inconclusive

// The scores q . k may overflow: these run under --assume-no-overflow, which the proof lists
// (by default the fold is refused, the reason at the running max: STRICT, and
// lit_tests/diagnostics/overflow.mlir).
// STRICT: error: the online softmax's running max may be -inf where a whole block of scores overflows
// STRICT: not proven: the online softmax's running max may be -inf

// No loop and no residual buffer is left in the shard_map body.
// NORMALIZED: sdy.manual_computation
// NORMALIZED-NOT: stablehlo.while
// NORMALIZED-NOT: stablehlo.dynamic_update_slice
// NORMALIZED-NOT: stablehlo.dynamic_slice
// NORMALIZED: sdy.return
