// RUN: not entangle check %s | filecheck %s

// Vocab-parallel log-sum-exp where each shard stabilises with its own max and rescales by
// exp(m) before the psum (no pmax), against a reference that subtracts the global max:
// log(psum(sum(exp(x - m_local)) * exp(m_local))) = log(sum(exp(x - m))) + m in real
// arithmetic, but exp(m_local) overflows in f32 for x above ~88 where the reference stays
// finite (issue 16, class 6). entangle-normalize no longer drops a max shift of an unbounded
// value (entangle_mlir/normalize/idioms.py `_unshifted_exact`), so the shards' own maxes meet the
// reference's global max as a partial max that was never all-reduced.

// CHECK: error: subtract combines a partial max over 'tp'
// CHECK: not proven:

sdy.mesh @mesh = <["tp"=4]>

func.func @ref(%x: tensor<2x16xf32>) -> tensor<2xf32> {
  %ninf = stablehlo.constant dense<0xFF800000> : tensor<f32>
  %zero = stablehlo.constant dense<0.0> : tensor<f32>
  %m = stablehlo.reduce(%x init: %ninf) applies stablehlo.maximum across dimensions = [1] : (tensor<2x16xf32>, tensor<f32>) -> tensor<2xf32>
  %mb = stablehlo.broadcast_in_dim %m, dims = [0] : (tensor<2xf32>) -> tensor<2x16xf32>
  %d = stablehlo.subtract %x, %mb : tensor<2x16xf32>
  %e = stablehlo.exponential %d : tensor<2x16xf32>
  %s = stablehlo.reduce(%e init: %zero) applies stablehlo.add across dimensions = [1] : (tensor<2x16xf32>, tensor<f32>) -> tensor<2xf32>
  %l = stablehlo.log %s : tensor<2xf32>
  %r = stablehlo.add %l, %m : tensor<2xf32>
  return %r : tensor<2xf32>
}

func.func @sharded(%x: tensor<2x16xf32>) -> tensor<2xf32> attributes {entangle.refines = @ref} {
  %0 = sdy.manual_computation(%x) in_shardings=[<@mesh, [{}, {"tp"}]>] out_shardings=[<@mesh, [{}]>] manual_axes={"tp"} (%a: tensor<2x4xf32>) {
    %ninf = stablehlo.constant dense<0xFF800000> : tensor<f32>
    %zero = stablehlo.constant dense<0.0> : tensor<f32>
    %m = stablehlo.reduce(%a init: %ninf) applies stablehlo.maximum across dimensions = [1] : (tensor<2x4xf32>, tensor<f32>) -> tensor<2xf32>
    %mb = stablehlo.broadcast_in_dim %m, dims = [0] : (tensor<2xf32>) -> tensor<2x4xf32>
    %d = stablehlo.subtract %a, %mb : tensor<2x4xf32>
    %e = stablehlo.exponential %d : tensor<2x4xf32>
    %s = stablehlo.reduce(%e init: %zero) applies stablehlo.add across dimensions = [1] : (tensor<2x4xf32>, tensor<f32>) -> tensor<2xf32>
    %em = stablehlo.exponential %m : tensor<2xf32>
    %p = stablehlo.multiply %s, %em : tensor<2xf32>
    %t = "stablehlo.all_reduce"(%p) ({
      ^bb0(%u: tensor<f32>, %v: tensor<f32>):
        %z = stablehlo.add %u, %v : tensor<f32>
        stablehlo.return %z : tensor<f32>
    }) {replica_groups = dense<[[0, 1, 2, 3]]> : tensor<1x4xi64>, channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, use_global_device_ids} : (tensor<2xf32>) -> tensor<2xf32>
    %l = stablehlo.log %t : tensor<2xf32>
    sdy.return %l : tensor<2xf32>
  } : (tensor<2x16xf32>) -> tensor<2xf32>
  return %0 : tensor<2xf32>
}
