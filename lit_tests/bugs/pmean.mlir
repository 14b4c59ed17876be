// RUN: not entangle check %S/Inputs/megatron_mlp_pmean_tp4.ref.mlir %S/Inputs/megatron_mlp_pmean_tp4.sharded.mlir | filecheck %s

// Bug pmean: pmean instead of psum after the row-parallel matmul (examples/models.py:86): the
// output is 1/4 of the reference. (The message names neither the collective nor the axis: see
// lit_tests/known_issues/pmean_names_axis.mlir.)
// Inputs: megatron_mlp_pmean_tp4, written by `python -m examples.generate_lit`.

// One error, at the bug line, its claim confirmed by running both programs (the default of
// `entangle check`), then the verdict (Z3 rule-instance checks on: the default).
// CHECK: examples/models.py:86:8: error: pmean over 'tp': the all_reduce sum is divided by 4, so the value is 1/4 x what the reference computes here (psum was needed)
// CHECK-NEXT: examples/catalog.py:213:10: note: result #0 differs from the reference: at top level: (1/2*dot_general({{.*}}) vs (1/8*dot_general({{.*}}
// CHECK-NEXT: examples/models.py:66:11: note: corresponds to the reference op stablehlo.dot_general (jit(mlp_ref)/dot_general)
// CHECK: note: confirmed by running both programs on 4 random inputs: result #0 differs from the reference by up to {{[0-9.e+]+}}
// CHECK-NOT: error:
// CHECK: not proven: pmean over 'tp': the all_reduce sum is divided by 4
// CHECK-NEXT: result#0 = replicated on every device  [P(None, None, None)]  (not proven)
// CHECK-NOT: error:
// CHECK: rule checks: Z3 checked {{[0-9]+}} rule instances: {{[0-9]+}} proved, 0 refuted, 0 inconclusive
