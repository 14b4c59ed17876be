// RUN: entangle-opt %s --split-input-file --entangle-normalize --entangle-import-shardings --entangle-infer-relations | filecheck %s
// RUN: entangle-opt %s --split-input-file --entangle-normalize --entangle-import-shardings --entangle-infer-relations --entangle-check-refinement --verify-diagnostics | filecheck %s --check-prefix=FULL

// stablehlo.scatter (gather_scatter rule): the scattered (indexed) operand dims must not be
// split; a window dim the updates cover whole keeps its split when the updates are split the
// same way; updates (and indices) split along their scatter dims each land on every device's
// copy, so a scatter-add of them is a partial sum over those axes (of scatter_add(|A| * X, I, U):
// a nonzero operand is counted once per device). Scatter-add is X + scatter_add(0, I, U).

sdy.mesh @mesh = <["tp"=4]>

func.func @ref(%x: tensor<16x8xf32>, %i: tensor<6x1xi32>, %u: tensor<6x8xf32>) -> tensor<16x8xf32> {
  %0 = "stablehlo.scatter"(%x, %i, %u) <{indices_are_sorted = false, scatter_dimension_numbers = #stablehlo.scatter<update_window_dims = [1], inserted_window_dims = [0], scatter_dims_to_operand_dims = [0], index_vector_dim = 1>, unique_indices = false}> ({
  ^bb0(%a: tensor<f32>, %b: tensor<f32>):
    %s = stablehlo.add %a, %b : tensor<f32>
    stablehlo.return %s : tensor<f32>
  }) : (tensor<16x8xf32>, tensor<6x1xi32>, tensor<6x8xf32>) -> tensor<16x8xf32>
  return %0 : tensor<16x8xf32>
}

// Columns split over tp for the operand and the updates: each device adds its columns.
// CHECK-LABEL: func.func @columns
// FULL: func.func @columns{{.*}}entangle.rho = ["result#0 = concat over 'tp' along dim 1"], entangle.verdict = "proven"
func.func @columns(%x: tensor<16x8xf32>, %i: tensor<6x1xi32>, %u: tensor<6x8xf32>) -> tensor<16x8xf32> attributes {entangle.refines = @ref} {
  %0 = sdy.manual_computation(%x, %i, %u) in_shardings=[<@mesh, [{}, {"tp"}]>, <@mesh, [{}, {}]>, <@mesh, [{}, {"tp"}]>] out_shardings=[<@mesh, [{}, {"tp"}]>] manual_axes={"tp"} (%a: tensor<16x2xf32>, %b: tensor<6x1xi32>, %c: tensor<6x2xf32>) {
    // CHECK: "stablehlo.scatter"
    // CHECK: entangle.relation = "tile [{}, {tp}] : (%arg0 + scatter(0, %arg1, %arg2))"
    %1 = "stablehlo.scatter"(%a, %b, %c) <{indices_are_sorted = false, scatter_dimension_numbers = #stablehlo.scatter<update_window_dims = [1], inserted_window_dims = [0], scatter_dims_to_operand_dims = [0], index_vector_dim = 1>, unique_indices = false}> ({
    ^bb0(%p: tensor<f32>, %q: tensor<f32>):
      %s = stablehlo.add %p, %q : tensor<f32>
      stablehlo.return %s : tensor<f32>
    }) : (tensor<16x2xf32>, tensor<6x1xi32>, tensor<6x2xf32>) -> tensor<16x2xf32>
    sdy.return %1 : tensor<16x2xf32>
  } : (tensor<16x8xf32>, tensor<6x1xi32>, tensor<6x8xf32>) -> tensor<16x8xf32>
  return %0 : tensor<16x8xf32>
}

// -----

sdy.mesh @mesh = <["tp"=2]>

func.func @ref(%i: tensor<6x1xi32>, %u: tensor<6x8xf32>) -> tensor<16x8xf32> {
  %z = stablehlo.constant dense<0.0> : tensor<16x8xf32>
  %0 = "stablehlo.scatter"(%z, %i, %u) <{indices_are_sorted = false, scatter_dimension_numbers = #stablehlo.scatter<update_window_dims = [1], inserted_window_dims = [0], scatter_dims_to_operand_dims = [0], index_vector_dim = 1>, unique_indices = false}> ({
  ^bb0(%a: tensor<f32>, %b: tensor<f32>):
    %s = stablehlo.add %a, %b : tensor<f32>
    stablehlo.return %s : tensor<f32>
  }) : (tensor<16x8xf32>, tensor<6x1xi32>, tensor<6x8xf32>) -> tensor<16x8xf32>
  return %0 : tensor<16x8xf32>
}

// Token updates split over tp (an embedding gradient): each device scatters its tokens into a
// zero table; the all_reduce adds the tables up.
// CHECK-LABEL: func.func @tokens
// FULL: func.func @tokens{{.*}}entangle.verdict = "proven"
func.func @tokens(%i: tensor<6x1xi32>, %u: tensor<6x8xf32>) -> tensor<16x8xf32> attributes {entangle.refines = @ref} {
  %0 = sdy.manual_computation(%i, %u) in_shardings=[<@mesh, [{"tp"}, {}]>, <@mesh, [{"tp"}, {}]>] out_shardings=[<@mesh, [{}, {}]>] manual_axes={"tp"} (%b: tensor<3x1xi32>, %c: tensor<3x8xf32>) {
    %z = stablehlo.constant dense<0.0> : tensor<16x8xf32>
    // CHECK: "stablehlo.scatter"
    // CHECK: entangle.relation = "partial sum {tp} : scatter(0, %arg0, %arg1)"
    %1 = "stablehlo.scatter"(%z, %b, %c) <{indices_are_sorted = false, scatter_dimension_numbers = #stablehlo.scatter<update_window_dims = [1], inserted_window_dims = [0], scatter_dims_to_operand_dims = [0], index_vector_dim = 1>, unique_indices = false}> ({
    ^bb0(%p: tensor<f32>, %q: tensor<f32>):
      %s = stablehlo.add %p, %q : tensor<f32>
      stablehlo.return %s : tensor<f32>
    }) : (tensor<16x8xf32>, tensor<3x1xi32>, tensor<3x8xf32>) -> tensor<16x8xf32>
    %2 = "stablehlo.all_reduce"(%1) ({
      ^bb0(%p: tensor<f32>, %q: tensor<f32>):
        %s = stablehlo.add %p, %q : tensor<f32>
        stablehlo.return %s : tensor<f32>
    }) {replica_groups = dense<[[0, 1]]> : tensor<1x2xi64>, channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, use_global_device_ids} : (tensor<16x8xf32>) -> tensor<16x8xf32>
    sdy.return %2 : tensor<16x8xf32>
  } : (tensor<6x1xi32>, tensor<6x8xf32>) -> tensor<16x8xf32>
  return %0 : tensor<16x8xf32>
}

// -----

sdy.mesh @mesh = <["tp"=4]>

func.func @ref(%x: tensor<16x8xf32>, %i: tensor<6x1xi32>, %u: tensor<6x8xf32>) -> tensor<16x8xf32> {
  // expected-note @+1 {{corresponds to the reference op stablehlo.scatter, which computes scatter(%arg0, %arg1, %arg2)}}
  %0 = "stablehlo.scatter"(%x, %i, %u) <{indices_are_sorted = false, scatter_dimension_numbers = #stablehlo.scatter<update_window_dims = [1], inserted_window_dims = [0], scatter_dims_to_operand_dims = [0], index_vector_dim = 1>, unique_indices = false}> ({
  ^bb0(%a: tensor<f32>, %b: tensor<f32>):
    stablehlo.return %b : tensor<f32>
  }) : (tensor<16x8xf32>, tensor<6x1xi32>, tensor<6x8xf32>) -> tensor<16x8xf32>
  return %0 : tensor<16x8xf32>
}

// Scattering rows into an operand whose rows are split: each device would index its own block.
// CHECK-LABEL: func.func @split_rows
// FULL: func.func @split_rows{{.*}}entangle.verdict = "not proven"
func.func @split_rows(%x: tensor<16x8xf32>, %i: tensor<6x1xi32>, %u: tensor<6x8xf32>) -> tensor<16x8xf32> attributes {entangle.refines = @ref} {
  %0 = sdy.manual_computation(%x, %i, %u) in_shardings=[<@mesh, [{"tp"}, {}]>, <@mesh, [{}, {}]>, <@mesh, [{}, {}]>] out_shardings=[<@mesh, [{"tp"}, {}]>] manual_axes={"tp"} (%a: tensor<4x8xf32>, %b: tensor<6x1xi32>, %c: tensor<6x8xf32>) {
    // CHECK: "stablehlo.scatter"
    // CHECK: entangle.relation = "opaque: scatter into dim 0, which is split over 'tp': each device would index its own block
    // expected-error @+1 {{scatter into dim 0, which is split over 'tp': each device would index its own block}}
    %1 = "stablehlo.scatter"(%a, %b, %c) <{indices_are_sorted = false, scatter_dimension_numbers = #stablehlo.scatter<update_window_dims = [1], inserted_window_dims = [0], scatter_dims_to_operand_dims = [0], index_vector_dim = 1>, unique_indices = false}> ({
    ^bb0(%p: tensor<f32>, %q: tensor<f32>):
      stablehlo.return %q : tensor<f32>
    }) : (tensor<4x8xf32>, tensor<6x1xi32>, tensor<6x8xf32>) -> tensor<4x8xf32>
    sdy.return %1 : tensor<4x8xf32>
  } : (tensor<16x8xf32>, tensor<6x1xi32>, tensor<6x8xf32>) -> tensor<16x8xf32>
  return %0 : tensor<16x8xf32>
}

// -----

sdy.mesh @mesh = <["dp"=4]>

func.func @ref(%i: tensor<8x1x1xi32>) -> tensor<8x16xf32> {
  %zero = stablehlo.constant dense<0.0> : tensor<8x16xf32>
  %one = stablehlo.constant dense<1.0> : tensor<8x1xf32>
  %0 = "stablehlo.scatter"(%zero, %i, %one) <{indices_are_sorted = false, scatter_dimension_numbers = #stablehlo.scatter<inserted_window_dims = [1], input_batching_dims = [0], scatter_indices_batching_dims = [0], scatter_dims_to_operand_dims = [1], index_vector_dim = 2>, unique_indices = false}> ({
  ^bb0(%a: tensor<f32>, %b: tensor<f32>):
    %s = stablehlo.add %a, %b : tensor<f32>
    stablehlo.return %s : tensor<f32>
  }) : (tensor<8x16xf32>, tensor<8x1x1xi32>, tensor<8x1xf32>) -> tensor<8x16xf32>
  return %0 : tensor<8x16xf32>
}

// Batching dims (the gradient of take_along_axis: the target logit of a cross-entropy): the
// rows of the indices split over dp, the zero buffer and the cotangent built at the local
// shape; each device writes into its own rows, so the result keeps the split (no partial sum).
// CHECK-LABEL: func.func @batching_rows_split
// FULL: func.func @batching_rows_split{{.*}}entangle.rho = ["result#0 = concat over 'dp' along dim 0"], entangle.verdict = "proven"
func.func @batching_rows_split(%i: tensor<8x1x1xi32>) -> tensor<8x16xf32> attributes {entangle.refines = @ref} {
  %0 = sdy.manual_computation(%i) in_shardings=[<@mesh, [{"dp"}, {}, {}]>] out_shardings=[<@mesh, [{"dp"}, {}]>] manual_axes={"dp"} (%b: tensor<2x1x1xi32>) {
    %zero = stablehlo.constant dense<0.0> : tensor<2x16xf32>
    %one = stablehlo.constant dense<1.0> : tensor<2x1xf32>
    // CHECK: "stablehlo.scatter"
    // CHECK: entangle.relation = "tile [{dp}, {}] : scatter(0, %arg0, 1)"
    %1 = "stablehlo.scatter"(%zero, %b, %one) <{indices_are_sorted = false, scatter_dimension_numbers = #stablehlo.scatter<inserted_window_dims = [1], input_batching_dims = [0], scatter_indices_batching_dims = [0], scatter_dims_to_operand_dims = [1], index_vector_dim = 2>, unique_indices = false}> ({
    ^bb0(%p: tensor<f32>, %q: tensor<f32>):
      %s = stablehlo.add %p, %q : tensor<f32>
      stablehlo.return %s : tensor<f32>
    }) : (tensor<2x16xf32>, tensor<2x1x1xi32>, tensor<2x1xf32>) -> tensor<2x16xf32>
    sdy.return %1 : tensor<2x16xf32>
  } : (tensor<8x1x1xi32>) -> tensor<8x16xf32>
  return %0 : tensor<8x16xf32>
}

// -----

sdy.mesh @mesh = <["dp"=2, "tp"=2]>

func.func @ref(%x: tensor<8x16xf32>, %i: tensor<8x1x1xi32>, %u: tensor<8x1xf32>) -> tensor<8x16xf32> {
  // expected-note @+1 {{corresponds to the reference op stablehlo.scatter}}
  %0 = "stablehlo.scatter"(%x, %i, %u) <{indices_are_sorted = false, scatter_dimension_numbers = #stablehlo.scatter<inserted_window_dims = [1], input_batching_dims = [0], scatter_indices_batching_dims = [0], scatter_dims_to_operand_dims = [1], index_vector_dim = 2>, unique_indices = false}> ({
  ^bb0(%a: tensor<f32>, %b: tensor<f32>):
    %s = stablehlo.add %a, %b : tensor<f32>
    stablehlo.return %s : tensor<f32>
  }) : (tensor<8x16xf32>, tensor<8x1x1xi32>, tensor<8x1xf32>) -> tensor<8x16xf32>
  return %0 : tensor<8x16xf32>
}

// Refused: the operand's rows split over dp but the indices' rows over tp: device (0, 1) would
// add the updates of rows 4-7 into rows 0-3.
// CHECK-LABEL: func.func @batching_operand_not_split
// FULL: func.func @batching_operand_not_split{{.*}}entangle.verdict = "not proven"
func.func @batching_operand_not_split(%x: tensor<8x16xf32>, %i: tensor<8x1x1xi32>, %u: tensor<8x1xf32>) -> tensor<8x16xf32> attributes {entangle.refines = @ref} {
  %0 = sdy.manual_computation(%x, %i, %u) in_shardings=[<@mesh, [{"dp"}, {}]>, <@mesh, [{"tp"}, {}, {}]>, <@mesh, [{"tp"}, {}]>] out_shardings=[<@mesh, [{"dp"}, {}]>] manual_axes={"dp", "tp"} (%a: tensor<4x16xf32>, %b: tensor<4x1x1xi32>, %c: tensor<4x1xf32>) {
    // CHECK: "stablehlo.scatter"
    // CHECK: entangle.relation = "opaque: scatter: batching dim 0 of the operand is split over 'dp' but the matching indices dim 0 is split over 'tp'
    // expected-error @+1 {{scatter: batching dim 0 of the operand is split over 'dp' but the matching indices dim 0 is split over 'tp': each device would pair rows of different tokens}}
    %1 = "stablehlo.scatter"(%a, %b, %c) <{indices_are_sorted = false, scatter_dimension_numbers = #stablehlo.scatter<inserted_window_dims = [1], input_batching_dims = [0], scatter_indices_batching_dims = [0], scatter_dims_to_operand_dims = [1], index_vector_dim = 2>, unique_indices = false}> ({
    ^bb0(%p: tensor<f32>, %q: tensor<f32>):
      %s = stablehlo.add %p, %q : tensor<f32>
      stablehlo.return %s : tensor<f32>
    }) : (tensor<4x16xf32>, tensor<4x1x1xi32>, tensor<4x1xf32>) -> tensor<4x16xf32>
    sdy.return %1 : tensor<4x16xf32>
  } : (tensor<8x16xf32>, tensor<8x1x1xi32>, tensor<8x1xf32>) -> tensor<8x16xf32>
  return %0 : tensor<8x16xf32>
}
