// RUN: entangle-opt %s --split-input-file --entangle-normalize --entangle-import-shardings --entangle-infer-relations | filecheck %s
// RUN: entangle-opt %s --split-input-file --entangle-normalize --entangle-import-shardings --entangle-infer-relations --entangle-check-refinement --verify-diagnostics | filecheck %s --check-prefix=FULL

// XLA's partitioning of jnp.cumsum(x, axis=1) with x's 16 columns split over 4 devices: it
// all_gathers x, pads 15 zero columns in front, and device b reads 19 columns at 4b: the 15
// columns before its block (zeros before column 0) and its own 4. A 16-wide sum window then
// leaves exactly its block of the cumsum. The padded tensor is a window of x on every device;
// the dynamic_slice makes overlapping windows of x split over the devices (stride 4, length
// 19, zeros outside x); the reduce_window of those is block b of the reference's.

module attributes {mhlo.num_partitions = 4 : i32} {
  func.func @ref(%x: tensor<8x16xf32>) -> tensor<8x16xf32> {
    %cst = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    %0 = "stablehlo.reduce_window"(%x, %cst) <{padding = dense<[[0, 0], [15, 0]]> : tensor<2x2xi64>, window_dimensions = array<i64: 1, 16>}> ({
    ^bb0(%a: tensor<f32>, %b: tensor<f32>):
      %s = stablehlo.add %a, %b : tensor<f32>
      stablehlo.return %s : tensor<f32>
    }) : (tensor<8x16xf32>, tensor<f32>) -> tensor<8x16xf32>
    return %0 : tensor<8x16xf32>
  }
  // FULL: func.func @sharded{{.*}}entangle.verdict = "proven"
  func.func @sharded(%arg0: tensor<8x4xf32> {mhlo.sharding = "{devices=[1,4]<=[4]}"}) -> (tensor<8x4xf32> {mhlo.sharding = "{devices=[1,4]<=[4]}"}) attributes {entangle.refines = @ref} {
    %0 = "stablehlo.all_gather"(%arg0) <{all_gather_dim = 1 : i64, channel_handle = #stablehlo.channel_handle<handle = 1, type = 0>, replica_groups = dense<[[0, 1, 2, 3]]> : tensor<1x4xi64>, use_global_device_ids}> : (tensor<8x4xf32>) -> tensor<8x16xf32>
    %cst = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    // CHECK: stablehlo.pad{{.*}}entangle.relation = "replicated : pad(%arg0, 0)"
    %1 = stablehlo.pad %0, %cst, low = [0, 15], high = [0, 0], interior = [0, 0] : (tensor<8x16xf32>, tensor<f32>) -> tensor<8x31xf32>
    %c = stablehlo.constant dense<0> : tensor<i32>
    %c_0 = stablehlo.constant dense<[0, 1, 2, 3]> : tensor<4xi32>
    %2 = stablehlo.partition_id : tensor<ui32>
    %3 = stablehlo.dynamic_slice %c_0, %2, sizes = [1] : (tensor<4xi32>, tensor<ui32>) -> tensor<1xi32>
    %4 = stablehlo.reshape %3 : (tensor<1xi32>) -> tensor<i32>
    %c_1 = stablehlo.constant dense<4> : tensor<i32>
    %5 = stablehlo.multiply %4, %c_1 : tensor<i32>
    // CHECK: stablehlo.dynamic_slice{{.*}}entangle.relation = "tile [{}, {d0, d1}] : %arg0 rows [b*B + 1, b*B + 20) of dim 1, zeros on devices [0, 1, 2, 3]"
    %6 = stablehlo.dynamic_slice %1, %c, %5, sizes = [8, 19] : (tensor<8x31xf32>, tensor<i32>, tensor<i32>) -> tensor<8x19xf32>
    // CHECK: }) {entangle.relation = "tile [{}, {d0, d1}] : reduce_window_sum(%arg0)"} : (tensor<8x19xf32>
    %7 = "stablehlo.reduce_window"(%6, %cst) <{window_dimensions = array<i64: 1, 16>}> ({
    ^bb0(%a: tensor<f32>, %b: tensor<f32>):
      %s = stablehlo.add %a, %b : tensor<f32>
      stablehlo.return %s : tensor<f32>
    }) : (tensor<8x19xf32>, tensor<f32>) -> tensor<8x4xf32>
    return %7 : tensor<8x4xf32>
  }
}

// -----

// The window one column short (18 columns, a 15-wide sum window): each device's sums miss
// a column. Every read is a window, but the reduce_window's results are no block of the
// reference's cumsum: flagged at the reduce_window.
module attributes {mhlo.num_partitions = 4 : i32} {
  func.func @ref(%x: tensor<8x16xf32>) -> tensor<8x16xf32> {
    %cst = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    %0 = "stablehlo.reduce_window"(%x, %cst) <{padding = dense<[[0, 0], [15, 0]]> : tensor<2x2xi64>, window_dimensions = array<i64: 1, 16>}> ({
    ^bb0(%a: tensor<f32>, %b: tensor<f32>):
      %s = stablehlo.add %a, %b : tensor<f32>
      stablehlo.return %s : tensor<f32>
    }) : (tensor<8x16xf32>, tensor<f32>) -> tensor<8x16xf32>
    return %0 : tensor<8x16xf32>
  }
  // FULL: func.func @short{{.*}}entangle.verdict = "not proven"
  func.func @short(%arg0: tensor<8x4xf32> {mhlo.sharding = "{devices=[1,4]<=[4]}"}) -> (tensor<8x4xf32> {mhlo.sharding = "{devices=[1,4]<=[4]}"}) attributes {entangle.refines = @ref} {
    %0 = "stablehlo.all_gather"(%arg0) <{all_gather_dim = 1 : i64, channel_handle = #stablehlo.channel_handle<handle = 1, type = 0>, replica_groups = dense<[[0, 1, 2, 3]]> : tensor<1x4xi64>, use_global_device_ids}> : (tensor<8x4xf32>) -> tensor<8x16xf32>
    %cst = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    %1 = stablehlo.pad %0, %cst, low = [0, 15], high = [0, 0], interior = [0, 0] : (tensor<8x16xf32>, tensor<f32>) -> tensor<8x31xf32>
    %c = stablehlo.constant dense<0> : tensor<i32>
    %c_0 = stablehlo.constant dense<[1, 5, 9, 13]> : tensor<4xi32>
    %2 = stablehlo.partition_id : tensor<ui32>
    %3 = stablehlo.dynamic_slice %c_0, %2, sizes = [1] : (tensor<4xi32>, tensor<ui32>) -> tensor<1xi32>
    %4 = stablehlo.reshape %3 : (tensor<1xi32>) -> tensor<i32>
    %6 = stablehlo.dynamic_slice %1, %c, %4, sizes = [8, 18] : (tensor<8x31xf32>, tensor<i32>, tensor<i32>) -> tensor<8x18xf32>
    // expected-error @+1 {{reduce_window computes reduce_window_sum(%arg0), which the reference never computes}}
    %7 = "stablehlo.reduce_window"(%6, %cst) <{window_dimensions = array<i64: 1, 15>}> ({
    ^bb0(%a: tensor<f32>, %b: tensor<f32>):
      %s = stablehlo.add %a, %b : tensor<f32>
      stablehlo.return %s : tensor<f32>
    }) : (tensor<8x18xf32>, tensor<f32>) -> tensor<8x4xf32>
    // expected-note @+1 {{result #0 differs from the reference}}
    return %7 : tensor<8x4xf32>
  }
}
