// RUN: entangle-opt %s --split-input-file --entangle-normalize --entangle-import-shardings --entangle-infer-relations | filecheck %s
// RUN: entangle-opt %s --split-input-file --entangle-normalize --entangle-import-shardings --entangle-infer-relations --entangle-check-refinement --verify-diagnostics | filecheck %s --check-prefix=FULL

// A halo exchange: XLA's partitioning of jnp.roll(x, 1, axis=0) with rows split over 4
// devices. Each device sends its last row to the next device (collective_permute) and prepends
// the row it receives to its first 3 rows, so device b holds rows 4b-1 .. 4b+2 (mod 16): block
// b of roll(x, 1). Slices of the split dim are halo windows (rows at an offset from the own
// block), the permute moves a window's offset by one block, and consecutive windows join.

module attributes {mhlo.num_partitions = 4 : i32} {
  func.func @ref(%x: tensor<16x4xf32>) -> tensor<16x4xf32> {
    %0 = stablehlo.slice %x [15:16, 0:4] : (tensor<16x4xf32>) -> tensor<1x4xf32>
    %1 = stablehlo.slice %x [0:15, 0:4] : (tensor<16x4xf32>) -> tensor<15x4xf32>
    %2 = stablehlo.concatenate %0, %1, dim = 0 : (tensor<1x4xf32>, tensor<15x4xf32>) -> tensor<16x4xf32>
    return %2 : tensor<16x4xf32>
  }
  // FULL: func.func @sharded{{.*}}entangle.verdict = "proven"
  func.func @sharded(%arg0: tensor<4x4xf32> {mhlo.sharding = "{devices=[4,1]<=[4]}"}) -> (tensor<4x4xf32> {mhlo.sharding = "{devices=[4,1]<=[4]}"}) attributes {entangle.refines = @ref} {
    // CHECK: stablehlo.slice{{.*}}entangle.relation = "tile [{d0, d1}, {}] : %arg0 rows [b*B + 3, b*B + 4) of dim 0"
    %0 = stablehlo.slice %arg0 [3:4, 0:4] : (tensor<4x4xf32>) -> tensor<1x4xf32>
    // CHECK: collective_permute{{.*}}entangle.relation = "tile [{d0, d1}, {}] : %arg0 rows [b*B + 15, b*B + 16) of dim 0"
    %1 = "stablehlo.collective_permute"(%0) <{channel_handle = #stablehlo.channel_handle<handle = 1, type = 0>, source_target_pairs = dense<[[0, 1], [1, 2], [2, 3], [3, 0]]> : tensor<4x2xi64>}> : (tensor<1x4xf32>) -> tensor<1x4xf32>
    %2 = stablehlo.slice %arg0 [0:3, 0:4] : (tensor<4x4xf32>) -> tensor<3x4xf32>
    // CHECK: stablehlo.concatenate{{.*}}entangle.relation = "tile [{d0, d1}, {}] : concatenate(slice(%arg0), slice(%arg0))"
    %3 = stablehlo.concatenate %1, %2, dim = 0 : (tensor<1x4xf32>, tensor<3x4xf32>) -> tensor<4x4xf32>
    return %3 : tensor<4x4xf32>
  }
}

// -----

// The halo sent the wrong way (pairs reversed): device b receives rows 4b+7 instead of 4b-1.
// The error is at the permute that delivered the wrong rows.
module attributes {mhlo.num_partitions = 4 : i32} {
  func.func @ref(%x: tensor<16x4xf32>) -> tensor<16x4xf32> {
    %0 = stablehlo.slice %x [15:16, 0:4] : (tensor<16x4xf32>) -> tensor<1x4xf32>
    %1 = stablehlo.slice %x [0:15, 0:4] : (tensor<16x4xf32>) -> tensor<15x4xf32>
    %2 = stablehlo.concatenate %0, %1, dim = 0 : (tensor<1x4xf32>, tensor<15x4xf32>) -> tensor<16x4xf32>
    return %2 : tensor<16x4xf32>
  }
  // FULL: func.func @wrong_neighbour{{.*}}entangle.verdict = "not proven"
  func.func @wrong_neighbour(%arg0: tensor<4x4xf32> {mhlo.sharding = "{devices=[4,1]<=[4]}"}) -> (tensor<4x4xf32> {mhlo.sharding = "{devices=[4,1]<=[4]}"}) attributes {entangle.refines = @ref} {
    %0 = stablehlo.slice %arg0 [3:4, 0:4] : (tensor<4x4xf32>) -> tensor<1x4xf32>
    // expected-error @+1 {{collective_permute delivers rows [4b+7, 4b+8) of dim 0 to the device with block b, but the concatenate needs rows [4b-1, 4b): the halo comes from the wrong neighbour}}
    %1 = "stablehlo.collective_permute"(%0) <{channel_handle = #stablehlo.channel_handle<handle = 1, type = 0>, source_target_pairs = dense<[[1, 0], [2, 1], [3, 2], [0, 3]]> : tensor<4x2xi64>}> : (tensor<1x4xf32>) -> tensor<1x4xf32>
    %2 = stablehlo.slice %arg0 [0:3, 0:4] : (tensor<4x4xf32>) -> tensor<3x4xf32>
    %3 = stablehlo.concatenate %1, %2, dim = 0 : (tensor<1x4xf32>, tensor<3x4xf32>) -> tensor<4x4xf32>
    return %3 : tensor<4x4xf32>
  }
}

// -----

// A window used as if it were the block: the slice is the error.
module attributes {mhlo.num_partitions = 4 : i32} {
  func.func @ref(%x: tensor<16x4xf32>) -> tensor<4x4xf32> {
    // expected-note @+1 {{corresponds to the reference op stablehlo.slice}}
    %0 = stablehlo.slice %x [0:4, 0:4] : (tensor<16x4xf32>) -> tensor<4x4xf32>
    return %0 : tensor<4x4xf32>
  }
  // FULL: func.func @window_used{{.*}}entangle.verdict = "not proven"
  func.func @window_used(%arg0: tensor<4x4xf32> {mhlo.sharding = "{devices=[4,1]<=[4]}"}) -> (tensor<1x4xf32> {mhlo.sharding = "{devices=[4,1]<=[4]}"}) attributes {entangle.refines = @ref} {
    // expected-error @+1 {{slice of dim 0, which is split over ('d0', 'd1'): each device slices its own block, not the global tensor}}
    %0 = stablehlo.slice %arg0 [0:1, 0:4] : (tensor<4x4xf32>) -> tensor<1x4xf32>
    %1 = stablehlo.negate %0 : tensor<1x4xf32>
    return %1 : tensor<1x4xf32>
  }
}
