// RUN: entangle-opt %s --entangle-normalize --entangle-import-shardings --entangle-infer-relations | filecheck %s

// Regression (fixed): a misleading message for an all_gather that gathers blocks in the wrong order.
// Rows split over (dp, tp) with dp major; gathering over dp concatenates blocks 0*4+j and
// 1*4+j, which are not adjacent. Refusing is right, but rules/collectives._all_gather_one checks
// "split along another dim" with a loop over ALL dims (the gather dim included) before its
// wrong-order branch, so it says
//   opaque: all_gather concatenates along dim 0 but the value is split along dim 0 over ('dp', 'tp')
// which contradicts itself, and the "gathers blocks in the wrong order" branch is unreachable.

sdy.mesh @mesh = <["dp"=2, "tp"=4]>

// CHECK-LABEL: func.func @gather_major_axis
func.func @gather_major_axis(%x: tensor<16x4xf32>) -> tensor<16x4xf32> {
  %0 = sdy.manual_computation(%x) in_shardings=[<@mesh, [{"dp", "tp"}, {}]>] out_shardings=[<@mesh, [{"dp", "tp"}, {}]>] manual_axes={"dp", "tp"} (%a: tensor<2x4xf32>) {
    // CHECK: "stablehlo.all_gather"{{.*}}entangle.relation = "opaque: all_gather over 'dp' along dim 0, which is split over ('dp', 'tp') (major first): it concatenates the blocks in the wrong order (only the minor-most axes 'tp' can be gathered)"
    %1 = "stablehlo.all_gather"(%a) {all_gather_dim = 0 : i64, replica_groups = dense<[[0, 4], [1, 5], [2, 6], [3, 7]]> : tensor<4x2xi64>, channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, use_global_device_ids} : (tensor<2x4xf32>) -> tensor<4x4xf32>
    %2 = stablehlo.slice %1 [0:2, 0:4] : (tensor<4x4xf32>) -> tensor<2x4xf32>
    sdy.return %2 : tensor<2x4xf32>
  } : (tensor<16x4xf32>) -> tensor<16x4xf32>
  return %0 : tensor<16x4xf32>
}
