// RUN: not entangle check %S/Inputs/layernorm_hidden_local_stats_tp4.ref.mlir %S/Inputs/layernorm_hidden_local_stats_tp4.sharded.mlir | filecheck %s

// Bug local_stats: LayerNorm with the hidden dim split computes per-shard mean/var
// (examples/models.py:164). The error points at the local mean (a partial sum over tp); the note
// at a subtract that mixes it with the split x (line 165 or 166: both do), and the reference
// reduce it stands for.
// Inputs: layernorm_hidden_local_stats_tp4, written by `python -m examples.generate_lit`.

// One error, at the bug line, its claim confirmed by running both programs (the default of
// `entangle check`), then the verdict (Z3 rule-instance checks on: the default).
// CHECK: examples/models.py:164:11: error: subtract combines a partial sum over 'tp' (missing all_reduce/psum) with a value split over 'tp'
// CHECK-NEXT: examples/models.py:{{16[56]}}:{{[0-9]+}}: note: the partial sum is used here by stablehlo.subtract
// CHECK-NEXT: examples/models.py:30:11: note: corresponds to the reference op stablehlo.reduce (jit(layernorm_ref)/reduce_sum)
// CHECK: note: confirmed by running both programs on 4 random inputs: result #0 differs from the reference by up to {{[0-9.e+]+}}
// CHECK-NOT: error:
// CHECK: not proven: subtract combines a partial sum over 'tp'
// CHECK-NEXT: result#0 = concat over 'tp' along dim 2  [P(None, None, 'tp')]  (not proven)
// CHECK-NOT: error:
// CHECK: rule checks: Z3 checked {{[0-9]+}} rule instances: {{[0-9]+}} proved, 0 refuted, 0 inconclusive
