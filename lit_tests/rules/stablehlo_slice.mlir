// RUN: entangle-opt %s --split-input-file --entangle-normalize --entangle-import-shardings --entangle-infer-relations | filecheck %s

// stablehlo.slice (movement rule): slicing a replicated dim slices the global tensor; a split dim
// may only be taken whole (each device would slice its own block, not the global tensor).
// Partial sums are kept.

sdy.mesh @mesh = <["dp"=2, "tp"=4]>

// The fused QKV split: columns of a row-split activation.
// CHECK-LABEL: func.func @replicated_dim
func.func @replicated_dim(%x: tensor<8x12xf32>) -> tensor<8x4xf32> {
  %0 = sdy.manual_computation(%x) in_shardings=[<@mesh, [{"dp", "tp"}, {}]>] out_shardings=[<@mesh, [{"dp", "tp"}, {}]>] manual_axes={"dp", "tp"} (%a: tensor<1x12xf32>) {
    // CHECK: stablehlo.slice %{{.*}}entangle.relation = "tile [{dp, tp}, {}] : slice(%arg0)"
    %1 = stablehlo.slice %a [0:1, 4:8] : (tensor<1x12xf32>) -> tensor<1x4xf32>
    // A whole-tensor slice is the identity.
    // CHECK: stablehlo.slice %{{.*}}entangle.relation = "tile [{dp, tp}, {}] : %arg0"
    %2 = stablehlo.slice %a [0:1, 0:12] : (tensor<1x12xf32>) -> tensor<1x12xf32>
    sdy.return %1 : tensor<1x4xf32>
  } : (tensor<8x12xf32>) -> tensor<8x4xf32>
  return %0 : tensor<8x4xf32>
}

// -----

sdy.mesh @mesh = <["tp"=4]>

// CHECK-LABEL: func.func @split_dim
func.func @split_dim(%x: tensor<8x16xf32>, %w: tensor<16x8xf32>) -> tensor<8x8xf32> {
  %0 = sdy.manual_computation(%x, %w) in_shardings=[<@mesh, [{}, {"tp"}]>, <@mesh, [{"tp"}, {}]>] out_shardings=[<@mesh, [{}, {}]>] manual_axes={"tp"} (%a: tensor<8x4xf32>, %b: tensor<4x8xf32>) {
    // Slicing a split dim takes rows of each device's own block: a halo window (an error unless
    // a collective_permute / concatenate completes it, see per_device/halo_exchange.mlir).
    // CHECK: stablehlo.slice %{{.*}}entangle.relation = "tile [{}, {tp}] : %arg0 rows [b*B + 0, b*B + 2) of dim 1"
    %1 = stablehlo.slice %a [0:8, 0:2] : (tensor<8x4xf32>) -> tensor<8x2xf32>
    %p = stablehlo.dot_general %a, %b, contracting_dims = [1] x [0] : (tensor<8x4xf32>, tensor<4x8xf32>) -> tensor<8x8xf32>
    // Slices are pushed toward the leaves (terms.push_slice): a slice of a dot's free dim
    // slices its operand.
    // CHECK: stablehlo.slice %{{.*}}entangle.relation = "partial sum {tp} : dot_general(%arg0, slice(%arg1))"
    %2 = stablehlo.slice %p [0:8, 0:8:2] : (tensor<8x8xf32>) -> tensor<8x4xf32>
    sdy.return %p : tensor<8x8xf32>
  } : (tensor<8x16xf32>, tensor<16x8xf32>) -> tensor<8x8xf32>
  return %0 : tensor<8x8xf32>
}
