// RUN: not entangle check %s | filecheck %s

// Vocab-parallel log-sum-exp without any max shift, log(psum(sum(exp(x)))), against the
// reference's max-shifted m + log(sum(exp(x - m))): equal in real arithmetic, but exp(x) is
// inf in f32 for x above ~88 where the reference stays finite (issue 16, class 6: overflow
// is not assumed away). It used to be "verified": entangle-normalize rewrote the reference's
// shifted form to the unshifted one. The shift is now dropped only where neither form can
// overflow (x bounded), never for an input.

// CHECK: error: exponential computes exponential(
// CHECK: not proven:
// CHECK-NOT: assumptions:
// CHECK: rule checks: Z3 checked {{[0-9]+}} rule instances: {{[0-9]+}} proved, 0 refuted, 0 inconclusive; {{[1-9][0-9]*}} of them in the reference walk

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
    %zero = stablehlo.constant dense<0.0> : tensor<f32>
    %e = stablehlo.exponential %a : tensor<2x4xf32>
    %s = stablehlo.reduce(%e init: %zero) applies stablehlo.add across dimensions = [1] : (tensor<2x4xf32>, tensor<f32>) -> tensor<2xf32>
    %t = "stablehlo.all_reduce"(%s) ({
      ^bb0(%p: tensor<f32>, %q: tensor<f32>):
        %sum = stablehlo.add %p, %q : tensor<f32>
        stablehlo.return %sum : tensor<f32>
    }) {replica_groups = dense<[[0, 1, 2, 3]]> : tensor<1x4xi64>, channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, use_global_device_ids} : (tensor<2xf32>) -> tensor<2xf32>
    %l = stablehlo.log %t : tensor<2xf32>
    sdy.return %l : tensor<2xf32>
  } : (tensor<2x16xf32>) -> tensor<2xf32>
  return %0 : tensor<2xf32>
}
