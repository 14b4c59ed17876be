// RUN: entangle-opt %s --split-input-file --entangle-normalize --entangle-import-shardings --entangle-infer-relations | filecheck %s

// stablehlo.compare (elementwise rule): an i1 with the operands' shared layout; comparing a
// partial sum is refused. On device scalars it is evaluated per device.

sdy.mesh @mesh = <["dp"=2, "tp"=4]>

// Tiled operands, and a causal-mask compare of two iotas (replicated).
// CHECK-LABEL: func.func @tiled
func.func @tiled(%x: tensor<8x16xf32>, %y: tensor<8x16xf32>) -> tensor<8x16xi1> {
  %0 = sdy.manual_computation(%x, %y) in_shardings=[<@mesh, [{"dp"}, {"tp"}]>, <@mesh, [{"dp"}, {"tp"}]>] out_shardings=[<@mesh, [{"dp"}, {"tp"}]>] manual_axes={"dp", "tp"} (%a: tensor<4x4xf32>, %b: tensor<4x4xf32>) {
    // CHECK: stablehlo.compare GT, %{{.*}}entangle.relation = "tile [{dp}, {tp}] : compare(%arg0, %arg1)"
    %1 = stablehlo.compare GT, %a, %b : (tensor<4x4xf32>, tensor<4x4xf32>) -> tensor<4x4xi1>
    %r = stablehlo.iota dim = 0 : tensor<4x4xi32>
    %c = stablehlo.iota dim = 1 : tensor<4x4xi32>
    // CHECK: stablehlo.compare GE, %{{.*}}entangle.relation = "replicated : compare(iota(dim 0), iota(dim 1))"
    %2 = stablehlo.compare GE, %r, %c : (tensor<4x4xi32>, tensor<4x4xi32>) -> tensor<4x4xi1>
    sdy.return %1 : tensor<4x4xi1>
  } : (tensor<8x16xf32>, tensor<8x16xf32>) -> tensor<8x16xi1>
  return %0 : tensor<8x16xi1>
}

// -----

sdy.mesh @mesh = <["tp"=4]>

// CHECK-LABEL: func.func @partial_sum
func.func @partial_sum(%x: tensor<8x16xf32>, %w: tensor<16x8xf32>) -> tensor<8x8xi1> {
  %0 = sdy.manual_computation(%x, %w) in_shardings=[<@mesh, [{}, {"tp"}]>, <@mesh, [{"tp"}, {}]>] out_shardings=[<@mesh, [{}, {}]>] manual_axes={"tp"} (%a: tensor<8x4xf32>, %b: tensor<4x8xf32>) {
    %p = stablehlo.dot_general %a, %b, contracting_dims = [1] x [0] : (tensor<8x4xf32>, tensor<4x8xf32>) -> tensor<8x8xf32>
    %z = stablehlo.constant dense<0.0> : tensor<8x8xf32>
    // CHECK: stablehlo.compare GT, %{{.*}}entangle.relation = "opaque: nonlinear op compare applied to a partial sum over 'tp': missing all_reduce/psum before it"
    %1 = stablehlo.compare GT, %p, %z : (tensor<8x8xf32>, tensor<8x8xf32>) -> tensor<8x8xi1>
    sdy.return %1 : tensor<8x8xi1>
  } : (tensor<8x16xf32>, tensor<16x8xf32>) -> tensor<8x8xi1>
  return %0 : tensor<8x8xi1>
}

// -----

sdy.mesh @mesh = <["dp"=2, "tp"=4]>

// jax's negative-index wrap: `i < 0` per device.
// CHECK-LABEL: func.func @device_scalar
func.func @device_scalar(%x: tensor<8x16xf32>) -> tensor<8x16xf32> {
  %0 = sdy.manual_computation(%x) in_shardings=[<@mesh, [{}, {}]>] out_shardings=[<@mesh, [{}, {}]>] manual_axes={"dp", "tp"} (%a: tensor<8x16xf32>) {
    %pid = stablehlo.partition_id : tensor<ui32>
    %i = stablehlo.convert %pid : (tensor<ui32>) -> tensor<i32>
    %c = stablehlo.constant dense<3> : tensor<i32>
    %s = stablehlo.subtract %i, %c : tensor<i32>
    %z = stablehlo.constant dense<0> : tensor<i32>
    // CHECK: stablehlo.compare LT, %{{.*}}entangle.relation = "device scalar [1, 1, 1, 0, 0, 0, 0, 0]"
    %1 = stablehlo.compare LT, %s, %z, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
    sdy.return %a : tensor<8x16xf32>
  } : (tensor<8x16xf32>) -> tensor<8x16xf32>
  return %0 : tensor<8x16xf32>
}
