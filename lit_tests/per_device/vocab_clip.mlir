// RUN: entangle-opt %s --split-input-file --entangle-normalize --entangle-import-shardings --entangle-infer-relations | filecheck %s
// RUN: entangle-opt %s --split-input-file --entangle-normalize --entangle-import-shardings --entangle-infer-relations --entangle-check-refinement --verify-diagnostics | filecheck %s --check-prefix=FULL

// `jnp.clip(ids - start, 0, 3)` as jax lowers it (maximum, then minimum) is the local index of
// a clamped `BlockIndex`: `ids - start` inside the device's block of 4 rows, clamped outside
// (rules/kinds/device_blocks.clip); the gather there reads the id's own row inside the block,
// the select zeroes the rest and the psum adds up to the lookup of every valid id.

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
    // CHECK: stablehlo.maximum{{.*}}entangle.relation = "clamp(x - 4*axis_index(tp), 0, ) for x = replicated : %arg1"
    %raised = stablehlo.maximum %z, %local : tensor<8xi32>
    // CHECK: stablehlo.minimum{{.*}}entangle.relation = "clamp(x - 4*axis_index(tp), 0, 3) for x = replicated : %arg1"
    %index = stablehlo.minimum %last, %raised : tensor<8xi32>
    %col = stablehlo.reshape %index : (tensor<8xi32>) -> tensor<8x1xi32>
    // CHECK: stablehlo.gather{{.*}}entangle.relation = "replicated : gather(%arg0, reshape(%arg1)) where (0 <= x - 4*axis_index(tp) < 4)
    %found = "stablehlo.gather"(%a, %col) <{dimension_numbers = #stablehlo.gather<offset_dims = [1], collapsed_slice_dims = [0], start_index_map = [0], index_vector_dim = 1>, indices_are_sorted = false, slice_sizes = array<i64: 1, 4>}> : (tensor<4x4xf32>, tensor<8x1xi32>) -> tensor<8x4xf32>
    %mb = stablehlo.broadcast_in_dim %mask, dims = [0] : (tensor<8xi1>) -> tensor<8x4xi1>
    %zf = stablehlo.constant dense<0.0> : tensor<8x4xf32>
    // CHECK: stablehlo.select{{.*}}entangle.relation = "partial sum {tp} : select(
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

// -----

// `lax.clamp(0, local, 3)`: one clamp op, the same index. Clamped to [1, 3] it cuts the block
// (id 4b would read row 1): refused.

sdy.mesh @mesh = <["tp"=4]>

func.func @ref(%t: tensor<8xi32>) -> tensor<8xi32> {
  return %t : tensor<8xi32>
}

func.func @sharded(%t: tensor<8xi32>) -> tensor<8xi32> attributes {entangle.refines = @ref} {
  %0 = sdy.manual_computation(%t) in_shardings=[<@mesh, [{}]>] out_shardings=[<@mesh, [{}]>] manual_axes={"tp"} (%ids: tensor<8xi32>) {
    %pid = stablehlo.partition_id : tensor<ui32>
    %i = stablehlo.convert %pid : (tensor<ui32>) -> tensor<i32>
    %four = stablehlo.constant dense<4> : tensor<i32>
    %start = stablehlo.multiply %i, %four : tensor<i32>
    %sb = stablehlo.broadcast_in_dim %start, dims = [] : (tensor<i32>) -> tensor<8xi32>
    %local = stablehlo.subtract %ids, %sb : tensor<8xi32>
    %lo = stablehlo.constant dense<0> : tensor<8xi32>
    %one = stablehlo.constant dense<1> : tensor<8xi32>
    %hi = stablehlo.constant dense<3> : tensor<8xi32>
    // CHECK: stablehlo.clamp{{.*}}entangle.relation = "clamp(x - 4*axis_index(tp), 0, 3) for x = replicated : %arg0"
    %index = stablehlo.clamp %lo, %local, %hi : (tensor<8xi32>, tensor<8xi32>, tensor<8xi32>) -> tensor<8xi32>
    // CHECK: stablehlo.clamp{{.*}}entangle.relation = "opaque: stablehlo.clamp clamps a local index into [1, 3], which cuts the device's block [0, 4) (not supported)"
    %cut = stablehlo.clamp %one, %local, %hi : (tensor<8xi32>, tensor<8xi32>, tensor<8xi32>) -> tensor<8xi32>
    sdy.return %ids : tensor<8xi32>
  } : (tensor<8xi32>) -> tensor<8xi32>
  return %0 : tensor<8xi32>
}
