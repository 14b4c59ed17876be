// RUN: entangle-opt %s --pass-pipeline='builtin.module(entangle-normalize,entangle-import-shardings,entangle-infer-relations,entangle-check-refinement)' --verify-diagnostics

// Regression (fixed): integer divide truncates toward zero, so `(x / 2) * 2` is not `x`; the
// divide by a constant used to become the rational scale 1/2 and the program was proven.
//   def ref(x):  return x                                  # x: int32[8]
//   def body(x_l):  return jax.lax.div(x_l, 2) * 2         # BUG: x = 3 gives 2

sdy.mesh @mesh = <["dp"=2]>

func.func @ref(%x: tensor<8xi32>) -> tensor<8xi32> {
  return %x : tensor<8xi32>
}

func.func @sharded(%x: tensor<8xi32>) -> tensor<8xi32> attributes {entangle.refines = @ref} {
  %0 = sdy.manual_computation(%x) in_shardings=[<@mesh, [{"dp"}]>] out_shardings=[<@mesh, [{"dp"}]>] manual_axes={"dp"} (%a: tensor<4xi32>) {
    %c2 = stablehlo.constant dense<2> : tensor<4xi32>
    // expected-error @+1 {{divide computes (%arg0 / 2), which the reference never computes}}
    %q = stablehlo.divide %a, %c2 : tensor<4xi32>
    %r = stablehlo.multiply %q, %c2 : tensor<4xi32>
    sdy.return %r : tensor<4xi32>
  } : (tensor<8xi32>) -> tensor<8xi32>
  // expected-note @+1 {{result #0 differs from the reference: at top level: %arg0 vs (2*(%arg0 / 2))}}
  return %0 : tensor<8xi32>
}
