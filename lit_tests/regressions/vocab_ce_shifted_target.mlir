// RUN: entangle-opt %s --split-input-file --entangle-normalize --entangle-import-shardings --entangle-infer-relations | filecheck %s
// RUN: entangle-opt %s --split-input-file --entangle-normalize --entangle-import-shardings --entangle-infer-relations --entangle-check-refinement --verify-diagnostics | filecheck %s --check-prefix=FULL

// Megatron's vocab-parallel cross-entropy against `jax.nn.logsumexp(x) - x[label]`: the
// target logit is picked from the max-shifted logits at the clipped local label. Three exact
// rewrites of entangle-normalize meet the two forms (normalize/idioms.py): the gather of
// `x - broadcast(m)` is the gather of x minus m (`_gather_of_shift`), and logsumexp's guards,
// `select(is_finite(m), m, 0)` and `log(abs(sum))`, hold on every value they see
// (`_finite_guard`, `_nonnegative_abs`: the max of finite inputs is finite, a sum of
// exponentials is not negative).

sdy.mesh @mesh = <["tp"=4]>

func.func @ref(%x: tensor<2x8xf32>, %l: tensor<2xi32>) -> tensor<2xf32> {
  %ninf = stablehlo.constant dense<0xFF800000> : tensor<f32>
  %m0 = stablehlo.reduce(%x init: %ninf) applies stablehlo.maximum across dimensions = [1] : (tensor<2x8xf32>, tensor<f32>) -> tensor<2xf32>
  %ninfs = stablehlo.constant dense<0xFF800000> : tensor<2xf32>
  %m1 = stablehlo.maximum %ninfs, %m0 : tensor<2xf32>
  %fin = stablehlo.is_finite %m1 : (tensor<2xf32>) -> tensor<2xi1>
  %zero = stablehlo.constant dense<0.0> : tensor<2xf32>
  // CHECK-NOT: stablehlo.is_finite
  %m = stablehlo.select %fin, %m1, %zero : tensor<2xi1>, tensor<2xf32>
  %mb = stablehlo.broadcast_in_dim %m, dims = [0] : (tensor<2xf32>) -> tensor<2x8xf32>
  %sh = stablehlo.subtract %x, %mb : tensor<2x8xf32>
  %e = stablehlo.exponential %sh : tensor<2x8xf32>
  %z = stablehlo.constant dense<0.0> : tensor<f32>
  %s = stablehlo.reduce(%e init: %z) applies stablehlo.add across dimensions = [1] : (tensor<2x8xf32>, tensor<f32>) -> tensor<2xf32>
  // CHECK-NOT: stablehlo.abs
  %a = stablehlo.abs %s : tensor<2xf32>
  %lg = stablehlo.log %a : tensor<2xf32>
  %lse = stablehlo.add %lg, %m : tensor<2xf32>
  %col = stablehlo.reshape %l : (tensor<2xi32>) -> tensor<2x1x1xi32>
  %g = "stablehlo.gather"(%x, %col) <{dimension_numbers = #stablehlo.gather<collapsed_slice_dims = [1], operand_batching_dims = [0], start_indices_batching_dims = [0], start_index_map = [1], index_vector_dim = 2>, indices_are_sorted = false, slice_sizes = array<i64: 1, 1>}> : (tensor<2x8xf32>, tensor<2x1x1xi32>) -> tensor<2x1xf32>
  %picked = stablehlo.reshape %g : (tensor<2x1xf32>) -> tensor<2xf32>
  %out = stablehlo.subtract %lse, %picked : tensor<2xf32>
  return %out : tensor<2xf32>
}

// FULL: func.func @sharded{{.*}}entangle.verdict = "proven"
func.func @sharded(%x: tensor<2x8xf32>, %l: tensor<2xi32>) -> tensor<2xf32> attributes {entangle.refines = @ref} {
  %0 = sdy.manual_computation(%x, %l) in_shardings=[<@mesh, [{}, {"tp"}]>, <@mesh, [{}]>] out_shardings=[<@mesh, [{}]>] manual_axes={"tp"} (%xl: tensor<2x2xf32>, %labels: tensor<2xi32>) {
    %ninf = stablehlo.constant dense<0xFF800000> : tensor<f32>
    %mloc = stablehlo.reduce(%xl init: %ninf) applies stablehlo.maximum across dimensions = [1] : (tensor<2x2xf32>, tensor<f32>) -> tensor<2xf32>
    %m = "stablehlo.all_reduce"(%mloc) ({
      ^bb0(%u: tensor<f32>, %v: tensor<f32>):
        %r = stablehlo.maximum %u, %v : tensor<f32>
        stablehlo.return %r : tensor<f32>
    }) {replica_groups = dense<[[0, 1, 2, 3]]> : tensor<1x4xi64>, channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, use_global_device_ids} : (tensor<2xf32>) -> tensor<2xf32>
    %m1 = stablehlo.broadcast_in_dim %m, dims = [0] : (tensor<2xf32>) -> tensor<2x1xf32>
    %mb = stablehlo.broadcast_in_dim %m1, dims = [0, 1] : (tensor<2x1xf32>) -> tensor<2x2xf32>
    %sh = stablehlo.subtract %xl, %mb : tensor<2x2xf32>
    %pid = stablehlo.partition_id : tensor<ui32>
    %i = stablehlo.convert %pid : (tensor<ui32>) -> tensor<i32>
    %two = stablehlo.constant dense<2> : tensor<i32>
    %start = stablehlo.multiply %i, %two : tensor<i32>
    %sb = stablehlo.broadcast_in_dim %start, dims = [] : (tensor<i32>) -> tensor<2xi32>
    %local = stablehlo.subtract %labels, %sb : tensor<2xi32>
    %zi = stablehlo.constant dense<0> : tensor<2xi32>
    %ni = stablehlo.constant dense<2> : tensor<2xi32>
    %lower = stablehlo.compare GE, %local, %zi, SIGNED : (tensor<2xi32>, tensor<2xi32>) -> tensor<2xi1>
    %upper = stablehlo.compare LT, %local, %ni, SIGNED : (tensor<2xi32>, tensor<2xi32>) -> tensor<2xi1>
    %mask = stablehlo.and %lower, %upper : tensor<2xi1>
    %one = stablehlo.constant dense<1> : tensor<2xi32>
    %index = stablehlo.clamp %zi, %local, %one : (tensor<2xi32>, tensor<2xi32>, tensor<2xi32>) -> tensor<2xi32>
    %col = stablehlo.reshape %index : (tensor<2xi32>) -> tensor<2x1x1xi32>
    // CHECK: stablehlo.gather{{.*}}entangle.relation = "replicated : gather(%arg0, reshape(%arg1)) where (0 <= x - 2*axis_index(tp) < 2)
    // CHECK: stablehlo.subtract{{.*}}entangle.relation = "replicated : (gather(%arg0, reshape(%arg1)) + -1*reshape(reduce_max(%arg0))) where
    %g = "stablehlo.gather"(%sh, %col) <{dimension_numbers = #stablehlo.gather<collapsed_slice_dims = [1], operand_batching_dims = [0], start_indices_batching_dims = [0], start_index_map = [1], index_vector_dim = 2>, indices_are_sorted = false, slice_sizes = array<i64: 1, 1>}> : (tensor<2x2xf32>, tensor<2x1x1xi32>) -> tensor<2x1xf32>
    %pl = stablehlo.reshape %g : (tensor<2x1xf32>) -> tensor<2xf32>
    %zf = stablehlo.constant dense<0.0> : tensor<2xf32>
    %pk = stablehlo.select %mask, %pl, %zf : tensor<2xi1>, tensor<2xf32>
    %picked = "stablehlo.all_reduce"(%pk) ({
      ^bb0(%u: tensor<f32>, %v: tensor<f32>):
        %r = stablehlo.add %u, %v : tensor<f32>
        stablehlo.return %r : tensor<f32>
    }) {replica_groups = dense<[[0, 1, 2, 3]]> : tensor<1x4xi64>, channel_handle = #stablehlo.channel_handle<handle = 2, type = 1>, use_global_device_ids} : (tensor<2xf32>) -> tensor<2xf32>
    %e = stablehlo.exponential %sh : tensor<2x2xf32>
    %z = stablehlo.constant dense<0.0> : tensor<f32>
    %sl = stablehlo.reduce(%e init: %z) applies stablehlo.add across dimensions = [1] : (tensor<2x2xf32>, tensor<f32>) -> tensor<2xf32>
    %s = "stablehlo.all_reduce"(%sl) ({
      ^bb0(%u: tensor<f32>, %v: tensor<f32>):
        %r = stablehlo.add %u, %v : tensor<f32>
        stablehlo.return %r : tensor<f32>
    }) {replica_groups = dense<[[0, 1, 2, 3]]> : tensor<1x4xi64>, channel_handle = #stablehlo.channel_handle<handle = 3, type = 1>, use_global_device_ids} : (tensor<2xf32>) -> tensor<2xf32>
    %lg = stablehlo.log %s : tensor<2xf32>
    %out = stablehlo.subtract %lg, %picked : tensor<2xf32>
    sdy.return %out : tensor<2xf32>
  } : (tensor<2x8xf32>, tensor<2xi32>) -> tensor<2xf32>
  return %0 : tensor<2xf32>
}
