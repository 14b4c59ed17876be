// RUN: entangle-opt %s --split-input-file --entangle-normalize --entangle-import-shardings --entangle-infer-relations | filecheck %s

// stablehlo.clamp (elementwise rule): clamp(lo, x, hi) with splat bounds (poly) keeps x's
// layout; clamping a partial sum is refused. jax clamps dynamic_slice offsets on device scalars.

sdy.mesh @mesh = <["dp"=2, "tp"=4]>

// CHECK-LABEL: func.func @tiled
func.func @tiled(%x: tensor<8x16xf32>) -> tensor<8x16xf32> {
  %0 = sdy.manual_computation(%x) in_shardings=[<@mesh, [{"dp"}, {"tp"}]>] out_shardings=[<@mesh, [{"dp"}, {"tp"}]>] manual_axes={"dp", "tp"} (%a: tensor<4x4xf32>) {
    %lo = stablehlo.constant dense<-1.0> : tensor<4x4xf32>
    %hi = stablehlo.constant dense<1.0> : tensor<4x4xf32>
    // CHECK: stablehlo.clamp %{{.*}}entangle.relation = "tile [{dp}, {tp}] : clamp(-1, %arg0, 1)"
    %1 = stablehlo.clamp %lo, %a, %hi : tensor<4x4xf32>
    sdy.return %1 : tensor<4x4xf32>
  } : (tensor<8x16xf32>) -> tensor<8x16xf32>
  return %0 : tensor<8x16xf32>
}

// -----

sdy.mesh @mesh = <["tp"=4]>

// CHECK-LABEL: func.func @partial_sum
func.func @partial_sum(%x: tensor<8x16xf32>, %w: tensor<16x8xf32>) -> tensor<8x8xf32> {
  %0 = sdy.manual_computation(%x, %w) in_shardings=[<@mesh, [{}, {"tp"}]>, <@mesh, [{"tp"}, {}]>] out_shardings=[<@mesh, [{}, {}]>] manual_axes={"tp"} (%a: tensor<8x4xf32>, %b: tensor<4x8xf32>) {
    %p = stablehlo.dot_general %a, %b, contracting_dims = [1] x [0] : (tensor<8x4xf32>, tensor<4x8xf32>) -> tensor<8x8xf32>
    %lo = stablehlo.constant dense<-1.0> : tensor<8x8xf32>
    %hi = stablehlo.constant dense<1.0> : tensor<8x8xf32>
    // CHECK: stablehlo.clamp %{{.*}}entangle.relation = "opaque: nonlinear op clamp applied to a partial sum over 'tp': missing all_reduce/psum before it"
    %1 = stablehlo.clamp %lo, %p, %hi : tensor<8x8xf32>
    sdy.return %1 : tensor<8x8xf32>
  } : (tensor<8x16xf32>, tensor<16x8xf32>) -> tensor<8x8xf32>
  return %0 : tensor<8x8xf32>
}

// -----

sdy.mesh @mesh = <["dp"=2, "tp"=4]>

// CHECK-LABEL: func.func @device_scalar
func.func @device_scalar(%x: tensor<8x16xf32>) -> tensor<8x16xf32> {
  %0 = sdy.manual_computation(%x) in_shardings=[<@mesh, [{}, {}]>] out_shardings=[<@mesh, [{}, {}]>] manual_axes={"dp", "tp"} (%a: tensor<8x16xf32>) {
    %pid = stablehlo.partition_id : tensor<ui32>
    %i = stablehlo.convert %pid : (tensor<ui32>) -> tensor<i32>
    %lo = stablehlo.constant dense<2> : tensor<i32>
    %hi = stablehlo.constant dense<5> : tensor<i32>
    // CHECK: stablehlo.clamp %{{.*}}entangle.relation = "device scalar [2, 2, 2, 3, 4, 5, 5, 5]"
    %1 = stablehlo.clamp %lo, %i, %hi : tensor<i32>
    sdy.return %a : tensor<8x16xf32>
  } : (tensor<8x16xf32>) -> tensor<8x16xf32>
  return %0 : tensor<8x16xf32>
}
