// RUN: not entangle check %S/Inputs/seqpar_mlp_all_gather_wrong_dim_tp4.ref.mlir %S/Inputs/seqpar_mlp_all_gather_wrong_dim_tp4.sharded.mlir | filecheck %s

// Bug all_gather_wrong_dim: the sequence-parallel MLP gathers the hidden dim instead of the
// sequence (examples/models.py:213); the token flatten hides the shape error from jax.
// Inputs: seqpar_mlp_all_gather_wrong_dim_tp4, written by `python -m examples.generate_lit`.

// One error, at the bug line, its claim confirmed by running both programs (the default of
// `entangle check`), then the verdict (Z3 rule-instance checks on: the default).
// CHECK: examples/models.py:213:9: error: all_gather concatenates along dim 2 but the value is split along dim 1 over 'tp'
// CHECK: note: confirmed by running both programs on 4 random inputs: result #0 differs from the reference by up to {{[0-9.e+]+}}
// CHECK-NOT: error:
// CHECK: not proven: all_gather concatenates along dim 2 but the value is split along dim 1 over 'tp'
// CHECK-NEXT: result#0 = concat over 'tp' along dim 1  [P(None, 'tp', None)]  (not proven)
// CHECK-NOT: error:
// CHECK: rule checks: Z3 checked {{[0-9]+}} rule instances: {{[0-9]+}} proved, 0 refuted, 0 inconclusive
