// RUN: not entangle check %S/../bugs/Inputs/megatron_mlp_pmean_tp4.ref.mlir %S/../bugs/Inputs/megatron_mlp_pmean_tp4.sharded.mlir | filecheck %s

// Regression (fixed): the pmean diagnostic names neither the collective nor the mesh axis.
// `lax.pmean(h @ w2, 'tp')` lowers to all_reduce(sum over tp) then divide by 4. The tool points
// at the right line but only says
//   examples/models.py:86:8: error: value is 1/4 x what the reference computes here (...)
// Every other bug's diagnostic names the axis ('tp', 'dp'); this one should say that the mean
// over 'tp' divides by 4 (e.g. "pmean over 'tp' ... 1/4 x"), so the user knows to use psum.
// See lit_tests/bugs/pmean.mlir for what it prints today.

// CHECK: examples/models.py:86:8: error: {{.*}}'tp'{{.*}}
