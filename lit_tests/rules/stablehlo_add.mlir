// RUN: entangle-opt %s --split-input-file --entangle-normalize --entangle-import-shardings --entangle-infer-relations | filecheck %s

// stablehlo.add (elementwise rule, linear): operands share one layout. A partial sum stays a
// partial sum; a replicated addend is counted once per device of the partial axes.

sdy.mesh @mesh = <["dp"=2, "tp"=4]>

// A shared 2-D tiling is kept.
// CHECK-LABEL: func.func @tiled_2d
func.func @tiled_2d(%x: tensor<8x16xf32>, %y: tensor<8x16xf32>) -> tensor<8x16xf32> {
  %0 = sdy.manual_computation(%x, %y) in_shardings=[<@mesh, [{"dp"}, {"tp"}]>, <@mesh, [{"dp"}, {"tp"}]>] out_shardings=[<@mesh, [{"dp"}, {"tp"}]>] manual_axes={"dp", "tp"} (%a: tensor<4x4xf32>, %b: tensor<4x4xf32>) {
    // CHECK: stablehlo.add %{{.*}}entangle.relation = "tile [{dp}, {tp}] : (%arg0 + %arg1)"
    %1 = stablehlo.add %a, %b : tensor<4x4xf32>
    sdy.return %1 : tensor<4x4xf32>
  } : (tensor<8x16xf32>, tensor<8x16xf32>) -> tensor<8x16xf32>
  return %0 : tensor<8x16xf32>
}

// -----

sdy.mesh @mesh = <["dp"=2, "tp"=4]>

// Poly dims: a splat built at the local shape, and a broadcast of a replicated vector, take the
// tiling of the value they are added to.
// CHECK-LABEL: func.func @poly
func.func @poly(%x: tensor<8x16xf32>, %v: tensor<16xf32>) -> tensor<8x16xf32> {
  %0 = sdy.manual_computation(%x, %v) in_shardings=[<@mesh, [{"dp"}, {}]>, <@mesh, [{}]>] out_shardings=[<@mesh, [{"dp"}, {}]>] manual_axes={"dp", "tp"} (%a: tensor<4x16xf32>, %vl: tensor<16xf32>) {
    %c = stablehlo.constant dense<1.0> : tensor<4x16xf32>
    // CHECK: stablehlo.add %{{.*}}entangle.relation = "tile [{dp}, {}] : (%arg0 + 1)"
    %1 = stablehlo.add %a, %c : tensor<4x16xf32>
    %b = stablehlo.broadcast_in_dim %vl, dims = [1] : (tensor<16xf32>) -> tensor<4x16xf32>
    // CHECK: stablehlo.add %{{.*}}entangle.relation = "tile [{dp}, {}] : (%arg0 + broadcast(%arg1) + 1)"
    %2 = stablehlo.add %1, %b : tensor<4x16xf32>
    sdy.return %2 : tensor<4x16xf32>
  } : (tensor<8x16xf32>, tensor<16xf32>) -> tensor<8x16xf32>
  return %0 : tensor<8x16xf32>
}

// -----

sdy.mesh @mesh = <["tp"=4]>

// Partial sums: p + p stays partial; p + r (r replicated) is p + 4*r after the psum.
// CHECK-LABEL: func.func @partial_sum
func.func @partial_sum(%x: tensor<8x16xf32>, %w: tensor<16x8xf32>, %r: tensor<8x8xf32>) -> tensor<8x8xf32> {
  %0 = sdy.manual_computation(%x, %w, %r) in_shardings=[<@mesh, [{}, {"tp"}]>, <@mesh, [{"tp"}, {}]>, <@mesh, [{}, {}]>] out_shardings=[<@mesh, [{}, {}]>] manual_axes={"tp"} (%a: tensor<8x4xf32>, %b: tensor<4x8xf32>, %rl: tensor<8x8xf32>) {
    %p = stablehlo.dot_general %a, %b, contracting_dims = [1] x [0] : (tensor<8x4xf32>, tensor<4x8xf32>) -> tensor<8x8xf32>
    // CHECK: stablehlo.add %{{.*}}entangle.relation = "partial sum {tp} : (2*dot_general(%arg0, %arg1))"
    %1 = stablehlo.add %p, %p : tensor<8x8xf32>
    // CHECK: stablehlo.add %{{.*}}entangle.relation = "partial sum {tp} : (4*%arg2 + 2*dot_general(%arg0, %arg1))"
    %2 = stablehlo.add %1, %rl : tensor<8x8xf32>
    sdy.return %2 : tensor<8x8xf32>
  } : (tensor<8x16xf32>, tensor<16x8xf32>, tensor<8x8xf32>) -> tensor<8x8xf32>
  return %0 : tensor<8x8xf32>
}

// -----

sdy.mesh @mesh = <["tp"=4]>

// Refused: operands split along different dims, and a partial sum plus a value split over the
// partial axis.
// CHECK-LABEL: func.func @mismatch
func.func @mismatch(%x: tensor<4x16xf32>, %y: tensor<16x4xf32>, %w: tensor<16x16xf32>) -> tensor<4x16xf32> {
  %0 = sdy.manual_computation(%x, %y, %w) in_shardings=[<@mesh, [{}, {"tp"}]>, <@mesh, [{"tp"}, {}]>, <@mesh, [{"tp"}, {}]>] out_shardings=[<@mesh, [{}, {"tp"}]>] manual_axes={"tp"} (%a: tensor<4x4xf32>, %b: tensor<4x4xf32>, %c: tensor<4x16xf32>) {
    // CHECK: stablehlo.add %{{.*}}entangle.relation = "opaque: add: operands are laid out differently along dim 0 (not split vs split over 'tp')"
    %1 = stablehlo.add %a, %b : tensor<4x4xf32>
    %p = stablehlo.dot_general %a, %c, contracting_dims = [1] x [0] : (tensor<4x4xf32>, tensor<4x16xf32>) -> tensor<4x16xf32>
    %q = stablehlo.slice %p [0:4, 0:4] : (tensor<4x16xf32>) -> tensor<4x4xf32>
    // CHECK: stablehlo.add %{{.*}}entangle.relation = "opaque: add combines a partial sum over 'tp' (missing all_reduce/psum) with a value split over 'tp'"
    %2 = stablehlo.add %q, %a : tensor<4x4xf32>
    sdy.return %2 : tensor<4x4xf32>
  } : (tensor<4x16xf32>, tensor<16x4xf32>, tensor<16x16xf32>) -> tensor<4x16xf32>
  return %0 : tensor<4x16xf32>
}
