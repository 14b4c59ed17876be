// RUN: entangle-opt %s --entangle-normalize --entangle-import-shardings --entangle-infer-relations --entangle-check-refinement | filecheck %s
// XFAIL: *

// Known issue (library: layouts and collective_permute): a halo exchange. XLA's partitioning
// of jnp.roll(x, 1, axis=0) with rows split over 4 devices: each device sends its last row to
// the next device (collective_permute) and prepends the row it receives to its first 3 rows.
// Device d then holds rows 4d-1 .. 4d+2 (mod 16) = block d of roll(x, 1). Relating it needs a
// windowed layout (a block at a device-dependent offset, with wrap-around) and a
// collective_permute rule that moves blocks between devices; today the first slice of the split
// dim is refused ("each device slices its own block").

module attributes {mhlo.num_partitions = 4 : i32} {
  func.func @ref(%x: tensor<16x4xf32>) -> tensor<16x4xf32> {
    %0 = stablehlo.slice %x [15:16, 0:4] : (tensor<16x4xf32>) -> tensor<1x4xf32>
    %1 = stablehlo.slice %x [0:15, 0:4] : (tensor<16x4xf32>) -> tensor<15x4xf32>
    %2 = stablehlo.concatenate %0, %1, dim = 0 : (tensor<1x4xf32>, tensor<15x4xf32>) -> tensor<16x4xf32>
    return %2 : tensor<16x4xf32>
  }
  // CHECK: func.func @sharded{{.*}}entangle.verdict = "proven"
  func.func @sharded(%arg0: tensor<4x4xf32> {mhlo.sharding = "{devices=[4,1]<=[4]}"}) -> (tensor<4x4xf32> {mhlo.sharding = "{devices=[4,1]<=[4]}"}) attributes {entangle.refines = @ref} {
    %0 = stablehlo.slice %arg0 [3:4, 0:4] : (tensor<4x4xf32>) -> tensor<1x4xf32>
    %1 = "stablehlo.collective_permute"(%0) <{channel_handle = #stablehlo.channel_handle<handle = 1, type = 0>, source_target_pairs = dense<[[0, 1], [1, 2], [2, 3], [3, 0]]> : tensor<4x2xi64>}> : (tensor<1x4xf32>) -> tensor<1x4xf32>
    %2 = stablehlo.slice %arg0 [0:3, 0:4] : (tensor<4x4xf32>) -> tensor<3x4xf32>
    %3 = stablehlo.concatenate %1, %2, dim = 0 : (tensor<1x4xf32>, tensor<3x4xf32>) -> tensor<4x4xf32>
    return %3 : tensor<4x4xf32>
  }
}
