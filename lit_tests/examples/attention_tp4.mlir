// RUN: entangle check %S/Inputs/attention_tp4.ref.mlir %S/Inputs/attention_tp4.sharded.mlir | filecheck %s

// Correct example attention_tp4: Causal MHA, heads over tp, row-parallel output projection + psum.
// Inputs written by `python -m examples.generate_lit`. Proven with the Z3 rule-instance checks on.

// CHECK-NOT: error:
// CHECK: verified: the sharded program refines the reference on mesh tp=4
// CHECK-NEXT: result#0 = replicated on every device
// CHECK-NOT: error:
// CHECK: rule checks: Z3 checked {{[0-9]+}} rule instances: {{[0-9]+}} proved, 0 refuted, 0 inconclusive
