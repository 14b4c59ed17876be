// RUN: entangle-opt %s --split-input-file --entangle-normalize --entangle-import-shardings --entangle-infer-relations | filecheck %s

// stablehlo.negate (elementwise rule, linear): keeps a tiling and a partial sum; the negation of
// a partial max is a partial min. Signs pull through dot_general, so -(dot(-x, w)) is dot(x, w).

sdy.mesh @mesh = <["tp"=4]>

// CHECK-LABEL: func.func @partial
func.func @partial(%x: tensor<8x16xf32>, %w: tensor<16x8xf32>) -> tensor<8x8xf32> {
  %0 = sdy.manual_computation(%x, %w) in_shardings=[<@mesh, [{}, {"tp"}]>, <@mesh, [{"tp"}, {}]>] out_shardings=[<@mesh, [{}, {}]>] manual_axes={"tp"} (%a: tensor<8x4xf32>, %b: tensor<4x8xf32>) {
    // CHECK: stablehlo.negate %{{.*}}entangle.relation = "tile [{}, {tp}] : (-1*%arg0)"
    %n = stablehlo.negate %a : tensor<8x4xf32>
    %p = stablehlo.dot_general %n, %b, contracting_dims = [1] x [0] : (tensor<8x4xf32>, tensor<4x8xf32>) -> tensor<8x8xf32>
    // CHECK: stablehlo.negate %{{.*}}entangle.relation = "partial sum {tp} : dot_general(%arg0, %arg1)"
    %1 = stablehlo.negate %p : tensor<8x8xf32>
    sdy.return %1 : tensor<8x8xf32>
  } : (tensor<8x16xf32>, tensor<16x8xf32>) -> tensor<8x8xf32>
  return %0 : tensor<8x8xf32>
}

// -----

sdy.mesh @mesh = <["tp"=4]>

// CHECK-LABEL: func.func @partial_max
func.func @partial_max(%x: tensor<8x16xf32>) -> tensor<8xf32> {
  %0 = sdy.manual_computation(%x) in_shardings=[<@mesh, [{}, {"tp"}]>] out_shardings=[<@mesh, [{}]>] manual_axes={"tp"} (%a: tensor<8x4xf32>) {
    %ninf = stablehlo.constant dense<0xFF800000> : tensor<f32>
    %m = stablehlo.reduce(%a init: %ninf) applies stablehlo.maximum across dimensions = [1] : (tensor<8x4xf32>, tensor<f32>) -> tensor<8xf32>
    // CHECK: stablehlo.negate %{{.*}}entangle.relation = "partial min {tp} : (-1*reduce_max(%arg0))"
    %1 = stablehlo.negate %m : tensor<8xf32>
    sdy.return %1 : tensor<8xf32>
  } : (tensor<8x16xf32>) -> tensor<8xf32>
  return %0 : tensor<8xf32>
}

// -----

sdy.mesh @mesh = <["dp"=2, "tp"=4]>

// CHECK-LABEL: func.func @device_scalar
func.func @device_scalar(%x: tensor<8x16xf32>) -> tensor<8x16xf32> {
  %0 = sdy.manual_computation(%x) in_shardings=[<@mesh, [{}, {}]>] out_shardings=[<@mesh, [{}, {}]>] manual_axes={"dp", "tp"} (%a: tensor<8x16xf32>) {
    %pid = stablehlo.partition_id : tensor<ui32>
    %i = stablehlo.convert %pid : (tensor<ui32>) -> tensor<i32>
    // CHECK: stablehlo.negate %{{.*}}entangle.relation = "device scalar [0, -1, -2, -3, -4, -5, -6, -7]"
    %1 = stablehlo.negate %i : tensor<i32>
    sdy.return %a : tensor<8x16xf32>
  } : (tensor<8x16xf32>) -> tensor<8x16xf32>
  return %0 : tensor<8x16xf32>
}
