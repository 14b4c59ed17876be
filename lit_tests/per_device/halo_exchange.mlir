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

// -----

// XLA's x[4:12] with the 16 rows split over 4 devices: each device gathers a 2-row halo from
// both neighbours (the end devices receive nothing: zeros), then reads its 2 rows at offset
// 6 - 2b of that 8-row window. The reads avoid the zeros, so the result is block b of x[4:12].
module attributes {mhlo.num_partitions = 4 : i32} {
  func.func @ref(%x: tensor<16x4xf32>) -> tensor<8x4xf32> {
    %0 = stablehlo.slice %x [4:12, 0:4] : (tensor<16x4xf32>) -> tensor<8x4xf32>
    %c = stablehlo.constant dense<2.000000e+00> : tensor<8x4xf32>
    %1 = stablehlo.multiply %0, %c : tensor<8x4xf32>
    return %1 : tensor<8x4xf32>
  }
  // FULL: func.func @sharded_slice{{.*}}entangle.verdict = "proven"
  func.func @sharded_slice(%arg0: tensor<4x4xf32> {mhlo.sharding = "{devices=[4,1]<=[4]}"}) -> (tensor<2x4xf32> {mhlo.sharding = "{devices=[4,1]<=[4]}"}) attributes {entangle.refines = @ref} {
    %0 = stablehlo.slice %arg0 [2:4, 0:4] : (tensor<4x4xf32>) -> tensor<2x4xf32>
    %1 = "stablehlo.collective_permute"(%0) <{channel_handle = #stablehlo.channel_handle<handle = 1, type = 0>, source_target_pairs = dense<[[0, 1], [1, 2], [2, 3]]> : tensor<3x2xi64>}> : (tensor<2x4xf32>) -> tensor<2x4xf32>
    %2 = stablehlo.slice %arg0 [0:2, 0:4] : (tensor<4x4xf32>) -> tensor<2x4xf32>
    %3 = "stablehlo.collective_permute"(%2) <{channel_handle = #stablehlo.channel_handle<handle = 2, type = 0>, source_target_pairs = dense<[[1, 0], [2, 1], [3, 2]]> : tensor<3x2xi64>}> : (tensor<2x4xf32>) -> tensor<2x4xf32>
    // CHECK: stablehlo.concatenate{{.*}}entangle.relation = "tile [{d0, d1}, {}] : %arg0 rows [b*B + 14, b*B + 22) of dim 0, zeros on devices [0, 3]"
    %4 = stablehlo.concatenate %1, %arg0, %3, dim = 0 : (tensor<2x4xf32>, tensor<4x4xf32>, tensor<2x4xf32>) -> tensor<8x4xf32>
    %c = stablehlo.constant dense<[0, 1, 2, 3]> : tensor<4xi32>
    %5 = stablehlo.partition_id : tensor<ui32>
    %6 = stablehlo.dynamic_slice %c, %5, sizes = [1] : (tensor<4xi32>, tensor<ui32>) -> tensor<1xi32>
    %7 = stablehlo.reshape %6 : (tensor<1xi32>) -> tensor<i32>
    %c_0 = stablehlo.constant dense<-2> : tensor<i32>
    %8 = stablehlo.multiply %7, %c_0 : tensor<i32>
    %c_1 = stablehlo.constant dense<6> : tensor<i32>
    %9 = stablehlo.add %8, %c_1 : tensor<i32>
    %c_2 = stablehlo.constant dense<0> : tensor<i32>
    // CHECK: stablehlo.dynamic_slice{{.*}}entangle.relation = "tile [{d0, d1}, {}] : slice(%arg0)"
    %10 = stablehlo.dynamic_slice %4, %9, %c_2, sizes = [2, 4] : (tensor<8x4xf32>, tensor<i32>, tensor<i32>) -> tensor<2x4xf32>
    %11 = mhlo.copy %10 : tensor<2x4xf32>
    %cst = stablehlo.constant dense<2.000000e+00> : tensor<f32>
    %12 = stablehlo.broadcast_in_dim %cst, dims = [] : (tensor<f32>) -> tensor<2x4xf32>
    %13 = stablehlo.multiply %11, %12 : tensor<2x4xf32>
    return %13 : tensor<2x4xf32>
  }
}
