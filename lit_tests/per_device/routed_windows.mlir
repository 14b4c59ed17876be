// RUN: entangle-opt %s --split-input-file --entangle-normalize --entangle-import-shardings --entangle-infer-relations | filecheck %s
// RUN: entangle-opt %s --split-input-file --entangle-normalize --entangle-import-shardings --entangle-infer-relations --entangle-check-refinement --verify-diagnostics | filecheck %s --check-prefix=FULL

// XLA's routing of x[8:16] (of 16 rows split over 4 devices) back onto the 4 devices, as it
// splits a fused qkv matmul's output into q, k and v: device b needs rows [8 + 2b, 10 + 2b),
// which devices 2 and 3 hold. Point-to-point collective_permutes bring each device its rows
// (the devices a permute skips receive zeros) and selects on the device id pick, per device,
// the rows meant for it: a window with a start per device ([8, 10, 12, 14]): block b of
// x[8:16].

module attributes {mhlo.num_partitions = 4 : i32} {
  func.func @ref(%x: tensor<16x2xf32>) -> tensor<8x2xf32> {
    %0 = stablehlo.slice %x [8:16, 0:2] : (tensor<16x2xf32>) -> tensor<8x2xf32>
    return %0 : tensor<8x2xf32>
  }
  // FULL: func.func @sharded{{.*}}entangle.verdict = "proven"
  func.func @sharded(%arg0: tensor<4x2xf32> {mhlo.sharding = "{devices=[4,1]<=[4]}"}) -> (tensor<2x2xf32> {mhlo.sharding = "{devices=[4,1]<=[4]}"}) attributes {entangle.refines = @ref} {
    %pid = stablehlo.partition_id : tensor<ui32>
    %c = stablehlo.constant dense<[0, 1, 2, 3]> : tensor<4xi32>
    %t = stablehlo.dynamic_slice %c, %pid, sizes = [1] : (tensor<4xi32>, tensor<ui32>) -> tensor<1xi32>
    %d = stablehlo.reshape %t : (tensor<1xi32>) -> tensor<i32>
    %c1 = stablehlo.constant dense<1> : tensor<i32>
    %c2 = stablehlo.constant dense<2> : tensor<i32>
    %c3 = stablehlo.constant dense<3> : tensor<i32>
    %a = stablehlo.slice %arg0 [0:2, 0:2] : (tensor<4x2xf32>) -> tensor<2x2xf32>
    %b = stablehlo.slice %arg0 [2:4, 0:2] : (tensor<4x2xf32>) -> tensor<2x2xf32>
    // CHECK: collective_permute{{.*}}entangle.relation = "tile [{d0, d1}, {}] : %arg0 rows [b*B + 8, b*B + 10) of dim 0, zeros on devices [1, 2, 3]"
    %p0 = "stablehlo.collective_permute"(%a) <{channel_handle = #stablehlo.channel_handle<handle = 1, type = 0>, source_target_pairs = dense<[[2, 0]]> : tensor<1x2xi64>}> : (tensor<2x2xf32>) -> tensor<2x2xf32>
    %p1 = "stablehlo.collective_permute"(%b) <{channel_handle = #stablehlo.channel_handle<handle = 2, type = 0>, source_target_pairs = dense<[[2, 1]]> : tensor<1x2xi64>}> : (tensor<2x2xf32>) -> tensor<2x2xf32>
    %p2 = "stablehlo.collective_permute"(%a) <{channel_handle = #stablehlo.channel_handle<handle = 3, type = 0>, source_target_pairs = dense<[[3, 2]]> : tensor<1x2xi64>}> : (tensor<2x2xf32>) -> tensor<2x2xf32>
    %e1 = stablehlo.compare EQ, %d, %c1 : (tensor<i32>, tensor<i32>) -> tensor<i1>
    %m1 = stablehlo.broadcast_in_dim %e1, dims = [] : (tensor<i1>) -> tensor<2x2xi1>
    // CHECK: stablehlo.select{{.*}}entangle.relation = "tile [{d0, d1}, {}] : %arg0 rows [s, s + 2) of dim 0 from s = [8, 10, 16, 20] per device, zeros on devices [2, 3]"
    %s1 = stablehlo.select %m1, %p1, %p0 : tensor<2x2xi1>, tensor<2x2xf32>
    %e2 = stablehlo.compare EQ, %d, %c2 : (tensor<i32>, tensor<i32>) -> tensor<i1>
    %m2 = stablehlo.broadcast_in_dim %e2, dims = [] : (tensor<i1>) -> tensor<2x2xi1>
    %s2 = stablehlo.select %m2, %p2, %s1 : tensor<2x2xi1>, tensor<2x2xf32>
    %e3 = stablehlo.compare EQ, %d, %c3 : (tensor<i32>, tensor<i32>) -> tensor<i1>
    %m3 = stablehlo.broadcast_in_dim %e3, dims = [] : (tensor<i1>) -> tensor<2x2xi1>
    // CHECK: stablehlo.select{{.*}}entangle.relation = "tile [{d0, d1}, {}] : slice(%arg0)"
    %s3 = stablehlo.select %m3, %b, %s2 : tensor<2x2xi1>, tensor<2x2xf32>
    return %s3 : tensor<2x2xf32>
  }
}

// -----

// Device 1's rows come from device 3 instead of device 2 (rows [14, 16) where [10, 12)
// belong). Flagged at the select that assembles the rows.
module attributes {mhlo.num_partitions = 4 : i32} {
  func.func @ref(%x: tensor<16x2xf32>) -> tensor<8x2xf32> {
    %0 = stablehlo.slice %x [8:16, 0:2] : (tensor<16x2xf32>) -> tensor<8x2xf32>
    return %0 : tensor<8x2xf32>
  }
  // FULL: func.func @misrouted{{.*}}entangle.verdict = "not proven"
  func.func @misrouted(%arg0: tensor<4x2xf32> {mhlo.sharding = "{devices=[4,1]<=[4]}"}) -> (tensor<2x2xf32> {mhlo.sharding = "{devices=[4,1]<=[4]}"}) attributes {entangle.refines = @ref} {
    %pid = stablehlo.partition_id : tensor<ui32>
    %c = stablehlo.constant dense<[0, 1, 2, 3]> : tensor<4xi32>
    %t = stablehlo.dynamic_slice %c, %pid, sizes = [1] : (tensor<4xi32>, tensor<ui32>) -> tensor<1xi32>
    %d = stablehlo.reshape %t : (tensor<1xi32>) -> tensor<i32>
    %c1 = stablehlo.constant dense<1> : tensor<i32>
    %c2 = stablehlo.constant dense<2> : tensor<i32>
    %c3 = stablehlo.constant dense<3> : tensor<i32>
    %a = stablehlo.slice %arg0 [0:2, 0:2] : (tensor<4x2xf32>) -> tensor<2x2xf32>
    %b = stablehlo.slice %arg0 [2:4, 0:2] : (tensor<4x2xf32>) -> tensor<2x2xf32>
    %p0 = "stablehlo.collective_permute"(%a) <{channel_handle = #stablehlo.channel_handle<handle = 1, type = 0>, source_target_pairs = dense<[[2, 0]]> : tensor<1x2xi64>}> : (tensor<2x2xf32>) -> tensor<2x2xf32>
    %p1 = "stablehlo.collective_permute"(%b) <{channel_handle = #stablehlo.channel_handle<handle = 2, type = 0>, source_target_pairs = dense<[[3, 1]]> : tensor<1x2xi64>}> : (tensor<2x2xf32>) -> tensor<2x2xf32>
    %p2 = "stablehlo.collective_permute"(%a) <{channel_handle = #stablehlo.channel_handle<handle = 3, type = 0>, source_target_pairs = dense<[[3, 2]]> : tensor<1x2xi64>}> : (tensor<2x2xf32>) -> tensor<2x2xf32>
    %e1 = stablehlo.compare EQ, %d, %c1 : (tensor<i32>, tensor<i32>) -> tensor<i1>
    %m1 = stablehlo.broadcast_in_dim %e1, dims = [] : (tensor<i1>) -> tensor<2x2xi1>
    %s1 = stablehlo.select %m1, %p1, %p0 : tensor<2x2xi1>, tensor<2x2xf32>
    %e2 = stablehlo.compare EQ, %d, %c2 : (tensor<i32>, tensor<i32>) -> tensor<i1>
    %m2 = stablehlo.broadcast_in_dim %e2, dims = [] : (tensor<i1>) -> tensor<2x2xi1>
    %s2 = stablehlo.select %m2, %p2, %s1 : tensor<2x2xi1>, tensor<2x2xf32>
    %e3 = stablehlo.compare EQ, %d, %c3 : (tensor<i32>, tensor<i32>) -> tensor<i1>
    %m3 = stablehlo.broadcast_in_dim %e3, dims = [] : (tensor<i1>) -> tensor<2x2xi1>
    // expected-error @+1 {{select gives device 1 rows [14, 16) of dim 0 where the other devices' rows put [10, 12): rows routed from the wrong device}}
    %s3 = stablehlo.select %m3, %b, %s2 : tensor<2x2xi1>, tensor<2x2xf32>
    return %s3 : tensor<2x2xf32>
  }
}
