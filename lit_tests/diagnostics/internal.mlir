// RUN: entangle-opt %s --split-input-file --pass-pipeline='builtin.module(entangle-normalize,entangle-import-shardings,entangle-infer-relations,entangle-check-refinement)' --verify-diagnostics
// RUN: not entangle check %s --json | filecheck %s

// A correct program the analysis cannot finish. The body adds a per-row bias built at the
// LOCAL shape (as jax builds broadcasts inside shard_map): a scalar broadcast to the 2 local
// rows, exp'd, then broadcast along the columns. The bias is the same on every row, so it is
// the reference's bias, but rebuilding the global value would mean widening a broadcast of
// exp(broadcast(t)) along dim 0, which the walk does not know how to do. The value becomes
// opaque with an "internal limitation" reason: not proven, never a wrong "verified".
// On 128 devices the general tier does not run either (it expands at most 64 devices; on 4,
// lit_tests/general/widened_broadcast.mlir, it proves the program).
//
//   def body(x_l, t):                             # x_l: [256 / tp, 16], t: scalar
//       bias = jnp.exp(jnp.broadcast_to(t, (x_l.shape[0],)))
//       return x_l + bias[:, None]
//   shard_map(body, mesh, in_specs=(P('tp', None), P()), out_specs=P('tp', None))

// CHECK: "verdict": "not proven"
// CHECK: "diagnostics": [
// CHECK: "message": "add: cannot widen dim 0 of a broadcast value"
// CHECK: "reason": "internal"
// CHECK: "general_tier": {
// CHECK: "reason": "general tier limited to 64 devices (the mesh has 128)"

sdy.mesh @mesh = <["tp"=128]>

func.func @ref(%x: tensor<256x16xf32>, %t: tensor<f32>) -> tensor<256x16xf32> {
  %b = stablehlo.broadcast_in_dim %t, dims = [] : (tensor<f32>) -> tensor<256xf32>
  %e = stablehlo.exponential %b : tensor<256xf32>
  %c = stablehlo.broadcast_in_dim %e, dims = [0] : (tensor<256xf32>) -> tensor<256x16xf32>
  %0 = stablehlo.add %x, %c : tensor<256x16xf32>
  return %0 : tensor<256x16xf32>
}

func.func @sharded(%x: tensor<256x16xf32>, %t: tensor<f32>) -> tensor<256x16xf32> attributes {entangle.refines = @ref} {
  %0 = sdy.manual_computation(%x, %t) in_shardings=[<@mesh, [{"tp"}, {}]>, <@mesh, []>] out_shardings=[<@mesh, [{"tp"}, {}]>] manual_axes={"tp"} (%a: tensor<2x16xf32>, %s: tensor<f32>) {
    %b = stablehlo.broadcast_in_dim %s, dims = [] : (tensor<f32>) -> tensor<2xf32>
    %e = stablehlo.exponential %b : tensor<2xf32>
    %c = stablehlo.broadcast_in_dim %e, dims = [0] : (tensor<2xf32>) -> tensor<2x16xf32>
    // expected-error @+1 {{add: cannot widen dim 0 of a broadcast value}}
    %1 = stablehlo.add %a, %c : tensor<2x16xf32>
    sdy.return %1 : tensor<2x16xf32>
  } : (tensor<256x16xf32>, tensor<f32>) -> tensor<256x16xf32>
  return %0 : tensor<256x16xf32>
}
