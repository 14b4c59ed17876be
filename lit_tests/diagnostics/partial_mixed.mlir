// RUN: entangle-opt %s --split-input-file --pass-pipeline='builtin.module(entangle-normalize,entangle-import-shardings,entangle-infer-relations,entangle-check-refinement)' --verify-diagnostics
// RUN: not entangle check %s --json | filecheck %s

// LayerNorm-style centering with the hidden dim split: the mean is computed from the local
// shard only, then subtracted from the (split) activations.
//
//   def body(x_l):                          # x_l: [8, 16 / tp]
//       mean = jnp.sum(x_l, axis=1) / 16    # BUG: needs jax.lax.psum(jnp.sum(x_l, axis=1), 'tp')
//       return x_l - mean[:, None]
//   shard_map(body, mesh, in_specs=P(None, 'tp'), out_specs=P(None, 'tp'))
//
// The error is at the local sum (a partial sum over 'tp'); the note is at the subtract that
// combines it with a value split over 'tp'.

// CHECK: "verdict": "not proven"
// CHECK: "diagnostics": [
// CHECK: "message": "subtract combines a partial sum over 'tp' (missing all_reduce/psum) with a value split over 'tp'"
// CHECK: "reason": "partial_mixed"

sdy.mesh @mesh = <["tp"=4]>

func.func @ref(%x: tensor<8x16xf32>) -> tensor<8x16xf32> {
  %c0 = stablehlo.constant dense<0.0> : tensor<f32>
  // expected-note @+1 {{corresponds to the reference op stablehlo.reduce}}
  %s = stablehlo.reduce(%x init: %c0) applies stablehlo.add across dimensions = [1] : (tensor<8x16xf32>, tensor<f32>) -> tensor<8xf32>
  %n = stablehlo.constant dense<16.0> : tensor<8xf32>
  %m = stablehlo.divide %s, %n : tensor<8xf32>
  %b = stablehlo.broadcast_in_dim %m, dims = [0] : (tensor<8xf32>) -> tensor<8x16xf32>
  %y = stablehlo.subtract %x, %b : tensor<8x16xf32>
  return %y : tensor<8x16xf32>
}

func.func @sharded(%x: tensor<8x16xf32>) -> tensor<8x16xf32> attributes {entangle.refines = @ref} {
  %0 = sdy.manual_computation(%x) in_shardings=[<@mesh, [{}, {"tp"}]>] out_shardings=[<@mesh, [{}, {"tp"}]>] manual_axes={"tp"} (%a: tensor<8x4xf32>) {
    %c0 = stablehlo.constant dense<0.0> : tensor<f32>
    // expected-error @+1 {{subtract combines a partial sum over 'tp' (missing all_reduce/psum) with a value split over 'tp'}}
    %s = stablehlo.reduce(%a init: %c0) applies stablehlo.add across dimensions = [1] : (tensor<8x4xf32>, tensor<f32>) -> tensor<8xf32>
    %n = stablehlo.constant dense<16.0> : tensor<8xf32>
    %m = stablehlo.divide %s, %n : tensor<8xf32>
    %b = stablehlo.broadcast_in_dim %m, dims = [0] : (tensor<8xf32>) -> tensor<8x4xf32>
    // expected-note @+1 {{the partial sum is used here by stablehlo.subtract}}
    %y = stablehlo.subtract %a, %b : tensor<8x4xf32>
    sdy.return %y : tensor<8x4xf32>
  } : (tensor<8x16xf32>) -> tensor<8x16xf32>
  return %0 : tensor<8x16xf32>
}
