// RUN: entangle-opt %s --split-input-file --pass-pipeline='builtin.module(entangle-normalize,entangle-import-shardings,entangle-infer-relations,entangle-check-refinement,entangle-verify-rules)' --verify-diagnostics
// RUN: not entangle check %s --json | filecheck %s

// A count computed from float values: each device sums its shard, truncates the sum to int32
// and the integer pieces are psum'd. Truncation does not commute with the sum (0.5 + 0.5
// truncates to 0 piece by piece, to 1 as a whole), but the convert rule keeps the partial sum
// across a float -> int convert, so the walk alone would call this program proven. The Z3
// check of that rule instance (entangle-verify-rules, on by default in `entangle check`)
// refutes it, and the verdict is withdrawn.
//
//   def ref(x):  return jnp.sum(x).astype(jnp.int32)
//   def body(x_l):                                # x_l: [8 / tp]
//       return jax.lax.psum(jnp.sum(x_l).astype(jnp.int32), 'tp')   # BUG: convert after psum
//   shard_map(body, mesh, in_specs=P('tp'), out_specs=P())
//
// "refuted" always means a rule claimed something false: this example stops producing it when
// the convert rule refuses float -> int converts of partial sums (it should then report
// nonlinear_partial).

// CHECK: "verdict": "not proven"
// CHECK: "diagnostics": [
// CHECK: "message": "proof of the rule instance for stablehlo.convert was refuted by Z3 (a rule is wrong: please report this)"
// CHECK: "reason": "refuted"
// CHECK: "rule_check_mode": "Z3 checked 4 rule instances: 3 proved, 1 refuted, 0 inconclusive"

sdy.mesh @mesh = <["tp"=4]>

func.func @ref(%x: tensor<8xf32>) -> tensor<i32> {
  %c0 = stablehlo.constant dense<0.0> : tensor<f32>
  %s = stablehlo.reduce(%x init: %c0) applies stablehlo.add across dimensions = [0] : (tensor<8xf32>, tensor<f32>) -> tensor<f32>
  %i = stablehlo.convert %s : (tensor<f32>) -> tensor<i32>
  return %i : tensor<i32>
}

func.func @sharded(%x: tensor<8xf32>) -> tensor<i32> attributes {entangle.refines = @ref} {
  %0 = sdy.manual_computation(%x) in_shardings=[<@mesh, [{"tp"}]>] out_shardings=[<@mesh, []>] manual_axes={"tp"} (%a: tensor<2xf32>) {
    %c0 = stablehlo.constant dense<0.0> : tensor<f32>
    %s = stablehlo.reduce(%a init: %c0) applies stablehlo.add across dimensions = [0] : (tensor<2xf32>, tensor<f32>) -> tensor<f32>
    // expected-error @+1 {{proof of the rule instance for stablehlo.convert was refuted by Z3 (a rule is wrong: please report this)}}
    %i = stablehlo.convert %s : (tensor<f32>) -> tensor<i32>
    %r = "stablehlo.all_reduce"(%i) ({
      ^bb0(%u: tensor<i32>, %v: tensor<i32>):
        %t = stablehlo.add %u, %v : tensor<i32>
        stablehlo.return %t : tensor<i32>
    }) {replica_groups = dense<[[0, 1, 2, 3]]> : tensor<1x4xi64>, channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, use_global_device_ids} : (tensor<i32>) -> tensor<i32>
    sdy.return %r : tensor<i32>
  } : (tensor<8xf32>) -> tensor<i32>
  return %0 : tensor<i32>
}
