// RUN: entangle-opt %s --split-input-file --entangle-normalize --entangle-import-shardings --entangle-infer-relations | filecheck %s

// stablehlo.constant (movement rule): a constant is the same on every device. A splat is
// poly in every dim (jax builds splats at LOCAL shapes, so it adapts to its partner's global
// size and tiling); a dense (non-splat) constant is not, since its local values are all there is.

sdy.mesh @mesh = <["dp"=2, "tp"=4]>

// CHECK-LABEL: func.func @splat
func.func @splat(%x: tensor<8x16xf32>) -> tensor<8x16xf32> {
  %0 = sdy.manual_computation(%x) in_shardings=[<@mesh, [{"dp"}, {"tp"}]>] out_shardings=[<@mesh, [{"dp"}, {"tp"}]>] manual_axes={"dp", "tp"} (%a: tensor<4x4xf32>) {
    // Values print as exact rationals.
    // CHECK: stablehlo.constant {entangle.relation = "replicated : 1/2"}
    %c = stablehlo.constant dense<0.5> : tensor<4x4xf32>
    // CHECK: stablehlo.multiply %{{.*}}entangle.relation = "tile [{dp}, {tp}] : (1/2*%arg0)"
    %1 = stablehlo.multiply %a, %c : tensor<4x4xf32>
    sdy.return %1 : tensor<4x4xf32>
  } : (tensor<8x16xf32>) -> tensor<8x16xf32>
  return %0 : tensor<8x16xf32>
}

// -----

sdy.mesh @mesh = <["dp"=2, "tp"=4]>

// A dense constant at the local shape is a 4x4 replicated tensor: adding it to a tiled 8x16
// value is refused rather than guessed.
// CHECK-LABEL: func.func @dense
func.func @dense(%x: tensor<8x16xf32>) -> tensor<8x16xf32> {
  %0 = sdy.manual_computation(%x) in_shardings=[<@mesh, [{"dp"}, {"tp"}]>] out_shardings=[<@mesh, [{"dp"}, {"tp"}]>] manual_axes={"dp", "tp"} (%a: tensor<4x4xf32>) {
    // CHECK: stablehlo.constant {entangle.relation = "replicated : dense<f32>"}
    %c = stablehlo.constant dense<[[1.0, 2.0, 3.0, 4.0], [1.0, 2.0, 3.0, 4.0], [1.0, 2.0, 3.0, 4.0], [1.0, 2.0, 3.0, 4.0]]> : tensor<4x4xf32>
    // CHECK: stablehlo.add %{{.*}}entangle.relation = "opaque: add: operands are laid out differently along dim 0 (split over 'dp' vs not split)"
    %1 = stablehlo.add %a, %c : tensor<4x4xf32>
    sdy.return %1 : tensor<4x4xf32>
  } : (tensor<8x16xf32>) -> tensor<8x16xf32>
  return %0 : tensor<8x16xf32>
}

// -----

// Outside a manual computation a constant is a global value.
// CHECK-LABEL: func.func @global
func.func @global(%x: tensor<4xi32>) -> tensor<4xi32> {
  // CHECK: stablehlo.constant {entangle.relation = "global : 7"}
  %c = stablehlo.constant dense<7> : tensor<4xi32>
  // CHECK: stablehlo.add %{{.*}}entangle.relation = "global : (%arg0 + 7)"
  %1 = stablehlo.add %x, %c : tensor<4xi32>
  return %1 : tensor<4xi32>
}
