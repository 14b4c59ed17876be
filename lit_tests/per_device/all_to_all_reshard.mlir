// RUN: entangle-opt %s --split-input-file --entangle-normalize --entangle-import-shardings --entangle-infer-relations --entangle-check-refinement --verify-diagnostics | filecheck %s

// XLA's reshard from one split dim to another: reshape in a unit dim, all_to_all with
// split_dimension == concat_dimension, transpose, reshape. Device b's chunk i after the
// all_to_all is chunk b of device i, so the block index i leaves the rows and the device's
// index b becomes the major part of the dim after the all_to_all dim (rules/collectives.py);
// the reshape/transpose chain then collapses to x split along its columns (terms.py).

module attributes {mhlo.num_partitions = 4 : i32} {
  func.func @ref(%x: tensor<8x4xf32>) -> tensor<8x4xf32> {
    return %x : tensor<8x4xf32>
  }
  // CHECK-LABEL: func.func @rows_to_columns{{.*}}entangle.rho = ["result#0 = concat over ('d0', 'd1') along dim 1"], entangle.verdict = "proven"
  func.func @rows_to_columns(%x: tensor<2x4xf32> {mhlo.sharding = "{devices=[4,1]<=[4]}"}) -> (tensor<8x1xf32> {mhlo.sharding = "{devices=[1,4]<=[4]}"}) attributes {entangle.refines = @ref} {
    %0 = stablehlo.reshape %x : (tensor<2x4xf32>) -> tensor<2x4x1xf32>
    // CHECK: "stablehlo.all_to_all"{{.*}}entangle.relation = "tile [{}, {}, {d0, d1}] : reshape(transpose(reshape(%arg0)))"
    %1 = "stablehlo.all_to_all"(%0) <{channel_handle = #stablehlo.channel_handle<handle = 1, type = 0>, concat_dimension = 1 : i64, replica_groups = dense<[[0, 1, 2, 3]]> : tensor<1x4xi64>, split_count = 4 : i64, split_dimension = 1 : i64}> : (tensor<2x4x1xf32>) -> tensor<2x4x1xf32>
    // CHECK: stablehlo.transpose{{.*}}entangle.relation = "tile [{}, {}, {d0, d1}] : reshape(%arg0)"
    %2 = stablehlo.transpose %1, dims = [1, 0, 2] : (tensor<2x4x1xf32>) -> tensor<4x2x1xf32>
    // CHECK: stablehlo.reshape{{.*}}entangle.relation = "tile [{}, {d0, d1}] : %arg0"
    %3 = stablehlo.reshape %2 : (tensor<4x2x1xf32>) -> tensor<8x1xf32>
    return %3 : tensor<8x1xf32>
  }
}

// -----

module attributes {mhlo.num_partitions = 4 : i32} {
  func.func @ref(%x: tensor<4x8xf32>) -> tensor<4x8xf32> {
    return %x : tensor<4x8xf32>
  }
  // Columns back to rows: the split dim is the unit dim, the target dim is reshaped in two.
  // CHECK-LABEL: func.func @columns_to_rows{{.*}}entangle.rho = ["result#0 = concat over ('d0', 'd1') along dim 0"], entangle.verdict = "proven"
  func.func @columns_to_rows(%x: tensor<4x2xf32> {mhlo.sharding = "{devices=[1,4]<=[4]}"}) -> (tensor<1x8xf32> {mhlo.sharding = "{devices=[4,1]<=[4]}"}) attributes {entangle.refines = @ref} {
    %0 = stablehlo.reshape %x : (tensor<4x2xf32>) -> tensor<4x1x2xf32>
    %1 = "stablehlo.all_to_all"(%0) <{channel_handle = #stablehlo.channel_handle<handle = 1, type = 0>, concat_dimension = 0 : i64, replica_groups = dense<[[0, 1, 2, 3]]> : tensor<1x4xi64>, split_count = 4 : i64, split_dimension = 0 : i64}> : (tensor<4x1x2xf32>) -> tensor<4x1x2xf32>
    %2 = stablehlo.transpose %1, dims = [1, 0, 2] : (tensor<4x1x2xf32>) -> tensor<1x4x2xf32>
    %3 = stablehlo.reshape %2 : (tensor<1x4x2xf32>) -> tensor<1x8xf32>
    return %3 : tensor<1x8xf32>
  }
}

// -----

module attributes {mhlo.num_partitions = 4 : i32} {
  func.func @ref(%x: tensor<8x4xf32>) -> tensor<8x4xf32> {
    return %x : tensor<8x4xf32>
  }
  // The transpose is missing: each device's column interleaves the source devices' rows.
  // CHECK-LABEL: func.func @missing_transpose{{.*}}entangle.verdict = "not proven"
  func.func @missing_transpose(%x: tensor<2x4xf32> {mhlo.sharding = "{devices=[4,1]<=[4]}"}) -> (tensor<8x1xf32> {mhlo.sharding = "{devices=[1,4]<=[4]}"}) attributes {entangle.refines = @ref} {
    %0 = stablehlo.reshape %x : (tensor<2x4xf32>) -> tensor<2x4x1xf32>
    %1 = "stablehlo.all_to_all"(%0) <{channel_handle = #stablehlo.channel_handle<handle = 1, type = 0>, concat_dimension = 1 : i64, replica_groups = dense<[[0, 1, 2, 3]]> : tensor<1x4xi64>, split_count = 4 : i64, split_dimension = 1 : i64}> : (tensor<2x4x1xf32>) -> tensor<2x4x1xf32>
    // expected-error @+1 {{reshape computes reshape(transpose(reshape(%arg0))), which the reference never computes}}
    %3 = stablehlo.reshape %1 : (tensor<2x4x1xf32>) -> tensor<8x1xf32>
    // expected-note @+1 {{result #0 differs from the reference}}
    return %3 : tensor<8x1xf32>
  }
}
