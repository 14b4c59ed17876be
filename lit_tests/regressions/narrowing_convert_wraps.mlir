// RUN: entangle-opt %s --pass-pipeline='builtin.module(entangle-normalize,entangle-import-shardings,entangle-infer-relations,entangle-check-refinement)' --verify-diagnostics

// Regression (fixed): a narrowing integer convert wraps (300 -> i8 is 44), so a round trip
// i32 -> i8 -> i32 is not the identity; converts between integer types used to be dropped as
// exact and the program was proven.
//   def ref(x):  return x                                              # x: int32[8]
//   def body(x_l):  return x_l.astype(jnp.int8).astype(jnp.int32)     # BUG

sdy.mesh @mesh = <["dp"=2]>

func.func @ref(%x: tensor<8xi32>) -> tensor<8xi32> {
  return %x : tensor<8xi32>
}

func.func @sharded(%x: tensor<8xi32>) -> tensor<8xi32> attributes {entangle.refines = @ref} {
  %0 = sdy.manual_computation(%x) in_shardings=[<@mesh, [{"dp"}]>] out_shardings=[<@mesh, [{"dp"}]>] manual_axes={"dp"} (%a: tensor<4xi32>) {
    // expected-error @+1 {{convert computes convert(%arg0), which the reference never computes}}
    %n = stablehlo.convert %a : (tensor<4xi32>) -> tensor<4xi8>
    %w = stablehlo.convert %n : (tensor<4xi8>) -> tensor<4xi32>
    sdy.return %w : tensor<4xi32>
  } : (tensor<8xi32>) -> tensor<8xi32>
  // expected-note @+1 {{result #0 differs from the reference: at top level: %arg0 vs convert(convert(%arg0))}}
  return %0 : tensor<8xi32>
}
