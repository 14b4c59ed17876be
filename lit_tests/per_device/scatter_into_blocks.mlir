// RUN: entangle-opt %s --split-input-file --entangle-normalize --entangle-import-shardings --entangle-infer-relations --entangle-check-refinement --verify-diagnostics | filecheck %s

// XLA's scatter into a table split along the scattered rows: every device scatters all the
// updates at `ids - offset(device)` into its block. Update windows that do not fit are skipped
// whole (XLA), so each device applies exactly the updates of its rows: with offset = 4 * block
// index, its block of the global scatter (rules/gather_scatter._scatter_into_blocks).

module attributes {mhlo.num_partitions = 4 : i32} {
  func.func @ref(%x: tensor<16x8xf32>, %i: tensor<6x1xi32>, %u: tensor<6x8xf32>) -> tensor<16x8xf32> {
    %0 = "stablehlo.scatter"(%x, %i, %u) <{scatter_dimension_numbers = #stablehlo.scatter<update_window_dims = [1], inserted_window_dims = [0], scatter_dims_to_operand_dims = [0], index_vector_dim = 1>}> ({
    ^bb0(%a: tensor<f32>, %b: tensor<f32>):
      %s = stablehlo.add %a, %b : tensor<f32>
      stablehlo.return %s : tensor<f32>
    }) : (tensor<16x8xf32>, tensor<6x1xi32>, tensor<6x8xf32>) -> tensor<16x8xf32>
    return %0 : tensor<16x8xf32>
  }
  // CHECK-LABEL: func.func @rows_split{{.*}}entangle.verdict = "proven"
  func.func @rows_split(%x: tensor<4x8xf32> {mhlo.sharding = "{devices=[4,1]<=[4]}"}, %i: tensor<6x1xi32> {mhlo.sharding = "{replicated}"}, %u: tensor<6x8xf32> {mhlo.sharding = "{replicated}"}) -> (tensor<4x8xf32> {mhlo.sharding = "{devices=[4,1]<=[4]}"}) attributes {entangle.refines = @ref} {
    %table = stablehlo.constant dense<[0, 4, 8, 12]> : tensor<4xi32>
    %pid = stablehlo.partition_id : tensor<ui32>
    %t = stablehlo.dynamic_slice %table, %pid, sizes = [1] : (tensor<4xi32>, tensor<ui32>) -> tensor<1xi32>
    %off = stablehlo.broadcast_in_dim %t, dims = [1] : (tensor<1xi32>) -> tensor<6x1xi32>
    // CHECK: stablehlo.subtract{{.*}}entangle.relation = "replicated : %arg1 + device offsets {{.*}}"
    %local = stablehlo.subtract %i, %off : tensor<6x1xi32>
    %0 = "stablehlo.scatter"(%x, %local, %u) <{scatter_dimension_numbers = #stablehlo.scatter<update_window_dims = [1], inserted_window_dims = [0], scatter_dims_to_operand_dims = [0], index_vector_dim = 1>}> ({
    ^bb0(%a: tensor<f32>, %b: tensor<f32>):
      %s = stablehlo.add %a, %b : tensor<f32>
      stablehlo.return %s : tensor<f32>
    }) : (tensor<4x8xf32>, tensor<6x1xi32>, tensor<6x8xf32>) -> tensor<4x8xf32>
    return %0 : tensor<4x8xf32>
  }
}

// -----

module attributes {mhlo.num_partitions = 4 : i32} {
  func.func @ref(%x: tensor<16x8xf32>, %i: tensor<6x1xi32>, %u: tensor<6x8xf32>) -> tensor<16x8xf32> {
    %0 = "stablehlo.scatter"(%x, %i, %u) <{scatter_dimension_numbers = #stablehlo.scatter<update_window_dims = [1], inserted_window_dims = [0], scatter_dims_to_operand_dims = [0], index_vector_dim = 1>}> ({
    ^bb0(%a: tensor<f32>, %b: tensor<f32>):
      %s = stablehlo.add %a, %b : tensor<f32>
      stablehlo.return %s : tensor<f32>
    }) : (tensor<16x8xf32>, tensor<6x1xi32>, tensor<6x8xf32>) -> tensor<16x8xf32>
    return %0 : tensor<16x8xf32>
  }
  // Device 3 subtracts 8: rows 8..11 are added into its block of rows 12..15.
  // CHECK-LABEL: func.func @wrong_offset{{.*}}entangle.verdict = "not proven"
  func.func @wrong_offset(%x: tensor<4x8xf32> {mhlo.sharding = "{devices=[4,1]<=[4]}"}, %i: tensor<6x1xi32> {mhlo.sharding = "{replicated}"}, %u: tensor<6x8xf32> {mhlo.sharding = "{replicated}"}) -> (tensor<4x8xf32> {mhlo.sharding = "{devices=[4,1]<=[4]}"}) attributes {entangle.refines = @ref} {
    %table = stablehlo.constant dense<[0, 4, 8, 8]> : tensor<4xi32>
    %pid = stablehlo.partition_id : tensor<ui32>
    %t = stablehlo.dynamic_slice %table, %pid, sizes = [1] : (tensor<4xi32>, tensor<ui32>) -> tensor<1xi32>
    %off = stablehlo.broadcast_in_dim %t, dims = [1] : (tensor<1xi32>) -> tensor<6x1xi32>
    // CHECK: stablehlo.subtract{{.*}}entangle.relation = "replicated : %arg1 + device offsets {{.*}}"
    %local = stablehlo.subtract %i, %off : tensor<6x1xi32>
    // expected-error @+1 {{scatter indices are shifted by [0, -4, -8, -8], not by minus each device's block offset along dim 0 (4 * axis_index(('d0', 'd1')))}}
    %0 = "stablehlo.scatter"(%x, %local, %u) <{scatter_dimension_numbers = #stablehlo.scatter<update_window_dims = [1], inserted_window_dims = [0], scatter_dims_to_operand_dims = [0], index_vector_dim = 1>}> ({
    ^bb0(%a: tensor<f32>, %b: tensor<f32>):
      %s = stablehlo.add %a, %b : tensor<f32>
      stablehlo.return %s : tensor<f32>
    }) : (tensor<4x8xf32>, tensor<6x1xi32>, tensor<6x8xf32>) -> tensor<4x8xf32>
    return %0 : tensor<4x8xf32>
  }
}
