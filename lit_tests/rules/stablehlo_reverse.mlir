// RUN: entangle-opt %s --split-input-file --entangle-normalize --entangle-import-shardings --entangle-infer-relations | filecheck %s

// stablehlo.reverse (movement rule, jnp.flip): along dims that are not split each device
// reverses its whole rows, keeping the tiling of the other dims and a partial sum; a reverse
// of a split dim (device d's block is device n-1-d's reversed) is not related.

sdy.mesh @mesh = <["dp"=2, "tp"=4]>

// CHECK-LABEL: func.func @unsplit_dim
func.func @unsplit_dim(%x: tensor<8x16xf32>) -> tensor<8x16xf32> {
  %0 = sdy.manual_computation(%x) in_shardings=[<@mesh, [{"dp"}, {}]>] out_shardings=[<@mesh, [{"dp"}, {}]>] manual_axes={"dp", "tp"} (%a: tensor<4x16xf32>) {
    // CHECK: stablehlo.reverse %{{.*}}entangle.relation = "tile [{dp}, {}] : reverse(%arg0)"
    %1 = stablehlo.reverse %a, dims = [1] : tensor<4x16xf32>
    sdy.return %1 : tensor<4x16xf32>
  } : (tensor<8x16xf32>) -> tensor<8x16xf32>
  return %0 : tensor<8x16xf32>
}

// -----

sdy.mesh @mesh = <["dp"=2, "tp"=4]>

// A partial sum stays partial; a reverse of the split dim is refused.
// CHECK-LABEL: func.func @partial_and_split
func.func @partial_and_split(%x: tensor<8x16xf32>, %w: tensor<16x8xf32>) -> tensor<8x8xf32> {
  %0 = sdy.manual_computation(%x, %w) in_shardings=[<@mesh, [{"dp"}, {"tp"}]>, <@mesh, [{"tp"}, {}]>] out_shardings=[<@mesh, [{"dp"}, {}]>] manual_axes={"dp", "tp"} (%a: tensor<4x4xf32>, %b: tensor<4x8xf32>) {
    %p = stablehlo.dot_general %a, %b, contracting_dims = [1] x [0] : (tensor<4x4xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>
    // CHECK: stablehlo.reverse %{{.*}}entangle.relation = "tile [{dp}, {}] partial sum {tp} : reverse(dot_general(%arg0, %arg1))"
    %r = stablehlo.reverse %p, dims = [1] : tensor<4x8xf32>
    // CHECK: stablehlo.reverse %{{.*}}entangle.relation = "opaque: reverse of dim 0, which is split over 'dp'
    %s = stablehlo.reverse %p, dims = [0] : tensor<4x8xf32>
    %1 = stablehlo.add %r, %s : tensor<4x8xf32>
    sdy.return %r : tensor<4x8xf32>
  } : (tensor<8x16xf32>, tensor<16x8xf32>) -> tensor<8x8xf32>
  return %0 : tensor<8x8xf32>
}
