// RUN: entangle-opt %s --split-input-file --entangle-normalize --entangle-import-shardings --entangle-infer-relations | filecheck %s

// stablehlo.subtract (elementwise rule, linear): like add. jax's `x - mean` on a sequence shard
// keeps the tiling; a replicated value minus a partial sum is 4*r - p after the psum.

sdy.mesh @mesh = <["tp"=4]>

// CHECK-LABEL: func.func @tiled_poly
func.func @tiled_poly(%x: tensor<4x16xf32>) -> tensor<4x16xf32> {
  %0 = sdy.manual_computation(%x) in_shardings=[<@mesh, [{}, {"tp"}]>] out_shardings=[<@mesh, [{}, {"tp"}]>] manual_axes={"tp"} (%a: tensor<4x4xf32>) {
    %c = stablehlo.constant dense<3.0> : tensor<f32>
    %b = stablehlo.broadcast_in_dim %c, dims = [] : (tensor<f32>) -> tensor<4x4xf32>
    // CHECK: stablehlo.subtract %{{.*}}entangle.relation = "tile [{}, {tp}] : (%arg0 + -3)"
    %1 = stablehlo.subtract %a, %b : tensor<4x4xf32>
    sdy.return %1 : tensor<4x4xf32>
  } : (tensor<4x16xf32>) -> tensor<4x16xf32>
  return %0 : tensor<4x16xf32>
}

// -----

sdy.mesh @mesh = <["tp"=4]>

// CHECK-LABEL: func.func @partial
func.func @partial(%x: tensor<8x16xf32>, %w: tensor<16x8xf32>, %r: tensor<8x8xf32>) -> tensor<8x8xf32> {
  %0 = sdy.manual_computation(%x, %w, %r) in_shardings=[<@mesh, [{}, {"tp"}]>, <@mesh, [{"tp"}, {}]>, <@mesh, [{}, {}]>] out_shardings=[<@mesh, [{}, {}]>] manual_axes={"tp"} (%a: tensor<8x4xf32>, %b: tensor<4x8xf32>, %rl: tensor<8x8xf32>) {
    %p = stablehlo.dot_general %a, %b, contracting_dims = [1] x [0] : (tensor<8x4xf32>, tensor<4x8xf32>) -> tensor<8x8xf32>
    // CHECK: stablehlo.subtract %{{.*}}entangle.relation = "partial sum {tp} : (4*%arg2 + -1*dot_general(%arg0, %arg1))"
    %1 = stablehlo.subtract %rl, %p : tensor<8x8xf32>
    // p - p is 0 only where p is finite: a contraction of finite inputs can overflow, so the
    // zero multiple of p is kept (NaN where p is inf).
    // CHECK: stablehlo.subtract %{{.*}}entangle.relation = "partial sum {tp} : (dot_general(%arg0, %arg1) * 0)"
    %2 = stablehlo.subtract %p, %p : tensor<8x8xf32>
    sdy.return %1 : tensor<8x8xf32>
  } : (tensor<8x16xf32>, tensor<16x8xf32>, tensor<8x8xf32>) -> tensor<8x8xf32>
  return %0 : tensor<8x8xf32>
}

// -----

sdy.mesh @mesh = <["tp"=4]>

// A partial max (a local max before pmax) minus a replicated value is still a partial max;
// a replicated value minus a partial max is not (it would be a partial min).
// CHECK-LABEL: func.func @partial_max
func.func @partial_max(%x: tensor<8x16xf32>, %r: tensor<8xf32>) -> tensor<8xf32> {
  %0 = sdy.manual_computation(%x, %r) in_shardings=[<@mesh, [{}, {"tp"}]>, <@mesh, [{}]>] out_shardings=[<@mesh, [{}]>] manual_axes={"tp"} (%a: tensor<8x4xf32>, %rl: tensor<8xf32>) {
    %ninf = stablehlo.constant dense<0xFF800000> : tensor<f32>
    %m = stablehlo.reduce(%a init: %ninf) applies stablehlo.maximum across dimensions = [1] : (tensor<8x4xf32>, tensor<f32>) -> tensor<8xf32>
    // CHECK: stablehlo.subtract %{{.*}}entangle.relation = "partial max {tp} : (-1*%arg1 + reduce_max(%arg0))"
    %1 = stablehlo.subtract %m, %rl : tensor<8xf32>
    // CHECK: stablehlo.subtract %{{.*}}entangle.relation = "opaque: nonlinear op subtract applied to a partial max over 'tp'
    %2 = stablehlo.subtract %rl, %m : tensor<8xf32>
    sdy.return %1 : tensor<8xf32>
  } : (tensor<8x16xf32>, tensor<8xf32>) -> tensor<8xf32>
  return %0 : tensor<8xf32>
}

// -----

sdy.mesh @mesh = <["dp"=2, "tp"=4]>

// Device-dependent integers are tabulated over the 8 devices (jax's axis_index arithmetic).
// CHECK-LABEL: func.func @device_scalar
func.func @device_scalar(%x: tensor<8x16xf32>) -> tensor<8x16xf32> {
  %0 = sdy.manual_computation(%x) in_shardings=[<@mesh, [{}, {}]>] out_shardings=[<@mesh, [{}, {}]>] manual_axes={"dp", "tp"} (%a: tensor<8x16xf32>) {
    %pid = stablehlo.partition_id : tensor<ui32>
    %i = stablehlo.convert %pid : (tensor<ui32>) -> tensor<i32>
    %c1 = stablehlo.constant dense<1> : tensor<i32>
    // CHECK: stablehlo.subtract %{{.*}}entangle.relation = "device scalar [-1, 0, 1, 2, 3, 4, 5, 6]"
    %1 = stablehlo.subtract %i, %c1 : tensor<i32>
    sdy.return %a : tensor<8x16xf32>
  } : (tensor<8x16xf32>) -> tensor<8x16xf32>
  return %0 : tensor<8x16xf32>
}
