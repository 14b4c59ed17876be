// RUN: entangle-opt %s --split-input-file --entangle-normalize --entangle-import-shardings --entangle-infer-relations | filecheck %s
// RUN: entangle-opt %s --split-input-file --entangle-normalize --entangle-import-shardings --entangle-infer-relations --entangle-check-refinement --verify-diagnostics | filecheck %s --check-prefix=FULL

// chlo.top_k (sorting rule): the k largest values along the last dim and their indices. Top-k
// works row by row, so dims other than the last keep their split (a MoE router on a dp- or
// sequence-split batch of tokens); the last dim must not be split (each device would pick the
// top k of its own block of candidates) and the operand must not be a partial sum.

sdy.mesh @mesh = <["dp"=2, "tp"=4]>

func.func @ref(%x: tensor<16x8xf32>) -> (tensor<16x2xf32>, tensor<16x2xi32>) {
  %values, %indices = chlo.top_k(%x, k = 2) : tensor<16x8xf32> -> (tensor<16x2xf32>, tensor<16x2xi32>)
  return %values, %indices : tensor<16x2xf32>, tensor<16x2xi32>
}

// Tokens split over dp and tp (as under dp x sp): each device routes its own tokens.
// CHECK-LABEL: func.func @rows_split
// FULL: func.func @rows_split{{.*}}entangle.verdict = "proven"
func.func @rows_split(%x: tensor<16x8xf32>) -> (tensor<16x2xf32>, tensor<16x2xi32>) attributes {entangle.refines = @ref} {
  %0:2 = sdy.manual_computation(%x) in_shardings=[<@mesh, [{"dp", "tp"}, {}]>] out_shardings=[<@mesh, [{"dp", "tp"}, {}]>, <@mesh, [{"dp", "tp"}, {}]>] manual_axes={"dp", "tp"} (%a: tensor<2x8xf32>) {
    // CHECK: chlo.top_k{{.*}}entangle.relation = "tile [{dp, tp}, {}] : top_k(%arg0, k=2).values; tile [{dp, tp}, {}] : top_k(%arg0, k=2).indices"
    %values, %indices = chlo.top_k(%a, k = 2) : tensor<2x8xf32> -> (tensor<2x2xf32>, tensor<2x2xi32>)
    sdy.return %values, %indices : tensor<2x2xf32>, tensor<2x2xi32>
  } : (tensor<16x8xf32>) -> (tensor<16x2xf32>, tensor<16x2xi32>)
  return %0#0, %0#1 : tensor<16x2xf32>, tensor<16x2xi32>
}

// -----

sdy.mesh @mesh = <["tp"=4]>

func.func @ref(%x: tensor<4x16xf32>) -> tensor<4x2xf32> {
  // expected-note @+1 {{corresponds to the reference op chlo.top_k}}
  %values, %indices = chlo.top_k(%x, k = 2) : tensor<4x16xf32> -> (tensor<4x2xf32>, tensor<4x2xi32>)
  return %values : tensor<4x2xf32>
}

// Refused: the candidates (experts, vocab) split over tp; each device would return the top 2 of
// its own 4 candidates.
// CHECK-LABEL: func.func @candidates_split
// FULL: func.func @candidates_split{{.*}}entangle.verdict = "not proven"
func.func @candidates_split(%x: tensor<4x16xf32>) -> tensor<4x2xf32> attributes {entangle.refines = @ref} {
  %0 = sdy.manual_computation(%x) in_shardings=[<@mesh, [{}, {"tp"}]>] out_shardings=[<@mesh, [{}, {}]>] manual_axes={"tp"} (%a: tensor<4x4xf32>) {
    // expected-error @+2 {{top_k along dim 1, which is split over 'tp': each device picks the top 2 of its own block of candidates, not of the whole row (all_gather the dim first)}}
    // CHECK: chlo.top_k{{.*}}entangle.relation = "opaque: top_k along dim 1
    %values, %indices = chlo.top_k(%a, k = 2) : tensor<4x4xf32> -> (tensor<4x2xf32>, tensor<4x2xi32>)
    sdy.return %values : tensor<4x2xf32>
  } : (tensor<4x16xf32>) -> tensor<4x2xf32>
  return %0 : tensor<4x2xf32>
}
