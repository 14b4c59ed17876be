// RUN: entangle-opt %s --split-input-file --pass-pipeline='builtin.module(entangle-normalize,entangle-import-shardings,entangle-infer-relations,entangle-check-refinement)' --verify-diagnostics
// RUN: not entangle check %s --json | filecheck %s

// A row sum that starts at 1 (a reduce with init value 1, e.g. a smoothed count), computed on
// column shards and then psum'd: every device adds the 1 once, so the result is 4 too large.
// No clean relation connects the local reduce to the reference.
//
//   def ref(x):  return jax.lax.reduce(x, 1.0, jax.lax.add, (1,))
//   def body(x_l):                                # x_l: [8, 16 / tp]
//       return jax.lax.psum(jax.lax.reduce(x_l, 1.0, jax.lax.add, (1,)), 'tp')   # BUG
//   shard_map(body, mesh, in_specs=P(None, 'tp'), out_specs=P())

// CHECK: "verdict": "not proven"
// CHECK: "diagnostics": [
// CHECK: "message": "reduce over a split dim with init value 1 (not the identity of add): every device adds it once"
// CHECK: "reason": "unrelated"

sdy.mesh @mesh = <["tp"=4]>

func.func @ref(%x: tensor<8x16xf32>) -> tensor<8xf32> {
  %c1 = stablehlo.constant dense<1.0> : tensor<f32>
  // expected-note @+1 {{corresponds to the reference op stablehlo.reduce}}
  %s = stablehlo.reduce(%x init: %c1) applies stablehlo.add across dimensions = [1] : (tensor<8x16xf32>, tensor<f32>) -> tensor<8xf32>
  return %s : tensor<8xf32>
}

func.func @sharded(%x: tensor<8x16xf32>) -> tensor<8xf32> attributes {entangle.refines = @ref} {
  %0 = sdy.manual_computation(%x) in_shardings=[<@mesh, [{}, {"tp"}]>] out_shardings=[<@mesh, [{}]>] manual_axes={"tp"} (%a: tensor<8x4xf32>) {
    %c1 = stablehlo.constant dense<1.0> : tensor<f32>
    // expected-error @+1 {{reduce over a split dim with init value 1 (not the identity of add): every device adds it once}}
    %s = stablehlo.reduce(%a init: %c1) applies stablehlo.add across dimensions = [1] : (tensor<8x4xf32>, tensor<f32>) -> tensor<8xf32>
    %t = "stablehlo.all_reduce"(%s) ({
      ^bb0(%u: tensor<f32>, %v: tensor<f32>):
        %z = stablehlo.add %u, %v : tensor<f32>
        stablehlo.return %z : tensor<f32>
    }) {replica_groups = dense<[[0, 1, 2, 3]]> : tensor<1x4xi64>, channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, use_global_device_ids} : (tensor<8xf32>) -> tensor<8xf32>
    sdy.return %t : tensor<8xf32>
  } : (tensor<8x16xf32>) -> tensor<8xf32>
  return %0 : tensor<8xf32>
}
