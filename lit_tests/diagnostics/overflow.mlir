// RUN: entangle-opt %s --split-input-file --pass-pipeline='builtin.module(entangle-normalize,entangle-import-shardings,entangle-infer-relations,entangle-check-refinement)' --verify-diagnostics
// RUN: not entangle check %s --json | filecheck %s
// RUN: entangle check %s --assume-no-overflow | filecheck %s --check-prefix=ASSUMED

// Flash-style attention on each device (queries split over tp, keys and values taken two
// blocks at a time): an online softmax, correct in real arithmetic.
//
//   def body(q, k, v):                                    # q: [4 / tp, 4], k, v: [4, 4]
//       s0 = q @ k[:2].T
//       m0 = jnp.max(s0, axis=-1)                         # the first block's running max
//       p0 = jnp.exp(s0 - m0[:, None])
//       s1 = q @ k[2:].T
//       m1 = jnp.maximum(m0, jnp.max(s1, axis=-1))
//       ...                                               # rescale by exp(m0 - m1), add
//       return o / l[:, None]
//   reference: jax.nn.softmax(q @ k.T, axis=-1) @ v
//
// But a score q . k of finite inputs can overflow float32: where a whole row of the first
// block's scores is -inf, m0 is -inf and exp(-inf - -inf) is NaN, where the softmax over all
// the keys is finite. The fold of the online softmax into that softmax is refused, and the
// error says so at the first block's running max; the walk's own error follows. Under
// `--assume-no-overflow` the program is proven and the assumption listed.

// CHECK: "verdict": "not proven"
// CHECK: "diagnostics": [
// CHECK: "message": "the online softmax's running max may be -inf where a whole block of scores overflows (a sum or product of finite inputs, such as q . k, can overflow float32)
// CHECK: "reason": "overflow"

// ASSUMED: verified: the sharded program refines the reference on mesh tp=2
// ASSUMED: assumptions:
// ASSUMED: - no intermediate overflow: sums and products of finite values computed by the programs stay finite (--assume-no-overflow)

sdy.mesh @mesh = <["tp"=2]>

func.func @ref(%q: tensor<4x4xf32>, %k: tensor<4x4xf32>, %v: tensor<4x4xf32>) -> tensor<4x4xf32> {
  // expected-note @+1 {{corresponds to the reference op stablehlo.transpose}}
  %0 = stablehlo.transpose %k, dims = [1, 0] : (tensor<4x4xf32>) -> tensor<4x4xf32>
  %1 = stablehlo.dot_general %q, %0, contracting_dims = [1] x [0] : (tensor<4x4xf32>, tensor<4x4xf32>) -> tensor<4x4xf32>
  %ninf = stablehlo.constant dense<0xFF800000> : tensor<f32>
  %2 = stablehlo.reduce(%1 init: %ninf) applies stablehlo.maximum across dimensions = [1] : (tensor<4x4xf32>, tensor<f32>) -> tensor<4xf32>
  %3 = stablehlo.broadcast_in_dim %2, dims = [0] : (tensor<4xf32>) -> tensor<4x4xf32>
  %4 = stablehlo.subtract %1, %3 : tensor<4x4xf32>
  %5 = stablehlo.exponential %4 : tensor<4x4xf32>
  %zero = stablehlo.constant dense<0.000000e+00> : tensor<f32>
  %6 = stablehlo.reduce(%5 init: %zero) applies stablehlo.add across dimensions = [1] : (tensor<4x4xf32>, tensor<f32>) -> tensor<4xf32>
  %7 = stablehlo.broadcast_in_dim %6, dims = [0] : (tensor<4xf32>) -> tensor<4x4xf32>
  %8 = stablehlo.divide %5, %7 : tensor<4x4xf32>
  %9 = stablehlo.dot_general %8, %v, contracting_dims = [1] x [0] : (tensor<4x4xf32>, tensor<4x4xf32>) -> tensor<4x4xf32>
  return %9 : tensor<4x4xf32>
}

func.func @sharded(%q: tensor<4x4xf32>, %k: tensor<4x4xf32>, %v: tensor<4x4xf32>) -> tensor<4x4xf32> attributes {entangle.refines = @ref} {
  %0 = sdy.manual_computation(%q, %k, %v) in_shardings=[<@mesh, [{"tp"}, {}]>, <@mesh, [{}, {}]>, <@mesh, [{}, {}]>] out_shardings=[<@mesh, [{"tp"}, {}]>] manual_axes={"tp"} (%ql: tensor<2x4xf32>, %kl: tensor<4x4xf32>, %vl: tensor<4x4xf32>) {
    // expected-error @+1 {{slice computes slice(%arg1), which the reference never computes}}
    %1 = stablehlo.slice %kl [0:2, 0:4] : (tensor<4x4xf32>) -> tensor<2x4xf32>
    %2 = stablehlo.transpose %1, dims = [1, 0] : (tensor<2x4xf32>) -> tensor<4x2xf32>
    %3 = stablehlo.dot_general %ql, %2, contracting_dims = [1] x [0] : (tensor<2x4xf32>, tensor<4x2xf32>) -> tensor<2x2xf32>
    %ninf = stablehlo.constant dense<0xFF800000> : tensor<f32>
    // expected-error @+1 {{the online softmax's running max may be -inf where a whole block of scores overflows (a sum or product of finite inputs, such as q . k, can overflow float32): the program is NaN there while the softmax over all the blocks is finite; pass --assume-no-overflow to assume no intermediate overflow}}
    %4 = stablehlo.reduce(%3 init: %ninf) applies stablehlo.maximum across dimensions = [1] : (tensor<2x2xf32>, tensor<f32>) -> tensor<2xf32>
    %5 = stablehlo.broadcast_in_dim %4, dims = [0] : (tensor<2xf32>) -> tensor<2x2xf32>
    %6 = stablehlo.subtract %3, %5 : tensor<2x2xf32>
    %7 = stablehlo.exponential %6 : tensor<2x2xf32>
    %zero = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    %8 = stablehlo.reduce(%7 init: %zero) applies stablehlo.add across dimensions = [1] : (tensor<2x2xf32>, tensor<f32>) -> tensor<2xf32>
    %9 = stablehlo.slice %vl [0:2, 0:4] : (tensor<4x4xf32>) -> tensor<2x4xf32>
    %10 = stablehlo.dot_general %7, %9, contracting_dims = [1] x [0] : (tensor<2x2xf32>, tensor<2x4xf32>) -> tensor<2x4xf32>
    %11 = stablehlo.slice %kl [2:4, 0:4] : (tensor<4x4xf32>) -> tensor<2x4xf32>
    %12 = stablehlo.transpose %11, dims = [1, 0] : (tensor<2x4xf32>) -> tensor<4x2xf32>
    %13 = stablehlo.dot_general %ql, %12, contracting_dims = [1] x [0] : (tensor<2x4xf32>, tensor<4x2xf32>) -> tensor<2x2xf32>
    %14 = stablehlo.reduce(%13 init: %ninf) applies stablehlo.maximum across dimensions = [1] : (tensor<2x2xf32>, tensor<f32>) -> tensor<2xf32>
    %15 = stablehlo.maximum %4, %14 : tensor<2xf32>
    %16 = stablehlo.subtract %4, %15 : tensor<2xf32>
    %17 = stablehlo.exponential %16 : tensor<2xf32>
    %18 = stablehlo.broadcast_in_dim %15, dims = [0] : (tensor<2xf32>) -> tensor<2x2xf32>
    %19 = stablehlo.subtract %13, %18 : tensor<2x2xf32>
    %20 = stablehlo.exponential %19 : tensor<2x2xf32>
    %21 = stablehlo.multiply %8, %17 : tensor<2xf32>
    %22 = stablehlo.reduce(%20 init: %zero) applies stablehlo.add across dimensions = [1] : (tensor<2x2xf32>, tensor<f32>) -> tensor<2xf32>
    %23 = stablehlo.add %21, %22 : tensor<2xf32>
    %24 = stablehlo.broadcast_in_dim %17, dims = [0] : (tensor<2xf32>) -> tensor<2x4xf32>
    %25 = stablehlo.multiply %10, %24 : tensor<2x4xf32>
    %26 = stablehlo.slice %vl [2:4, 0:4] : (tensor<4x4xf32>) -> tensor<2x4xf32>
    %27 = stablehlo.dot_general %20, %26, contracting_dims = [1] x [0] : (tensor<2x2xf32>, tensor<2x4xf32>) -> tensor<2x4xf32>
    %28 = stablehlo.add %25, %27 : tensor<2x4xf32>
    %29 = stablehlo.broadcast_in_dim %23, dims = [0] : (tensor<2xf32>) -> tensor<2x4xf32>
    %30 = stablehlo.divide %28, %29 : tensor<2x4xf32>
    sdy.return %30 : tensor<2x4xf32>
  } : (tensor<4x4xf32>, tensor<4x4xf32>, tensor<4x4xf32>) -> tensor<4x4xf32>
  // expected-note @+1 {{result #0 differs from the reference}}
  return %0 : tensor<4x4xf32>
}
