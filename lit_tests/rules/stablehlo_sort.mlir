// RUN: entangle-opt %s --split-input-file --entangle-normalize --entangle-import-shardings --entangle-infer-relations | filecheck %s
// RUN: entangle-opt %s --split-input-file --entangle-normalize --entangle-import-shardings --entangle-infer-relations --entangle-check-refinement --verify-diagnostics | filecheck %s --check-prefix=FULL

// stablehlo.sort (sorting rule) with jax's comparator, read whole: ascending by the first
// operand (on floats -0 and +0 equal and NaNs last: jax maps them before a TOTALORDER `<`), the
// other operands moved alike (argsort's iota), stable. Along a dim that is not split every
// device sorts whole rows, so the other dims keep their split; along a split dim each device
// would sort its own block: refused, as is any other comparator.

sdy.mesh @mesh = <["tp"=4]>

func.func @ref(%x: tensor<8x6xi32>) -> tensor<8x6xi32> {
  %0 = "stablehlo.sort"(%x) <{dimension = 1 : i64, is_stable = true}> ({
  ^bb0(%a: tensor<i32>, %b: tensor<i32>):
    %1 = stablehlo.compare LT, %a, %b, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
    stablehlo.return %1 : tensor<i1>
  }) : (tensor<8x6xi32>) -> tensor<8x6xi32>
  return %0 : tensor<8x6xi32>
}

// jnp.sort(x, axis=1) of rows split over tp.
// CHECK-LABEL: func.func @rows_split
// FULL: func.func @rows_split{{.*}}entangle.verdict = "proven"
func.func @rows_split(%x: tensor<8x6xi32>) -> tensor<8x6xi32> attributes {entangle.refines = @ref} {
  %0 = sdy.manual_computation(%x) in_shardings=[<@mesh, [{"tp"}, {}]>] out_shardings=[<@mesh, [{"tp"}, {}]>] manual_axes={"tp"} (%a: tensor<2x6xi32>) {
    // CHECK: "stablehlo.sort"
    // CHECK: entangle.relation = "tile [{tp}, {}] : sort(%arg0)"
    %1 = "stablehlo.sort"(%a) <{dimension = 1 : i64, is_stable = true}> ({
    ^bb0(%u: tensor<i32>, %v: tensor<i32>):
      %2 = stablehlo.compare LT, %u, %v, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
      stablehlo.return %2 : tensor<i1>
    }) : (tensor<2x6xi32>) -> tensor<2x6xi32>
    sdy.return %1 : tensor<2x6xi32>
  } : (tensor<8x6xi32>) -> tensor<8x6xi32>
  return %0 : tensor<8x6xi32>
}

// -----

sdy.mesh @mesh = <["tp"=2]>

func.func @ref(%x: tensor<8x6xi32>) -> tensor<8x6xi32> {
  // expected-note @+1 {{corresponds to the reference op stablehlo.sort}}
  %0 = "stablehlo.sort"(%x) <{dimension = 1 : i64, is_stable = true}> ({
  ^bb0(%a: tensor<i32>, %b: tensor<i32>):
    %1 = stablehlo.compare LT, %a, %b, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
    stablehlo.return %1 : tensor<i1>
  }) : (tensor<8x6xi32>) -> tensor<8x6xi32>
  return %0 : tensor<8x6xi32>
}

// Refused: the sorted dim split (each device sorts its own half of the row).
// CHECK-LABEL: func.func @sorted_dim_split
// FULL: func.func @sorted_dim_split{{.*}}entangle.verdict = "not proven"
func.func @sorted_dim_split(%x: tensor<8x6xi32>) -> tensor<8x6xi32> attributes {entangle.refines = @ref} {
  %0 = sdy.manual_computation(%x) in_shardings=[<@mesh, [{}, {"tp"}]>] out_shardings=[<@mesh, [{}, {"tp"}]>] manual_axes={"tp"} (%a: tensor<8x3xi32>) {
    // CHECK: "stablehlo.sort"
    // CHECK: entangle.relation = "opaque: sort along dim 1, which is split over 'tp': each device sorts its own block, not the whole row (all_gather the dim first)"
    // expected-error @+1 {{sort along dim 1, which is split over 'tp': each device sorts its own block, not the whole row (all_gather the dim first)}}
    %1 = "stablehlo.sort"(%a) <{dimension = 1 : i64, is_stable = true}> ({
    ^bb0(%u: tensor<i32>, %v: tensor<i32>):
      %2 = stablehlo.compare LT, %u, %v, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
      stablehlo.return %2 : tensor<i1>
    }) : (tensor<8x3xi32>) -> tensor<8x3xi32>
    sdy.return %1 : tensor<8x3xi32>
  } : (tensor<8x6xi32>) -> tensor<8x6xi32>
  return %0 : tensor<8x6xi32>
}

// -----

sdy.mesh @mesh = <["tp"=2]>

func.func @ref(%x: tensor<8x6xi32>) -> tensor<8x6xi32> {
  // expected-note @+1 {{corresponds to the reference op stablehlo.sort}}
  %0 = "stablehlo.sort"(%x) <{dimension = 1 : i64, is_stable = true}> ({
  ^bb0(%a: tensor<i32>, %b: tensor<i32>):
    %1 = stablehlo.compare LT, %a, %b, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
    stablehlo.return %1 : tensor<i1>
  }) : (tensor<8x6xi32>) -> tensor<8x6xi32>
  return %0 : tensor<8x6xi32>
}

// Refused: a comparator that sorts in descending order (`b < a`) is another function.
// CHECK-LABEL: func.func @descending_comparator
// FULL: func.func @descending_comparator{{.*}}entangle.verdict = "not proven"
func.func @descending_comparator(%x: tensor<8x6xi32>) -> tensor<8x6xi32> attributes {entangle.refines = @ref} {
  %0 = sdy.manual_computation(%x) in_shardings=[<@mesh, [{"tp"}, {}]>] out_shardings=[<@mesh, [{"tp"}, {}]>] manual_axes={"tp"} (%a: tensor<4x6xi32>) {
    // CHECK: "stablehlo.sort"
    // CHECK: entangle.relation = "opaque: not a supported sort: sort whose comparator is not jax's ascending order on the first operand"
    // expected-error @+1 {{not a supported sort: sort whose comparator is not jax's ascending order on the first operand}}
    %1 = "stablehlo.sort"(%a) <{dimension = 1 : i64, is_stable = true}> ({
    ^bb0(%u: tensor<i32>, %v: tensor<i32>):
      %2 = stablehlo.compare LT, %v, %u, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
      stablehlo.return %2 : tensor<i1>
    }) : (tensor<4x6xi32>) -> tensor<4x6xi32>
    sdy.return %1 : tensor<4x6xi32>
  } : (tensor<8x6xi32>) -> tensor<8x6xi32>
  return %0 : tensor<8x6xi32>
}
