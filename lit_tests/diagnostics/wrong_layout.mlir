// RUN: entangle-opt %s --split-input-file --pass-pipeline='builtin.module(entangle-normalize,entangle-import-shardings,entangle-infer-relations,entangle-check-refinement)' --verify-diagnostics
// RUN: not entangle check %s --json | filecheck %s

// On a dp=2 x tp=2 mesh the rows are split over dp, but out_specs names tp:
//
//   def body(x_l):                                # x_l: [8 / dp, 16]
//       return jnp.tanh(x_l)
//   shard_map(body, mesh, in_specs=P('dp', None), out_specs=P('tp', None))  # BUG: P('dp', None)
//
// Both specs give the same local shape, so jax accepts it, but the output would be assembled
// from the wrong devices' blocks. The error is at the shard_map the value leaves.

// CHECK: "verdict": "not proven"
// CHECK: "diagnostics": [
// CHECK: "message": "result #0 is split along dim 0 over 'dp' but out_specs declares it split along dim 0 over 'tp'"
// CHECK: "reason": "wrong_layout"

sdy.mesh @mesh = <["dp"=2, "tp"=2]>

func.func @ref(%x: tensor<8x16xf32>) -> tensor<8x16xf32> {
  // expected-note @+1 {{corresponds to the reference op stablehlo.tanh}}
  %0 = stablehlo.tanh %x : tensor<8x16xf32>
  return %0 : tensor<8x16xf32>
}

func.func @sharded(%x: tensor<8x16xf32>) -> tensor<8x16xf32> attributes {entangle.refines = @ref} {
  // expected-error @+1 {{result #0 is split along dim 0 over 'dp' but out_specs declares it split along dim 0 over 'tp'}}
  %0 = sdy.manual_computation(%x) in_shardings=[<@mesh, [{"dp"}, {}]>] out_shardings=[<@mesh, [{"tp"}, {}]>] manual_axes={"dp", "tp"} (%a: tensor<4x16xf32>) {
    %1 = stablehlo.tanh %a : tensor<4x16xf32>
    sdy.return %1 : tensor<4x16xf32>
  } : (tensor<8x16xf32>) -> tensor<8x16xf32>
  return %0 : tensor<8x16xf32>
}
