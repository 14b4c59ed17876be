// RUN: entangle-opt %s --split-input-file --pass-pipeline='builtin.module(entangle-normalize,entangle-import-shardings,entangle-infer-relations,entangle-check-refinement)' --verify-diagnostics
// RUN: not entangle check %s --json | filecheck %s

// The Megatron row-parallel matmul without its psum. x is split along its columns and w along
// its rows, so each device's x_l @ w_l is a partial sum of x @ w; the body returns it as it is:
//
//   def body(x_l, w_l):
//       return x_l @ w_l                    # BUG: missing jax.lax.psum(..., 'tp')
//   shard_map(body, mesh, in_specs=(P(None, 'tp'), P('tp', None)), out_specs=P())
//
// The error is at the matmul that made the partial sum; the notes show where it leaves
// shard_map and the reference matmul it stands for.

// CHECK: "verdict": "not proven"
// CHECK: "diagnostics": [
// CHECK: "message": "value is still a partial sum over 'tp' when it leaves shard_map (result #0): missing all_reduce/psum"
// CHECK: "reason": "missing_reduction"

sdy.mesh @mesh = <["tp"=4]>

func.func @ref(%x: tensor<8x16xf32>, %w: tensor<16x8xf32>) -> tensor<8x8xf32> {
  // expected-note @+1 {{corresponds to the reference op stablehlo.dot_general}}
  %0 = stablehlo.dot_general %x, %w, contracting_dims = [1] x [0] : (tensor<8x16xf32>, tensor<16x8xf32>) -> tensor<8x8xf32>
  return %0 : tensor<8x8xf32>
}

func.func @sharded(%x: tensor<8x16xf32>, %w: tensor<16x8xf32>) -> tensor<8x8xf32> attributes {entangle.refines = @ref} {
  // expected-note @+1 {{the partial sum leaves shard_map here}}
  %0 = sdy.manual_computation(%x, %w) in_shardings=[<@mesh, [{}, {"tp"}]>, <@mesh, [{"tp"}, {}]>] out_shardings=[<@mesh, [{}, {}]>] manual_axes={"tp"} (%a: tensor<8x4xf32>, %b: tensor<4x8xf32>) {
    // expected-error @+1 {{value is still a partial sum over 'tp' when it leaves shard_map (result #0): missing all_reduce/psum}}
    %1 = stablehlo.dot_general %a, %b, contracting_dims = [1] x [0] : (tensor<8x4xf32>, tensor<4x8xf32>) -> tensor<8x8xf32>
    sdy.return %1 : tensor<8x8xf32>
  } : (tensor<8x16xf32>, tensor<16x8xf32>) -> tensor<8x8xf32>
  return %0 : tensor<8x8xf32>
}
