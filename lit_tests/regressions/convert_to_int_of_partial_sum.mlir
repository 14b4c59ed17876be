// RUN: entangle-opt %s --pass-pipeline='builtin.module(entangle-normalize,entangle-import-shardings,entangle-infer-relations,entangle-check-refinement)' --verify-diagnostics

// Regression (fixed): a float -> int convert truncates, so it does not commute with a partial
// sum; the walk used to keep the partial sum across it (only the Z3 instance check caught it).
//   def ref(x):  return jnp.sum(x).astype(jnp.int32)
//   def body(x_l):  return jax.lax.psum(jnp.sum(x_l).astype(jnp.int32), 'tp')   # BUG

sdy.mesh @mesh = <["tp"=4]>

func.func @ref(%x: tensor<8xf32>) -> tensor<i32> {
  %c0 = stablehlo.constant dense<0.0> : tensor<f32>
  // expected-note @+1 {{corresponds to the reference op stablehlo.reduce}}
  %s = stablehlo.reduce(%x init: %c0) applies stablehlo.add across dimensions = [0] : (tensor<8xf32>, tensor<f32>) -> tensor<f32>
  %i = stablehlo.convert %s : (tensor<f32>) -> tensor<i32>
  return %i : tensor<i32>
}

func.func @sharded(%x: tensor<8xf32>) -> tensor<i32> attributes {entangle.refines = @ref} {
  %0 = sdy.manual_computation(%x) in_shardings=[<@mesh, [{"tp"}]>] out_shardings=[<@mesh, []>] manual_axes={"tp"} (%a: tensor<2xf32>) {
    %c0 = stablehlo.constant dense<0.0> : tensor<f32>
    // expected-error @+1 {{nonlinear op convert applied to a partial sum over 'tp': missing all_reduce/psum before it}}
    %s = stablehlo.reduce(%a init: %c0) applies stablehlo.add across dimensions = [0] : (tensor<2xf32>, tensor<f32>) -> tensor<f32>
    // expected-note @+1 {{the partial sum is used here by stablehlo.convert}}
    %i = stablehlo.convert %s : (tensor<f32>) -> tensor<i32>
    %r = "stablehlo.all_reduce"(%i) ({
      ^bb0(%u: tensor<i32>, %v: tensor<i32>):
        %t = stablehlo.add %u, %v : tensor<i32>
        stablehlo.return %t : tensor<i32>
    }) {replica_groups = dense<[[0, 1, 2, 3]]> : tensor<1x4xi64>, channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, use_global_device_ids} : (tensor<i32>) -> tensor<i32>
    sdy.return %r : tensor<i32>
  } : (tensor<8xf32>) -> tensor<i32>
  return %0 : tensor<i32>
}
