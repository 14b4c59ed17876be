// RUN: entangle-opt %s --split-input-file --entangle-normalize --entangle-import-shardings --entangle-infer-relations | filecheck %s
// RUN: entangle-opt %s --split-input-file --entangle-normalize --entangle-import-shardings --entangle-infer-relations --entangle-check-refinement --verify-diagnostics | filecheck %s --check-prefix=FULL

// The Megatron embedding with the mask as nested wheres,
// `where(local >= 0, where(local < 4, rows, 0), 0)`: entangle-normalize folds nested selects
// with one fill into a select on the `and` of their predicates (normalize/idioms.py
// `_nested_select`, exact for any values), which is the device's block.

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
    %last = stablehlo.constant dense<3> : tensor<8xi32>
    %index = stablehlo.clamp %z, %local, %last : (tensor<8xi32>, tensor<8xi32>, tensor<8xi32>) -> tensor<8xi32>
    %col = stablehlo.reshape %index : (tensor<8xi32>) -> tensor<8x1xi32>
    %found = "stablehlo.gather"(%a, %col) <{dimension_numbers = #stablehlo.gather<offset_dims = [1], collapsed_slice_dims = [0], start_index_map = [0], index_vector_dim = 1>, indices_are_sorted = false, slice_sizes = array<i64: 1, 4>}> : (tensor<4x4xf32>, tensor<8x1xi32>) -> tensor<8x4xf32>
    %lb = stablehlo.broadcast_in_dim %lower, dims = [0] : (tensor<8xi1>) -> tensor<8x4xi1>
    %ub = stablehlo.broadcast_in_dim %upper, dims = [0] : (tensor<8xi1>) -> tensor<8x4xi1>
    %zf = stablehlo.constant dense<0.0> : tensor<8x4xf32>
    %inner = stablehlo.select %ub, %found, %zf : tensor<8x4xi1>, tensor<8x4xf32>
    // CHECK: stablehlo.and{{.*}}entangle.relation = "(0 <= x - 4*axis_index(tp) < 4) for x = replicated : broadcast(%arg1)"
    // CHECK: stablehlo.select{{.*}}entangle.relation = "partial sum {tp} : select(
    %kept = stablehlo.select %lb, %inner, %zf : tensor<8x4xi1>, tensor<8x4xf32>
    %sum = "stablehlo.all_reduce"(%kept) ({
      ^bb0(%u: tensor<f32>, %v: tensor<f32>):
        %s = stablehlo.add %u, %v : tensor<f32>
        stablehlo.return %s : tensor<f32>
    }) {replica_groups = dense<[[0, 1, 2, 3]]> : tensor<1x4xi64>, channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, use_global_device_ids} : (tensor<8x4xf32>) -> tensor<8x4xf32>
    sdy.return %sum : tensor<8x4xf32>
  } : (tensor<16x4xf32>, tensor<8xi32>) -> tensor<8x4xf32>
  return %0 : tensor<8x4xf32>
}

// -----

// The off-by-one twin `(local >= 0) & (local <= 4)`: id 4b+4 also counts as device b's, which
// adds the clipped row 3 for it. The mask is blamed where it is built.

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
    %upper = stablehlo.compare LE, %local, %n, SIGNED : (tensor<8xi32>, tensor<8xi32>) -> tensor<8xi1>
    // CHECK: stablehlo.and{{.*}}entangle.relation = "(0 <= x - 4*axis_index(tp) < 5) for x = replicated : %arg1"
    // expected-error @+1 {{the mask is not the device's block: it tests ids x with 0 <= x - 4*axis_index(tp) < 5 (inside kept as the block)}}
    %mask = stablehlo.and %lower, %upper : tensor<8xi1>
    %last = stablehlo.constant dense<3> : tensor<8xi32>
    %index = stablehlo.clamp %z, %local, %last : (tensor<8xi32>, tensor<8xi32>, tensor<8xi32>) -> tensor<8xi32>
    %col = stablehlo.reshape %index : (tensor<8xi32>) -> tensor<8x1xi32>
    %found = "stablehlo.gather"(%a, %col) <{dimension_numbers = #stablehlo.gather<offset_dims = [1], collapsed_slice_dims = [0], start_index_map = [0], index_vector_dim = 1>, indices_are_sorted = false, slice_sizes = array<i64: 1, 4>}> : (tensor<4x4xf32>, tensor<8x1xi32>) -> tensor<8x4xf32>
    %mb = stablehlo.broadcast_in_dim %mask, dims = [0] : (tensor<8xi1>) -> tensor<8x4xi1>
    %zf = stablehlo.constant dense<0.0> : tensor<8x4xf32>
    // expected-note @+1 {{the mask is used here by stablehlo.select}}
    %kept = stablehlo.select %mb, %found, %zf : tensor<8x4xi1>, tensor<8x4xf32>
    %sum = "stablehlo.all_reduce"(%kept) ({
      ^bb0(%u: tensor<f32>, %v: tensor<f32>):
        %s = stablehlo.add %u, %v : tensor<f32>
        stablehlo.return %s : tensor<f32>
    }) {replica_groups = dense<[[0, 1, 2, 3]]> : tensor<1x4xi64>, channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, use_global_device_ids} : (tensor<8x4xf32>) -> tensor<8x4xf32>
    sdy.return %sum : tensor<8x4xf32>
  } : (tensor<16x4xf32>, tensor<8xi32>) -> tensor<8x4xf32>
  return %0 : tensor<8x4xf32>
}
