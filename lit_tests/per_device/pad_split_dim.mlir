// RUN: entangle-opt %s --split-input-file --entangle-normalize --entangle-import-shardings --entangle-infer-relations | filecheck %s
// RUN: entangle-opt %s --split-input-file --entangle-normalize --entangle-import-shardings --entangle-infer-relations --entangle-check-refinement --verify-diagnostics | filecheck %s --check-prefix=FULL

// XLA's partitioning of jnp.pad(x, ((2, 2), (0, 0))) with x's 16 rows split over 4 devices
// (20 result rows, 5 per device). Each device takes a halo row from both neighbours (the end
// devices receive nothing: zeros), pads that 6-row window with a zero row on both sides and
// reads its 5 rows at offset b: rows 5b-2 .. 5b+2 of x, where the rows outside x are exactly
// the zeros it reads. That is block b of pad(x): a zero-extended window.

module attributes {mhlo.num_partitions = 4 : i32} {
  func.func @ref(%x: tensor<16x4xf32>) -> tensor<20x4xf32> {
    %z = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    %0 = stablehlo.pad %x, %z, low = [2, 0], high = [2, 0], interior = [0, 0] : (tensor<16x4xf32>, tensor<f32>) -> tensor<20x4xf32>
    return %0 : tensor<20x4xf32>
  }
  // FULL: func.func @sharded{{.*}}entangle.verdict = "proven"
  func.func @sharded(%arg0: tensor<4x4xf32> {mhlo.sharding = "{devices=[4,1]<=[4]}"}) -> (tensor<5x4xf32> {mhlo.sharding = "{devices=[4,1]<=[4]}"}) attributes {entangle.refines = @ref} {
    %c = stablehlo.constant dense<[0, 1, 2, 3]> : tensor<4xi32>
    %1 = stablehlo.partition_id : tensor<ui32>
    %2 = stablehlo.dynamic_slice %c, %1, sizes = [1] : (tensor<4xi32>, tensor<ui32>) -> tensor<1xi32>
    %3 = stablehlo.reshape %2 : (tensor<1xi32>) -> tensor<i32>
    %12 = stablehlo.slice %arg0 [3:4, 0:4] : (tensor<4x4xf32>) -> tensor<1x4xf32>
    %13 = "stablehlo.collective_permute"(%12) <{channel_handle = #stablehlo.channel_handle<handle = 1, type = 0>, source_target_pairs = dense<[[0, 1], [1, 2], [2, 3]]> : tensor<3x2xi64>}> : (tensor<1x4xf32>) -> tensor<1x4xf32>
    %14 = stablehlo.slice %arg0 [0:1, 0:4] : (tensor<4x4xf32>) -> tensor<1x4xf32>
    %15 = "stablehlo.collective_permute"(%14) <{channel_handle = #stablehlo.channel_handle<handle = 2, type = 0>, source_target_pairs = dense<[[1, 0], [2, 1], [3, 2]]> : tensor<3x2xi64>}> : (tensor<1x4xf32>) -> tensor<1x4xf32>
    // CHECK: stablehlo.concatenate{{.*}}entangle.relation = "tile [{d0, d1}, {}] : %arg0 rows [b*B + 15, b*B + 21) of dim 0, zeros on devices [0, 3]"
    %16 = stablehlo.concatenate %13, %arg0, %15, dim = 0 : (tensor<1x4xf32>, tensor<4x4xf32>, tensor<1x4xf32>) -> tensor<6x4xf32>
    %c_3 = stablehlo.constant dense<0> : tensor<i32>
    %17 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    // CHECK: stablehlo.pad{{.*}}entangle.relation = "tile [{d0, d1}, {}] : %arg0 rows [b*B + 14, b*B + 22) of dim 0, zeros on devices [0, 1, 2, 3]"
    %18 = stablehlo.pad %16, %17, low = [1, 0], high = [1, 0], interior = [0, 0] : (tensor<6x4xf32>, tensor<f32>) -> tensor<8x4xf32>
    // CHECK: stablehlo.dynamic_slice{{.*}}entangle.relation = "tile [{d0, d1}, {}] : pad(%arg0, 0)"
    %19 = stablehlo.dynamic_slice %18, %3, %c_3, sizes = [5, 4] : (tensor<8x4xf32>, tensor<i32>, tensor<i32>) -> tensor<5x4xf32>
    return %19 : tensor<5x4xf32>
  }
}

// -----

// The same with a cyclic halo exchange (3 -> 0 sends too): device 0's row before x's first
// is x's last row, not the zero of the padding. Flagged at the read.
module attributes {mhlo.num_partitions = 4 : i32} {
  func.func @ref(%x: tensor<16x4xf32>) -> tensor<20x4xf32> {
    %z = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    %0 = stablehlo.pad %x, %z, low = [2, 0], high = [2, 0], interior = [0, 0] : (tensor<16x4xf32>, tensor<f32>) -> tensor<20x4xf32>
    return %0 : tensor<20x4xf32>
  }
  // FULL: func.func @wrapped{{.*}}entangle.verdict = "not proven"
  func.func @wrapped(%arg0: tensor<4x4xf32> {mhlo.sharding = "{devices=[4,1]<=[4]}"}) -> (tensor<5x4xf32> {mhlo.sharding = "{devices=[4,1]<=[4]}"}) attributes {entangle.refines = @ref} {
    %c = stablehlo.constant dense<[0, 1, 2, 3]> : tensor<4xi32>
    %1 = stablehlo.partition_id : tensor<ui32>
    %2 = stablehlo.dynamic_slice %c, %1, sizes = [1] : (tensor<4xi32>, tensor<ui32>) -> tensor<1xi32>
    %3 = stablehlo.reshape %2 : (tensor<1xi32>) -> tensor<i32>
    %12 = stablehlo.slice %arg0 [3:4, 0:4] : (tensor<4x4xf32>) -> tensor<1x4xf32>
    %13 = "stablehlo.collective_permute"(%12) <{channel_handle = #stablehlo.channel_handle<handle = 1, type = 0>, source_target_pairs = dense<[[0, 1], [1, 2], [2, 3], [3, 0]]> : tensor<4x2xi64>}> : (tensor<1x4xf32>) -> tensor<1x4xf32>
    %14 = stablehlo.slice %arg0 [0:1, 0:4] : (tensor<4x4xf32>) -> tensor<1x4xf32>
    %15 = "stablehlo.collective_permute"(%14) <{channel_handle = #stablehlo.channel_handle<handle = 2, type = 0>, source_target_pairs = dense<[[1, 0], [2, 1], [3, 2]]> : tensor<3x2xi64>}> : (tensor<1x4xf32>) -> tensor<1x4xf32>
    %16 = stablehlo.concatenate %13, %arg0, %15, dim = 0 : (tensor<1x4xf32>, tensor<4x4xf32>, tensor<1x4xf32>) -> tensor<6x4xf32>
    %c_3 = stablehlo.constant dense<0> : tensor<i32>
    %17 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    %18 = stablehlo.pad %16, %17, low = [1, 0], high = [1, 0], interior = [0, 0] : (tensor<6x4xf32>, tensor<f32>) -> tensor<8x4xf32>
    // expected-error @+1 {{dynamic_slice along dim 0: device 0 reads row 15 of the global tensor at row -1, outside it, where zero padding belongs (local row 1 of its window: a halo that wrapped around the ends)}}
    %19 = stablehlo.dynamic_slice %18, %3, %c_3, sizes = [5, 4] : (tensor<8x4xf32>, tensor<i32>, tensor<i32>) -> tensor<5x4xf32>
    return %19 : tensor<5x4xf32>
  }
}
