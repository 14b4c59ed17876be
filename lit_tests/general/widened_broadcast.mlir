// RUN: entangle check %s | filecheck %s
// RUN: not entangle check %s --no-general-tier | filecheck %s --check-prefix=LAYOUT

// A correct program the layout tier cannot finish (lit_tests/diagnostics/internal.mlir on 4
// devices): the bias is built at the LOCAL shape, exp'd, then broadcast along the columns,
// and rebuilding the global value would mean widening a broadcast of exp(broadcast(t)). The
// general tier expands the program per device: on each one the bias is exp of the broadcast
// scalar, the same term as the reference's rows, so the outputs meet without Z3.
//
//   def body(x_l, t):                             # x_l: [8 / tp, 16], t: scalar
//       bias = jnp.exp(jnp.broadcast_to(t, (x_l.shape[0],)))
//       return x_l + bias[:, None]
//   shard_map(body, mesh, in_specs=(P('tp', None), P()), out_specs=P('tp', None))

// CHECK: verified: the sharded program refines the reference on mesh tp=4
// CHECK: note: proven by per-device expansion on 4 devices (general tier)

// LAYOUT: error: add: cannot widen dim 0 of a broadcast value
// LAYOUT: not proven

sdy.mesh @mesh = <["tp"=4]>

func.func @ref(%x: tensor<8x16xf32>, %t: tensor<f32>) -> tensor<8x16xf32> {
  %b = stablehlo.broadcast_in_dim %t, dims = [] : (tensor<f32>) -> tensor<8xf32>
  %e = stablehlo.exponential %b : tensor<8xf32>
  %c = stablehlo.broadcast_in_dim %e, dims = [0] : (tensor<8xf32>) -> tensor<8x16xf32>
  %0 = stablehlo.add %x, %c : tensor<8x16xf32>
  return %0 : tensor<8x16xf32>
}

func.func @sharded(%x: tensor<8x16xf32>, %t: tensor<f32>) -> tensor<8x16xf32> attributes {entangle.refines = @ref} {
  %0 = sdy.manual_computation(%x, %t) in_shardings=[<@mesh, [{"tp"}, {}]>, <@mesh, []>] out_shardings=[<@mesh, [{"tp"}, {}]>] manual_axes={"tp"} (%a: tensor<2x16xf32>, %s: tensor<f32>) {
    %b = stablehlo.broadcast_in_dim %s, dims = [] : (tensor<f32>) -> tensor<2xf32>
    %e = stablehlo.exponential %b : tensor<2xf32>
    %c = stablehlo.broadcast_in_dim %e, dims = [0] : (tensor<2xf32>) -> tensor<2x16xf32>
    %1 = stablehlo.add %a, %c : tensor<2x16xf32>
    sdy.return %1 : tensor<2x16xf32>
  } : (tensor<8x16xf32>, tensor<f32>) -> tensor<8x16xf32>
  return %0 : tensor<8x16xf32>
}
