// RUN: entangle-opt %s --split-input-file --entangle-normalize --entangle-import-shardings --entangle-infer-relations | filecheck %s

// stablehlo.xor (elementwise rule): bitwise/logical xor.

sdy.mesh @mesh = <["dp"=2, "tp"=4]>

// Masks split like the data keep the split.
// CHECK-LABEL: func.func @tiled_masks
func.func @tiled_masks(%x: tensor<8x16xf32>, %y: tensor<8x16xf32>) -> tensor<8x16xi1> {
  %0 = sdy.manual_computation(%x, %y) in_shardings=[<@mesh, [{"dp"}, {"tp"}]>, <@mesh, [{"dp"}, {"tp"}]>] out_shardings=[<@mesh, [{"dp"}, {"tp"}]>] manual_axes={"dp", "tp"} (%a: tensor<4x4xf32>, %b: tensor<4x4xf32>) {
    %z = stablehlo.constant dense<0.0> : tensor<4x4xf32>
    %ma = stablehlo.compare GT, %a, %z : (tensor<4x4xf32>, tensor<4x4xf32>) -> tensor<4x4xi1>
    %mb = stablehlo.compare LT, %b, %z : (tensor<4x4xf32>, tensor<4x4xf32>) -> tensor<4x4xi1>
    // CHECK: stablehlo.xor %{{.*}}entangle.relation = "tile [{dp}, {tp}] : xor(compare(%arg0, 0), compare(%arg1, 0))"
    %1 = stablehlo.xor %ma, %mb : tensor<4x4xi1>
    sdy.return %1 : tensor<4x4xi1>
  } : (tensor<8x16xf32>, tensor<8x16xf32>) -> tensor<8x16xi1>
  return %0 : tensor<8x16xi1>
}

// -----

sdy.mesh @mesh = <["tp"=4]>

// Refused: a mask split over tp along dim 0 combined with one split along dim 1.
// CHECK-LABEL: func.func @mismatch
func.func @mismatch(%x: tensor<16x4xf32>, %y: tensor<4x16xf32>) -> tensor<16x4xi1> {
  %0 = sdy.manual_computation(%x, %y) in_shardings=[<@mesh, [{"tp"}, {}]>, <@mesh, [{}, {"tp"}]>] out_shardings=[<@mesh, [{"tp"}, {}]>] manual_axes={"tp"} (%a: tensor<4x4xf32>, %b: tensor<4x4xf32>) {
    %z = stablehlo.constant dense<0.0> : tensor<4x4xf32>
    %ma = stablehlo.compare GT, %a, %z : (tensor<4x4xf32>, tensor<4x4xf32>) -> tensor<4x4xi1>
    %mb = stablehlo.compare LT, %b, %z : (tensor<4x4xf32>, tensor<4x4xf32>) -> tensor<4x4xi1>
    // CHECK: stablehlo.xor %{{.*}}entangle.relation = "opaque: xor: operands are laid out differently along dim 0 (split over 'tp' vs not split)"
    %1 = stablehlo.xor %ma, %mb : tensor<4x4xi1>
    sdy.return %1 : tensor<4x4xi1>
  } : (tensor<16x4xf32>, tensor<4x16xf32>) -> tensor<16x4xi1>
  return %0 : tensor<16x4xi1>
}
