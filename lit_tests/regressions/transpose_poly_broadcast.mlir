// RUN: entangle-opt %s --entangle-normalize --entangle-import-shardings --entangle-infer-relations | filecheck %s

// Regression (fixed): a poly dim that went through a transpose cannot be widened.
// `broadcast_in_dim %v dims=[1] -> 4x8` has a poly dim 0 (jax builds it at the local shape);
// the transpose rule moves the poly flag to dim 1, but when the multiply unifies dim 1 with its
// partner (split over dp, global 8), `rules/common.resize` only knows splat/broadcast/lin/
// elementwise terms, not transpose(broadcast(...)), and the multiply becomes
//   opaque: multiply: cannot widen dim 1 of a broadcast value
// (category "internal"). transpose(broadcast(v)) is constant along that dim, so it widens fine.

sdy.mesh @mesh = <["dp"=2, "tp"=4]>

// CHECK-LABEL: func.func @transposed_broadcast
func.func @transposed_broadcast(%x: tensor<8x16xf32>, %v: tensor<8xf32>) -> tensor<8x16xf32> {
  %0 = sdy.manual_computation(%x, %v) in_shardings=[<@mesh, [{}, {"dp"}]>, <@mesh, [{}]>] out_shardings=[<@mesh, [{}, {"dp"}]>] manual_axes={"dp", "tp"} (%a: tensor<8x8xf32>, %vl: tensor<8xf32>) {
    %bv = stablehlo.broadcast_in_dim %vl, dims = [1] : (tensor<8xf32>) -> tensor<8x8xf32>
    %bt = stablehlo.transpose %bv, dims = [1, 0] : (tensor<8x8xf32>) -> tensor<8x8xf32>
    // The term may print in any canonical form; the layout is what matters.
    // CHECK: stablehlo.multiply %{{.*}}entangle.relation = "tile [{}, {dp}] : {{.*}}%arg0{{.*}}%arg1{{.*}}"
    %1 = stablehlo.multiply %a, %bt : tensor<8x8xf32>
    sdy.return %1 : tensor<8x8xf32>
  } : (tensor<8x16xf32>, tensor<8xf32>) -> tensor<8x16xf32>
  return %0 : tensor<8x16xf32>
}
