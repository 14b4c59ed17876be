// RUN: entangle-opt %s --entangle-normalize --entangle-import-shardings --entangle-infer-relations | filecheck %s

// Regression (fixed): the walker never runs the scatter rule (infer.REGION_RULE_OPS does not list
// stablehlo.scatter), so this embedding gradient is "opaque: unsupported op stablehlo.scatter
// (with regions)"; see also rules/stablehlo_scatter.mlir.
// `jnp.zeros((32, 4)).at[ids].add(g)` inside shard_map builds the zeros as a splat at the LOCAL
// shape; the scatter rule itself now adapts that poly buffer to the updates' split (it used to
// freeze it and refuse "window dim 1 of the operand is not split but the updates' dim 1 is split
// over 'tp'"). With scatter in REGION_RULE_OPS this file passes: then drop the XFAIL.

sdy.mesh @mesh = <["dp"=2, "tp"=4]>

// CHECK-LABEL: func.func @embedding_grad
func.func @embedding_grad(%ids: tensor<8x1xi32>, %g: tensor<8x16xf32>) -> tensor<32x16xf32> {
  %0 = sdy.manual_computation(%ids, %g) in_shardings=[<@mesh, [{"dp"}, {}]>, <@mesh, [{"dp"}, {"tp"}]>] out_shardings=[<@mesh, [{}, {"tp"}]>] manual_axes={"dp", "tp"} (%i: tensor<4x1xi32>, %u: tensor<4x4xf32>) {
    %z = stablehlo.constant dense<0.0> : tensor<32x4xf32>
    // CHECK: "stablehlo.scatter"
    // CHECK: entangle.relation = "tile [{}, {tp}] partial sum {dp} : scatter(0, %arg0, %arg1)"
    %1 = "stablehlo.scatter"(%z, %i, %u) ({
      ^bb0(%p: tensor<f32>, %q: tensor<f32>):
        %s = stablehlo.add %p, %q : tensor<f32>
        stablehlo.return %s : tensor<f32>
    }) {scatter_dimension_numbers = #stablehlo.scatter<update_window_dims = [1], inserted_window_dims = [0], scatter_dims_to_operand_dims = [0], index_vector_dim = 1>} : (tensor<32x4xf32>, tensor<4x1xi32>, tensor<4x4xf32>) -> tensor<32x4xf32>
    %2 = "stablehlo.all_reduce"(%1) ({
      ^bb0(%p: tensor<f32>, %q: tensor<f32>):
        %s = stablehlo.add %p, %q : tensor<f32>
        stablehlo.return %s : tensor<f32>
    }) {replica_groups = dense<[[0, 4], [1, 5], [2, 6], [3, 7]]> : tensor<4x2xi64>, channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, use_global_device_ids} : (tensor<32x4xf32>) -> tensor<32x4xf32>
    sdy.return %2 : tensor<32x4xf32>
  } : (tensor<8x1xi32>, tensor<8x16xf32>) -> tensor<32x16xf32>
  return %0 : tensor<32x16xf32>
}
