// RUN: entangle-opt %s --split-input-file --entangle-normalize --entangle-import-shardings --entangle-infer-relations | filecheck %s
// RUN: entangle-opt %s --split-input-file --entangle-normalize --entangle-import-shardings --entangle-infer-relations --entangle-check-refinement --verify-diagnostics | filecheck %s --check-prefix=FULL

// Micro-batching the local batch: x's 16 rows are split over 4 devices (data parallel) and
// each device sums tanh over its first 2 rows and its last 2 rows separately (two
// micro-batches), adds the two sums and all_reduces. Each slice is a window of the split dim
// (rows [4b, 4b+2) and [4b+2, 4b+4)); tanh of a window is the same window of tanh(x); the sum
// over a window is a summed window; the sums of the two complementary windows are the sum of
// the device's block: a partial sum, which the all_reduce completes.

module attributes {mhlo.num_partitions = 4 : i32} {
  func.func @ref(%x: tensor<16x4xf32>) -> tensor<f32> {
    %0 = stablehlo.tanh %x : tensor<16x4xf32>
    %z = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    %1 = stablehlo.reduce(%0 init: %z) applies stablehlo.add across dimensions = [0, 1] : (tensor<16x4xf32>, tensor<f32>) -> tensor<f32>
    return %1 : tensor<f32>
  }
  // FULL: func.func @sharded{{.*}}entangle.verdict = "proven"
  func.func @sharded(%arg0: tensor<4x4xf32> {mhlo.sharding = "{devices=[4,1]<=[4]}"}) -> (tensor<f32> {mhlo.sharding = "{replicated}"}) attributes {entangle.refines = @ref} {
    %0 = stablehlo.slice %arg0 [0:2, 0:4] : (tensor<4x4xf32>) -> tensor<2x4xf32>
    // CHECK: stablehlo.tanh{{.*}}entangle.relation = "tile [{d0, d1}, {}] : tanh(%arg0) rows [b*B + 0, b*B + 2) of dim 0"
    %1 = stablehlo.tanh %0 : tensor<2x4xf32>
    %z = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    // CHECK: stablehlo.reduce{{.*}}entangle.relation = "tile [{d0, d1}, {}] : sum over dims [0, 1] of tanh(%arg0) rows [b*B + 0, b*B + 2) of dim 0"
    %2 = stablehlo.reduce(%1 init: %z) applies stablehlo.add across dimensions = [0, 1] : (tensor<2x4xf32>, tensor<f32>) -> tensor<f32>
    %3 = stablehlo.slice %arg0 [2:4, 0:4] : (tensor<4x4xf32>) -> tensor<2x4xf32>
    %4 = stablehlo.tanh %3 : tensor<2x4xf32>
    %5 = stablehlo.reduce(%4 init: %z) applies stablehlo.add across dimensions = [0, 1] : (tensor<2x4xf32>, tensor<f32>) -> tensor<f32>
    // CHECK: stablehlo.add{{.*}}entangle.relation = "partial sum {d0, d1} : reduce_sum(tanh(%arg0))"
    %6 = stablehlo.add %2, %5 : tensor<f32>
    %7 = "stablehlo.all_reduce"(%6) <{channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, replica_groups = dense<[[0, 1, 2, 3]]> : tensor<1x4xi64>, use_global_device_ids}> ({
    ^bb0(%a: tensor<f32>, %b: tensor<f32>):
      %s = stablehlo.add %a, %b : tensor<f32>
      stablehlo.return %s : tensor<f32>
    }) : (tensor<f32>) -> tensor<f32>
    return %7 : tensor<f32>
  }
}

// -----

// The second micro-batch's sum is dropped: the all_reduce adds only the first 2 rows of each
// block. Flagged at the reduce whose partial sum covers half a block.
module attributes {mhlo.num_partitions = 4 : i32} {
  func.func @ref(%x: tensor<16x4xf32>) -> tensor<f32> {
    %0 = stablehlo.tanh %x : tensor<16x4xf32>
    %z = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    %1 = stablehlo.reduce(%0 init: %z) applies stablehlo.add across dimensions = [0, 1] : (tensor<16x4xf32>, tensor<f32>) -> tensor<f32>
    return %1 : tensor<f32>
  }
  // FULL: func.func @one_microbatch{{.*}}entangle.verdict = "not proven"
  func.func @one_microbatch(%arg0: tensor<4x4xf32> {mhlo.sharding = "{devices=[4,1]<=[4]}"}) -> (tensor<f32> {mhlo.sharding = "{replicated}"}) attributes {entangle.refines = @ref} {
    %0 = stablehlo.slice %arg0 [0:2, 0:4] : (tensor<4x4xf32>) -> tensor<2x4xf32>
    %1 = stablehlo.tanh %0 : tensor<2x4xf32>
    %z = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    // expected-error @+1 {{sum over rows [4b, 4b+2) of dim 0, which is split over ('d0', 'd1'), only: part of each device's block (the sum of the other rows is never added)}}
    %2 = stablehlo.reduce(%1 init: %z) applies stablehlo.add across dimensions = [0, 1] : (tensor<2x4xf32>, tensor<f32>) -> tensor<f32>
    %7 = "stablehlo.all_reduce"(%2) <{channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, replica_groups = dense<[[0, 1, 2, 3]]> : tensor<1x4xi64>, use_global_device_ids}> ({
    ^bb0(%a: tensor<f32>, %b: tensor<f32>):
      %s = stablehlo.add %a, %b : tensor<f32>
      stablehlo.return %s : tensor<f32>
    }) : (tensor<f32>) -> tensor<f32>
    return %7 : tensor<f32>
  }
}

// -----

// Gradient accumulation of a weight gradient: x^T g over each micro-batch's rows (a matmul
// contracting the window's dim sums its rows), accumulated from zeros and all_reduced: the
// matmul over the whole batch.
module attributes {mhlo.num_partitions = 4 : i32} {
  func.func @ref(%x: tensor<16x3xf32>, %g: tensor<16x5xf32>) -> tensor<3x5xf32> {
    %0 = stablehlo.dot_general %x, %g, contracting_dims = [0] x [0] : (tensor<16x3xf32>, tensor<16x5xf32>) -> tensor<3x5xf32>
    return %0 : tensor<3x5xf32>
  }
  // FULL: func.func @accumulated{{.*}}entangle.verdict = "proven"
  func.func @accumulated(%x: tensor<4x3xf32> {mhlo.sharding = "{devices=[4,1]<=[4]}"}, %g: tensor<4x5xf32> {mhlo.sharding = "{devices=[4,1]<=[4]}"}) -> (tensor<3x5xf32> {mhlo.sharding = "{replicated}"}) attributes {entangle.refines = @ref} {
    %zeros = stablehlo.constant dense<0.000000e+00> : tensor<3x5xf32>
    %x0 = stablehlo.slice %x [0:2, 0:3] : (tensor<4x3xf32>) -> tensor<2x3xf32>
    %g0 = stablehlo.slice %g [0:2, 0:5] : (tensor<4x5xf32>) -> tensor<2x5xf32>
    // CHECK: stablehlo.dot_general{{.*}}entangle.relation = "tile [{d0, d1}, {}, {}] : sum over dims [0] of dot_general(%arg0, %arg1) rows [b*B + 0, b*B + 2) of dim 0"
    %w0 = stablehlo.dot_general %x0, %g0, contracting_dims = [0] x [0] : (tensor<2x3xf32>, tensor<2x5xf32>) -> tensor<3x5xf32>
    %a0 = stablehlo.add %zeros, %w0 : tensor<3x5xf32>
    %x1 = stablehlo.slice %x [2:4, 0:3] : (tensor<4x3xf32>) -> tensor<2x3xf32>
    %g1 = stablehlo.slice %g [2:4, 0:5] : (tensor<4x5xf32>) -> tensor<2x5xf32>
    %w1 = stablehlo.dot_general %x1, %g1, contracting_dims = [0] x [0] : (tensor<2x3xf32>, tensor<2x5xf32>) -> tensor<3x5xf32>
    // CHECK: stablehlo.add{{.*}}entangle.relation = "partial sum {d0, d1} : dot_general(%arg0, %arg1)"
    %a1 = stablehlo.add %a0, %w1 : tensor<3x5xf32>
    %out = "stablehlo.all_reduce"(%a1) <{channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, replica_groups = dense<[[0, 1, 2, 3]]> : tensor<1x4xi64>, use_global_device_ids}> ({
    ^bb0(%a: tensor<f32>, %b: tensor<f32>):
      %s = stablehlo.add %a, %b : tensor<f32>
      stablehlo.return %s : tensor<f32>
    }) : (tensor<3x5xf32>) -> tensor<3x5xf32>
    return %out : tensor<3x5xf32>
  }
}
