// RUN: entangle-opt %s --split-input-file --pass-pipeline='builtin.module(entangle-normalize,entangle-import-shardings,entangle-infer-relations,entangle-check-refinement)' --verify-diagnostics
// RUN: not entangle check %s --json | filecheck %s

// The Megatron row-parallel matmul reduced over only half of the devices: the psum was given
// axis_index_groups, so devices {0, 1} and {2, 3} each add only their two pieces.
//
//   def body(x_l, w_l):
//       return jax.lax.psum(x_l @ w_l, 'tp', axis_index_groups=[[0, 1], [2, 3]])   # BUG
//   shard_map(body, mesh, in_specs=(P(None, 'tp'), P('tp', None)), out_specs=P())
//
// The groups are not the device groups of any set of mesh axes of tp=4.

// CHECK: "verdict": "not proven"
// CHECK: "diagnostics": [
// CHECK: "message": "stablehlo.all_reduce: replica groups {{\[\[}}0, 1], [2, 3{{\]\]}} do not correspond to any mesh axes of tp=4"
// CHECK: "reason": "wrong_groups"

sdy.mesh @mesh = <["tp"=4]>

func.func @ref(%x: tensor<8x16xf32>, %w: tensor<16x8xf32>) -> tensor<8x8xf32> {
  // expected-note @+1 {{corresponds to the reference op stablehlo.dot_general}}
  %0 = stablehlo.dot_general %x, %w, contracting_dims = [1] x [0] : (tensor<8x16xf32>, tensor<16x8xf32>) -> tensor<8x8xf32>
  return %0 : tensor<8x8xf32>
}

func.func @sharded(%x: tensor<8x16xf32>, %w: tensor<16x8xf32>) -> tensor<8x8xf32> attributes {entangle.refines = @ref} {
  %0 = sdy.manual_computation(%x, %w) in_shardings=[<@mesh, [{}, {"tp"}]>, <@mesh, [{"tp"}, {}]>] out_shardings=[<@mesh, [{}, {}]>] manual_axes={"tp"} (%a: tensor<8x4xf32>, %b: tensor<4x8xf32>) {
    %1 = stablehlo.dot_general %a, %b, contracting_dims = [1] x [0] : (tensor<8x4xf32>, tensor<4x8xf32>) -> tensor<8x8xf32>
    // expected-error @+1 {{stablehlo.all_reduce: replica groups [[0, 1], [2, 3]] do not correspond to any mesh axes of tp=4}}
    %2 = "stablehlo.all_reduce"(%1) ({
      ^bb0(%u: tensor<f32>, %v: tensor<f32>):
        %s = stablehlo.add %u, %v : tensor<f32>
        stablehlo.return %s : tensor<f32>
    }) {replica_groups = dense<[[0, 1], [2, 3]]> : tensor<2x2xi64>, channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, use_global_device_ids} : (tensor<8x8xf32>) -> tensor<8x8xf32>
    sdy.return %2 : tensor<8x8xf32>
  } : (tensor<8x16xf32>, tensor<16x8xf32>) -> tensor<8x8xf32>
  return %0 : tensor<8x8xf32>
}
