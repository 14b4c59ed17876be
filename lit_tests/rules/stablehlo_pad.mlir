// RUN: entangle-opt %s --split-input-file --entangle-normalize --entangle-import-shardings --entangle-infer-relations | filecheck %s

// stablehlo.pad (movement rule): padding a replicated dim pads the global tensor; a split dim
// may not be padded (every device would pad its own block). A partial sum may be padded with 0
// only (sum of zeros is zero).

sdy.mesh @mesh = <["dp"=2, "tp"=4]>

// CHECK-LABEL: func.func @replicated_dim
func.func @replicated_dim(%x: tensor<8x16xf32>) -> tensor<8x19xf32> {
  %0 = sdy.manual_computation(%x) in_shardings=[<@mesh, [{"dp"}, {}]>] out_shardings=[<@mesh, [{"dp"}, {}]>] manual_axes={"dp", "tp"} (%a: tensor<4x16xf32>) {
    %z = stablehlo.constant dense<0.0> : tensor<f32>
    // CHECK: stablehlo.pad %{{.*}}entangle.relation = "tile [{dp}, {}] : pad(%arg0, 0)"
    %1 = stablehlo.pad %a, %z, low = [0, 1], high = [0, 2], interior = [0, 0] : (tensor<4x16xf32>, tensor<f32>) -> tensor<4x19xf32>
    sdy.return %1 : tensor<4x19xf32>
  } : (tensor<8x16xf32>) -> tensor<8x19xf32>
  return %0 : tensor<8x19xf32>
}

// -----

sdy.mesh @mesh = <["tp"=4]>

// CHECK-LABEL: func.func @refused
func.func @refused(%x: tensor<8x16xf32>, %w: tensor<16x8xf32>) -> tensor<8x9xf32> {
  %0 = sdy.manual_computation(%x, %w) in_shardings=[<@mesh, [{}, {"tp"}]>, <@mesh, [{"tp"}, {}]>] out_shardings=[<@mesh, [{}, {}]>] manual_axes={"tp"} (%a: tensor<8x4xf32>, %b: tensor<4x8xf32>) {
    %z = stablehlo.constant dense<0.0> : tensor<f32>
    %one = stablehlo.constant dense<1.0> : tensor<f32>
    // CHECK: stablehlo.pad %{{.*}}entangle.relation = "opaque: pad of dim 1, which is split over 'tp': every device pads its own block"
    %1 = stablehlo.pad %a, %z, low = [0, 1], high = [0, 0], interior = [0, 0] : (tensor<8x4xf32>, tensor<f32>) -> tensor<8x5xf32>
    %p = stablehlo.dot_general %a, %b, contracting_dims = [1] x [0] : (tensor<8x4xf32>, tensor<4x8xf32>) -> tensor<8x8xf32>
    // CHECK: stablehlo.pad %{{.*}}entangle.relation = "partial sum {tp} : pad(dot_general(%arg0, %arg1), 0)"
    %2 = stablehlo.pad %p, %z, low = [0, 1], high = [0, 0], interior = [0, 0] : (tensor<8x8xf32>, tensor<f32>) -> tensor<8x9xf32>
    // Every device pads with 1, so the reduced padding is 4 (and the reference pads with 1).
    // CHECK: stablehlo.pad %{{.*}}entangle.relation = "partial sum {tp} : pad(dot_general(%arg0, %arg1), 4)"
    %3 = stablehlo.pad %p, %one, low = [0, 1], high = [0, 0], interior = [0, 0] : (tensor<8x8xf32>, tensor<f32>) -> tensor<8x9xf32>
    sdy.return %3 : tensor<8x9xf32>
  } : (tensor<8x16xf32>, tensor<16x8xf32>) -> tensor<8x9xf32>
  return %0 : tensor<8x9xf32>
}
