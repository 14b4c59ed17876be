// RUN: entangle-opt %s --split-input-file --entangle-normalize --entangle-import-shardings --entangle-infer-relations | filecheck %s
// RUN: entangle-opt %s --split-input-file --entangle-normalize --entangle-import-shardings --entangle-infer-relations --entangle-check-refinement --verify-diagnostics | filecheck %s --check-prefix=FULL

// stablehlo.gather (gather_scatter rule): a gather only selects elements, so
// * indices split along their batch dims give the result split along the matching batch dims;
// * an operand split along a fully sliced offset dim (an embedding table split on the hidden dim)
//   gives the result split along the matching offset dim;
// * a partial operand stays partial;
// * an operand split along an indexed dim is refused: each device would index its own block (the
//   masked "index - my offset" form XLA emits needs device-dependent index tensors).

sdy.mesh @mesh = <["dp"=2, "tp"=4]>

func.func @ref(%t: tensor<16x8xf32>, %i: tensor<8x1xi32>) -> tensor<8x8xf32> {
  %0 = "stablehlo.gather"(%t, %i) <{dimension_numbers = #stablehlo.gather<offset_dims = [1], collapsed_slice_dims = [0], start_index_map = [0], index_vector_dim = 1>, indices_are_sorted = false, slice_sizes = array<i64: 1, 8>}> : (tensor<16x8xf32>, tensor<8x1xi32>) -> tensor<8x8xf32>
  return %0 : tensor<8x8xf32>
}

// Token ids split over dp (rows of the result), the table's hidden dim split over tp.
// CHECK-LABEL: func.func @ids_and_hidden
// FULL: func.func @ids_and_hidden{{.*}}entangle.rho = ["result#0 = concat over 'dp' along dim 0, then concat over 'tp' along dim 1"], entangle.verdict = "proven"
func.func @ids_and_hidden(%t: tensor<16x8xf32>, %i: tensor<8x1xi32>) -> tensor<8x8xf32> attributes {entangle.refines = @ref} {
  %0 = sdy.manual_computation(%t, %i) in_shardings=[<@mesh, [{}, {"tp"}]>, <@mesh, [{"dp"}, {}]>] out_shardings=[<@mesh, [{"dp"}, {"tp"}]>] manual_axes={"dp", "tp"} (%a: tensor<16x2xf32>, %b: tensor<4x1xi32>) {
    // CHECK: "stablehlo.gather"{{.*}}entangle.relation = "tile [{dp}, {tp}] : gather(%arg0, %arg1)"
    %1 = "stablehlo.gather"(%a, %b) <{dimension_numbers = #stablehlo.gather<offset_dims = [1], collapsed_slice_dims = [0], start_index_map = [0], index_vector_dim = 1>, indices_are_sorted = false, slice_sizes = array<i64: 1, 2>}> : (tensor<16x2xf32>, tensor<4x1xi32>) -> tensor<4x2xf32>
    sdy.return %1 : tensor<4x2xf32>
  } : (tensor<16x8xf32>, tensor<8x1xi32>) -> tensor<8x8xf32>
  return %0 : tensor<8x8xf32>
}

// -----

sdy.mesh @mesh = <["tp"=4]>

func.func @ref(%t: tensor<16x8xf32>, %u: tensor<8x8xf32>, %i: tensor<8x1xi32>) -> tensor<8x8xf32> {
  %0 = stablehlo.dot_general %t, %u, contracting_dims = [1] x [0] : (tensor<16x8xf32>, tensor<8x8xf32>) -> tensor<16x8xf32>
  %1 = "stablehlo.gather"(%0, %i) <{dimension_numbers = #stablehlo.gather<offset_dims = [1], collapsed_slice_dims = [0], start_index_map = [0], index_vector_dim = 1>, indices_are_sorted = false, slice_sizes = array<i64: 1, 8>}> : (tensor<16x8xf32>, tensor<8x1xi32>) -> tensor<8x8xf32>
  return %1 : tensor<8x8xf32>
}

// A gather of partial sums is the partial sum of the gathers: the psum may come after it.
// CHECK-LABEL: func.func @partial_table
// FULL: func.func @partial_table{{.*}}entangle.verdict = "proven"
func.func @partial_table(%t: tensor<16x8xf32>, %u: tensor<8x8xf32>, %i: tensor<8x1xi32>) -> tensor<8x8xf32> attributes {entangle.refines = @ref} {
  %0 = sdy.manual_computation(%t, %u, %i) in_shardings=[<@mesh, [{}, {"tp"}]>, <@mesh, [{"tp"}, {}]>, <@mesh, [{}, {}]>] out_shardings=[<@mesh, [{}, {}]>] manual_axes={"tp"} (%a: tensor<16x2xf32>, %w: tensor<2x8xf32>, %b: tensor<8x1xi32>) {
    %p = stablehlo.dot_general %a, %w, contracting_dims = [1] x [0] : (tensor<16x2xf32>, tensor<2x8xf32>) -> tensor<16x8xf32>
    // CHECK: "stablehlo.gather"{{.*}}entangle.relation = "partial sum {tp} : gather(dot_general(%arg0, %arg1), %arg2)"
    %g = "stablehlo.gather"(%p, %b) <{dimension_numbers = #stablehlo.gather<offset_dims = [1], collapsed_slice_dims = [0], start_index_map = [0], index_vector_dim = 1>, indices_are_sorted = false, slice_sizes = array<i64: 1, 8>}> : (tensor<16x8xf32>, tensor<8x1xi32>) -> tensor<8x8xf32>
    %r = "stablehlo.all_reduce"(%g) ({
      ^bb0(%x: tensor<f32>, %y: tensor<f32>):
        %s = stablehlo.add %x, %y : tensor<f32>
        stablehlo.return %s : tensor<f32>
    }) {replica_groups = dense<[[0, 1, 2, 3]]> : tensor<1x4xi64>, channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, use_global_device_ids} : (tensor<8x8xf32>) -> tensor<8x8xf32>
    sdy.return %r : tensor<8x8xf32>
  } : (tensor<16x8xf32>, tensor<8x8xf32>, tensor<8x1xi32>) -> tensor<8x8xf32>
  return %0 : tensor<8x8xf32>
}

// -----

sdy.mesh @mesh = <["tp"=4]>

func.func @ref(%t: tensor<16x8xf32>, %i: tensor<8x1xi32>) -> tensor<8x8xf32> {
  // expected-note @+1 {{corresponds to the reference op stablehlo.gather, which computes gather(%arg0, %arg1)}}
  %0 = "stablehlo.gather"(%t, %i) <{dimension_numbers = #stablehlo.gather<offset_dims = [1], collapsed_slice_dims = [0], start_index_map = [0], index_vector_dim = 1>, indices_are_sorted = false, slice_sizes = array<i64: 1, 8>}> : (tensor<16x8xf32>, tensor<8x1xi32>) -> tensor<8x8xf32>
  return %0 : tensor<8x8xf32>
}

// CHECK-LABEL: func.func @refused
// FULL: func.func @refused{{.*}}entangle.verdict = "not proven"
func.func @refused(%t: tensor<16x8xf32>, %i: tensor<8x1xi32>) -> tensor<8x8xf32> attributes {entangle.refines = @ref} {
  %0 = sdy.manual_computation(%t, %i) in_shardings=[<@mesh, [{"tp"}, {}]>, <@mesh, [{}, {}]>] out_shardings=[<@mesh, [{}, {}]>] manual_axes={"tp"} (%a: tensor<4x8xf32>, %b: tensor<8x1xi32>) {
    // The table's rows (the gathered dim) are split: each device would read its own rows.
    // CHECK: "stablehlo.gather"{{.*}}entangle.relation = "opaque: gather indexes dim 0 of an operand split over 'tp': each device would index its own block
    // expected-error @+1 {{gather indexes dim 0 of an operand split over 'tp': each device would index its own block}}
    %1 = "stablehlo.gather"(%a, %b) <{dimension_numbers = #stablehlo.gather<offset_dims = [1], collapsed_slice_dims = [0], start_index_map = [0], index_vector_dim = 1>, indices_are_sorted = false, slice_sizes = array<i64: 1, 8>}> : (tensor<4x8xf32>, tensor<8x1xi32>) -> tensor<8x8xf32>
    sdy.return %1 : tensor<8x8xf32>
  } : (tensor<16x8xf32>, tensor<8x1xi32>) -> tensor<8x8xf32>
  return %0 : tensor<8x8xf32>
}

// -----

sdy.mesh @mesh = <["tp"=4]>

func.func @ref(%t: tensor<16x8xf32>, %i: tensor<8x1xi32>) -> tensor<8x8xf32> {
  // expected-note @+1 {{corresponds to the reference op stablehlo.gather}}
  %0 = "stablehlo.gather"(%t, %i) <{dimension_numbers = #stablehlo.gather<offset_dims = [1], collapsed_slice_dims = [0], start_index_map = [0], index_vector_dim = 1>, indices_are_sorted = false, slice_sizes = array<i64: 1, 8>}> : (tensor<16x8xf32>, tensor<8x1xi32>) -> tensor<8x8xf32>
  return %0 : tensor<8x8xf32>
}

// CHECK-LABEL: func.func @diagonal
// FULL: func.func @diagonal{{.*}}entangle.verdict = "not proven"
func.func @diagonal(%t: tensor<16x8xf32>, %i: tensor<8x1xi32>) -> tensor<8x8xf32> attributes {entangle.refines = @ref} {
  %0 = sdy.manual_computation(%t, %i) in_shardings=[<@mesh, [{}, {"tp"}]>, <@mesh, [{"tp"}, {}]>] out_shardings=[<@mesh, [{}, {}]>] manual_axes={"tp"} (%a: tensor<16x2xf32>, %b: tensor<2x1xi32>) {
    %c0 = stablehlo.constant dense<0.0> : tensor<f32>
    // The same axis splits the ids and the hidden dim: devices hold diagonal blocks only.
    // CHECK: "stablehlo.gather"{{.*}}entangle.relation = "opaque: gather: mesh axis 'tp' splits both the operand and the indices
    // expected-error @+1 {{gather: mesh axis 'tp' splits both the operand and the indices}}
    %1 = "stablehlo.gather"(%a, %b) <{dimension_numbers = #stablehlo.gather<offset_dims = [1], collapsed_slice_dims = [0], start_index_map = [0], index_vector_dim = 1>, indices_are_sorted = false, slice_sizes = array<i64: 1, 2>}> : (tensor<16x2xf32>, tensor<2x1xi32>) -> tensor<2x2xf32>
    %p = stablehlo.pad %1, %c0, low = [0, 0], high = [6, 6], interior = [0, 0] : (tensor<2x2xf32>, tensor<f32>) -> tensor<8x8xf32>
    sdy.return %p : tensor<8x8xf32>
  } : (tensor<16x8xf32>, tensor<8x1xi32>) -> tensor<8x8xf32>
  return %0 : tensor<8x8xf32>
}

// -----

sdy.mesh @mesh = <["dp"=2, "tp"=2]>

func.func @ref(%x: tensor<8x16xf32>, %i: tensor<8x1x1xi32>) -> tensor<8x1xf32> {
  %0 = "stablehlo.gather"(%x, %i) <{dimension_numbers = #stablehlo.gather<collapsed_slice_dims = [1], operand_batching_dims = [0], start_indices_batching_dims = [0], start_index_map = [1], index_vector_dim = 2>, indices_are_sorted = false, slice_sizes = array<i64: 1, 1>}> : (tensor<8x16xf32>, tensor<8x1x1xi32>) -> tensor<8x1xf32>
  return %0 : tensor<8x1xf32>
}

// Batching dims (`take_along_axis`: the target logit of a cross-entropy): logits and targets
// split alike along the batching dim; each device picks within its own rows.
// CHECK-LABEL: func.func @batching_rows_split
// FULL: func.func @batching_rows_split{{.*}}entangle.rho = ["result#0 = concat over ('dp', 'tp') along dim 0"], entangle.verdict = "proven"
func.func @batching_rows_split(%x: tensor<8x16xf32>, %i: tensor<8x1x1xi32>) -> tensor<8x1xf32> attributes {entangle.refines = @ref} {
  %0 = sdy.manual_computation(%x, %i) in_shardings=[<@mesh, [{"dp", "tp"}, {}]>, <@mesh, [{"dp", "tp"}, {}, {}]>] out_shardings=[<@mesh, [{"dp", "tp"}, {}]>] manual_axes={"dp", "tp"} (%a: tensor<2x16xf32>, %b: tensor<2x1x1xi32>) {
    // CHECK: "stablehlo.gather"{{.*}}entangle.relation = "tile [{dp, tp}, {}] : gather(%arg0, %arg1)"
    %1 = "stablehlo.gather"(%a, %b) <{dimension_numbers = #stablehlo.gather<collapsed_slice_dims = [1], operand_batching_dims = [0], start_indices_batching_dims = [0], start_index_map = [1], index_vector_dim = 2>, indices_are_sorted = false, slice_sizes = array<i64: 1, 1>}> : (tensor<2x16xf32>, tensor<2x1x1xi32>) -> tensor<2x1xf32>
    sdy.return %1 : tensor<2x1xf32>
  } : (tensor<8x16xf32>, tensor<8x1x1xi32>) -> tensor<8x1xf32>
  return %0 : tensor<8x1xf32>
}

// -----

sdy.mesh @mesh = <["dp"=2, "tp"=2]>

func.func @ref(%x: tensor<8x16xf32>, %i: tensor<8x1x1xi32>) -> tensor<8x1xf32> {
  // expected-note @+1 {{corresponds to the reference op stablehlo.gather}}
  %0 = "stablehlo.gather"(%x, %i) <{dimension_numbers = #stablehlo.gather<collapsed_slice_dims = [1], operand_batching_dims = [0], start_indices_batching_dims = [0], start_index_map = [1], index_vector_dim = 2>, indices_are_sorted = false, slice_sizes = array<i64: 1, 1>}> : (tensor<8x16xf32>, tensor<8x1x1xi32>) -> tensor<8x1xf32>
  return %0 : tensor<8x1xf32>
}

// Refused: logits rows split over dp, targets over tp: device (0, 1) would pick row r's logit
// with the target of row 4 + r.
// CHECK-LABEL: func.func @batching_split_differently
// FULL: func.func @batching_split_differently{{.*}}entangle.verdict = "not proven"
func.func @batching_split_differently(%x: tensor<8x16xf32>, %i: tensor<8x1x1xi32>) -> tensor<8x1xf32> attributes {entangle.refines = @ref} {
  %0 = sdy.manual_computation(%x, %i) in_shardings=[<@mesh, [{"dp"}, {}]>, <@mesh, [{"tp"}, {}, {}]>] out_shardings=[<@mesh, [{"dp"}, {}]>] manual_axes={"dp", "tp"} (%a: tensor<4x16xf32>, %b: tensor<4x1x1xi32>) {
    // expected-error @+2 {{gather: batching dim 0 of the operand is split over 'dp' but the matching indices dim 0 is split over 'tp': each device would pair rows of different tokens}}
    // CHECK: "stablehlo.gather"{{.*}}entangle.relation = "opaque: gather: batching dim 0
    %1 = "stablehlo.gather"(%a, %b) <{dimension_numbers = #stablehlo.gather<collapsed_slice_dims = [1], operand_batching_dims = [0], start_indices_batching_dims = [0], start_index_map = [1], index_vector_dim = 2>, indices_are_sorted = false, slice_sizes = array<i64: 1, 1>}> : (tensor<4x16xf32>, tensor<4x1x1xi32>) -> tensor<4x1xf32>
    sdy.return %1 : tensor<4x1xf32>
  } : (tensor<8x16xf32>, tensor<8x1x1xi32>) -> tensor<8x1xf32>
  return %0 : tensor<8x1xf32>
}
