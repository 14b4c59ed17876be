// RUN: entangle check --assume-no-overflow %S/Inputs/ring_attention_grad.ref.mlir %S/Inputs/ring_attention_grad.sharded.mlir | filecheck %s
// RUN: entangle-opt --pass-pipeline='builtin.module(entangle-normalize{assume-no-overflow})' %S/Inputs/ring_attention_grad.sharded.mlir | filecheck %s --check-prefix=NORMALIZED
// RUN: not entangle check --no-verify-rules %S/Inputs/ring_attention_grad.ref.mlir %S/Inputs/ring_attention_grad.sharded.mlir | filecheck %s --check-prefix=STRICT

// Ring attention training over cp=4 (examples/real/repro.py `ring_attention_grad`): jax.grad
// through the online softmax with the running max differentiated. jax's backward gives each
// running max a cotangent and sends it to the scores' argmax (the tie shares of `maximum`, the
// indicator over the tie count of `reduce_max`). That cotangent is zero in real arithmetic:
// entangle-normalize proves it by einsum-polynomial algebra (entangle_mlir/normalize/polynomial.py) and
// replaces the products by zeros (entangle_mlir/normalize/max_cotangent.py); the backward is then the
// stopped max's, which online_backward.py folds (dQ one contraction, dK/dV slices of one
// contraction sent back around the reverse ring).
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

// No tie share of a max (select(x == m, 1, 0) / select(y == m, 2, 1)) is left.
// NORMALIZED-NOT: dense<2.000000e+00>
// NORMALIZED: sdy.manual_computation
// NORMALIZED-NOT: dense<2.000000e+00>
