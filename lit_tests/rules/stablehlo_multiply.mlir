// RUN: entangle-opt %s --split-input-file --entangle-normalize --entangle-import-shardings --entangle-infer-relations | filecheck %s

// stablehlo.multiply (elementwise rule): linear in each operand separately. A partial sum times
// a replicated value stays a partial sum; a product of two partial sums is refused.

sdy.mesh @mesh = <["dp"=2, "tp"=4]>

// A LayerNorm gain: the broadcast vector is split like the hidden dim; dim 0 is poly.
// CHECK-LABEL: func.func @tiled_gain
func.func @tiled_gain(%x: tensor<8x16xf32>, %g: tensor<16xf32>) -> tensor<8x16xf32> {
  %0 = sdy.manual_computation(%x, %g) in_shardings=[<@mesh, [{"dp"}, {"tp"}]>, <@mesh, [{"tp"}]>] out_shardings=[<@mesh, [{"dp"}, {"tp"}]>] manual_axes={"dp", "tp"} (%a: tensor<4x4xf32>, %gl: tensor<4xf32>) {
    // CHECK: stablehlo.broadcast_in_dim %{{.*}}entangle.relation = "tile [{}, {tp}] : broadcast(%arg1)"
    %b = stablehlo.broadcast_in_dim %gl, dims = [1] : (tensor<4xf32>) -> tensor<4x4xf32>
    // CHECK: stablehlo.multiply %{{.*}}entangle.relation = "tile [{dp}, {tp}] : (%arg0 * broadcast(%arg1))"
    %1 = stablehlo.multiply %a, %b : tensor<4x4xf32>
    sdy.return %1 : tensor<4x4xf32>
  } : (tensor<8x16xf32>, tensor<16xf32>) -> tensor<8x16xf32>
  return %0 : tensor<8x16xf32>
}

// -----

sdy.mesh @mesh = <["tp"=4]>

// CHECK-LABEL: func.func @partial
func.func @partial(%x: tensor<8x16xf32>, %w: tensor<16x8xf32>, %r: tensor<8x8xf32>) -> tensor<8x8xf32> {
  %0 = sdy.manual_computation(%x, %w, %r) in_shardings=[<@mesh, [{}, {"tp"}]>, <@mesh, [{"tp"}, {}]>, <@mesh, [{}, {}]>] out_shardings=[<@mesh, [{}, {}]>] manual_axes={"tp"} (%a: tensor<8x4xf32>, %b: tensor<4x8xf32>, %rl: tensor<8x8xf32>) {
    %p = stablehlo.dot_general %a, %b, contracting_dims = [1] x [0] : (tensor<8x4xf32>, tensor<4x8xf32>) -> tensor<8x8xf32>
    // CHECK: stablehlo.multiply %{{.*}}entangle.relation = "partial sum {tp} : (%arg2 * dot_general(%arg0, %arg1))"
    %1 = stablehlo.multiply %p, %rl : tensor<8x8xf32>
    // CHECK: stablehlo.multiply %{{.*}}entangle.relation = "opaque: nonlinear op multiply applied to a partial sum over 'tp': missing all_reduce/psum before it"
    %2 = stablehlo.multiply %p, %p : tensor<8x8xf32>
    sdy.return %1 : tensor<8x8xf32>
  } : (tensor<8x16xf32>, tensor<16x8xf32>, tensor<8x8xf32>) -> tensor<8x8xf32>
  return %0 : tensor<8x8xf32>
}

// -----

sdy.mesh @mesh = <["tp"=4]>

// A partial max scaled by a positive constant stays a partial max; by a negative one it is not.
// CHECK-LABEL: func.func @partial_max
func.func @partial_max(%x: tensor<8x16xf32>) -> tensor<8xf32> {
  %0 = sdy.manual_computation(%x) in_shardings=[<@mesh, [{}, {"tp"}]>] out_shardings=[<@mesh, [{}]>] manual_axes={"tp"} (%a: tensor<8x4xf32>) {
    %ninf = stablehlo.constant dense<0xFF800000> : tensor<f32>
    %m = stablehlo.reduce(%a init: %ninf) applies stablehlo.maximum across dimensions = [1] : (tensor<8x4xf32>, tensor<f32>) -> tensor<8xf32>
    %two = stablehlo.constant dense<2.0> : tensor<8xf32>
    %neg = stablehlo.constant dense<-2.0> : tensor<8xf32>
    // CHECK: stablehlo.multiply %{{.*}}entangle.relation = "partial max {tp} : (2*reduce_max(%arg0))"
    %1 = stablehlo.multiply %m, %two : tensor<8xf32>
    // A negative factor turns a partial max into a partial min.
    // CHECK: stablehlo.multiply %{{.*}}entangle.relation = "partial min {tp} : (-2*reduce_max(%arg0))"
    %2 = stablehlo.multiply %m, %neg : tensor<8xf32>
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
    %c4 = stablehlo.constant dense<4> : tensor<i32>
    // CHECK: stablehlo.multiply %{{.*}}entangle.relation = "device scalar [0, 4, 8, 12, 16, 20, 24, 28]"
    %1 = stablehlo.multiply %i, %c4 : tensor<i32>
    sdy.return %a : tensor<8x16xf32>
  } : (tensor<8x16xf32>) -> tensor<8x16xf32>
  return %0 : tensor<8x16xf32>
}
