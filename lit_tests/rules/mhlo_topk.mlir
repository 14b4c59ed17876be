// RUN: entangle-opt %s --split-input-file --entangle-normalize --entangle-import-shardings --entangle-infer-relations | filecheck %s
// RUN: entangle-opt %s --split-input-file --entangle-normalize --entangle-import-shardings --entangle-infer-relations --entangle-check-refinement --verify-diagnostics | filecheck %s --check-prefix=FULL

// mhlo.topk (sorting rule): chlo.top_k as XLA's per-device programs spell it (the same term:
// the k largest values along the last dim and their indices, ties to the lower index). Rows
// keep their split; the last dim must not be split; `largest = false` (the k smallest) is not
// supported.

sdy.mesh @mesh = <["dp"=2, "tp"=4]>

func.func @ref(%x: tensor<16x8xf32>) -> (tensor<16x2xf32>, tensor<16x2xi32>) {
  %values, %indices = chlo.top_k(%x, k = 2) : tensor<16x8xf32> -> (tensor<16x2xf32>, tensor<16x2xi32>)
  return %values, %indices : tensor<16x2xf32>, tensor<16x2xi32>
}

// Rows split over dp and tp: each device selects within its own rows; the reference's
// chlo.top_k is the same term.
// CHECK-LABEL: func.func @rows_split
// FULL: func.func @rows_split{{.*}}entangle.verdict = "proven"
func.func @rows_split(%x: tensor<16x8xf32>) -> (tensor<16x2xf32>, tensor<16x2xi32>) attributes {entangle.refines = @ref} {
  %0:2 = sdy.manual_computation(%x) in_shardings=[<@mesh, [{"dp", "tp"}, {}]>] out_shardings=[<@mesh, [{"dp", "tp"}, {}]>, <@mesh, [{"dp", "tp"}, {}]>] manual_axes={"dp", "tp"} (%a: tensor<2x8xf32>) {
    // CHECK: mhlo.topk{{.*}}entangle.relation = "tile [{dp, tp}, {}] : top_k(%arg0, k=2).values; tile [{dp, tp}, {}] : top_k(%arg0, k=2).indices"
    %values, %indices = mhlo.topk(%a, k = 2) : tensor<2x8xf32> -> (tensor<2x2xf32>, tensor<2x2xi32>)
    sdy.return %values, %indices : tensor<2x2xf32>, tensor<2x2xi32>
  } : (tensor<16x8xf32>) -> (tensor<16x2xf32>, tensor<16x2xi32>)
  return %0#0, %0#1 : tensor<16x2xf32>, tensor<16x2xi32>
}

// -----

sdy.mesh @mesh = <["tp"=4]>

func.func @ref(%x: tensor<4x16xf32>) -> tensor<4x2xf32> {
  // expected-note @+1 {{corresponds to the reference op chlo.top_k, which computes top_k(%arg0, k=2).values}}
  %values, %indices = chlo.top_k(%x, k = 2) : tensor<4x16xf32> -> (tensor<4x2xf32>, tensor<4x2xi32>)
  return %values : tensor<4x2xf32>
}

// Refused: the k smallest values are another selection.
// CHECK-LABEL: func.func @smallest
// FULL: func.func @smallest{{.*}}entangle.verdict = "not proven"
func.func @smallest(%x: tensor<4x16xf32>) -> tensor<4x2xf32> attributes {entangle.refines = @ref} {
  %0 = sdy.manual_computation(%x) in_shardings=[<@mesh, [{"tp"}, {}]>] out_shardings=[<@mesh, [{"tp"}, {}]>] manual_axes={"tp"} (%a: tensor<1x16xf32>) {
    // expected-error @+2 {{mhlo.topk of the k smallest values is not supported}}
    // CHECK: mhlo.topk{{.*}}entangle.relation = "opaque: mhlo.topk of the k smallest values is not supported
    %values, %indices = mhlo.topk(%a, k = 2, largest = false) : tensor<1x16xf32> -> (tensor<1x2xf32>, tensor<1x2xi32>)
    sdy.return %values : tensor<1x2xf32>
  } : (tensor<4x16xf32>) -> tensor<4x2xf32>
  return %0 : tensor<4x2xf32>
}
