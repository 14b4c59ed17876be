// RUN: entangle check --assume-no-overflow %S/Inputs/ring_attention_gqa_grad.ref.mlir %S/Inputs/ring_attention_gqa_grad.sharded.mlir | filecheck %s
// RUN: entangle-opt --pass-pipeline='builtin.module(entangle-normalize{assume-no-overflow})' %S/Inputs/ring_attention_gqa_grad.sharded.mlir | filecheck %s --check-prefix=NORMALIZED
// RUN: not entangle check --no-verify-rules %S/Inputs/ring_attention_gqa_grad.ref.mlir %S/Inputs/ring_attention_gqa_grad.sharded.mlir | filecheck %s --check-prefix=STRICT

// Ring attention training over cp=4 with grouped-query attention (examples/real/repro.py
// `ring_attention_gqa_grad`, Llama-3's `layers.ring_attention`): k and v have 2 heads, q 4,
// and each ring step repeats k and v's heads (`jnp.repeat(kb, 2, axis=2)`). jax's backward
// sums each step's key and value cotangents over the repeat (reshape to (kv heads, repeat),
// reduce over the repeat) before sending them back around the reverse ring.
// entangle-normalize moves those views and sums onto the contraction over all the keys
// (online_backward._ring_return), so each step's contribution is a slice of one value.
// Inputs: the reproducer lowered by examples/real/catalog.lower_pair, repo root stripped.

// CHECK: verified: the sharded program refines the reference on mesh cp=4
// CHECK-NEXT: result#0 = concat over 'cp' along dim 1
// CHECK-NEXT: result#1 = concat over 'cp' along dim 1
// CHECK-NEXT: result#2 = concat over 'cp' along dim 1
// CHECK: - no intermediate overflow: sums and products of finite values computed by the programs stay finite (--assume-no-overflow)
// CHECK: rule checks: Z3 checked {{[0-9]+}} rule instances: {{[0-9]+}} proved, 0 refuted, 0 inconclusive

// The scores q . k may overflow: these run under --assume-no-overflow, which the proof lists
// (by default the fold is refused, the reason at the running max: STRICT, and
// lit_tests/diagnostics/overflow.mlir).
// STRICT: error: the online softmax's running max may be -inf where a whole block of scores overflows
// STRICT: not proven: the online softmax's running max may be -inf

// The key and value gradients: the sum over the repeat of the contraction over all 8 keys
// (one per gradient), no per-step sum over the repeat left.
// NORMALIZED: sdy.manual_computation
// NORMALIZED-NOT: (tensor<2x2x2x2x4xf32>, tensor<f32>) -> tensor<2x2x2x4xf32>
// NORMALIZED: applies stablehlo.add across dimensions = [3] : (tensor<2x8x2x2x4xf32>, tensor<f32>) -> tensor<2x8x2x4xf32>
// NORMALIZED-NOT: (tensor<2x2x2x2x4xf32>, tensor<f32>) -> tensor<2x2x2x4xf32>
// NORMALIZED: applies stablehlo.add across dimensions = [3] : (tensor<2x8x2x2x4xf32>, tensor<f32>) -> tensor<2x8x2x4xf32>
// NORMALIZED-NOT: (tensor<2x2x2x2x4xf32>, tensor<f32>) -> tensor<2x2x2x4xf32>
// NORMALIZED: sdy.return
