// RUN: entangle-opt %s --split-input-file --entangle-normalize --entangle-import-shardings --entangle-infer-relations | filecheck %s

// stablehlo.gather (gather_scatter rule): an embedding lookup. Indices' batch dims carry their
// split into the result; an operand dim that is sliced whole keeps its split in the result's
// offset dim. Indexing (or partially slicing) a split operand dim is refused: each device would
// index its own block (the masked "index - my offset" idiom is not supported yet).

sdy.mesh @mesh = <["dp"=2, "tp"=4]>

// Token ids split over dp, the table's hidden dim over tp.
// CHECK-LABEL: func.func @embedding
func.func @embedding(%table: tensor<32x16xf32>, %ids: tensor<8x1xi32>) -> tensor<8x16xf32> {
  %0 = sdy.manual_computation(%table, %ids) in_shardings=[<@mesh, [{}, {"tp"}]>, <@mesh, [{"dp"}, {}]>] out_shardings=[<@mesh, [{"dp"}, {"tp"}]>] manual_axes={"dp", "tp"} (%t: tensor<32x4xf32>, %i: tensor<4x1xi32>) {
    // CHECK: "stablehlo.gather"{{.*}}entangle.relation = "tile [{dp}, {tp}] : gather(%arg0, %arg1)"
    %1 = "stablehlo.gather"(%t, %i) {dimension_numbers = #stablehlo.gather<offset_dims = [1], collapsed_slice_dims = [0], start_index_map = [0], index_vector_dim = 1>, slice_sizes = array<i64: 1, 4>} : (tensor<32x4xf32>, tensor<4x1xi32>) -> tensor<4x4xf32>
    sdy.return %1 : tensor<4x4xf32>
  } : (tensor<32x16xf32>, tensor<8x1xi32>) -> tensor<8x16xf32>
  return %0 : tensor<8x16xf32>
}

// -----

sdy.mesh @mesh = <["tp"=4]>

// Refused: a vocab-parallel table (rows split over tp) indexed with global token ids, and a
// partial slice of the split hidden dim.
// CHECK-LABEL: func.func @split_indexed_dim
func.func @split_indexed_dim(%table: tensor<32x16xf32>, %ids: tensor<8x1xi32>, %t2: tensor<32x16xf32>) -> tensor<8x16xf32> {
  %0 = sdy.manual_computation(%table, %ids, %t2) in_shardings=[<@mesh, [{"tp"}, {}]>, <@mesh, [{}, {}]>, <@mesh, [{}, {"tp"}]>] out_shardings=[<@mesh, [{}, {}]>] manual_axes={"tp"} (%t: tensor<8x16xf32>, %i: tensor<8x1xi32>, %u: tensor<32x4xf32>) {
    // CHECK: "stablehlo.gather"{{.*}}entangle.relation = "opaque: gather indexes dim 0 of an operand split over 'tp': each device would index its own block
    %1 = "stablehlo.gather"(%t, %i) {dimension_numbers = #stablehlo.gather<offset_dims = [1], collapsed_slice_dims = [0], start_index_map = [0], index_vector_dim = 1>, slice_sizes = array<i64: 1, 16>} : (tensor<8x16xf32>, tensor<8x1xi32>) -> tensor<8x16xf32>
    // CHECK: "stablehlo.gather"{{.*}}entangle.relation = "opaque: gather indexes dim 1 of an operand split over 'tp'
    %2 = "stablehlo.gather"(%u, %i) {dimension_numbers = #stablehlo.gather<offset_dims = [1], collapsed_slice_dims = [0], start_index_map = [0], index_vector_dim = 1>, slice_sizes = array<i64: 1, 2>} : (tensor<32x4xf32>, tensor<8x1xi32>) -> tensor<8x2xf32>
    sdy.return %1 : tensor<8x16xf32>
  } : (tensor<32x16xf32>, tensor<8x1xi32>, tensor<32x16xf32>) -> tensor<8x16xf32>
  return %0 : tensor<8x16xf32>
}

// -----

sdy.mesh @mesh = <["tp"=4]>

// Gather only selects elements: a partial sum stays partial.
// CHECK-LABEL: func.func @partial
func.func @partial(%x: tensor<32x16xf32>, %w: tensor<16x8xf32>, %ids: tensor<8x1xi32>) -> tensor<8x8xf32> {
  %0 = sdy.manual_computation(%x, %w, %ids) in_shardings=[<@mesh, [{}, {"tp"}]>, <@mesh, [{"tp"}, {}]>, <@mesh, [{}, {}]>] out_shardings=[<@mesh, [{}, {}]>] manual_axes={"tp"} (%a: tensor<32x4xf32>, %b: tensor<4x8xf32>, %i: tensor<8x1xi32>) {
    %p = stablehlo.dot_general %a, %b, contracting_dims = [1] x [0] : (tensor<32x4xf32>, tensor<4x8xf32>) -> tensor<32x8xf32>
    // CHECK: "stablehlo.gather"{{.*}}entangle.relation = "partial sum {tp} : gather(dot_general(%arg0, %arg1), %arg2)"
    %1 = "stablehlo.gather"(%p, %i) {dimension_numbers = #stablehlo.gather<offset_dims = [1], collapsed_slice_dims = [0], start_index_map = [0], index_vector_dim = 1>, slice_sizes = array<i64: 1, 8>} : (tensor<32x8xf32>, tensor<8x1xi32>) -> tensor<8x8xf32>
    sdy.return %1 : tensor<8x8xf32>
  } : (tensor<32x16xf32>, tensor<16x8xf32>, tensor<8x1xi32>) -> tensor<8x8xf32>
  return %0 : tensor<8x8xf32>
}
