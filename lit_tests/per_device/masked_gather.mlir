// RUN: entangle-opt %s --entangle-normalize --entangle-import-shardings --entangle-infer-relations --entangle-check-refinement | filecheck %s

// XLA's gather from a table whose rows (the gathered dim) are split over 4 devices, for
// `table[idx]` with replicated ids. Each device clamps the ids, subtracts its own row offset
// (the offset table [0, 4, 8, 12] indexed by partition_id), gathers from its 4 rows (the gather
// clamps the ids of other blocks), replaces the rows of ids outside its block by 0
// (compare/or/reduce-or -> select) and the all_reduce adds the devices' results: exactly one
// device contributes each id's row (rules/kinds/device_blocks.py). Proven for valid ids
// (0 <= id < 16), an assumption the report states.

module attributes {mhlo.num_partitions = 4 : i32} {
  func.func @ref(%arg0: tensor<16x8xf32>, %arg1: tensor<6xi32>) -> tensor<6x8xf32> {
    %c = stablehlo.constant dense<0> : tensor<i32>
    %0 = stablehlo.broadcast_in_dim %c, dims = [] : (tensor<i32>) -> tensor<6xi32>
    %1 = stablehlo.compare LT, %arg1, %0, SIGNED : (tensor<6xi32>, tensor<6xi32>) -> tensor<6xi1>
    %c_0 = stablehlo.constant dense<16> : tensor<i32>
    %2 = stablehlo.broadcast_in_dim %c_0, dims = [] : (tensor<i32>) -> tensor<6xi32>
    %3 = stablehlo.add %arg1, %2 : tensor<6xi32>
    %4 = stablehlo.select %1, %3, %arg1 : tensor<6xi1>, tensor<6xi32>
    %5 = stablehlo.broadcast_in_dim %4, dims = [0] : (tensor<6xi32>) -> tensor<6x1xi32>
    %6 = "stablehlo.gather"(%arg0, %5) <{dimension_numbers = #stablehlo.gather<offset_dims = [1], collapsed_slice_dims = [0], start_index_map = [0], index_vector_dim = 1>, indices_are_sorted = false, slice_sizes = array<i64: 1, 8>}> : (tensor<16x8xf32>, tensor<6x1xi32>) -> tensor<6x8xf32>
    return %6 : tensor<6x8xf32>
  }
  // CHECK: func.func @sharded{{.*}}entangle.verdict = "proven"
  func.func @sharded(%arg0: tensor<4x8xf32> {mhlo.sharding = "{devices=[4,1]<=[4]}"}, %arg1: tensor<6xi32> {mhlo.sharding = "{replicated}"}) -> (tensor<6x8xf32> {mhlo.sharding = "{replicated}"}) attributes {entangle.refines = @ref} {
    %c = stablehlo.constant dense<0> : tensor<i32>
    %0 = stablehlo.broadcast_in_dim %c, dims = [] : (tensor<i32>) -> tensor<6x1xi32>
    %1 = stablehlo.broadcast_in_dim %c, dims = [] : (tensor<i32>) -> tensor<6xi32>
    %2 = stablehlo.compare LT, %arg1, %1 : (tensor<6xi32>, tensor<6xi32>) -> tensor<6xi1>
    %c_0 = stablehlo.constant dense<16> : tensor<i32>
    %3 = stablehlo.broadcast_in_dim %c_0, dims = [] : (tensor<i32>) -> tensor<6xi32>
    %4 = stablehlo.add %arg1, %3 : tensor<6xi32>
    %5 = stablehlo.select %2, %4, %arg1 : tensor<6xi1>, tensor<6xi32>
    %6 = stablehlo.reshape %5 : (tensor<6xi32>) -> tensor<6x1xi32>
    %c_1 = stablehlo.constant dense<15> : tensor<1xi32>
    %7 = stablehlo.broadcast_in_dim %c_1, dims = [1] : (tensor<1xi32>) -> tensor<6x1xi32>
    %8 = stablehlo.clamp %0, %6, %7 : tensor<6x1xi32>
    %c_2 = stablehlo.constant dense<[0, 4, 8, 12]> : tensor<4xi32>
    %9 = stablehlo.partition_id : tensor<ui32>
    %10 = stablehlo.dynamic_slice %c_2, %9, sizes = [1] : (tensor<4xi32>, tensor<ui32>) -> tensor<1xi32>
    %11 = stablehlo.reshape %10 : (tensor<1xi32>) -> tensor<i32>
    %12 = stablehlo.reshape %11 : (tensor<i32>) -> tensor<1xi32>
    %13 = stablehlo.broadcast_in_dim %12, dims = [1] : (tensor<1xi32>) -> tensor<6x1xi32>
    %14 = stablehlo.compare LT, %8, %13 : (tensor<6x1xi32>, tensor<6x1xi32>) -> tensor<6x1xi1>
    %c_3 = stablehlo.constant dense<3> : tensor<i32>
    %15 = stablehlo.add %11, %c_3 : tensor<i32>
    %16 = stablehlo.reshape %15 : (tensor<i32>) -> tensor<1xi32>
    %17 = stablehlo.broadcast_in_dim %16, dims = [1] : (tensor<1xi32>) -> tensor<6x1xi32>
    %18 = stablehlo.compare GT, %8, %17 : (tensor<6x1xi32>, tensor<6x1xi32>) -> tensor<6x1xi1>
    %19 = stablehlo.or %14, %18 : tensor<6x1xi1>
    %c_4 = stablehlo.constant dense<false> : tensor<i1>
    %20 = stablehlo.reduce(%19 init: %c_4) applies stablehlo.or across dimensions = [1] : (tensor<6x1xi1>, tensor<i1>) -> tensor<6xi1>
    %21 = stablehlo.broadcast_in_dim %20, dims = [0] : (tensor<6xi1>) -> tensor<6x8xi1>
    %cst = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    %22 = stablehlo.broadcast_in_dim %cst, dims = [] : (tensor<f32>) -> tensor<6x8xf32>
    %23 = stablehlo.subtract %8, %13 : tensor<6x1xi32>
    %24 = "stablehlo.gather"(%arg0, %23) <{dimension_numbers = #stablehlo.gather<offset_dims = [1], collapsed_slice_dims = [0], start_index_map = [0], index_vector_dim = 1>, indices_are_sorted = false, slice_sizes = array<i64: 1, 8>}> : (tensor<4x8xf32>, tensor<6x1xi32>) -> tensor<6x8xf32>
    %25 = stablehlo.select %21, %22, %24 : tensor<6x8xi1>, tensor<6x8xf32>
    %26 = "stablehlo.all_reduce"(%25) <{channel_handle = #stablehlo.channel_handle<handle = 2, type = 0>, replica_groups = dense<[[0, 1, 2, 3]]> : tensor<1x4xi64>, use_global_device_ids}> ({
    ^bb0(%arg2: tensor<f32>, %arg3: tensor<f32>):
      %27 = stablehlo.add %arg2, %arg3 : tensor<f32>
      stablehlo.return %27 : tensor<f32>
    }) : (tensor<6x8xf32>) -> tensor<6x8xf32>
    return %26 : tensor<6x8xf32>
  }
}
