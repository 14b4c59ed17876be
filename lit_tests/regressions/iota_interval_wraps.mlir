// RUN: entangle-opt %s --pass-pipeline='builtin.module(entangle-normalize,entangle-import-shardings,entangle-infer-relations,entangle-check-refinement)' --verify-diagnostics

// Regression (fixed): `iota + 2147483000 < 2147483647` in int32 is false only at i = 647:
// from i = 648 on the add wraps to negative values and the test is true again. It used to be
// read as the interval i < 647 (a prefix mask) and the program was proven equal to zeroing
// x[647:].
//   def ref(x):   return jnp.where(lax.iota(jnp.int32, 1024) < 647, x, 0.0)
//   def body(x):  return jnp.where(lax.iota(jnp.int32, 1024) + 2147483000 < 2147483647, x, 0.0)

sdy.mesh @mesh = <["dp"=2]>

func.func @ref(%x: tensor<1024xf32>) -> tensor<1024xf32> {
  %i = stablehlo.iota dim = 0 : tensor<1024xi32>
  %c = stablehlo.constant dense<647> : tensor<1024xi32>
  %p = stablehlo.compare LT, %i, %c, SIGNED : (tensor<1024xi32>, tensor<1024xi32>) -> tensor<1024xi1>
  %z = stablehlo.constant dense<0.0> : tensor<1024xf32>
  %r = stablehlo.select %p, %x, %z : tensor<1024xi1>, tensor<1024xf32>
  return %r : tensor<1024xf32>
}

func.func @sharded(%x: tensor<1024xf32>) -> tensor<1024xf32> attributes {entangle.refines = @ref} {
  %0 = sdy.manual_computation(%x) in_shardings=[<@mesh, [{}]>] out_shardings=[<@mesh, [{}]>] manual_axes={"dp"} (%a: tensor<1024xf32>) {
    %i = stablehlo.iota dim = 0 : tensor<1024xi32>
    %k = stablehlo.constant dense<2147483000> : tensor<1024xi32>
    // expected-error @+1 {{add computes (iota(dim 0) + 2147483000), which the reference never computes}}
    %s = stablehlo.add %i, %k : tensor<1024xi32>
    %m = stablehlo.constant dense<2147483647> : tensor<1024xi32>
    %p = stablehlo.compare LT, %s, %m, SIGNED : (tensor<1024xi32>, tensor<1024xi32>) -> tensor<1024xi1>
    %z = stablehlo.constant dense<0.0> : tensor<1024xf32>
    %r = stablehlo.select %p, %a, %z : tensor<1024xi1>, tensor<1024xf32>
    sdy.return %r : tensor<1024xf32>
  } : (tensor<1024xf32>) -> tensor<1024xf32>
  // expected-note @+1 {{result #0 differs from the reference}}
  return %0 : tensor<1024xf32>
}
