// RUN: entangle-opt %s --split-input-file --entangle-normalize --entangle-import-shardings --entangle-infer-relations | filecheck %s

// stablehlo.convert (elementwise rule): an exact convert (bf16 -> f32, i16 -> f32, booleans,
// integer -> integer) is the identity on terms and keeps tilings and partial sums; a rounding
// one (f32 -> bf16, i32 -> f32) is a `convert` term, and on a partial sum it is precision lost
// (each device's partial is rounded before the sum). It is how jax turns partition_id (ui32)
// into an i32 index.

sdy.mesh @mesh = <["dp"=2, "tp"=4]>

// CHECK-LABEL: func.func @tiled_and_partial
func.func @tiled_and_partial(%x: tensor<8x16xf32>, %w: tensor<16x8xf32>) -> tensor<8x8xbf16> {
  %0 = sdy.manual_computation(%x, %w) in_shardings=[<@mesh, [{"dp"}, {"tp"}]>, <@mesh, [{"tp"}, {}]>] out_shardings=[<@mesh, [{"dp"}, {}]>] manual_axes={"dp", "tp"} (%a: tensor<4x4xf32>, %b: tensor<4x8xf32>) {
    // CHECK: stablehlo.convert %{{.*}}entangle.relation = "tile [{dp}, {tp}] : convert(%arg0)"
    %c = stablehlo.convert %a : (tensor<4x4xf32>) -> tensor<4x4xbf16>
    %p = stablehlo.dot_general %a, %b, contracting_dims = [1] x [0] : (tensor<4x4xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>
    // CHECK: stablehlo.convert %{{.*}}entangle.relation = "opaque: precision lost: convert f32 -> bf16 rounds each device's partial sum over 'tp' to bf16
    %1 = stablehlo.convert %p : (tensor<4x8xf32>) -> tensor<4x8xbf16>
    sdy.return %1 : tensor<4x8xbf16>
  } : (tensor<8x16xf32>, tensor<16x8xf32>) -> tensor<8x8xbf16>
  return %0 : tensor<8x8xbf16>
}

// -----

sdy.mesh @mesh = <["dp"=2, "tp"=4]>

// An iota converted to f32 is exact; partition_id converted to i32 stays a device scalar.
// CHECK-LABEL: func.func @iota_and_device_scalar
func.func @iota_and_device_scalar(%x: tensor<8x16xf32>) -> tensor<8x16xf32> {
  %0 = sdy.manual_computation(%x) in_shardings=[<@mesh, [{}, {}]>] out_shardings=[<@mesh, [{}, {}]>] manual_axes={"dp", "tp"} (%a: tensor<8x16xf32>) {
    %i = stablehlo.iota dim = 1 : tensor<8x16xi32>
    // CHECK: stablehlo.convert %{{.*}}entangle.relation = "replicated : iota(dim 1)"
    %f = stablehlo.convert %i : (tensor<8x16xi32>) -> tensor<8x16xf32>
    %1 = stablehlo.add %a, %f : tensor<8x16xf32>
    %pid = stablehlo.partition_id : tensor<ui32>
    // CHECK: stablehlo.convert %{{.*}}entangle.relation = "device scalar [0, 1, 2, 3, 4, 5, 6, 7]"
    %d = stablehlo.convert %pid : (tensor<ui32>) -> tensor<i32>
    sdy.return %1 : tensor<8x16xf32>
  } : (tensor<8x16xf32>) -> tensor<8x16xf32>
  return %0 : tensor<8x16xf32>
}
