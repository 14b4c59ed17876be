// RUN: entangle check %s %s 2>&1 | filecheck %s

// The correct twin of negative_zero_constant.mlir: reference and sharded program both select
// -0.0; proven, every rule instance by Z3 (the -0.0 splat is a broadcast scalar constant).

// CHECK: verified
// CHECK: 0 refuted, 0 inconclusive

sdy.mesh @mesh = <["tp"=4]>

func.func @ref(%x: tensor<8x4xf32>) -> tensor<8x4xf32> {
  %zero = stablehlo.constant dense<0.0> : tensor<8x4xf32>
  %p = stablehlo.compare GT, %x, %zero, FLOAT : (tensor<8x4xf32>, tensor<8x4xf32>) -> tensor<8x4xi1>
  %nz = stablehlo.constant dense<-0.0> : tensor<8x4xf32>
  %y = stablehlo.select %p, %x, %nz : tensor<8x4xi1>, tensor<8x4xf32>
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
