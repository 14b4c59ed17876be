// RUN: not entangle check %S/Inputs/megatron_mlp_bias_before_psum_tp4.ref.mlir %S/Inputs/megatron_mlp_bias_before_psum_tp4.sharded.mlir | filecheck %s

// Bug bias_before_psum: b2 is added to the partial sums inside the psum (examples/models.py:93),
// so it is counted tp = 4 times. The error points at the add.
// Inputs: megatron_mlp_bias_before_psum_tp4, written by `python -m examples.generate_lit`.

// One error, at the bug line, its claim confirmed by running both programs (the default of
// `entangle check`), then the verdict (Z3 rule-instance checks on: the default).
// CHECK: examples/models.py:93:17: error: adds a value replicated over 'tp' to a partial sum over 'tp': after the all_reduce/psum it is counted 4 times (add it after the reduction)
// CHECK-NEXT: examples/catalog.py:213:10: note: result #0 differs from the reference: at top level: {{.*}} vs (1/2*dot_general({{.*}}) + 4*broadcast(b2))
// CHECK-NEXT: examples/models.py:66:11: note: corresponds to the reference op stablehlo.add (jit(mlp_ref)/add)
// CHECK: note: confirmed by running both programs on 4 random inputs: result #0 differs from the reference by up to {{[0-9.e+]+}}
// CHECK-NOT: error:
// CHECK: not proven: adds a value replicated over 'tp' to a partial sum over 'tp'
// CHECK-NEXT: result#0 = replicated on every device  [P(None, None, None)]  (not proven)
// CHECK-NOT: error:
// CHECK: rule checks: Z3 checked {{[0-9]+}} rule instances: {{[0-9]+}} proved, 0 refuted, 0 inconclusive
