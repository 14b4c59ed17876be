// RUN: entangle-opt %s --split-input-file --entangle-normalize --entangle-import-shardings --entangle-infer-relations | filecheck %s
// RUN: entangle-opt %s --split-input-file --entangle-normalize --entangle-import-shardings --entangle-infer-relations --entangle-check-refinement --verify-diagnostics | filecheck %s --check-prefix=FULL

// Per-device programs (XLA's partitioner output): offsets computed from partition_id are
// evaluated as a table over all devices and matched against block offsets of the synthesized
// mesh (4 devices -> d0=2 x d1=2, row-major). XLA's form of a reduce_scatter on CPU is an
// all_reduce followed by each device's dynamic_slice, at offsets read from a constant table
// indexed by partition_id; jax's axis_index arithmetic gives the same table.

module attributes {mhlo.num_partitions = 4 : i32} {
  func.func @ref(%x: tensor<16x8xf32>, %w: tensor<8x12xf32>) -> tensor<16x12xf32> {
    %0 = stablehlo.dot_general %x, %w, contracting_dims = [1] x [0] : (tensor<16x8xf32>, tensor<8x12xf32>) -> tensor<16x12xf32>
    return %0 : tensor<16x12xf32>
  }
  // CHECK-LABEL: func.func @table
  // FULL: func.func @table{{.*}}entangle.rho = ["result#0 = concat over ('d0', 'd1') along dim 0"], entangle.verdict = "proven"
  func.func @table(%x: tensor<16x2xf32> {mhlo.sharding = "{devices=[1,4]<=[4]}"}, %w: tensor<2x12xf32> {mhlo.sharding = "{devices=[4,1]<=[4]}"}) -> (tensor<4x12xf32> {mhlo.sharding = "{devices=[4,1]<=[4]}"}) attributes {entangle.refines = @ref} {
    // CHECK: stablehlo.dot {{.*}}entangle.relation = "partial sum {d0, d1} : dot_general(%arg0, %arg1)"
    %0 = stablehlo.dot %x, %w : (tensor<16x2xf32>, tensor<2x12xf32>) -> tensor<16x12xf32>
    // CHECK: "stablehlo.all_reduce"
    // CHECK: entangle.relation = "replicated : dot_general(%arg0, %arg1)"
    %1 = "stablehlo.all_reduce"(%0) <{channel_handle = #stablehlo.channel_handle<handle = 1, type = 0>, replica_groups = dense<[[0, 1, 2, 3]]> : tensor<1x4xi64>, use_global_device_ids}> ({
    ^bb0(%a: tensor<f32>, %b: tensor<f32>):
      %s = stablehlo.add %a, %b : tensor<f32>
      stablehlo.return %s : tensor<f32>
    }) : (tensor<16x12xf32>) -> tensor<16x12xf32>
    %table = stablehlo.constant dense<[0, 4, 8, 12]> : tensor<4xi32>
    // CHECK: stablehlo.partition_id {{.*}}entangle.relation = "device scalar [0, 1, 2, 3]"
    %pid = stablehlo.partition_id : tensor<ui32>
    // CHECK: stablehlo.dynamic_slice {{.*}}entangle.relation = "device scalar [0, 4, 8, 12]"
    %t = stablehlo.dynamic_slice %table, %pid, sizes = [1] : (tensor<4xi32>, tensor<ui32>) -> tensor<1xi32>
    // CHECK: stablehlo.reshape {{.*}}entangle.relation = "device scalar [0, 4, 8, 12]"
    %off = stablehlo.reshape %t : (tensor<1xi32>) -> tensor<i32>
    %c0 = stablehlo.constant dense<0> : tensor<i32>
    // CHECK: stablehlo.dynamic_slice {{.*}}entangle.relation = "tile [{d0, d1}, {}] : dot_general(%arg0, %arg1)"
    %2 = stablehlo.dynamic_slice %1, %off, %c0, sizes = [4, 12] : (tensor<16x12xf32>, tensor<i32>, tensor<i32>) -> tensor<4x12xf32>
    return %2 : tensor<4x12xf32>
  }
}

// -----

module attributes {mhlo.num_partitions = 8 : i32} {
  func.func @ref(%x: tensor<8x16xf32>) -> tensor<8x16xf32> {
    return %x : tensor<8x16xf32>
  }
  // 8 devices as dp=2 x tp=4 (d0 x (d1, d2)): columns by (partition_id % 4) * 4, rows by
  // (partition_id / 4) * 4, as jax's axis_index arithmetic writes them.
  // CHECK-LABEL: func.func @arithmetic
  // FULL: func.func @arithmetic{{.*}}entangle.rho = ["result#0 = concat over 'd0' along dim 0, then concat over ('d1', 'd2') along dim 1"], entangle.verdict = "proven"
  func.func @arithmetic(%x: tensor<8x16xf32> {mhlo.sharding = "{replicated}"}) -> (tensor<4x4xf32> {mhlo.sharding = "{devices=[2,4]<=[8]}"}) attributes {entangle.refines = @ref} {
    %pid = stablehlo.partition_id : tensor<ui32>
    %i = stablehlo.convert %pid : (tensor<ui32>) -> tensor<i32>
    %c4 = stablehlo.constant dense<4> : tensor<i32>
    %tp = stablehlo.remainder %i, %c4 : tensor<i32>
    %dp = stablehlo.divide %i, %c4 : tensor<i32>
    // CHECK: stablehlo.multiply {{.*}}entangle.relation = "device scalar [0, 0, 0, 0, 4, 4, 4, 4]"
    %row = stablehlo.multiply %dp, %c4 : tensor<i32>
    // CHECK: stablehlo.multiply {{.*}}entangle.relation = "device scalar [0, 4, 8, 12, 0, 4, 8, 12]"
    %col = stablehlo.multiply %tp, %c4 : tensor<i32>
    // CHECK: stablehlo.dynamic_slice {{.*}}entangle.relation = "tile [{d0}, {d1, d2}] : %arg0"
    %0 = stablehlo.dynamic_slice %x, %row, %col, sizes = [4, 4] : (tensor<8x16xf32>, tensor<i32>, tensor<i32>) -> tensor<4x4xf32>
    return %0 : tensor<4x4xf32>
  }
}

// -----

module attributes {mhlo.num_partitions = 4 : i32} {
  func.func @ref(%x: tensor<16x12xf32>) -> tensor<16x12xf32> {
    return %x : tensor<16x12xf32>
  }
  // A wrong table entry: device 2 reads rows 4..7, which belong to device 1.
  // CHECK-LABEL: func.func @wrong_entry
  // FULL: func.func @wrong_entry{{.*}}entangle.verdict = "not proven"
  func.func @wrong_entry(%x: tensor<16x12xf32> {mhlo.sharding = "{replicated}"}) -> (tensor<4x12xf32> {mhlo.sharding = "{devices=[4,1]<=[4]}"}) attributes {entangle.refines = @ref} {
    %table = stablehlo.constant dense<[0, 4, 4, 12]> : tensor<4xi32>
    %pid = stablehlo.partition_id : tensor<ui32>
    %t = stablehlo.dynamic_slice %table, %pid, sizes = [1] : (tensor<4xi32>, tensor<ui32>) -> tensor<1xi32>
    %off = stablehlo.reshape %t : (tensor<1xi32>) -> tensor<i32>
    %c0 = stablehlo.constant dense<0> : tensor<i32>
    // CHECK: stablehlo.dynamic_slice {{.*}}entangle.relation = "opaque: device-dependent offset is wrong along dim 0: device 2 reads [4, 8) instead of its own block [8, 12)
    // expected-error @+1 {{device-dependent offset is wrong along dim 0: device 2 reads [4, 8) instead of its own block [8, 12)}}
    %0 = stablehlo.dynamic_slice %x, %off, %c0, sizes = [4, 12] : (tensor<16x12xf32>, tensor<i32>, tensor<i32>) -> tensor<4x12xf32>
    return %0 : tensor<4x12xf32>
  }
}
