// RUN: entangle-opt %s --split-input-file --entangle-normalize --entangle-import-shardings --entangle-infer-relations | filecheck %s

// stablehlo.concatenate (movement rule): along a replicated dim, operands must agree on every
// other dim (poly dims adapt) and on their partial sums; along a split dim the blocks would
// interleave, so it is refused.

sdy.mesh @mesh = <["dp"=2, "tp"=4]>

// Rotary embeddings: concat(-x2, x1) along the (replicated) head dim of a batch shard.
// (Poly operands, e.g. a zeros block built at the local shape, are not adapted yet: see
// lit_tests/known_issues/concatenate_poly_splat.mlir.)
// CHECK-LABEL: func.func @replicated_dim
func.func @replicated_dim(%x: tensor<8x4xf32>, %y: tensor<8x4xf32>) -> tensor<8x8xf32> {
  %0 = sdy.manual_computation(%x, %y) in_shardings=[<@mesh, [{"dp"}, {}]>, <@mesh, [{"dp"}, {}]>] out_shardings=[<@mesh, [{"dp"}, {}]>] manual_axes={"dp", "tp"} (%a: tensor<4x4xf32>, %b: tensor<4x4xf32>) {
    %n = stablehlo.negate %b : tensor<4x4xf32>
    // CHECK: stablehlo.concatenate %{{.*}}entangle.relation = "tile [{dp}, {}] : concatenate((-1*%arg1), %arg0)"
    %1 = stablehlo.concatenate %n, %a, dim = 1 : (tensor<4x4xf32>, tensor<4x4xf32>) -> tensor<4x8xf32>
    sdy.return %1 : tensor<4x8xf32>
  } : (tensor<8x4xf32>, tensor<8x4xf32>) -> tensor<8x8xf32>
  return %0 : tensor<8x8xf32>
}

// -----

sdy.mesh @mesh = <["tp"=4]>

// CHECK-LABEL: func.func @refused
func.func @refused(%x: tensor<8x16xf32>, %w: tensor<16x8xf32>, %r: tensor<8x8xf32>) -> tensor<8x16xf32> {
  %0 = sdy.manual_computation(%x, %w, %r) in_shardings=[<@mesh, [{}, {"tp"}]>, <@mesh, [{"tp"}, {}]>, <@mesh, [{}, {}]>] out_shardings=[<@mesh, [{}, {}]>] manual_axes={"tp"} (%a: tensor<8x4xf32>, %b: tensor<4x8xf32>, %rl: tensor<8x8xf32>) {
    // CHECK: stablehlo.concatenate %{{.*}}entangle.relation = "opaque: concatenate along dim 1, which is split over 'tp': blocks interleave"
    %1 = stablehlo.concatenate %a, %a, dim = 1 : (tensor<8x4xf32>, tensor<8x4xf32>) -> tensor<8x8xf32>
    %p = stablehlo.dot_general %a, %b, contracting_dims = [1] x [0] : (tensor<8x4xf32>, tensor<4x8xf32>) -> tensor<8x8xf32>
    // CHECK: stablehlo.concatenate %{{.*}}entangle.relation = "partial sum {tp} : concatenate(dot_general(%arg0, %arg1), dot_general(%arg0, %arg1))"
    %2 = stablehlo.concatenate %p, %p, dim = 1 : (tensor<8x8xf32>, tensor<8x8xf32>) -> tensor<8x16xf32>
    // CHECK: stablehlo.concatenate %{{.*}}entangle.relation = "opaque: concatenate of values with different partial reductions"
    %3 = stablehlo.concatenate %p, %rl, dim = 1 : (tensor<8x8xf32>, tensor<8x8xf32>) -> tensor<8x16xf32>
    sdy.return %2 : tensor<8x16xf32>
  } : (tensor<8x16xf32>, tensor<16x8xf32>, tensor<8x8xf32>) -> tensor<8x16xf32>
  return %0 : tensor<8x16xf32>
}
