// RUN: entangle-opt %s --entangle-normalize --entangle-import-shardings --entangle-infer-relations | filecheck %s

// Regression (fixed): all_reduce depends on the order of devices inside a replica group.
// A sum over a group does not depend on the order the group lists its devices in (DESIGN.md:
// "group order matters for all_gather/reduce_scatter, not for all_reduce"), but
// rules/collectives.group_axes uses Mesh.axes_of_groups, which requires the in-group order of
// some axes permutation, so [[3, 2, 1, 0], [7, 6, 5, 4]] (= psum('tp'), listed backwards) gives
//   opaque: stablehlo.all_reduce: replica groups [[3, 2, 1, 0], [7, 6, 5, 4]] do not correspond
//   to any mesh axes of dp=2 x tp=4
// instead of completing the partial sum over tp.

sdy.mesh @mesh = <["dp"=2, "tp"=4]>

// CHECK-LABEL: func.func @reordered_groups
func.func @reordered_groups(%x: tensor<8x16xf32>) -> tensor<8xf32> {
  %0 = sdy.manual_computation(%x) in_shardings=[<@mesh, [{"dp"}, {"tp"}]>] out_shardings=[<@mesh, [{"dp"}]>] manual_axes={"dp", "tp"} (%a: tensor<4x4xf32>) {
    %zero = stablehlo.constant dense<0.0> : tensor<f32>
    %s = stablehlo.reduce(%a init: %zero) applies stablehlo.add across dimensions = [1] : (tensor<4x4xf32>, tensor<f32>) -> tensor<4xf32>
    // CHECK: "stablehlo.all_reduce"
    // CHECK: entangle.relation = "tile [{dp}] : reduce_sum(%arg0)"
    %1 = "stablehlo.all_reduce"(%s) ({
      ^bb0(%u: tensor<f32>, %v: tensor<f32>):
        %t = stablehlo.add %u, %v : tensor<f32>
        stablehlo.return %t : tensor<f32>
    }) {replica_groups = dense<[[3, 2, 1, 0], [7, 6, 5, 4]]> : tensor<2x4xi64>, channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, use_global_device_ids} : (tensor<4xf32>) -> tensor<4xf32>
    sdy.return %1 : tensor<4xf32>
  } : (tensor<8x16xf32>) -> tensor<8xf32>
  return %0 : tensor<8xf32>
}
