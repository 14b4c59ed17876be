// RUN: entangle-opt %s --split-input-file --entangle-normalize --entangle-import-shardings --entangle-infer-relations | filecheck %s

// stablehlo.and (elementwise rule): bitwise/logical and (combining masks).

sdy.mesh @mesh = <["dp"=2, "tp"=4]>

// Masks split like the data keep the split.
// CHECK-LABEL: func.func @tiled_masks
func.func @tiled_masks(%x: tensor<8x16xf32>, %y: tensor<8x16xf32>) -> tensor<8x16xi1> {
  %0 = sdy.manual_computation(%x, %y) in_shardings=[<@mesh, [{"dp"}, {"tp"}]>, <@mesh, [{"dp"}, {"tp"}]>] out_shardings=[<@mesh, [{"dp"}, {"tp"}]>] manual_axes={"dp", "tp"} (%a: tensor<4x4xf32>, %b: tensor<4x4xf32>) {
    %z = stablehlo.constant dense<0.0> : tensor<4x4xf32>
    %ma = stablehlo.compare GT, %a, %z : (tensor<4x4xf32>, tensor<4x4xf32>) -> tensor<4x4xi1>
    %mb = stablehlo.compare LT, %b, %z : (tensor<4x4xf32>, tensor<4x4xf32>) -> tensor<4x4xi1>
    // CHECK: stablehlo.and %{{.*}}entangle.relation = "tile [{dp}, {tp}] : and(compare(%arg0, 0), compare(%arg1, 0))"
    %1 = stablehlo.and %ma, %mb : tensor<4x4xi1>
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
    // CHECK: stablehlo.and %{{.*}}entangle.relation = "opaque: and: operands are laid out differently along dim 0 (split over 'tp' vs not split)"
    %1 = stablehlo.and %ma, %mb : tensor<4x4xi1>
    sdy.return %1 : tensor<4x4xi1>
  } : (tensor<16x4xf32>, tensor<4x16xf32>) -> tensor<16x4xi1>
  return %0 : tensor<16x4xi1>
}

// -----

sdy.mesh @mesh = <["dp"=2, "tp"=4]>

// On device predicates: p = (axis_index('tp') < 2), q = (axis_index('dp') == 1).
// CHECK-LABEL: func.func @device_scalar
func.func @device_scalar(%x: tensor<8x16xf32>) -> tensor<8x16xf32> {
  %0 = sdy.manual_computation(%x) in_shardings=[<@mesh, [{}, {}]>] out_shardings=[<@mesh, [{}, {}]>] manual_axes={"dp", "tp"} (%a: tensor<8x16xf32>) {
    %pid = stablehlo.partition_id : tensor<ui32>
    %i = stablehlo.convert %pid : (tensor<ui32>) -> tensor<i32>
    %c1 = stablehlo.constant dense<1> : tensor<i32>
    %c2 = stablehlo.constant dense<2> : tensor<i32>
    %c4 = stablehlo.constant dense<4> : tensor<i32>
    %tp = stablehlo.remainder %i, %c4 : tensor<i32>
    %dp = stablehlo.divide %i, %c4 : tensor<i32>
    // CHECK: stablehlo.compare {{.*}}entangle.relation = "device scalar [1, 1, 0, 0, 1, 1, 0, 0]"
    %p = stablehlo.compare LT, %tp, %c2, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
    // CHECK: stablehlo.compare {{.*}}entangle.relation = "device scalar [0, 0, 0, 0, 1, 1, 1, 1]"
    %q = stablehlo.compare EQ, %dp, %c1, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
    // CHECK: stablehlo.and %{{.*}}entangle.relation = "device scalar [0, 0, 0, 0, 1, 1, 0, 0]"
    %1 = stablehlo.and %p, %q : tensor<i1>
    sdy.return %a : tensor<8x16xf32>
  } : (tensor<8x16xf32>) -> tensor<8x16xf32>
  return %0 : tensor<8x16xf32>
}
