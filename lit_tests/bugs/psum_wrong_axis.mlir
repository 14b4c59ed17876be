// RUN: not entangle check %S/Inputs/gpt2_block_psum_wrong_axis_dp2_tp4.ref.mlir %S/Inputs/gpt2_block_psum_wrong_axis_dp2_tp4.sharded.mlir | filecheck %s

// Bug psum_wrong_axis (GPT-2 block on dp=2 x tp=4): the MLP partial sums are reduced over dp
// instead of tp (examples/models.py:290); dp splits the batch, so the psum adds different rows.
// Inputs: gpt2_block_psum_wrong_axis_dp2_tp4, written by `python -m examples.generate_lit`.

// One error, at the bug line, its claim confirmed by running both programs (the default of
// `entangle check`), then the verdict (Z3 rule-instance checks on: the default).
// CHECK: examples/models.py:290:8: error: all_reduce sums over 'dp' of a value split over 'dp': it combines different blocks
// CHECK-NEXT: examples/models.py:243:15: note: corresponds to the reference op stablehlo.dot_general (jit(gpt2_block_ref)/dot_general)
// CHECK: note: confirmed by running both programs on 4 random inputs: result #0 differs from the reference by up to {{[0-9.e+]+}}
// CHECK-NOT: error:
// CHECK: not proven: all_reduce sums over 'dp' of a value split over 'dp'
// CHECK-NEXT: result#0 = concat over 'dp' along dim 0  [P('dp', None, None)]  (not proven)
// CHECK-NOT: error:
// CHECK: rule checks: Z3 checked {{[0-9]+}} rule instances: {{[0-9]+}} proved, 0 refuted, 0 inconclusive
