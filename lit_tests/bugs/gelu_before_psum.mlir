// RUN: not entangle check %S/Inputs/row_linear_gelu_gelu_before_psum_tp4.ref.mlir %S/Inputs/row_linear_gelu_gelu_before_psum_tp4.sharded.mlir | filecheck %s

// Bug gelu_before_psum: GELU of the row-parallel partial products before the psum
// (examples/models.py:115). jax's tanh-GELU starts with x * x * x, so the first nonlinear use is
// a multiply; the error points at the matmul that made the partial sum, the note at the GELU.
// Inputs: row_linear_gelu_gelu_before_psum_tp4, written by `python -m examples.generate_lit`.

// One error, at the bug line, its claim confirmed by running both programs (the default of
// `entangle check`), then the verdict (Z3 rule-instance checks on: the default).
// CHECK: examples/models.py:115:20: error: nonlinear op multiply applied to a partial sum over 'tp': missing all_reduce/psum before it
// CHECK-NEXT: examples/models.py:115:8: note: the partial sum is used here by stablehlo.multiply
// CHECK-NEXT: examples/models.py:104:23: note: corresponds to the reference op stablehlo.dot_general (jit(row_linear_gelu_ref)/dot_general)
// CHECK: note: confirmed by running both programs on 4 random inputs: result #0 differs from the reference by up to {{[0-9.e+]+}}
// CHECK-NOT: error:
// CHECK: not proven: nonlinear op multiply applied to a partial sum over 'tp'
// CHECK-NEXT: result#0 = replicated on every device  [P(None, None, None)]  (not proven)
// CHECK-NOT: error:
// CHECK: rule checks: Z3 checked {{[0-9]+}} rule instances: {{[0-9]+}} proved, 0 refuted, 0 inconclusive
