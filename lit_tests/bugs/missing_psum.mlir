// RUN: not entangle check %S/Inputs/megatron_mlp_missing_psum_tp4.ref.mlir %S/Inputs/megatron_mlp_missing_psum_tp4.sharded.mlir | filecheck %s

// Bug missing_psum: the Megatron MLP forgets the psum after its row-parallel matmul
// (examples/models.py:79). The error points at that matmul and names the axis; the notes point
// at the shard_map the partial sum leaves and at the reference matmul it stands for.
// Inputs: megatron_mlp_missing_psum_tp4, written by `python -m examples.generate_lit`.

// One error, at the bug line, its claim confirmed by running both programs (the default of
// `entangle check`), then the verdict (Z3 rule-instance checks on: the default).
// CHECK: examples/models.py:79:8: error: value is still a partial sum over 'tp' when it leaves shard_map (result #0): missing all_reduce/psum
// CHECK-NEXT: examples/catalog.py:213:10: note: the partial sum leaves shard_map here
// CHECK-NEXT: examples/models.py:66:11: note: corresponds to the reference op stablehlo.dot_general (jit(mlp_ref)/dot_general)
// CHECK: note: confirmed by running both programs on 4 random inputs: result #0 differs from the reference by up to {{[0-9.e+]+}}
// CHECK-NOT: error:
// CHECK: not proven: value is still a partial sum over 'tp'
// CHECK-NEXT: result#0 = replicated on every device  [P(None, None, None)]  (not proven)
// CHECK-NOT: error:
// CHECK: rule checks: Z3 checked {{[0-9]+}} rule instances: {{[0-9]+}} proved, 0 refuted, 0 inconclusive
