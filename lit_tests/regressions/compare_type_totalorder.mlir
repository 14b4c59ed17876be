// RUN: entangle-opt %s --entangle-normalize --entangle-import-shardings --entangle-infer-relations | filecheck %s

// Regression (fixed, issue 16 class 3): `compare_type` was dropped from the term, so a
// TOTALORDER compare (-0 < +0) was taken for the FLOAT one (-0 == +0). It is now part of the
// term when it is not the element type's default (FLOAT for floats): compare[TOTALORDER].

sdy.mesh @mesh = <["tp"=4]>

// CHECK-LABEL: func.func @compare_types
func.func @compare_types(%x: tensor<8x16xf32>) -> (tensor<8x16xi1>, tensor<8x16xi1>) {
  %0:2 = sdy.manual_computation(%x) in_shardings=[<@mesh, [{}, {"tp"}]>] out_shardings=[<@mesh, [{}, {"tp"}]>, <@mesh, [{}, {"tp"}]>] manual_axes={"tp"} (%a: tensor<8x4xf32>) {
    %zero = stablehlo.constant dense<0.0> : tensor<8x4xf32>
    // CHECK: entangle.relation = "tile [{}, {tp}] : compare(%arg0, 0)"
    %f = stablehlo.compare GE, %a, %zero, FLOAT : (tensor<8x4xf32>, tensor<8x4xf32>) -> tensor<8x4xi1>
    // CHECK: entangle.relation = "tile [{}, {tp}] : compare[TOTALORDER](%arg0, 0)"
    %t = stablehlo.compare GE, %a, %zero, TOTALORDER : (tensor<8x4xf32>, tensor<8x4xf32>) -> tensor<8x4xi1>
    sdy.return %f, %t : tensor<8x4xi1>, tensor<8x4xi1>
  } : (tensor<8x16xf32>) -> (tensor<8x16xi1>, tensor<8x16xi1>)
  return %0#0, %0#1 : tensor<8x16xi1>, tensor<8x16xi1>
}
