// RUN: entangle-opt %s --split-input-file --pass-pipeline='builtin.module(entangle-normalize,entangle-import-shardings,entangle-infer-relations,entangle-check-refinement)' --verify-diagnostics
// RUN: not entangle check %s --json | filecheck %s

// On a dp=2 x tp=2 mesh, x is split over dp (rows) and tp (columns), w over tp (rows). Each
// device's x_l @ w_l is its dp block of a partial sum over tp, but the psum names the wrong
// axis:
//
//   def body(x_l, w_l):
//       return jax.lax.psum(x_l @ w_l, 'dp')      # BUG: the partial sum is over 'tp'
//   shard_map(body, mesh, in_specs=(P('dp', 'tp'), P('tp', None)), out_specs=P('dp', None))
//
// dp splits the rows, so summing over dp adds different rows together.

// CHECK: "verdict": "not proven"
// CHECK: "diagnostics": [
// CHECK: "message": "all_reduce sums over 'dp' of a value split over 'dp': it combines different blocks"
// CHECK: "reason": "wrong_axis"

sdy.mesh @mesh = <["dp"=2, "tp"=2]>

func.func @ref(%x: tensor<8x16xf32>, %w: tensor<16x8xf32>) -> tensor<8x8xf32> {
  // expected-note @+1 {{corresponds to the reference op stablehlo.dot_general}}
  %0 = stablehlo.dot_general %x, %w, contracting_dims = [1] x [0] : (tensor<8x16xf32>, tensor<16x8xf32>) -> tensor<8x8xf32>
  return %0 : tensor<8x8xf32>
}

func.func @sharded(%x: tensor<8x16xf32>, %w: tensor<16x8xf32>) -> tensor<8x8xf32> attributes {entangle.refines = @ref} {
  %0 = sdy.manual_computation(%x, %w) in_shardings=[<@mesh, [{"dp"}, {"tp"}]>, <@mesh, [{"tp"}, {}]>] out_shardings=[<@mesh, [{"dp"}, {}]>] manual_axes={"dp", "tp"} (%a: tensor<4x8xf32>, %b: tensor<8x8xf32>) {
    %1 = stablehlo.dot_general %a, %b, contracting_dims = [1] x [0] : (tensor<4x8xf32>, tensor<8x8xf32>) -> tensor<4x8xf32>
    // The replica groups [[0, 2], [1, 3]] are the devices that differ only in their dp index.
    // expected-error @+1 {{all_reduce sums over 'dp' of a value split over 'dp': it combines different blocks}}
    %2 = "stablehlo.all_reduce"(%1) ({
      ^bb0(%u: tensor<f32>, %v: tensor<f32>):
        %s = stablehlo.add %u, %v : tensor<f32>
        stablehlo.return %s : tensor<f32>
    }) {replica_groups = dense<[[0, 2], [1, 3]]> : tensor<2x2xi64>, channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, use_global_device_ids} : (tensor<4x8xf32>) -> tensor<4x8xf32>
    sdy.return %2 : tensor<4x8xf32>
  } : (tensor<8x16xf32>, tensor<16x8xf32>) -> tensor<8x8xf32>
  return %0 : tensor<8x8xf32>
}
