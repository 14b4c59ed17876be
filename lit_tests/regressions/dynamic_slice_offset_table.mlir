// RUN: entangle-opt %s --entangle-normalize --entangle-import-shardings --entangle-infer-relations | filecheck %s

// Regression (fixed): an offset table indexed by partition_id is not evaluated as a device scalar.
// XLA's partitioner (and DESIGN.md's second worked example) computes offsets as
//   %o = dynamic_slice %table, %partition_id, sizes = [1] -> reshape -> scalar
// The dynamic_slice rule treats the constant table like any other tensor and returns
// "tile [{dp, tp}] : dense<i32>" (a correct relation, but not a device scalar); the reshape to a
// scalar is then refused ("reshape regroups dim 0, which is split over ('dp', 'tp')") and the
// data slice fails with that misleading reason. The table [0, 4, 8, 12, 0, 4, 8, 12] is exactly
// axis_index('tp') * 4, so the data slice is a tiling over tp.

sdy.mesh @mesh = <["dp"=2, "tp"=4]>

// CHECK-LABEL: func.func @offset_table
func.func @offset_table(%x: tensor<8x16xf32>) -> tensor<8x16xf32> {
  %0 = sdy.manual_computation(%x) in_shardings=[<@mesh, [{}, {}]>] out_shardings=[<@mesh, [{}, {"tp"}]>] manual_axes={"dp", "tp"} (%a: tensor<8x16xf32>) {
    %pid = stablehlo.partition_id : tensor<ui32>
    %i = stablehlo.convert %pid : (tensor<ui32>) -> tensor<i32>
    %table = stablehlo.constant dense<[0, 4, 8, 12, 0, 4, 8, 12]> : tensor<8xi32>
    // CHECK: stablehlo.dynamic_slice %{{.*}}entangle.relation = "device scalar [0, 4, 8, 12, 0, 4, 8, 12]"
    %t = stablehlo.dynamic_slice %table, %i, sizes = [1] : (tensor<8xi32>, tensor<i32>) -> tensor<1xi32>
    // CHECK: stablehlo.reshape %{{.*}}entangle.relation = "device scalar [0, 4, 8, 12, 0, 4, 8, 12]"
    %off = stablehlo.reshape %t : (tensor<1xi32>) -> tensor<i32>
    %c0 = stablehlo.constant dense<0> : tensor<i32>
    // CHECK: stablehlo.dynamic_slice %{{.*}}entangle.relation = "tile [{}, {tp}] : %arg0"
    %1 = stablehlo.dynamic_slice %a, %c0, %off, sizes = [8, 4] : (tensor<8x16xf32>, tensor<i32>, tensor<i32>) -> tensor<8x4xf32>
    sdy.return %1 : tensor<8x4xf32>
  } : (tensor<8x16xf32>) -> tensor<8x16xf32>
  return %0 : tensor<8x16xf32>
}
