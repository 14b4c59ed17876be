// RUN: entangle-opt %s --split-input-file --pass-pipeline='builtin.module(entangle-normalize,entangle-import-shardings,entangle-infer-relations,entangle-check-refinement)' --verify-diagnostics
// RUN: not entangle check %s --json | filecheck %s

// A ring step (as in ring attention) left in the output path: every device passes its block to
// its right neighbour, and the shifted blocks are returned as if each device still held its own.
//
//   def body(x_l):                                # x_l: [8 / tp, 16]
//       y = jnp.tanh(x_l)
//       return jax.lax.ppermute(y, 'tp', [(i, (i + 1) % 4) for i in range(4)])   # BUG
//   shard_map(body, mesh, in_specs=P('tp', None), out_specs=P('tp', None))
//
// The error names one device that receives a block it does not own.

// CHECK: "verdict": "not proven"
// CHECK: "diagnostics": [
// CHECK: "message": "collective_permute moves blocks along 'tp': device 1 receives device 0's block
// CHECK: "reason": "wrong_order"

sdy.mesh @mesh = <["tp"=4]>

func.func @ref(%x: tensor<8x16xf32>) -> tensor<8x16xf32> {
  // expected-note @+1 {{moves blocks of the value that the reference op stablehlo.tanh}}
  %0 = stablehlo.tanh %x : tensor<8x16xf32>
  return %0 : tensor<8x16xf32>
}

func.func @sharded(%x: tensor<8x16xf32>) -> tensor<8x16xf32> attributes {entangle.refines = @ref} {
  %0 = sdy.manual_computation(%x) in_shardings=[<@mesh, [{"tp"}, {}]>] out_shardings=[<@mesh, [{"tp"}, {}]>] manual_axes={"tp"} (%a: tensor<2x16xf32>) {
    %1 = stablehlo.tanh %a : tensor<2x16xf32>
    // expected-error @+1 {{collective_permute moves blocks along 'tp': device 1 receives device 0's block}}
    %2 = "stablehlo.collective_permute"(%1) {source_target_pairs = dense<[[0, 1], [1, 2], [2, 3], [3, 0]]> : tensor<4x2xi64>, channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>} : (tensor<2x16xf32>) -> tensor<2x16xf32>
    sdy.return %2 : tensor<2x16xf32>
  } : (tensor<8x16xf32>) -> tensor<8x16xf32>
  // expected-note @+1 {{result #0 differs from the reference}}
  return %0 : tensor<8x16xf32>
}
