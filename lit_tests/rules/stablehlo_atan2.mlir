// RUN: entangle-opt %s --split-input-file --entangle-normalize --entangle-import-shardings --entangle-infer-relations | filecheck %s

// stablehlo.atan2 (elementwise rule): atan2(a, b).
// Operands share one layout (here a 2-D tiling, with a poly splat); a partial sum is refused.

sdy.mesh @mesh = <["dp"=2, "tp"=4]>

// CHECK-LABEL: func.func @tiled_2d
func.func @tiled_2d(%x: tensor<8x16xf32>, %y: tensor<8x16xf32>) -> tensor<8x16xf32> {
  %0 = sdy.manual_computation(%x, %y) in_shardings=[<@mesh, [{"dp"}, {"tp"}]>, <@mesh, [{"dp"}, {"tp"}]>] out_shardings=[<@mesh, [{"dp"}, {"tp"}]>] manual_axes={"dp", "tp"} (%a: tensor<4x4xf32>, %b: tensor<4x4xf32>) {
    // CHECK: stablehlo.atan2 %{{.*}}entangle.relation = "tile [{dp}, {tp}] : atan2(%arg0, %arg1)"
    %1 = stablehlo.atan2 %a, %b : tensor<4x4xf32>
    %c = stablehlo.constant dense<2.0> : tensor<4x4xf32>
    // CHECK: stablehlo.atan2 %{{.*}}entangle.relation = "tile [{dp}, {tp}] : atan2(atan2(%arg0, %arg1), 2)"
    %2 = stablehlo.atan2 %1, %c : tensor<4x4xf32>
    sdy.return %2 : tensor<4x4xf32>
  } : (tensor<8x16xf32>, tensor<8x16xf32>) -> tensor<8x16xf32>
  return %0 : tensor<8x16xf32>
}

// -----

sdy.mesh @mesh = <["tp"=4]>

// CHECK-LABEL: func.func @partial_sum
func.func @partial_sum(%x: tensor<8x16xf32>, %w: tensor<16x8xf32>) -> tensor<8x8xf32> {
  %0 = sdy.manual_computation(%x, %w) in_shardings=[<@mesh, [{}, {"tp"}]>, <@mesh, [{"tp"}, {}]>] out_shardings=[<@mesh, [{}, {}]>] manual_axes={"tp"} (%a: tensor<8x4xf32>, %b: tensor<4x8xf32>) {
    %p = stablehlo.dot_general %a, %b, contracting_dims = [1] x [0] : (tensor<8x4xf32>, tensor<4x8xf32>) -> tensor<8x8xf32>
    %c = stablehlo.constant dense<0.0> : tensor<8x8xf32>
    // CHECK: stablehlo.atan2 %{{.*}}entangle.relation = "opaque: nonlinear op atan2 applied to a partial sum over 'tp': missing all_reduce/psum before it"
    %1 = stablehlo.atan2 %p, %c : tensor<8x8xf32>
    sdy.return %1 : tensor<8x8xf32>
  } : (tensor<8x16xf32>, tensor<16x8xf32>) -> tensor<8x8xf32>
  return %0 : tensor<8x8xf32>
}
