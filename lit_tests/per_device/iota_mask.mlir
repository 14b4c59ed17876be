// RUN: entangle-opt %s --split-input-file --entangle-normalize --entangle-import-shardings --entangle-infer-relations --entangle-check-refinement --verify-diagnostics | filecheck %s

// The padding mask of an uneven shard. A value of 10 rows split over 4 devices is padded to
// 4 x 4 rows; before reducing over the rows each device zeroes its rows at or past row 10, with
// a mask built from iota + its row offset. `broadcast(partition_id * 4) + iota` is the global
// iota split over the devices (rules/shifted.py), `select(iota < 10, x, 0)` is x's first 10
// rows padded with zeros (terms.iota_interval), and a sum drops zero padding: the result is
// the reference's sum of x[:10]. Masking at 11 instead is caught (second function).

module attributes {mhlo.num_partitions = 4 : i32} {
  func.func @ref(%x: tensor<16xf32>) -> tensor<f32> {
    %0 = stablehlo.slice %x [0:10] : (tensor<16xf32>) -> tensor<10xf32>
    %z = stablehlo.constant dense<0.0> : tensor<f32>
    %1 = stablehlo.reduce(%0 init: %z) applies stablehlo.add across dimensions = [0] : (tensor<10xf32>, tensor<f32>) -> tensor<f32>
    return %1 : tensor<f32>
  }
  // CHECK-LABEL: func.func @sharded{{.*}}entangle.verdict = "proven"
  func.func @sharded(%x: tensor<4xf32> {mhlo.sharding = "{devices=[4]<=[4]}"}) -> (tensor<f32> {mhlo.sharding = "{replicated}"}) attributes {entangle.refines = @ref} {
    %pid = stablehlo.partition_id : tensor<ui32>
    %i = stablehlo.convert %pid : (tensor<ui32>) -> tensor<i32>
    %c4 = stablehlo.constant dense<4> : tensor<i32>
    %off = stablehlo.multiply %i, %c4 : tensor<i32>
    %offs = stablehlo.broadcast_in_dim %off, dims = [] : (tensor<i32>) -> tensor<4xi32>
    %iota = stablehlo.iota dim = 0 : tensor<4xi32>
    // CHECK: stablehlo.add{{.*}}entangle.relation = "tile [{d0, d1}] : iota(dim 0)"
    %rows = stablehlo.add %iota, %offs : tensor<4xi32>
    %c10 = stablehlo.constant dense<10> : tensor<4xi32>
    %keep = stablehlo.compare LT, %rows, %c10 : (tensor<4xi32>, tensor<4xi32>) -> tensor<4xi1>
    %zeros = stablehlo.constant dense<0.0> : tensor<4xf32>
    // CHECK: stablehlo.select{{.*}}entangle.relation = "tile [{d0, d1}] : pad(slice(%arg0), 0)"
    %m = stablehlo.select %keep, %x, %zeros : tensor<4xi1>, tensor<4xf32>
    %z = stablehlo.constant dense<0.0> : tensor<f32>
    // CHECK: stablehlo.reduce{{.*}}entangle.relation = "partial sum {d0, d1} : reduce_sum(slice(%arg0))"
    %s = stablehlo.reduce(%m init: %z) applies stablehlo.add across dimensions = [0] : (tensor<4xf32>, tensor<f32>) -> tensor<f32>
    %r = "stablehlo.all_reduce"(%s) <{channel_handle = #stablehlo.channel_handle<handle = 1, type = 0>, replica_groups = dense<[[0, 1, 2, 3]]> : tensor<1x4xi64>, use_global_device_ids}> ({
    ^bb0(%a: tensor<f32>, %b: tensor<f32>):
      %t = stablehlo.add %a, %b : tensor<f32>
      stablehlo.return %t : tensor<f32>
    }) : (tensor<f32>) -> tensor<f32>
    return %r : tensor<f32>
  }
}

// -----

module attributes {mhlo.num_partitions = 4 : i32} {
  func.func @ref(%x: tensor<16xf32>) -> tensor<f32> {
    %0 = stablehlo.slice %x [0:10] : (tensor<16xf32>) -> tensor<10xf32>
    %z = stablehlo.constant dense<0.0> : tensor<f32>
    %1 = stablehlo.reduce(%0 init: %z) applies stablehlo.add across dimensions = [0] : (tensor<10xf32>, tensor<f32>) -> tensor<f32>
    return %1 : tensor<f32>
  }
  // Masking at row 11 keeps a padding row: the sum is of x[:11].
  // CHECK-LABEL: func.func @mask_at_11{{.*}}entangle.verdict = "not proven"
  func.func @mask_at_11(%x: tensor<4xf32> {mhlo.sharding = "{devices=[4]<=[4]}"}) -> (tensor<f32> {mhlo.sharding = "{replicated}"}) attributes {entangle.refines = @ref} {
    %pid = stablehlo.partition_id : tensor<ui32>
    %i = stablehlo.convert %pid : (tensor<ui32>) -> tensor<i32>
    %c4 = stablehlo.constant dense<4> : tensor<i32>
    %off = stablehlo.multiply %i, %c4 : tensor<i32>
    %offs = stablehlo.broadcast_in_dim %off, dims = [] : (tensor<i32>) -> tensor<4xi32>
    %iota = stablehlo.iota dim = 0 : tensor<4xi32>
    // CHECK: stablehlo.add{{.*}}entangle.relation = "tile [{d0, d1}] : iota(dim 0)"
    %rows = stablehlo.add %iota, %offs : tensor<4xi32>
    %c10 = stablehlo.constant dense<11> : tensor<4xi32>
    %keep = stablehlo.compare LT, %rows, %c10 : (tensor<4xi32>, tensor<4xi32>) -> tensor<4xi1>
    %zeros = stablehlo.constant dense<0.0> : tensor<4xf32>
    // CHECK: stablehlo.select{{.*}}entangle.relation = "tile [{d0, d1}] : pad(slice(%arg0), 0)"
    %m = stablehlo.select %keep, %x, %zeros : tensor<4xi1>, tensor<4xf32>
    %z = stablehlo.constant dense<0.0> : tensor<f32>
    // CHECK: stablehlo.reduce{{.*}}entangle.relation = "partial sum {d0, d1} : reduce_sum(slice(%arg0))"
    // expected-error @+1 {{reduce computes reduce_sum(slice(%arg0)), which the reference never computes}}
    %s = stablehlo.reduce(%m init: %z) applies stablehlo.add across dimensions = [0] : (tensor<4xf32>, tensor<f32>) -> tensor<f32>
    %r = "stablehlo.all_reduce"(%s) <{channel_handle = #stablehlo.channel_handle<handle = 1, type = 0>, replica_groups = dense<[[0, 1, 2, 3]]> : tensor<1x4xi64>, use_global_device_ids}> ({
    ^bb0(%a: tensor<f32>, %b: tensor<f32>):
      %t = stablehlo.add %a, %b : tensor<f32>
      stablehlo.return %t : tensor<f32>
    }) : (tensor<f32>) -> tensor<f32>
    // expected-note @+1 {{result #0 differs from the reference}}
    return %r : tensor<f32>
  }
}
