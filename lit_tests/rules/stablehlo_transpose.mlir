// RUN: entangle-opt %s --split-input-file --entangle-normalize --entangle-import-shardings --entangle-infer-relations | filecheck %s

// stablehlo.transpose (movement rule): permutes tilings (and poly dims) with the dims; keeps a
// partial sum; two transposes compose.

sdy.mesh @mesh = <["dp"=2, "tp"=4]>

// CHECK-LABEL: func.func @tiled_2d
func.func @tiled_2d(%x: tensor<8x16xf32>) -> tensor<16x8xf32> {
  %0 = sdy.manual_computation(%x) in_shardings=[<@mesh, [{"dp"}, {"tp"}]>] out_shardings=[<@mesh, [{"tp"}, {"dp"}]>] manual_axes={"dp", "tp"} (%a: tensor<4x4xf32>) {
    // CHECK: stablehlo.transpose %{{.*}}entangle.relation = "tile [{tp}, {dp}] : transpose(%arg0)"
    %1 = stablehlo.transpose %a, dims = [1, 0] : (tensor<4x4xf32>) -> tensor<4x4xf32>
    // CHECK: stablehlo.transpose %{{.*}}entangle.relation = "tile [{dp}, {tp}] : %arg0"
    %2 = stablehlo.transpose %1, dims = [1, 0] : (tensor<4x4xf32>) -> tensor<4x4xf32>
    sdy.return %1 : tensor<4x4xf32>
  } : (tensor<8x16xf32>) -> tensor<16x8xf32>
  return %0 : tensor<16x8xf32>
}

// -----

sdy.mesh @mesh = <["dp"=2, "tp"=4]>

// A transposed poly splat still adapts to its partner; a partial sum stays partial.
// (A transposed poly broadcast does not yet: see lit_tests/known_issues/transpose_poly_broadcast.mlir.)
// CHECK-LABEL: func.func @poly_and_partial
func.func @poly_and_partial(%x: tensor<8x16xf32>, %w: tensor<16x8xf32>) -> tensor<8x8xf32> {
  %0 = sdy.manual_computation(%x, %w) in_shardings=[<@mesh, [{"dp"}, {"tp"}]>, <@mesh, [{"tp"}, {}]>] out_shardings=[<@mesh, [{}, {"dp"}]>] manual_axes={"dp", "tp"} (%a: tensor<4x4xf32>, %b: tensor<4x8xf32>) {
    %p = stablehlo.dot_general %a, %b, contracting_dims = [1] x [0] : (tensor<4x4xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>
    // CHECK: stablehlo.transpose %{{.*}}entangle.relation = "tile [{}, {dp}] partial sum {tp} : dot_general(%arg1, %arg0)"
    %t = stablehlo.transpose %p, dims = [1, 0] : (tensor<4x8xf32>) -> tensor<8x4xf32>
    %c = stablehlo.constant dense<3.0> : tensor<4x8xf32>
    // CHECK: stablehlo.transpose %{{.*}}entangle.relation = "replicated : 3"
    %ct = stablehlo.transpose %c, dims = [1, 0] : (tensor<4x8xf32>) -> tensor<8x4xf32>
    // CHECK: stablehlo.multiply %{{.*}}entangle.relation = "tile [{}, {dp}] partial sum {tp} : (3*dot_general(%arg1, %arg0))"
    %1 = stablehlo.multiply %t, %ct : tensor<8x4xf32>
    sdy.return %1 : tensor<8x4xf32>
  } : (tensor<8x16xf32>, tensor<16x8xf32>) -> tensor<8x8xf32>
  return %0 : tensor<8x8xf32>
}
