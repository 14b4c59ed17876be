// RUN: entangle-opt %s --entangle-normalize --entangle-import-shardings --entangle-infer-relations | filecheck %s

// Regression (fixed): stablehlo.not on an integer device scalar is evaluated as a LOGICAL not.
// On integers stablehlo.not is bitwise (~x = -x - 1); only on i1 is it the logical not.
// rules/elementwise._SCALAR_OPS maps "stablehlo.not" to `int(not a)` for every dtype, so
// not([0, 1, 2, 3] : i32) is tabulated as [1, 0, 0, 0] instead of [-1, -2, -3, -4]. An offset
// computed this way would be checked against the wrong table.

sdy.mesh @mesh = <["tp"=4]>

// CHECK-LABEL: func.func @bitwise_not
func.func @bitwise_not(%x: tensor<8xf32>) -> tensor<8xf32> {
  %0 = sdy.manual_computation(%x) in_shardings=[<@mesh, [{}]>] out_shardings=[<@mesh, [{}]>] manual_axes={"tp"} (%a: tensor<8xf32>) {
    %pid = stablehlo.partition_id : tensor<ui32>
    %i = stablehlo.convert %pid : (tensor<ui32>) -> tensor<i32>
    // CHECK: stablehlo.not %{{.*}}entangle.relation = "device scalar [-1, -2, -3, -4]"
    %1 = stablehlo.not %i : tensor<i32>
    sdy.return %a : tensor<8xf32>
  } : (tensor<8xf32>) -> tensor<8xf32>
  return %0 : tensor<8xf32>
}
