// RUN: entangle-opt %s --split-input-file --entangle-normalize --entangle-import-shardings --entangle-infer-relations | filecheck %s
// XFAIL: *
// The walker does not run the scatter rule yet: rules/gather_scatter.py marks `scatter` with
// `reads_regions`, but infer.py only lets REGION_RULE_OPS (reduce, all_reduce, reduce_scatter)
// through, so every scatter is "opaque: unsupported op stablehlo.scatter (with regions)".
// With scatter added to REGION_RULE_OPS every CHECK below passes: remove this XFAIL then.

// stablehlo.scatter (gather_scatter rule): the embedding gradient. Scattered operand dims must
// not be split; window dims split alike in operand and updates keep their split. Updates split
// along their scatter dims (indices split alike) land on every device's copy: scatter-add makes
// a partial sum over those axes (a replicated operand is then counted once per device); a
// replacing scatter of split updates is refused.

sdy.mesh @mesh = <["dp"=2, "tp"=4]>

// Gradient rows for tokens split over dp, hidden split over tp, added into an accumulator
// (replicated over dp, so it is counted once per dp device after the psum). (A zeros table built
// at the local shape is not adapted yet: see lit_tests/known_issues/scatter_poly_zeros.mlir.)
// CHECK-LABEL: func.func @scatter_add
func.func @scatter_add(%ids: tensor<8x1xi32>, %g: tensor<8x16xf32>, %acc: tensor<32x16xf32>) -> tensor<32x16xf32> {
  %0 = sdy.manual_computation(%ids, %g, %acc) in_shardings=[<@mesh, [{"dp"}, {}]>, <@mesh, [{"dp"}, {"tp"}]>, <@mesh, [{}, {"tp"}]>] out_shardings=[<@mesh, [{}, {"tp"}]>] manual_axes={"dp", "tp"} (%i: tensor<4x1xi32>, %u: tensor<4x4xf32>, %a: tensor<32x4xf32>) {
    // CHECK: "stablehlo.scatter"
    // CHECK: entangle.relation = "tile [{}, {tp}] partial sum {dp} : (2*%arg2 + scatter(0, %arg0, %arg1))"
    %1 = "stablehlo.scatter"(%a, %i, %u) ({
      ^bb0(%p: tensor<f32>, %q: tensor<f32>):
        %s = stablehlo.add %p, %q : tensor<f32>
        stablehlo.return %s : tensor<f32>
    }) {scatter_dimension_numbers = #stablehlo.scatter<update_window_dims = [1], inserted_window_dims = [0], scatter_dims_to_operand_dims = [0], index_vector_dim = 1>} : (tensor<32x4xf32>, tensor<4x1xi32>, tensor<4x4xf32>) -> tensor<32x4xf32>
    // CHECK: "stablehlo.all_reduce"
    // CHECK: entangle.relation = "tile [{}, {tp}] : (2*%arg2 + scatter(0, %arg0, %arg1))"
    %3 = "stablehlo.all_reduce"(%1) ({
      ^bb0(%p: tensor<f32>, %q: tensor<f32>):
        %s = stablehlo.add %p, %q : tensor<f32>
        stablehlo.return %s : tensor<f32>
    }) {replica_groups = dense<[[0, 4], [1, 5], [2, 6], [3, 7]]> : tensor<4x2xi64>, channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, use_global_device_ids} : (tensor<32x4xf32>) -> tensor<32x4xf32>
    sdy.return %3 : tensor<32x4xf32>
  } : (tensor<8x1xi32>, tensor<8x16xf32>, tensor<32x16xf32>) -> tensor<32x16xf32>
  return %0 : tensor<32x16xf32>
}

// -----

sdy.mesh @mesh = <["tp"=4]>

// Refused: replacing with updates split over tp (each device overwrites its own copy), and
// scattering into a split dim at computed indices.
// CHECK-LABEL: func.func @refused
func.func @refused(%ids: tensor<8x1xi32>, %g: tensor<8x16xf32>, %t: tensor<32x16xf32>) -> tensor<32x16xf32> {
  %0 = sdy.manual_computation(%ids, %g, %t) in_shardings=[<@mesh, [{"tp"}, {}]>, <@mesh, [{"tp"}, {}]>, <@mesh, [{"tp"}, {}]>] out_shardings=[<@mesh, [{}, {}]>] manual_axes={"tp"} (%i: tensor<2x1xi32>, %u: tensor<2x16xf32>, %tl: tensor<8x16xf32>) {
    %z = stablehlo.constant dense<0.0> : tensor<32x16xf32>
    // CHECK: "stablehlo.scatter"
    // CHECK: entangle.relation = "opaque: scatter (replace) of partial or split updates: replacing is not linear, every device overwrites its own copy"
    %1 = "stablehlo.scatter"(%z, %i, %u) ({
      ^bb0(%p: tensor<f32>, %q: tensor<f32>):
        stablehlo.return %q : tensor<f32>
    }) {scatter_dimension_numbers = #stablehlo.scatter<update_window_dims = [1], inserted_window_dims = [0], scatter_dims_to_operand_dims = [0], index_vector_dim = 1>} : (tensor<32x16xf32>, tensor<2x1xi32>, tensor<2x16xf32>) -> tensor<32x16xf32>
    %ii = "stablehlo.all_gather"(%i) {all_gather_dim = 0 : i64, replica_groups = dense<[[0, 1, 2, 3]]> : tensor<1x4xi64>, channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, use_global_device_ids} : (tensor<2x1xi32>) -> tensor<8x1xi32>
    %uu = "stablehlo.all_gather"(%u) {all_gather_dim = 0 : i64, replica_groups = dense<[[0, 1, 2, 3]]> : tensor<1x4xi64>, channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, use_global_device_ids} : (tensor<2x16xf32>) -> tensor<8x16xf32>
    // CHECK: "stablehlo.scatter"
    // CHECK: entangle.relation = "opaque: scatter into dim 0, which is split over 'tp': each device would index its own block
    %2 = "stablehlo.scatter"(%tl, %ii, %uu) ({
      ^bb0(%p: tensor<f32>, %q: tensor<f32>):
        %s = stablehlo.add %p, %q : tensor<f32>
        stablehlo.return %s : tensor<f32>
    }) {scatter_dimension_numbers = #stablehlo.scatter<update_window_dims = [1], inserted_window_dims = [0], scatter_dims_to_operand_dims = [0], index_vector_dim = 1>} : (tensor<8x16xf32>, tensor<8x1xi32>, tensor<8x16xf32>) -> tensor<8x16xf32>
    sdy.return %1 : tensor<32x16xf32>
  } : (tensor<8x1xi32>, tensor<8x16xf32>, tensor<32x16xf32>) -> tensor<32x16xf32>
  return %0 : tensor<32x16xf32>
}
