// RUN: entangle-opt %s --split-input-file --entangle-normalize --entangle-import-shardings --entangle-infer-relations | filecheck %s

// stablehlo.minimum (elementwise rule): min(a, b).
// Operands share one layout (here a 2-D tiling, with a poly splat; nested minima flatten); a partial sum is refused.

sdy.mesh @mesh = <["dp"=2, "tp"=4]>

// CHECK-LABEL: func.func @tiled_2d
func.func @tiled_2d(%x: tensor<8x16xf32>, %y: tensor<8x16xf32>) -> tensor<8x16xf32> {
  %0 = sdy.manual_computation(%x, %y) in_shardings=[<@mesh, [{"dp"}, {"tp"}]>, <@mesh, [{"dp"}, {"tp"}]>] out_shardings=[<@mesh, [{"dp"}, {"tp"}]>] manual_axes={"dp", "tp"} (%a: tensor<4x4xf32>, %b: tensor<4x4xf32>) {
    // CHECK: stablehlo.minimum %{{.*}}entangle.relation = "tile [{dp}, {tp}] : minimum(%arg0, %arg1)"
    %1 = stablehlo.minimum %a, %b : tensor<4x4xf32>
    %c = stablehlo.constant dense<2.0> : tensor<4x4xf32>
    // CHECK: stablehlo.minimum %{{.*}}entangle.relation = "tile [{dp}, {tp}] : minimum(%arg0, %arg1, 2)"
    %2 = stablehlo.minimum %1, %c : tensor<4x4xf32>
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
    // CHECK: stablehlo.minimum %{{.*}}entangle.relation = "opaque: nonlinear op minimum applied to a partial sum over 'tp': missing all_reduce/psum before it"
    %1 = stablehlo.minimum %p, %c : tensor<8x8xf32>
    sdy.return %1 : tensor<8x8xf32>
  } : (tensor<8x16xf32>, tensor<16x8xf32>) -> tensor<8x8xf32>
  return %0 : tensor<8x8xf32>
}

// -----

sdy.mesh @mesh = <["dp"=2, "tp"=4]>

// On device scalars: min(partition_id, 3).
// CHECK-LABEL: func.func @device_scalar
func.func @device_scalar(%x: tensor<8x16xf32>) -> tensor<8x16xf32> {
  %0 = sdy.manual_computation(%x) in_shardings=[<@mesh, [{}, {}]>] out_shardings=[<@mesh, [{}, {}]>] manual_axes={"dp", "tp"} (%a: tensor<8x16xf32>) {
    %pid = stablehlo.partition_id : tensor<ui32>
    %i = stablehlo.convert %pid : (tensor<ui32>) -> tensor<i32>
    %c = stablehlo.constant dense<3> : tensor<i32>
    // CHECK: stablehlo.minimum %{{.*}}entangle.relation = "device scalar [0, 1, 2, 3, 3, 3, 3, 3]"
    %1 = stablehlo.minimum %i, %c : tensor<i32>
    sdy.return %a : tensor<8x16xf32>
  } : (tensor<8x16xf32>) -> tensor<8x16xf32>
  return %0 : tensor<8x16xf32>
}
