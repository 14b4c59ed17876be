// RUN: not entangle check %s %s 2>&1 | filecheck %s

// Regression (fixed, issue 16, found by the semantic attacker): a splat constant's value is an
// exact rational, where -0.0 was +0.0, so `where(x > 0, x, -0.0)` was taken for the
// reference's `where(x > 0, x, 0.0)` although every zero of the output has the other sign.

// CHECK: not proven
// CHECK-NOT: verified

sdy.mesh @mesh = <["tp"=4]>

func.func @ref(%x: tensor<8x4xf32>) -> tensor<8x4xf32> {
  %zero = stablehlo.constant dense<0.0> : tensor<8x4xf32>
  %p = stablehlo.compare GT, %x, %zero, FLOAT : (tensor<8x4xf32>, tensor<8x4xf32>) -> tensor<8x4xi1>
  %y = stablehlo.select %p, %x, %zero : tensor<8x4xi1>, tensor<8x4xf32>
  return %y : tensor<8x4xf32>
}

func.func @sharded(%x: tensor<8x4xf32>) -> tensor<8x4xf32> attributes {entangle.refines = @ref} {
  %0 = sdy.manual_computation(%x) in_shardings=[<@mesh, [{"tp"}, {}]>] out_shardings=[<@mesh, [{"tp"}, {}]>] manual_axes={"tp"} (%a: tensor<2x4xf32>) {
    %zero = stablehlo.constant dense<0.0> : tensor<2x4xf32>
    %negzero = stablehlo.constant dense<-0.0> : tensor<2x4xf32>
    %p = stablehlo.compare GT, %a, %zero, FLOAT : (tensor<2x4xf32>, tensor<2x4xf32>) -> tensor<2x4xi1>
    %y = stablehlo.select %p, %a, %negzero : tensor<2x4xi1>, tensor<2x4xf32>
    sdy.return %y : tensor<2x4xf32>
  } : (tensor<8x4xf32>) -> tensor<8x4xf32>
  return %0 : tensor<8x4xf32>
}
