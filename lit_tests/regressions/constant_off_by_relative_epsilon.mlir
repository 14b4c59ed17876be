// RUN: not entangle check %s | filecheck %s

// Regression (issue 16, class 4): constants that differ by less than a relative 2^-21 were
// taken as equal, for every dtype: `x + 1000000400` for `x + 1000000000` in int32 (result #0)
// and a float32 reciprocal of 768 one ulp off, 0.00130208349 (result #1). Both are now
// "not proven": integer constants compare exactly, and a float constant only as itself or as
// the reference's rounded to its dtype (constant_rounding_exact.mlir). Grounded in
// tests/core/test_exact_constants.py (executed: the numbers differ).

// CHECK-DAG: note: result #0 differs from the reference
// CHECK-DAG: note: the sharded constant 1000000400 is not the reference's 1000000000 (i32 constants compare exactly)
// CHECK-DAG: note: result #1 differs from the reference
// CHECK-DAG: note: the sharded constant 0.00130208349 is not the reference's 1/768, nor its rounding to float32 (0.00130208337): constants compare exactly
// CHECK: not proven:
// CHECK-NOT: constant rounding

sdy.mesh @mesh = <["tp"=4]>

func.func @ref(%i: tensor<16xi32>, %x: tensor<16xf32>) -> (tensor<16xi32>, tensor<16xf32>) {
  %k = stablehlo.constant dense<1000000000> : tensor<16xi32>
  %0 = stablehlo.add %i, %k : tensor<16xi32>
  %c = stablehlo.constant dense<768.0> : tensor<16xf32>
  %1 = stablehlo.divide %x, %c : tensor<16xf32>
  return %0, %1 : tensor<16xi32>, tensor<16xf32>
}

func.func @sharded(%i: tensor<16xi32>, %x: tensor<16xf32>) -> (tensor<16xi32>, tensor<16xf32>) attributes {entangle.refines = @ref} {
  %0:2 = sdy.manual_computation(%i, %x) in_shardings=[<@mesh, [{"tp"}]>, <@mesh, [{"tp"}]>] out_shardings=[<@mesh, [{"tp"}]>, <@mesh, [{"tp"}]>] manual_axes={"tp"} (%a: tensor<4xi32>, %b: tensor<4xf32>) {
    %k = stablehlo.constant dense<1000000400> : tensor<4xi32>
    %1 = stablehlo.add %a, %k : tensor<4xi32>
    %c = stablehlo.constant dense<0.00130208349> : tensor<4xf32>
    %2 = stablehlo.multiply %b, %c : tensor<4xf32>
    sdy.return %1, %2 : tensor<4xi32>, tensor<4xf32>
  } : (tensor<16xi32>, tensor<16xf32>) -> (tensor<16xi32>, tensor<16xf32>)
  return %0#0, %0#1 : tensor<16xi32>, tensor<16xf32>
}
