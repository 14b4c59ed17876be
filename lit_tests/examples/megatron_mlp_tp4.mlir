// RUN: entangle check %S/Inputs/megatron_mlp_tp4.ref.mlir %S/Inputs/megatron_mlp_tp4.sharded.mlir | filecheck %s

// Correct example megatron_mlp_tp4: Megatron MLP: column-parallel W1/b1, row-parallel W2, psum, then b2.
// Inputs written by `python -m examples.generate_lit`. Proven with the Z3 rule-instance checks on.

// CHECK-NOT: error:
// CHECK: verified: the sharded program refines the reference on mesh tp=4
// CHECK-NEXT: result#0 = replicated on every device
// CHECK-NOT: error:
// CHECK: rule checks: Z3 checked {{[0-9]+}} rule instances: {{[0-9]+}} proved, 0 refuted, 0 inconclusive
