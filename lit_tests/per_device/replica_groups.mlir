// RUN: entangle-opt %s --split-input-file --entangle-normalize --entangle-import-shardings --entangle-infer-relations | filecheck %s
// RUN: entangle-opt %s --split-input-file --entangle-normalize --entangle-import-shardings --entangle-infer-relations --entangle-check-refinement --verify-diagnostics | filecheck %s --check-prefix=FULL

// Replica groups of XLA's collectives, read as axes of the synthesized mesh (8 devices ->
// d0=2 x d1=2 x d2=2). With a channel handle and use_global_device_ids the groups list global
// device ids (what the SPMD partitioner emits); XLA's HLO text may print them in the iota form
// `replica_groups=[2,4]<=[8]`, which jaxlib's converter expands to this dense form.

module attributes {mhlo.num_partitions = 8 : i32} {
  func.func @ref(%x: tensor<8x16xf32>) -> tensor<8xf32> {
    %z = stablehlo.constant dense<0.0> : tensor<f32>
    %0 = stablehlo.reduce(%x init: %z) applies stablehlo.add across dimensions = [1] : (tensor<8x16xf32>, tensor<f32>) -> tensor<8xf32>
    return %0 : tensor<8xf32>
  }
  // Rows over d0 (dp), columns over (d1, d2) (tp): the tp groups [[0,1,2,3],[4,5,6,7]].
  // CHECK-LABEL: func.func @tp_groups
  // FULL: func.func @tp_groups{{.*}}entangle.verdict = "proven"
  func.func @tp_groups(%x: tensor<4x4xf32> {mhlo.sharding = "{devices=[2,4]<=[8]}"}) -> (tensor<4xf32> {mhlo.sharding = "{devices=[2,4]<=[8] last_tile_dim_replicate}"}) attributes {entangle.refines = @ref} {
    %z = stablehlo.constant dense<0.0> : tensor<f32>
    // CHECK: stablehlo.reduce{{.*}}entangle.relation = "tile [{d0}] partial sum {d1, d2} : reduce_sum(%arg0)"
    %0 = stablehlo.reduce(%x init: %z) applies stablehlo.add across dimensions = [1] : (tensor<4x4xf32>, tensor<f32>) -> tensor<4xf32>
    // CHECK: "stablehlo.all_reduce"
    // CHECK: entangle.relation = "tile [{d0}] : reduce_sum(%arg0)"
    %1 = "stablehlo.all_reduce"(%0) <{channel_handle = #stablehlo.channel_handle<handle = 1, type = 0>, replica_groups = dense<[[0, 1, 2, 3], [4, 5, 6, 7]]> : tensor<2x4xi64>, use_global_device_ids}> ({
    ^bb0(%a: tensor<f32>, %b: tensor<f32>):
      %s = stablehlo.add %a, %b : tensor<f32>
      stablehlo.return %s : tensor<f32>
    }) : (tensor<4xf32>) -> tensor<4xf32>
    return %1 : tensor<4xf32>
  }
}

// -----

module attributes {mhlo.num_partitions = 8 : i32} {
  func.func @ref(%x: tensor<8x16xf32>) -> tensor<8xf32> {
    %z = stablehlo.constant dense<0.0> : tensor<f32>
    // expected-note @+1 {{corresponds to the reference op stablehlo.reduce}}
    %0 = stablehlo.reduce(%x init: %z) applies stablehlo.add across dimensions = [1] : (tensor<8x16xf32>, tensor<f32>) -> tensor<8xf32>
    return %0 : tensor<8xf32>
  }
  // The dp groups [[0,4],[1,5],[2,6],[3,7]] instead: sums the rows of different blocks.
  // CHECK-LABEL: func.func @dp_groups
  // FULL: func.func @dp_groups{{.*}}entangle.verdict = "not proven"
  func.func @dp_groups(%x: tensor<4x4xf32> {mhlo.sharding = "{devices=[2,4]<=[8]}"}) -> (tensor<4xf32> {mhlo.sharding = "{devices=[2,4]<=[8] last_tile_dim_replicate}"}) attributes {entangle.refines = @ref} {
    %z = stablehlo.constant dense<0.0> : tensor<f32>
    %0 = stablehlo.reduce(%x init: %z) applies stablehlo.add across dimensions = [1] : (tensor<4x4xf32>, tensor<f32>) -> tensor<4xf32>
    // CHECK: "stablehlo.all_reduce"
    // CHECK: entangle.relation = "opaque: all_reduce sums over 'd0' of a value split over 'd0': it combines different blocks"
    // expected-error @+1 {{all_reduce sums over 'd0' of a value split over 'd0': it combines different blocks}}
    %1 = "stablehlo.all_reduce"(%0) <{channel_handle = #stablehlo.channel_handle<handle = 1, type = 0>, replica_groups = dense<[[0, 4], [1, 5], [2, 6], [3, 7]]> : tensor<4x2xi64>, use_global_device_ids}> ({
    ^bb0(%a: tensor<f32>, %b: tensor<f32>):
      %s = stablehlo.add %a, %b : tensor<f32>
      stablehlo.return %s : tensor<f32>
    }) : (tensor<4xf32>) -> tensor<4xf32>
    return %1 : tensor<4xf32>
  }
}

// -----

module attributes {mhlo.num_partitions = 8 : i32} {
  func.func @ref(%x: tensor<8x16xf32>) -> tensor<8xf32> {
    %z = stablehlo.constant dense<0.0> : tensor<f32>
    // expected-note @+1 {{corresponds to the reference op stablehlo.reduce}}
    %0 = stablehlo.reduce(%x init: %z) applies stablehlo.add across dimensions = [1] : (tensor<8x16xf32>, tensor<f32>) -> tensor<8xf32>
    return %0 : tensor<8xf32>
  }
  // Groups that are no set of mesh axes.
  // CHECK-LABEL: func.func @no_axes
  // FULL: func.func @no_axes{{.*}}entangle.verdict = "not proven"
  func.func @no_axes(%x: tensor<4x4xf32> {mhlo.sharding = "{devices=[2,4]<=[8]}"}) -> (tensor<4xf32> {mhlo.sharding = "{devices=[2,4]<=[8] last_tile_dim_replicate}"}) attributes {entangle.refines = @ref} {
    %z = stablehlo.constant dense<0.0> : tensor<f32>
    %0 = stablehlo.reduce(%x init: %z) applies stablehlo.add across dimensions = [1] : (tensor<4x4xf32>, tensor<f32>) -> tensor<4xf32>
    // CHECK: "stablehlo.all_reduce"
    // CHECK: entangle.relation = "opaque: stablehlo.all_reduce: replica groups {{\[\[}}0, 1, 2, 4], [3, 5, 6, 7]] do not correspond to any mesh axes of d0=2 x d1=2 x d2=2"
    // expected-error @+1 {{replica groups [[0, 1, 2, 4], [3, 5, 6, 7]] do not correspond to any mesh axes}}
    %1 = "stablehlo.all_reduce"(%0) <{channel_handle = #stablehlo.channel_handle<handle = 1, type = 0>, replica_groups = dense<[[0, 1, 2, 4], [3, 5, 6, 7]]> : tensor<2x4xi64>, use_global_device_ids}> ({
    ^bb0(%a: tensor<f32>, %b: tensor<f32>):
      %s = stablehlo.add %a, %b : tensor<f32>
      stablehlo.return %s : tensor<f32>
    }) : (tensor<4xf32>) -> tensor<4xf32>
    return %1 : tensor<4xf32>
  }
}

// -----

module attributes {mhlo.num_partitions = 8 : i32} {
  func.func @ref(%x: tensor<8x16xf32>) -> tensor<8xf32> {
    %z = stablehlo.constant dense<0.0> : tensor<f32>
    // expected-note @+1 {{corresponds to the reference op stablehlo.reduce}}
    %0 = stablehlo.reduce(%x init: %z) applies stablehlo.add across dimensions = [1] : (tensor<8x16xf32>, tensor<f32>) -> tensor<8xf32>
    return %0 : tensor<8xf32>
  }
  // No channel handle, no use_global_device_ids: a cross-replica all_reduce whose groups are
  // replica ids. There is one replica, so each group is one process: a no-op on every
  // partition (StableHLO's cross_replica), never read as device ids. (Groups naming replica
  // ids beyond the one replica are bad input: XLA rejects them.)
  // CHECK-LABEL: func.func @replica_ids
  // FULL: func.func @replica_ids{{.*}}entangle.verdict = "not proven"
  func.func @replica_ids(%x: tensor<4x4xf32> {mhlo.sharding = "{devices=[2,4]<=[8]}"}) -> (tensor<4xf32> {mhlo.sharding = "{devices=[2,4]<=[8] last_tile_dim_replicate}"}) attributes {entangle.refines = @ref} {
    %z = stablehlo.constant dense<0.0> : tensor<f32>
    // expected-error @+1 {{value is still a partial sum over ('d1', 'd2') when it leaves the program (result #0): missing all_reduce/psum}}
    %0 = stablehlo.reduce(%x init: %z) applies stablehlo.add across dimensions = [1] : (tensor<4x4xf32>, tensor<f32>) -> tensor<4xf32>
    // CHECK: "stablehlo.all_reduce"
    // CHECK: entangle.relation = "tile [{d0}] partial sum {d1, d2} : reduce_sum(%arg0)"
    %1 = "stablehlo.all_reduce"(%0) <{replica_groups = dense<[[0]]> : tensor<1x1xi64>}> ({
    ^bb0(%a: tensor<f32>, %b: tensor<f32>):
      %s = stablehlo.add %a, %b : tensor<f32>
      stablehlo.return %s : tensor<f32>
    }) : (tensor<4xf32>) -> tensor<4xf32>
    // expected-note @+1 {{the partial sum leaves shard_map here}}
    return %1 : tensor<4xf32>
  }
}
