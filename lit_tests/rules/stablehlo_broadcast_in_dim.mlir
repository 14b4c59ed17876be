// RUN: entangle-opt %s --split-input-file --entangle-normalize --entangle-import-shardings --entangle-infer-relations | filecheck %s

// stablehlo.broadcast_in_dim (movement rule): kept dims carry their tiling; created dims (and
// dims widened from 1) are poly, taking their partner's global size and tiling later. A partial
// sum stays partial. Widening a split dim is refused.

sdy.mesh @mesh = <["dp"=2, "tp"=4]>

// A tiled vector broadcast along a new dim 0 (poly): dp comes from the partner.
// CHECK-LABEL: func.func @tiled_and_poly
func.func @tiled_and_poly(%x: tensor<8x16xf32>, %b: tensor<16xf32>) -> tensor<8x16xf32> {
  %0 = sdy.manual_computation(%x, %b) in_shardings=[<@mesh, [{"dp"}, {"tp"}]>, <@mesh, [{"tp"}]>] out_shardings=[<@mesh, [{"dp"}, {"tp"}]>] manual_axes={"dp", "tp"} (%a: tensor<4x4xf32>, %bl: tensor<4xf32>) {
    // CHECK: stablehlo.broadcast_in_dim %{{.*}}entangle.relation = "tile [{}, {tp}] : broadcast(%arg1)"
    %bb = stablehlo.broadcast_in_dim %bl, dims = [1] : (tensor<4xf32>) -> tensor<4x4xf32>
    // CHECK: stablehlo.add %{{.*}}entangle.relation = "tile [{dp}, {tp}] : (%arg0 + broadcast(%arg1))"
    %1 = stablehlo.add %a, %bb : tensor<4x4xf32>
    sdy.return %1 : tensor<4x4xf32>
  } : (tensor<8x16xf32>, tensor<16xf32>) -> tensor<8x16xf32>
  return %0 : tensor<8x16xf32>
}

// -----

sdy.mesh @mesh = <["dp"=2, "tp"=4]>

// jax's keepdims mean: reduce, then broadcast back over the reduced (now poly) dim. A broadcast
// that only inserts a unit dim is a reshape.
// CHECK-LABEL: func.func @partial_and_widen
func.func @partial_and_widen(%x: tensor<8x16xf32>) -> tensor<8x16xf32> {
  %0 = sdy.manual_computation(%x) in_shardings=[<@mesh, [{"dp"}, {"tp"}]>] out_shardings=[<@mesh, [{"dp"}, {"tp"}]>] manual_axes={"dp", "tp"} (%a: tensor<4x4xf32>) {
    %zero = stablehlo.constant dense<0.0> : tensor<f32>
    %s = stablehlo.reduce(%a init: %zero) applies stablehlo.add across dimensions = [1] : (tensor<4x4xf32>, tensor<f32>) -> tensor<4xf32>
    // CHECK: stablehlo.broadcast_in_dim %{{.*}}entangle.relation = "tile [{dp}, {}] partial sum {tp} : reshape(reduce_sum(%arg0))"
    %k = stablehlo.broadcast_in_dim %s, dims = [0] : (tensor<4xf32>) -> tensor<4x1xf32>
    // CHECK: stablehlo.broadcast_in_dim %{{.*}}entangle.relation = "tile [{dp}, {}] partial sum {tp} : broadcast(reduce_sum(%arg0))"
    %w = stablehlo.broadcast_in_dim %k, dims = [0, 1] : (tensor<4x1xf32>) -> tensor<4x4xf32>
    sdy.return %a : tensor<4x4xf32>
  } : (tensor<8x16xf32>) -> tensor<8x16xf32>
  return %0 : tensor<8x16xf32>
}

// -----

sdy.mesh @mesh = <["tp"=4]>

// Refused: dim 0 (global 4, one row per device) is widened to 4 rows on every device.
// CHECK-LABEL: func.func @widen_split_dim
func.func @widen_split_dim(%x: tensor<4x8xf32>) -> tensor<16x8xf32> {
  %0 = sdy.manual_computation(%x) in_shardings=[<@mesh, [{"tp"}, {}]>] out_shardings=[<@mesh, [{"tp"}, {}]>] manual_axes={"tp"} (%a: tensor<1x8xf32>) {
    // CHECK: stablehlo.broadcast_in_dim %{{.*}}entangle.relation = "opaque: broadcast widens dim 0, which is split over 'tp'"
    %1 = stablehlo.broadcast_in_dim %a, dims = [0, 1] : (tensor<1x8xf32>) -> tensor<4x8xf32>
    sdy.return %1 : tensor<4x8xf32>
  } : (tensor<4x8xf32>) -> tensor<16x8xf32>
  return %0 : tensor<16x8xf32>
}

// -----

sdy.mesh @mesh = <["dp"=2, "tp"=4]>

// A device scalar may be reshaped into a 1-element tensor; broadcast into data it becomes a
// zero tensor shifted per device (see lit_tests/regressions/device_offset_tensor.mlir).
// CHECK-LABEL: func.func @device_scalar
func.func @device_scalar(%x: tensor<8x16xf32>) -> tensor<8x16xf32> {
  %0 = sdy.manual_computation(%x) in_shardings=[<@mesh, [{}, {}]>] out_shardings=[<@mesh, [{}, {}]>] manual_axes={"dp", "tp"} (%a: tensor<8x16xf32>) {
    %pid = stablehlo.partition_id : tensor<ui32>
    // CHECK: stablehlo.broadcast_in_dim %{{.*}}entangle.relation = "device scalar [0, 1, 2, 3, 4, 5, 6, 7]"
    %1 = stablehlo.broadcast_in_dim %pid, dims = [] : (tensor<ui32>) -> tensor<1xui32>
    // CHECK: stablehlo.broadcast_in_dim %{{.*}}entangle.relation = "replicated : 0 + device offsets [0, 1, 2, 3, 4, 5, 6, 7]"
    %2 = stablehlo.broadcast_in_dim %pid, dims = [] : (tensor<ui32>) -> tensor<8xui32>
    sdy.return %a : tensor<8x16xf32>
  } : (tensor<8x16xf32>) -> tensor<8x16xf32>
  return %0 : tensor<8x16xf32>
}
