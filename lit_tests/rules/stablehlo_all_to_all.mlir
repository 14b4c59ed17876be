// RUN: entangle-opt %s --split-input-file --entangle-normalize --entangle-import-shardings --entangle-infer-relations | filecheck %s
// RUN: entangle-opt %s --split-input-file --entangle-normalize --entangle-import-shardings --entangle-infer-relations --entangle-check-refinement --verify-diagnostics | filecheck %s --check-prefix=FULL

// stablehlo.all_to_all (collectives rule): moves the split over axes G from the concat dim (G
// must be its minor axes) to the split dim (appended as minor axes). A concat dim that is not
// split over G, or a partial sum, is refused.

sdy.mesh @mesh = <["tp"=4]>

func.func @ref(%x: tensor<16x8xf32>) -> tensor<16x8xf32> {
  return %x : tensor<16x8xf32>
}

// Ulysses-style sequence <-> heads exchange: rows split -> columns split.
// CHECK-LABEL: func.func @rows_to_cols
// FULL: func.func @rows_to_cols{{.*}}entangle.rho = ["result#0 = concat over 'tp' along dim 1"], entangle.verdict = "proven"
func.func @rows_to_cols(%x: tensor<16x8xf32>) -> tensor<16x8xf32> attributes {entangle.refines = @ref} {
  %0 = sdy.manual_computation(%x) in_shardings=[<@mesh, [{"tp"}, {}]>] out_shardings=[<@mesh, [{}, {"tp"}]>] manual_axes={"tp"} (%a: tensor<4x8xf32>) {
    // CHECK: "stablehlo.all_to_all"{{.*}}entangle.relation = "tile [{}, {tp}] : %arg0"
    %1 = "stablehlo.all_to_all"(%a) {split_dimension = 1 : i64, concat_dimension = 0 : i64, split_count = 4 : i64, replica_groups = dense<[[0, 1, 2, 3]]> : tensor<1x4xi64>, channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>} : (tensor<4x8xf32>) -> tensor<16x2xf32>
    sdy.return %1 : tensor<16x2xf32>
  } : (tensor<16x8xf32>) -> tensor<16x8xf32>
  return %0 : tensor<16x8xf32>
}

// -----

sdy.mesh @mesh = <["dp"=2, "tp"=4]>

func.func @ref(%x: tensor<8x16xf32>) -> tensor<8x16xf32> {
  return %x : tensor<8x16xf32>
}

// 2-D mesh: the tp split of dim 1 moves to dim 0, minor to dp.
// CHECK-LABEL: func.func @cols_to_rows_2d
// FULL: func.func @cols_to_rows_2d{{.*}}entangle.rho = ["result#0 = concat over ('dp', 'tp') along dim 0"], entangle.verdict = "proven"
func.func @cols_to_rows_2d(%x: tensor<8x16xf32>) -> tensor<8x16xf32> attributes {entangle.refines = @ref} {
  %0 = sdy.manual_computation(%x) in_shardings=[<@mesh, [{"dp"}, {"tp"}]>] out_shardings=[<@mesh, [{"dp", "tp"}, {}]>] manual_axes={"dp", "tp"} (%a: tensor<4x4xf32>) {
    // CHECK: "stablehlo.all_to_all"{{.*}}entangle.relation = "tile [{dp, tp}, {}] : %arg0"
    %1 = "stablehlo.all_to_all"(%a) {split_dimension = 0 : i64, concat_dimension = 1 : i64, split_count = 4 : i64, replica_groups = dense<[[0, 1, 2, 3], [4, 5, 6, 7]]> : tensor<2x4xi64>, channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>} : (tensor<4x4xf32>) -> tensor<1x16xf32>
    sdy.return %1 : tensor<1x16xf32>
  } : (tensor<8x16xf32>) -> tensor<8x16xf32>
  return %0 : tensor<8x16xf32>
}

// -----

sdy.mesh @mesh = <["tp"=4]>

func.func @ref(%x: tensor<16x8xf32>) -> tensor<16x8xf32> {
  return %x : tensor<16x8xf32>
}

// Refused: the concat dim (1) is not split over tp; each device would stack 4 different
// column blocks of its own rows.
// CHECK-LABEL: func.func @wrong_dim
// FULL: func.func @wrong_dim{{.*}}entangle.verdict = "not proven"
func.func @wrong_dim(%x: tensor<16x8xf32>) -> tensor<16x8xf32> attributes {entangle.refines = @ref} {
  %0 = sdy.manual_computation(%x) in_shardings=[<@mesh, [{"tp"}, {}]>] out_shardings=[<@mesh, [{"tp"}, {}]>] manual_axes={"tp"} (%a: tensor<4x8xf32>) {
    // CHECK: "stablehlo.all_to_all"{{.*}}entangle.relation = "opaque: all_to_all concatenates along dim 1 but the value is not split along dim 1 over 'tp'"
    // expected-error @+1 {{all_to_all concatenates along dim 1 but the value is not split along dim 1 over 'tp'}}
    %1 = "stablehlo.all_to_all"(%a) {split_dimension = 0 : i64, concat_dimension = 1 : i64, split_count = 4 : i64, replica_groups = dense<[[0, 1, 2, 3]]> : tensor<1x4xi64>, channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>} : (tensor<4x8xf32>) -> tensor<1x32xf32>
    %2 = stablehlo.reshape %1 : (tensor<1x32xf32>) -> tensor<4x8xf32>
    sdy.return %2 : tensor<4x8xf32>
  } : (tensor<16x8xf32>) -> tensor<16x8xf32>
  return %0 : tensor<16x8xf32>
}

// -----

sdy.mesh @mesh = <["tp"=4]>

func.func @ref(%x: tensor<8x16xf32>, %w: tensor<16x8xf32>) -> tensor<8x8xf32> {
  // expected-note @+1 {{corresponds to the reference op stablehlo.dot_general}}
  %0 = stablehlo.dot_general %x, %w, contracting_dims = [1] x [0] : (tensor<8x16xf32>, tensor<16x8xf32>) -> tensor<8x8xf32>
  return %0 : tensor<8x8xf32>
}

// Refused: exchanging blocks of a partial sum.
// CHECK-LABEL: func.func @partial
// FULL: func.func @partial{{.*}}entangle.verdict = "not proven"
func.func @partial(%x: tensor<8x16xf32>, %w: tensor<16x8xf32>) -> tensor<8x8xf32> attributes {entangle.refines = @ref} {
  %0 = sdy.manual_computation(%x, %w) in_shardings=[<@mesh, [{}, {"tp"}]>, <@mesh, [{"tp"}, {}]>] out_shardings=[<@mesh, [{}, {}]>] manual_axes={"tp"} (%a: tensor<8x4xf32>, %b: tensor<4x8xf32>) {
    // expected-error @+1 {{all_to_all over 'tp' of a partial sum}}
    %p = stablehlo.dot_general %a, %b, contracting_dims = [1] x [0] : (tensor<8x4xf32>, tensor<4x8xf32>) -> tensor<8x8xf32>
    // CHECK: "stablehlo.all_to_all"{{.*}}entangle.relation = "opaque: all_to_all over 'tp' of a partial sum"
    // expected-note @+1 {{the partial sum is used here by stablehlo.all_to_all}}
    %1 = "stablehlo.all_to_all"(%p) {split_dimension = 1 : i64, concat_dimension = 0 : i64, split_count = 4 : i64, replica_groups = dense<[[0, 1, 2, 3]]> : tensor<1x4xi64>, channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>} : (tensor<8x8xf32>) -> tensor<32x2xf32>
    %2 = stablehlo.reshape %1 : (tensor<32x2xf32>) -> tensor<8x8xf32>
    sdy.return %2 : tensor<8x8xf32>
  } : (tensor<8x16xf32>, tensor<16x8xf32>) -> tensor<8x8xf32>
  return %0 : tensor<8x8xf32>
}
