// RUN: entangle-opt %s --entangle-normalize --entangle-import-shardings --entangle-infer-relations | filecheck %s

sdy.mesh @mesh = <["tp"=4]>

// jnp.take's bounds check: an `and` reduction over the (unsplit) index-vector dim keeps the
// layout of the other dims; over a split dim it is a partial min of booleans (and) over its
// axes, which an all_reduce with `and` (or jax's pmin) completes.
// CHECK-LABEL: func.func @logical_and
func.func @logical_and(%x: tensor<8x4xi1>) -> tensor<8xi1> {
  %0 = sdy.manual_computation(%x) in_shardings=[<@mesh, [{"tp"}, {}]>] out_shardings=[<@mesh, [{"tp"}]>] manual_axes={"tp"} (%a: tensor<2x4xi1>) {
    %t = stablehlo.constant dense<true> : tensor<i1>
    // CHECK: stablehlo.reduce{{.*}}entangle.relation = "tile [{tp}] : reduce_and(%arg0)"
    %r = stablehlo.reduce(%a init: %t) applies stablehlo.and across dimensions = [1] : (tensor<2x4xi1>, tensor<i1>) -> tensor<2xi1>
    // CHECK: stablehlo.reduce{{.*}}entangle.relation = "partial min {tp} : reduce_and(%arg0)"
    %s = stablehlo.reduce(%a init: %t) applies stablehlo.and across dimensions = [0] : (tensor<2x4xi1>, tensor<i1>) -> tensor<4xi1>
    sdy.return %r : tensor<2xi1>
  } : (tensor<8x4xi1>) -> tensor<8xi1>
  return %0 : tensor<8xi1>
}
