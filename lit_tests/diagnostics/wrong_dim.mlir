// RUN: entangle-opt %s --split-input-file --pass-pipeline='builtin.module(entangle-normalize,entangle-import-shardings,entangle-infer-relations,entangle-check-refinement)' --verify-diagnostics
// RUN: not entangle check %s --json | filecheck %s

// Sequence parallelism: the rows (tokens) are split over tp, and the body gathers the result
// back along the wrong dim:
//
//   def body(x_l):                                # x_l: [8 / tp, 16]
//       y = jnp.tanh(x_l)
//       return jax.lax.all_gather(y, 'tp', axis=1, tiled=True).reshape(8, 16)  # BUG: axis=0
//   shard_map(body, mesh, in_specs=P('tp', None), out_specs=P())
//
// Gathering along dim 1 lays the row blocks side by side; the reshape hides the shape change.

// CHECK: "verdict": "not proven"
// CHECK: "diagnostics": [
// CHECK: "message": "all_gather concatenates along dim 1 but the value is split along dim 0 over 'tp'"
// CHECK: "reason": "wrong_dim"

sdy.mesh @mesh = <["tp"=4]>

func.func @ref(%x: tensor<8x16xf32>) -> tensor<8x16xf32> {
  // expected-note @+1 {{corresponds to the reference op stablehlo.tanh}}
  %0 = stablehlo.tanh %x : tensor<8x16xf32>
  return %0 : tensor<8x16xf32>
}

func.func @sharded(%x: tensor<8x16xf32>) -> tensor<8x16xf32> attributes {entangle.refines = @ref} {
  %0 = sdy.manual_computation(%x) in_shardings=[<@mesh, [{"tp"}, {}]>] out_shardings=[<@mesh, [{}, {}]>] manual_axes={"tp"} (%a: tensor<2x16xf32>) {
    %1 = stablehlo.tanh %a : tensor<2x16xf32>
    // expected-error @+1 {{all_gather concatenates along dim 1 but the value is split along dim 0 over 'tp'}}
    %2 = "stablehlo.all_gather"(%1) {all_gather_dim = 1 : i64, replica_groups = dense<[[0, 1, 2, 3]]> : tensor<1x4xi64>, channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, use_global_device_ids} : (tensor<2x16xf32>) -> tensor<2x64xf32>
    %3 = stablehlo.reshape %2 : (tensor<2x64xf32>) -> tensor<8x16xf32>
    sdy.return %3 : tensor<8x16xf32>
  } : (tensor<8x16xf32>) -> tensor<8x16xf32>
  return %0 : tensor<8x16xf32>
}
