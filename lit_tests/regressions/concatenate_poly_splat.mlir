// RUN: entangle-opt %s --entangle-normalize --entangle-import-shardings --entangle-infer-relations | filecheck %s

// Regression (fixed): concatenate does not adapt poly operands.
// `jnp.concatenate([x, jnp.zeros((b, 4))], axis=1)` on a batch shard builds the zeros at the
// LOCAL shape (a splat, poly in every dim). rules/movement.concatenate calls `freeze()` on its
// operands before `unify_dims`, so the splat's dim 0 is taken as a replicated global 4 and the
// op becomes
//   opaque: concatenate: operands are laid out differently along dim 0 (split over 'dp' vs not split)
// Elementwise ops adapt the same splat (see rules/stablehlo_add.mlir, @poly).

sdy.mesh @mesh = <["dp"=2, "tp"=4]>

// CHECK-LABEL: func.func @pad_with_zeros
func.func @pad_with_zeros(%x: tensor<8x4xf32>) -> tensor<8x8xf32> {
  %0 = sdy.manual_computation(%x) in_shardings=[<@mesh, [{"dp"}, {}]>] out_shardings=[<@mesh, [{"dp"}, {}]>] manual_axes={"dp", "tp"} (%a: tensor<4x4xf32>) {
    %z = stablehlo.constant dense<0.0> : tensor<4x4xf32>
    // CHECK: stablehlo.concatenate %{{.*}}entangle.relation = "tile [{dp}, {}] : concatenate(%arg0, {{.*}})"
    %1 = stablehlo.concatenate %a, %z, dim = 1 : (tensor<4x4xf32>, tensor<4x4xf32>) -> tensor<4x8xf32>
    sdy.return %1 : tensor<4x8xf32>
  } : (tensor<8x4xf32>) -> tensor<8x8xf32>
  return %0 : tensor<8x8xf32>
}
