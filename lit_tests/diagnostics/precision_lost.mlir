// RUN: entangle-opt %s --split-input-file --pass-pipeline='builtin.module(entangle-normalize,entangle-import-shardings,entangle-infer-relations,entangle-check-refinement)' --verify-diagnostics
// RUN: not entangle check %s --json | filecheck %s

// A Megatron row-parallel matmul whose f32 partial products are rounded to bf16 before the
// psum (communication in bf16), against a reference that computes the matmul in f32:
//
//   def body(x_l, w_l):                     # x_l: [8, 16 / tp], w_l: [16 / tp, 8]
//       return jax.lax.psum((x_l @ w_l).astype(jnp.bfloat16), 'tp').astype(jnp.float32)  # BUG
//   shard_map(body, mesh, in_specs=(P(None, 'tp'), P('tp', None)), out_specs=P())
//
// Each device's partial sum is rounded to bf16 and the sum over devices is taken in bf16: a
// value computed at lower precision than the reference's. The error is at the convert.

// CHECK: "verdict": "not proven"
// CHECK: "diagnostics": [
// CHECK: "message": "precision lost: convert f32 -> bf16 rounds each device's partial sum over 'tp' to bf16, so the sum over devices is computed in bf16 where the reference computes it in f32"
// CHECK: "reason": "precision_lost"

sdy.mesh @mesh = <["tp"=4]>

func.func @ref(%x: tensor<8x16xf32>, %w: tensor<16x8xf32>) -> tensor<8x8xf32> {
  // expected-note @+1 {{corresponds to the reference op stablehlo.dot_general}}
  %y = stablehlo.dot_general %x, %w, contracting_dims = [1] x [0] : (tensor<8x16xf32>, tensor<16x8xf32>) -> tensor<8x8xf32>
  return %y : tensor<8x8xf32>
}

func.func @sharded(%x: tensor<8x16xf32>, %w: tensor<16x8xf32>) -> tensor<8x8xf32> attributes {entangle.refines = @ref} {
  %0 = sdy.manual_computation(%x, %w) in_shardings=[<@mesh, [{}, {"tp"}]>, <@mesh, [{"tp"}, {}]>] out_shardings=[<@mesh, [{}, {}]>] manual_axes={"tp"} (%a: tensor<8x4xf32>, %b: tensor<4x8xf32>) {
    %p = stablehlo.dot_general %a, %b, contracting_dims = [1] x [0] : (tensor<8x4xf32>, tensor<4x8xf32>) -> tensor<8x8xf32>
    // expected-error @+1 {{precision lost: convert f32 -> bf16 rounds each device's partial sum over 'tp' to bf16, so the sum over devices is computed in bf16 where the reference computes it in f32}}
    %h = stablehlo.convert %p : (tensor<8x8xf32>) -> tensor<8x8xbf16>
    %r = "stablehlo.all_reduce"(%h) ({
      ^bb0(%u: tensor<bf16>, %v: tensor<bf16>):
        %t = stablehlo.add %u, %v : tensor<bf16>
        stablehlo.return %t : tensor<bf16>
    }) {replica_groups = dense<[[0, 1, 2, 3]]> : tensor<1x4xi64>, channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, use_global_device_ids} : (tensor<8x8xbf16>) -> tensor<8x8xbf16>
    %f = stablehlo.convert %r : (tensor<8x8xbf16>) -> tensor<8x8xf32>
    sdy.return %f : tensor<8x8xf32>
  } : (tensor<8x16xf32>, tensor<16x8xf32>) -> tensor<8x8xf32>
  return %0 : tensor<8x8xf32>
}
