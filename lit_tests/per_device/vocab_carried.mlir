// RUN: entangle-opt %s --split-input-file --entangle-normalize --entangle-import-shardings --entangle-infer-relations | filecheck %s
// RUN: entangle-opt %s --split-input-file --entangle-normalize --entangle-import-shardings --entangle-infer-relations --entangle-check-refinement --verify-diagnostics | filecheck %s --check-prefix=FULL

// The scaling book's MoE: each device holds 2 of 8 experts, looks up every token's expert at
// the clipped local index, applies it (a dot_general batched over the tokens) and only then
// zeroes the tokens routed elsewhere. The lookup is valid inside the block; the batched
// dot_general and the scaling keep each token's row apart, so the product is valid inside the
// block too (rules/kinds/device_blocks.carried), and the where + psum add up to the reference.

sdy.mesh @mesh = <["X"=4]>

func.func @ref(%w: tensor<8x2x3xf32>, %x: tensor<4x2xf32>, %r: tensor<4xi32>) -> tensor<4x3xf32> {
  %col = stablehlo.reshape %r : (tensor<4xi32>) -> tensor<4x1xi32>
  %wt = "stablehlo.gather"(%w, %col) <{dimension_numbers = #stablehlo.gather<offset_dims = [1, 2], collapsed_slice_dims = [0], start_index_map = [0], index_vector_dim = 1>, indices_are_sorted = false, slice_sizes = array<i64: 1, 2, 3>}> : (tensor<8x2x3xf32>, tensor<4x1xi32>) -> tensor<4x2x3xf32>
  %y = stablehlo.dot_general %x, %wt, batching_dims = [0] x [0], contracting_dims = [1] x [1] : (tensor<4x2xf32>, tensor<4x2x3xf32>) -> tensor<4x3xf32>
  %two = stablehlo.constant dense<2.0> : tensor<4x3xf32>
  %out = stablehlo.multiply %y, %two : tensor<4x3xf32>
  return %out : tensor<4x3xf32>
}

// FULL: func.func @sharded{{.*}}entangle.verdict = "proven"
func.func @sharded(%w: tensor<8x2x3xf32>, %x: tensor<4x2xf32>, %r: tensor<4xi32>) -> tensor<4x3xf32> attributes {entangle.refines = @ref} {
  %0 = sdy.manual_computation(%w, %x, %r) in_shardings=[<@mesh, [{"X"}, {}, {}]>, <@mesh, [{}, {}]>, <@mesh, [{}]>] out_shardings=[<@mesh, [{}, {}]>] manual_axes={"X"} (%a: tensor<2x2x3xf32>, %xs: tensor<4x2xf32>, %route: tensor<4xi32>) {
    %pid = stablehlo.partition_id : tensor<ui32>
    %i = stablehlo.convert %pid : (tensor<ui32>) -> tensor<i32>
    %two_i = stablehlo.constant dense<2> : tensor<i32>
    %start = stablehlo.multiply %i, %two_i : tensor<i32>
    %sb = stablehlo.broadcast_in_dim %start, dims = [] : (tensor<i32>) -> tensor<4xi32>
    %local = stablehlo.subtract %route, %sb : tensor<4xi32>
    %z = stablehlo.constant dense<0> : tensor<4xi32>
    %n = stablehlo.constant dense<2> : tensor<4xi32>
    %lower = stablehlo.compare GE, %local, %z, SIGNED : (tensor<4xi32>, tensor<4xi32>) -> tensor<4xi1>
    %upper = stablehlo.compare LT, %local, %n, SIGNED : (tensor<4xi32>, tensor<4xi32>) -> tensor<4xi1>
    %mine = stablehlo.and %lower, %upper : tensor<4xi1>
    %last = stablehlo.constant dense<1> : tensor<4xi32>
    %index = stablehlo.clamp %z, %local, %last : (tensor<4xi32>, tensor<4xi32>, tensor<4xi32>) -> tensor<4xi32>
    %col = stablehlo.reshape %index : (tensor<4xi32>) -> tensor<4x1xi32>
    %wt = "stablehlo.gather"(%a, %col) <{dimension_numbers = #stablehlo.gather<offset_dims = [1, 2], collapsed_slice_dims = [0], start_index_map = [0], index_vector_dim = 1>, indices_are_sorted = false, slice_sizes = array<i64: 1, 2, 3>}> : (tensor<2x2x3xf32>, tensor<4x1xi32>) -> tensor<4x2x3xf32>
    // CHECK: stablehlo.dot_general{{.*}}entangle.relation = "replicated : dot_general(%arg1, gather(%arg0, reshape(%arg2))) where (0 <= x - 2*axis_index(X) < 2) for x = replicated : broadcast(%arg2), else unspecified values"
    %y = stablehlo.dot_general %xs, %wt, batching_dims = [0] x [0], contracting_dims = [1] x [1] : (tensor<4x2xf32>, tensor<4x2x3xf32>) -> tensor<4x3xf32>
    %two = stablehlo.constant dense<2.0> : tensor<4x3xf32>
    // CHECK: stablehlo.multiply{{.*}}where (0 <= x - 2*axis_index(X) < 2) for x = replicated : broadcast(%arg2), else unspecified values"
    %scaled = stablehlo.multiply %y, %two : tensor<4x3xf32>
    %mb = stablehlo.broadcast_in_dim %mine, dims = [0] : (tensor<4xi1>) -> tensor<4x3xi1>
    %zf = stablehlo.constant dense<0.0> : tensor<4x3xf32>
    // CHECK: stablehlo.select{{.*}}entangle.relation = "partial sum {X} : (2*select(
    %kept = stablehlo.select %mb, %scaled, %zf : tensor<4x3xi1>, tensor<4x3xf32>
    %sum = "stablehlo.all_reduce"(%kept) ({
      ^bb0(%u: tensor<f32>, %v: tensor<f32>):
        %s = stablehlo.add %u, %v : tensor<f32>
        stablehlo.return %s : tensor<f32>
    }) {replica_groups = dense<[[0, 1, 2, 3]]> : tensor<1x4xi64>, channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, use_global_device_ids} : (tensor<4x3xf32>) -> tensor<4x3xf32>
    sdy.return %sum : tensor<4x3xf32>
  } : (tensor<8x2x3xf32>, tensor<4x2xf32>, tensor<4xi32>) -> tensor<4x3xf32>
  return %0 : tensor<4x3xf32>
}

// -----

// The nearest wrong twin: no where after the expert product. The rows of tokens routed to
// other devices' experts (the clipped row of a local expert) reach the psum.

sdy.mesh @mesh = <["X"=4]>

func.func @ref(%w: tensor<8x2x3xf32>, %x: tensor<4x2xf32>, %r: tensor<4xi32>) -> tensor<4x3xf32> {
  %col = stablehlo.reshape %r : (tensor<4xi32>) -> tensor<4x1xi32>
  %wt = "stablehlo.gather"(%w, %col) <{dimension_numbers = #stablehlo.gather<offset_dims = [1, 2], collapsed_slice_dims = [0], start_index_map = [0], index_vector_dim = 1>, indices_are_sorted = false, slice_sizes = array<i64: 1, 2, 3>}> : (tensor<8x2x3xf32>, tensor<4x1xi32>) -> tensor<4x2x3xf32>
  %y = stablehlo.dot_general %x, %wt, batching_dims = [0] x [0], contracting_dims = [1] x [1] : (tensor<4x2xf32>, tensor<4x2x3xf32>) -> tensor<4x3xf32>
  return %y : tensor<4x3xf32>
}

// FULL: func.func @sharded{{.*}}entangle.verdict = "not proven"
func.func @sharded(%w: tensor<8x2x3xf32>, %x: tensor<4x2xf32>, %r: tensor<4xi32>) -> tensor<4x3xf32> attributes {entangle.refines = @ref} {
  %0 = sdy.manual_computation(%w, %x, %r) in_shardings=[<@mesh, [{"X"}, {}, {}]>, <@mesh, [{}, {}]>, <@mesh, [{}]>] out_shardings=[<@mesh, [{}, {}]>] manual_axes={"X"} (%a: tensor<2x2x3xf32>, %xs: tensor<4x2xf32>, %route: tensor<4xi32>) {
    %pid = stablehlo.partition_id : tensor<ui32>
    %i = stablehlo.convert %pid : (tensor<ui32>) -> tensor<i32>
    %two_i = stablehlo.constant dense<2> : tensor<i32>
    %start = stablehlo.multiply %i, %two_i : tensor<i32>
    %sb = stablehlo.broadcast_in_dim %start, dims = [] : (tensor<i32>) -> tensor<4xi32>
    %local = stablehlo.subtract %route, %sb : tensor<4xi32>
    %z = stablehlo.constant dense<0> : tensor<4xi32>
    %last = stablehlo.constant dense<1> : tensor<4xi32>
    %index = stablehlo.clamp %z, %local, %last : (tensor<4xi32>, tensor<4xi32>, tensor<4xi32>) -> tensor<4xi32>
    %col = stablehlo.reshape %index : (tensor<4xi32>) -> tensor<4x1xi32>
    // expected-error @+1 {{stablehlo.all_reduce uses rows looked up for ids outside this device's block}}
    %wt = "stablehlo.gather"(%a, %col) <{dimension_numbers = #stablehlo.gather<offset_dims = [1, 2], collapsed_slice_dims = [0], start_index_map = [0], index_vector_dim = 1>, indices_are_sorted = false, slice_sizes = array<i64: 1, 2, 3>}> : (tensor<2x2x3xf32>, tensor<4x1xi32>) -> tensor<4x2x3xf32>
    %y = stablehlo.dot_general %xs, %wt, batching_dims = [0] x [0], contracting_dims = [1] x [1] : (tensor<4x2xf32>, tensor<4x2x3xf32>) -> tensor<4x3xf32>
    // expected-note @+1 {{the lookup is used here by stablehlo.all_reduce}}
    %sum = "stablehlo.all_reduce"(%y) ({
      ^bb0(%u: tensor<f32>, %v: tensor<f32>):
        %s = stablehlo.add %u, %v : tensor<f32>
        stablehlo.return %s : tensor<f32>
    }) {replica_groups = dense<[[0, 1, 2, 3]]> : tensor<1x4xi64>, channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, use_global_device_ids} : (tensor<4x3xf32>) -> tensor<4x3xf32>
    sdy.return %sum : tensor<4x3xf32>
  } : (tensor<8x2x3xf32>, tensor<4x2xf32>, tensor<4xi32>) -> tensor<4x3xf32>
  return %0 : tensor<4x3xf32>
}
