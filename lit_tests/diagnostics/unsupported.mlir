// RUN: entangle-opt %s --split-input-file --pass-pipeline='builtin.module(entangle-normalize,entangle-import-shardings,entangle-infer-relations,entangle-check-refinement)' --verify-diagnostics
// RUN: not entangle check %s --json | filecheck %s

// A Gaussian quantile transform of the partial sums before the psum: erf_inv has no rule, so
// the op's value is opaque and the check says so (never a crash, never "verified").
//
//   def body(x_l, w_l):
//       y = jax.lax.erf_inv(x_l @ w_l)
//       return jax.lax.psum(y, 'tp')
//   shard_map(body, mesh, in_specs=(P(None, 'tp'), P('tp', None)), out_specs=P())

// CHECK: "verdict": "not proven"
// CHECK: "diagnostics": [
// CHECK: "message": "unsupported op chlo.erf_inv"
// CHECK: "reason": "unsupported"

sdy.mesh @mesh = <["tp"=4]>

func.func @ref(%x: tensor<8x16xf32>, %w: tensor<16x8xf32>) -> tensor<8x8xf32> {
  // expected-note @+1 {{corresponds to the reference op stablehlo.dot_general}}
  %0 = stablehlo.dot_general %x, %w, contracting_dims = [1] x [0] : (tensor<8x16xf32>, tensor<16x8xf32>) -> tensor<8x8xf32>
  return %0 : tensor<8x8xf32>
}

func.func @sharded(%x: tensor<8x16xf32>, %w: tensor<16x8xf32>) -> tensor<8x8xf32> attributes {entangle.refines = @ref} {
  %0 = sdy.manual_computation(%x, %w) in_shardings=[<@mesh, [{}, {"tp"}]>, <@mesh, [{"tp"}, {}]>] out_shardings=[<@mesh, [{}, {}]>] manual_axes={"tp"} (%a: tensor<8x4xf32>, %b: tensor<4x8xf32>) {
    %1 = stablehlo.dot_general %a, %b, contracting_dims = [1] x [0] : (tensor<8x4xf32>, tensor<4x8xf32>) -> tensor<8x8xf32>
    // expected-error @+1 {{unsupported op chlo.erf_inv}}
    %2 = chlo.erf_inv %1 : tensor<8x8xf32> -> tensor<8x8xf32>
    %3 = "stablehlo.all_reduce"(%2) ({
      ^bb0(%u: tensor<f32>, %v: tensor<f32>):
        %s = stablehlo.add %u, %v : tensor<f32>
        stablehlo.return %s : tensor<f32>
    }) {replica_groups = dense<[[0, 1, 2, 3]]> : tensor<1x4xi64>, channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, use_global_device_ids} : (tensor<8x8xf32>) -> tensor<8x8xf32>
    sdy.return %3 : tensor<8x8xf32>
  } : (tensor<8x16xf32>, tensor<16x8xf32>) -> tensor<8x8xf32>
  return %0 : tensor<8x8xf32>
}
