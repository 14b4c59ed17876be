// RUN: entangle-opt %s --split-input-file --entangle-normalize --entangle-import-shardings --entangle-infer-relations | filecheck %s
// RUN: entangle-opt %s --split-input-file --entangle-normalize --entangle-import-shardings --entangle-infer-relations --entangle-check-refinement --verify-diagnostics | filecheck %s --check-prefix=FULL

// Megatron's vocab-parallel embedding: a 16-row table split over tp=4, token ids replicated.
// Each device tests which ids fall in its block [4b, 4b+4), looks them up at `id - 4b` (0 for
// the others), zeroes the others and psums. The sum over devices is the lookup of every valid
// id (ids outside [0, 16) give zeros, where jnp.take gives NaN: the proof assumes valid ids
// and says so).

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
    // CHECK: stablehlo.compare{{.*}}entangle.relation = "(x - 4*axis_index(tp) < 0) for x = replicated : %arg1"
    %below = stablehlo.compare LT, %ids, %sb, SIGNED : (tensor<8xi32>, tensor<8xi32>) -> tensor<8xi1>
    %end = stablehlo.add %start, %four : tensor<i32>
    %eb = stablehlo.broadcast_in_dim %end, dims = [] : (tensor<i32>) -> tensor<8xi32>
    %above = stablehlo.compare GE, %ids, %eb, SIGNED : (tensor<8xi32>, tensor<8xi32>) -> tensor<8xi1>
    // CHECK: stablehlo.or{{.*}}entangle.relation = "not (0 <= x - 4*axis_index(tp) < 4) for x = replicated : %arg1"
    %outside = stablehlo.or %below, %above : tensor<8xi1>
    %shifted = stablehlo.subtract %ids, %sb : tensor<8xi32>
    %zi = stablehlo.constant dense<0> : tensor<8xi32>
    // CHECK: stablehlo.select{{.*}}entangle.relation = "(x - 4*axis_index(tp) inside the block, else 0) for x = replicated : %arg1"
    %local = stablehlo.select %outside, %zi, %shifted : tensor<8xi1>, tensor<8xi32>
    %col = stablehlo.reshape %local : (tensor<8xi32>) -> tensor<8x1xi32>
    // CHECK: stablehlo.gather{{.*}}entangle.relation = "replicated : gather(%arg0, reshape(%arg1)) where (0 <= x - 4*axis_index(tp) < 4)
    %found = "stablehlo.gather"(%a, %col) <{dimension_numbers = #stablehlo.gather<offset_dims = [1], collapsed_slice_dims = [0], start_index_map = [0], index_vector_dim = 1>, indices_are_sorted = false, slice_sizes = array<i64: 1, 4>}> : (tensor<4x4xf32>, tensor<8x1xi32>) -> tensor<8x4xf32>
    %ob = stablehlo.broadcast_in_dim %outside, dims = [0] : (tensor<8xi1>) -> tensor<8x4xi1>
    %zf = stablehlo.constant dense<0.0> : tensor<8x4xf32>
    // CHECK: stablehlo.select{{.*}}entangle.relation = "partial sum {tp} : select(
    %kept = stablehlo.select %ob, %zf, %found : tensor<8x4xi1>, tensor<8x4xf32>
    %sum = "stablehlo.all_reduce"(%kept) ({
      ^bb0(%u: tensor<f32>, %v: tensor<f32>):
        %z = stablehlo.add %u, %v : tensor<f32>
        stablehlo.return %z : tensor<f32>
    }) {replica_groups = dense<[[0, 1, 2, 3]]> : tensor<1x4xi64>, channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, use_global_device_ids} : (tensor<8x4xf32>) -> tensor<8x4xf32>
    sdy.return %sum : tensor<8x4xf32>
  } : (tensor<16x4xf32>, tensor<8xi32>) -> tensor<8x4xf32>
  return %0 : tensor<8x4xf32>
}

// -----

// The same with an off-by-one upper bound (`ids > start + 4`): id 4b+4 counts as inside
// device b's block too, so the local index is not the device's block any more.

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
    %below = stablehlo.compare LT, %ids, %sb, SIGNED : (tensor<8xi32>, tensor<8xi32>) -> tensor<8xi1>
    %end = stablehlo.add %start, %four : tensor<i32>
    %eb = stablehlo.broadcast_in_dim %end, dims = [] : (tensor<i32>) -> tensor<8xi32>
    %above = stablehlo.compare GT, %ids, %eb, SIGNED : (tensor<8xi32>, tensor<8xi32>) -> tensor<8xi1>
    // CHECK: stablehlo.or{{.*}}entangle.relation = "not (0 <= x - 4*axis_index(tp) < 5) for x = replicated : %arg1"
    // expected-error @+1 {{the mask is not the device's block: it tests ids x with 0 <= x - 4*axis_index(tp) < 5}}
    %outside = stablehlo.or %below, %above : tensor<8xi1>
    %shifted = stablehlo.subtract %ids, %sb : tensor<8xi32>
    %zi = stablehlo.constant dense<0> : tensor<8xi32>
    // expected-note @+1 {{the mask is used here by stablehlo.select}}
    %local = stablehlo.select %outside, %zi, %shifted : tensor<8xi1>, tensor<8xi32>
    %col = stablehlo.reshape %local : (tensor<8xi32>) -> tensor<8x1xi32>
    %found = "stablehlo.gather"(%a, %col) <{dimension_numbers = #stablehlo.gather<offset_dims = [1], collapsed_slice_dims = [0], start_index_map = [0], index_vector_dim = 1>, indices_are_sorted = false, slice_sizes = array<i64: 1, 4>}> : (tensor<4x4xf32>, tensor<8x1xi32>) -> tensor<8x4xf32>
    %ob = stablehlo.broadcast_in_dim %outside, dims = [0] : (tensor<8xi1>) -> tensor<8x4xi1>
    %zf = stablehlo.constant dense<0.0> : tensor<8x4xf32>
    %kept = stablehlo.select %ob, %zf, %found : tensor<8x4xi1>, tensor<8x4xf32>
    %sum = "stablehlo.all_reduce"(%kept) ({
      ^bb0(%u: tensor<f32>, %v: tensor<f32>):
        %z = stablehlo.add %u, %v : tensor<f32>
        stablehlo.return %z : tensor<f32>
    }) {replica_groups = dense<[[0, 1, 2, 3]]> : tensor<1x4xi64>, channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, use_global_device_ids} : (tensor<8x4xf32>) -> tensor<8x4xf32>
    sdy.return %sum : tensor<8x4xf32>
  } : (tensor<16x4xf32>, tensor<8xi32>) -> tensor<8x4xf32>
  return %0 : tensor<8x4xf32>
}
