// RUN: entangle-opt %s --split-input-file --pass-pipeline='builtin.module(entangle-normalize,entangle-import-shardings,entangle-infer-relations,entangle-check-refinement)' --verify-diagnostics
// RUN: not entangle check %s --json | filecheck %s

// Per-block sums wanted (reference: jnp.sum(x.reshape(4, 32), axis=1)), but the local sums are
// psum'd first (every device now holds the total), and then all_gathered as if they were still
// per-device values.
//
//   def body(x_l):                                # x_l: [8 / tp, 16]
//       total = jax.lax.psum(jnp.sum(x_l), 'tp')
//       return jax.lax.all_gather(total[None], 'tp', tiled=True)   # BUG: already replicated
//   shard_map(body, mesh, in_specs=P('tp', None), out_specs=P())
//
// The all_gather concatenates 4 identical copies of the total. (Summing the gathered copies
// instead would be caught as an all_reduce of a replicated value: entangle-normalize reads
// `sum(all_gather(v[None]))` as `psum(v)`.)

// CHECK: "verdict": "not proven"
// CHECK: "diagnostics": [
// CHECK: "message": "all_gather over 'tp' of a value replicated over 'tp': it concatenates 4 identical copies"
// CHECK: "reason": "duplicate"

sdy.mesh @mesh = <["tp"=4]>

func.func @ref(%x: tensor<8x16xf32>) -> tensor<4xf32> {
  %c0 = stablehlo.constant dense<0.0> : tensor<f32>
  %b = stablehlo.reshape %x : (tensor<8x16xf32>) -> tensor<4x32xf32>
  %s = stablehlo.reduce(%b init: %c0) applies stablehlo.add across dimensions = [1] : (tensor<4x32xf32>, tensor<f32>) -> tensor<4xf32>
  return %s : tensor<4xf32>
}

func.func @sharded(%x: tensor<8x16xf32>) -> tensor<4xf32> attributes {entangle.refines = @ref} {
  %0 = sdy.manual_computation(%x) in_shardings=[<@mesh, [{"tp"}, {}]>] out_shardings=[<@mesh, [{}]>] manual_axes={"tp"} (%a: tensor<2x16xf32>) {
    %c0 = stablehlo.constant dense<0.0> : tensor<f32>
    %s = stablehlo.reduce(%a init: %c0) applies stablehlo.add across dimensions = [0, 1] : (tensor<2x16xf32>, tensor<f32>) -> tensor<f32>
    %t = "stablehlo.all_reduce"(%s) ({
      ^bb0(%u: tensor<f32>, %v: tensor<f32>):
        %z = stablehlo.add %u, %v : tensor<f32>
        stablehlo.return %z : tensor<f32>
    }) {replica_groups = dense<[[0, 1, 2, 3]]> : tensor<1x4xi64>, channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, use_global_device_ids} : (tensor<f32>) -> tensor<f32>
    %r = stablehlo.reshape %t : (tensor<f32>) -> tensor<1xf32>
    // expected-error @+1 {{all_gather over 'tp' of a value replicated over 'tp': it concatenates 4 identical copies}}
    %g = "stablehlo.all_gather"(%r) {all_gather_dim = 0 : i64, replica_groups = dense<[[0, 1, 2, 3]]> : tensor<1x4xi64>, channel_handle = #stablehlo.channel_handle<handle = 2, type = 1>, use_global_device_ids} : (tensor<1xf32>) -> tensor<4xf32>
    sdy.return %g : tensor<4xf32>
  } : (tensor<8x16xf32>) -> tensor<4xf32>
  return %0 : tensor<4xf32>
}
