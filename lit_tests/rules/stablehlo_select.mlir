// RUN: entangle-opt %s --split-input-file --entangle-normalize --entangle-import-shardings --entangle-infer-relations | filecheck %s

// stablehlo.select (elementwise rule): predicate and branches share one layout. With a
// replicated predicate, select(c, p, 0) of a partial sum p stays a partial sum (jax's masked
// vocab-parallel embedding); select(c, p, r) with r nonzero is refused.

sdy.mesh @mesh = <["dp"=2, "tp"=4]>

// CHECK-LABEL: func.func @tiled_mask
func.func @tiled_mask(%x: tensor<8x16xf32>) -> tensor<8x16xf32> {
  %0 = sdy.manual_computation(%x) in_shardings=[<@mesh, [{"dp"}, {"tp"}]>] out_shardings=[<@mesh, [{"dp"}, {"tp"}]>] manual_axes={"dp", "tp"} (%a: tensor<4x4xf32>) {
    %z = stablehlo.constant dense<0.0> : tensor<4x4xf32>
    %c = stablehlo.compare GT, %a, %z : (tensor<4x4xf32>, tensor<4x4xf32>) -> tensor<4x4xi1>
    %ninf = stablehlo.constant dense<0xFF800000> : tensor<4x4xf32>
    // CHECK: stablehlo.select %{{.*}}entangle.relation = "tile [{dp}, {tp}] : select(compare(%arg0, 0), %arg0, -inf)"
    %1 = stablehlo.select %c, %a, %ninf : tensor<4x4xi1>, tensor<4x4xf32>
    sdy.return %1 : tensor<4x4xf32>
  } : (tensor<8x16xf32>) -> tensor<8x16xf32>
  return %0 : tensor<8x16xf32>
}

// -----

sdy.mesh @mesh = <["tp"=4]>

// CHECK-LABEL: func.func @partial
func.func @partial(%x: tensor<8x16xf32>, %w: tensor<16x8xf32>, %m: tensor<8x8xi1>, %r: tensor<8x8xf32>) -> tensor<8x8xf32> {
  %0 = sdy.manual_computation(%x, %w, %m, %r) in_shardings=[<@mesh, [{}, {"tp"}]>, <@mesh, [{"tp"}, {}]>, <@mesh, [{}, {}]>, <@mesh, [{}, {}]>] out_shardings=[<@mesh, [{}, {}]>] manual_axes={"tp"} (%a: tensor<8x4xf32>, %b: tensor<4x8xf32>, %ml: tensor<8x8xi1>, %rl: tensor<8x8xf32>) {
    %p = stablehlo.dot_general %a, %b, contracting_dims = [1] x [0] : (tensor<8x4xf32>, tensor<4x8xf32>) -> tensor<8x8xf32>
    %z = stablehlo.constant dense<0.0> : tensor<8x8xf32>
    // CHECK: stablehlo.select %{{.*}}entangle.relation = "partial sum {tp} : select(%arg2, dot_general(%arg0, %arg1), 0)"
    %1 = stablehlo.select %ml, %p, %z : tensor<8x8xi1>, tensor<8x8xf32>
    // CHECK: stablehlo.select %{{.*}}entangle.relation = "opaque: nonlinear op select applied to a partial sum over 'tp': missing all_reduce/psum before it"
    %2 = stablehlo.select %ml, %p, %rl : tensor<8x8xi1>, tensor<8x8xf32>
    sdy.return %1 : tensor<8x8xf32>
  } : (tensor<8x16xf32>, tensor<16x8xf32>, tensor<8x8xi1>, tensor<8x8xf32>) -> tensor<8x8xf32>
  return %0 : tensor<8x8xf32>
}

// -----

sdy.mesh @mesh = <["dp"=2, "tp"=4]>

// jax's negative-index wrap on device scalars: select(i < 0, i + 8, i).
// CHECK-LABEL: func.func @device_scalar
func.func @device_scalar(%x: tensor<8x16xf32>) -> tensor<8x16xf32> {
  %0 = sdy.manual_computation(%x) in_shardings=[<@mesh, [{}, {}]>] out_shardings=[<@mesh, [{}, {}]>] manual_axes={"dp", "tp"} (%a: tensor<8x16xf32>) {
    %pid = stablehlo.partition_id : tensor<ui32>
    %i = stablehlo.convert %pid : (tensor<ui32>) -> tensor<i32>
    %c3 = stablehlo.constant dense<3> : tensor<i32>
    %s = stablehlo.subtract %i, %c3 : tensor<i32>
    %z = stablehlo.constant dense<0> : tensor<i32>
    %neg = stablehlo.compare LT, %s, %z, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
    %c8 = stablehlo.constant dense<8> : tensor<i32>
    %w = stablehlo.add %s, %c8 : tensor<i32>
    // CHECK: stablehlo.select %{{.*}}entangle.relation = "device scalar [5, 6, 7, 0, 1, 2, 3, 4]"
    %1 = stablehlo.select %neg, %w, %s : tensor<i1>, tensor<i32>
    sdy.return %a : tensor<8x16xf32>
  } : (tensor<8x16xf32>) -> tensor<8x16xf32>
  return %0 : tensor<8x16xf32>
}
