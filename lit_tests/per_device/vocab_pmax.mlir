// RUN: entangle-opt %s --split-input-file --entangle-normalize --entangle-import-shardings --entangle-infer-relations | filecheck %s
// RUN: entangle-opt %s --split-input-file --entangle-normalize --entangle-import-shardings --entangle-infer-relations --entangle-check-refinement --verify-diagnostics | filecheck %s --check-prefix=FULL

// `pmax(where(mask, rows, -inf))`: every other device holds -inf, so the max over tp is the
// row of the one device whose block holds the id (rules/kinds/device_blocks.select).

sdy.mesh @mesh = <["tp"=4]>

func.func @ref(%w: tensor<16x4xf32>, %t: tensor<8xi32>) -> tensor<8x4xf32> {
  %col = stablehlo.reshape %t : (tensor<8xi32>) -> tensor<8x1xi32>
  %0 = "stablehlo.gather"(%w, %col) <{dimension_numbers = #stablehlo.gather<offset_dims = [1], collapsed_slice_dims = [0], start_index_map = [0], index_vector_dim = 1>, indices_are_sorted = false, slice_sizes = array<i64: 1, 4>}> : (tensor<16x4xf32>, tensor<8x1xi32>) -> tensor<8x4xf32>
  return %0 : tensor<8x4xf32>
}

// FULL: func.func @sharded{{.*}}entangle.verdict = "proven"
func.func @sharded(%w: tensor<16x4xf32>, %t: tensor<8xi32>) -> tensor<8x4xf32> attributes {entangle.refines = @ref} {
  %0 = sdy.manual_computation(%w, %t) in_shardings=[<@mesh, [{"tp"}, {}]>, <@mesh, [{}]>] out_shardings=[<@mesh, [{}, {}]>] manual_axes={"tp"} (%a: tensor<4x4xf32>, %ids: tensor<8xi32>) {
    %pid = stablehlo.partition_id : tensor<ui32>
    %i = stablehlo.convert %pid : (tensor<ui32>) -> tensor<i32>
    %four = stablehlo.constant dense<4> : tensor<i32>
    %start = stablehlo.multiply %i, %four : tensor<i32>
    %sb = stablehlo.broadcast_in_dim %start, dims = [] : (tensor<i32>) -> tensor<8xi32>
    %local = stablehlo.subtract %ids, %sb : tensor<8xi32>
    %z = stablehlo.constant dense<0> : tensor<8xi32>
    %n = stablehlo.constant dense<4> : tensor<8xi32>
    %lower = stablehlo.compare GE, %local, %z, SIGNED : (tensor<8xi32>, tensor<8xi32>) -> tensor<8xi1>
    %upper = stablehlo.compare LT, %local, %n, SIGNED : (tensor<8xi32>, tensor<8xi32>) -> tensor<8xi1>
    %mask = stablehlo.and %lower, %upper : tensor<8xi1>
    %last = stablehlo.constant dense<3> : tensor<8xi32>
    %index = stablehlo.clamp %z, %local, %last : (tensor<8xi32>, tensor<8xi32>, tensor<8xi32>) -> tensor<8xi32>
    %col = stablehlo.reshape %index : (tensor<8xi32>) -> tensor<8x1xi32>
    %found = "stablehlo.gather"(%a, %col) <{dimension_numbers = #stablehlo.gather<offset_dims = [1], collapsed_slice_dims = [0], start_index_map = [0], index_vector_dim = 1>, indices_are_sorted = false, slice_sizes = array<i64: 1, 4>}> : (tensor<4x4xf32>, tensor<8x1xi32>) -> tensor<8x4xf32>
    %mb = stablehlo.broadcast_in_dim %mask, dims = [0] : (tensor<8xi1>) -> tensor<8x4xi1>
    %low = stablehlo.constant dense<0xFF800000> : tensor<8x4xf32>
    // CHECK: stablehlo.select{{.*}}entangle.relation = "partial max {tp} : select(
    %kept = stablehlo.select %mb, %found, %low : tensor<8x4xi1>, tensor<8x4xf32>
    %top = "stablehlo.all_reduce"(%kept) ({
      ^bb0(%u: tensor<f32>, %v: tensor<f32>):
        %s = stablehlo.maximum %u, %v : tensor<f32>
        stablehlo.return %s : tensor<f32>
    }) {replica_groups = dense<[[0, 1, 2, 3]]> : tensor<1x4xi64>, channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, use_global_device_ids} : (tensor<8x4xf32>) -> tensor<8x4xf32>
    sdy.return %top : tensor<8x4xf32>
  } : (tensor<16x4xf32>, tensor<8xi32>) -> tensor<8x4xf32>
  return %0 : tensor<8x4xf32>
}

// -----

// The nearest wrong twin: zeros outside the block, then a pmax (a negative row loses to the
// other devices' zeros). The select is a partial sum; its pmax is refused.

sdy.mesh @mesh = <["tp"=4]>

func.func @ref(%w: tensor<16x4xf32>, %t: tensor<8xi32>) -> tensor<8x4xf32> {
  %col = stablehlo.reshape %t : (tensor<8xi32>) -> tensor<8x1xi32>
  %0 = "stablehlo.gather"(%w, %col) <{dimension_numbers = #stablehlo.gather<offset_dims = [1], collapsed_slice_dims = [0], start_index_map = [0], index_vector_dim = 1>, indices_are_sorted = false, slice_sizes = array<i64: 1, 4>}> : (tensor<16x4xf32>, tensor<8x1xi32>) -> tensor<8x4xf32>
  return %0 : tensor<8x4xf32>
}

// FULL: func.func @sharded{{.*}}entangle.verdict = "not proven"
func.func @sharded(%w: tensor<16x4xf32>, %t: tensor<8xi32>) -> tensor<8x4xf32> attributes {entangle.refines = @ref} {
  %0 = sdy.manual_computation(%w, %t) in_shardings=[<@mesh, [{"tp"}, {}]>, <@mesh, [{}]>] out_shardings=[<@mesh, [{}, {}]>] manual_axes={"tp"} (%a: tensor<4x4xf32>, %ids: tensor<8xi32>) {
    %pid = stablehlo.partition_id : tensor<ui32>
    %i = stablehlo.convert %pid : (tensor<ui32>) -> tensor<i32>
    %four = stablehlo.constant dense<4> : tensor<i32>
    %start = stablehlo.multiply %i, %four : tensor<i32>
    %sb = stablehlo.broadcast_in_dim %start, dims = [] : (tensor<i32>) -> tensor<8xi32>
    %local = stablehlo.subtract %ids, %sb : tensor<8xi32>
    %z = stablehlo.constant dense<0> : tensor<8xi32>
    %n = stablehlo.constant dense<4> : tensor<8xi32>
    %lower = stablehlo.compare GE, %local, %z, SIGNED : (tensor<8xi32>, tensor<8xi32>) -> tensor<8xi1>
    %upper = stablehlo.compare LT, %local, %n, SIGNED : (tensor<8xi32>, tensor<8xi32>) -> tensor<8xi1>
    %mask = stablehlo.and %lower, %upper : tensor<8xi1>
    %last = stablehlo.constant dense<3> : tensor<8xi32>
    %index = stablehlo.clamp %z, %local, %last : (tensor<8xi32>, tensor<8xi32>, tensor<8xi32>) -> tensor<8xi32>
    %col = stablehlo.reshape %index : (tensor<8xi32>) -> tensor<8x1xi32>
    %found = "stablehlo.gather"(%a, %col) <{dimension_numbers = #stablehlo.gather<offset_dims = [1], collapsed_slice_dims = [0], start_index_map = [0], index_vector_dim = 1>, indices_are_sorted = false, slice_sizes = array<i64: 1, 4>}> : (tensor<4x4xf32>, tensor<8x1xi32>) -> tensor<8x4xf32>
    %mb = stablehlo.broadcast_in_dim %mask, dims = [0] : (tensor<8xi1>) -> tensor<8x4xi1>
    %zf = stablehlo.constant dense<0.0> : tensor<8x4xf32>
    // CHECK: stablehlo.select{{.*}}entangle.relation = "partial sum {tp} : select(
    %kept = stablehlo.select %mb, %found, %zf : tensor<8x4xi1>, tensor<8x4xf32>
    // expected-error @+1 {{all_reduce takes the max over 'tp' but the value is a partial sum: the reduction kind is wrong}}
    %top = "stablehlo.all_reduce"(%kept) ({
      ^bb0(%u: tensor<f32>, %v: tensor<f32>):
        %s = stablehlo.maximum %u, %v : tensor<f32>
        stablehlo.return %s : tensor<f32>
    }) {replica_groups = dense<[[0, 1, 2, 3]]> : tensor<1x4xi64>, channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, use_global_device_ids} : (tensor<8x4xf32>) -> tensor<8x4xf32>
    sdy.return %top : tensor<8x4xf32>
  } : (tensor<16x4xf32>, tensor<8xi32>) -> tensor<8x4xf32>
  return %0 : tensor<8x4xf32>
}
