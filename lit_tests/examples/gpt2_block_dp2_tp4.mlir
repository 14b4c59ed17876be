// RUN: entangle check %S/Inputs/gpt2_block_dp2_tp4.ref.mlir %S/Inputs/gpt2_block_dp2_tp4.sharded.mlir | filecheck %s

// Correct example gpt2_block_dp2_tp4: GPT-2 block (LN, causal MHA, residual, LN, GELU MLP): batch over dp, TP over tp.
// Inputs written by `python -m examples.generate_lit`. Proven with the Z3 rule-instance checks on.

// CHECK-NOT: error:
// CHECK: verified: the sharded program refines the reference on mesh dp=2 x tp=4
// CHECK-NEXT: result#0 = concat over 'dp' along dim 0
// CHECK-NOT: error:
// CHECK: rule checks: Z3 checked {{[0-9]+}} rule instances: {{[0-9]+}} proved, 0 refuted, 0 inconclusive
