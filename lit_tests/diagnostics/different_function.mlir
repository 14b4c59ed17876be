// RUN: entangle-opt %s --split-input-file --pass-pipeline='builtin.module(entangle-normalize,entangle-import-shardings,entangle-infer-relations,entangle-check-refinement)' --verify-diagnostics
// RUN: not entangle check %s --json | filecheck %s

// The shard_map body computes a different function from the model: the reference clips with
// a maximum, the hand-written per-device body uses a minimum. The layouts are all right; the
// values are not.
//
//   def ref(x, y):  return jnp.maximum(x, y)
//   def body(x_l, y_l):  return jnp.minimum(x_l, y_l)       # BUG: maximum
//   shard_map(body, mesh, in_specs=(P('tp', None), P('tp', None)), out_specs=P('tp', None))
//
// The error is at the first op whose value the reference never computes; the note shows the
// two terms side by side.

// CHECK: "verdict": "not proven"
// CHECK: "diagnostics": [
// CHECK: "message": "minimum computes minimum(%arg0, %arg1), which the reference never computes"
// CHECK: "message": "result #0 differs from the reference: at top level: maximum(%arg0, %arg1) vs minimum(%arg0, %arg1)"
// CHECK: "reason": "different_function"

sdy.mesh @mesh = <["tp"=4]>

func.func @ref(%x: tensor<8x16xf32>, %y: tensor<8x16xf32>) -> tensor<8x16xf32> {
  // expected-note @+1 {{corresponds to the reference op stablehlo.maximum}}
  %0 = stablehlo.maximum %x, %y : tensor<8x16xf32>
  return %0 : tensor<8x16xf32>
}

func.func @sharded(%x: tensor<8x16xf32>, %y: tensor<8x16xf32>) -> tensor<8x16xf32> attributes {entangle.refines = @ref} {
  %0 = sdy.manual_computation(%x, %y) in_shardings=[<@mesh, [{"tp"}, {}]>, <@mesh, [{"tp"}, {}]>] out_shardings=[<@mesh, [{"tp"}, {}]>] manual_axes={"tp"} (%a: tensor<2x16xf32>, %b: tensor<2x16xf32>) {
    // expected-error @+1 {{minimum computes minimum(%arg0, %arg1), which the reference never computes}}
    %1 = stablehlo.minimum %a, %b : tensor<2x16xf32>
    sdy.return %1 : tensor<2x16xf32>
  } : (tensor<8x16xf32>, tensor<8x16xf32>) -> tensor<8x16xf32>
  // expected-note @+1 {{result #0 differs from the reference: at top level: maximum(%arg0, %arg1) vs minimum(%arg0, %arg1)}}
  return %0 : tensor<8x16xf32>
}
