// RUN: entangle-opt %s --split-input-file --pass-pipeline='builtin.module(entangle-normalize,entangle-import-shardings,entangle-infer-relations,entangle-check-refinement)' --verify-diagnostics
// RUN: not entangle check %s --json | filecheck %s

// Each device slices its rows out of a replicated input by hand, with the block size computed
// for the wrong number of devices:
//
//   def body(x):                                  # x: [16, 8], replicated
//       i = jax.lax.axis_index('tp')
//       rows = jax.lax.dynamic_slice_in_dim(x, i * 2, 4)   # BUG: the block is 16 / 4 = 4 rows
//       return jnp.tanh(rows)
//   shard_map(body, mesh, in_specs=P(), out_specs=P('tp', None))
//
// The error names a device that reads the wrong rows, and the offset formula found vs the one
// expected.

// CHECK: "verdict": "not proven"
// CHECK: "diagnostics": [
// CHECK: "message": "device-dependent offset is wrong along dim 0: device 1 reads [2, 6) instead of its own block [4, 8); found offset = 2 * axis_index('tp'), expected offset = 4 * axis_index('tp')"
// CHECK: "reason": "wrong_offset"

sdy.mesh @mesh = <["tp"=4]>

func.func @ref(%x: tensor<16x8xf32>) -> tensor<16x8xf32> {
  %0 = stablehlo.tanh %x : tensor<16x8xf32>
  return %0 : tensor<16x8xf32>
}

func.func @sharded(%x: tensor<16x8xf32>) -> tensor<16x8xf32> attributes {entangle.refines = @ref} {
  %0 = sdy.manual_computation(%x) in_shardings=[<@mesh, [{}, {}]>] out_shardings=[<@mesh, [{"tp"}, {}]>] manual_axes={"tp"} (%a: tensor<16x8xf32>) {
    %pid = stablehlo.partition_id : tensor<ui32>
    %i = stablehlo.convert %pid : (tensor<ui32>) -> tensor<i32>
    %c2 = stablehlo.constant dense<2> : tensor<i32>
    %off = stablehlo.multiply %i, %c2 : tensor<i32>
    %c0 = stablehlo.constant dense<0> : tensor<i32>
    // expected-error @+1 {{device-dependent offset is wrong along dim 0: device 1 reads [2, 6) instead of its own block [4, 8); found offset = 2 * axis_index('tp'), expected offset = 4 * axis_index('tp')}}
    %1 = stablehlo.dynamic_slice %a, %off, %c0, sizes = [4, 8] : (tensor<16x8xf32>, tensor<i32>, tensor<i32>) -> tensor<4x8xf32>
    %2 = stablehlo.tanh %1 : tensor<4x8xf32>
    sdy.return %2 : tensor<4x8xf32>
  } : (tensor<16x8xf32>) -> tensor<16x8xf32>
  return %0 : tensor<16x8xf32>
}
