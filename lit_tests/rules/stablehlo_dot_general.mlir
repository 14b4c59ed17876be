// RUN: entangle-opt %s --split-input-file --entangle-normalize --entangle-import-shardings --entangle-infer-relations | filecheck %s
// RUN: entangle-opt %s --split-input-file --entangle-normalize --entangle-import-shardings --entangle-infer-relations --entangle-check-refinement --verify-diagnostics | filecheck %s --check-prefix=FULL

// stablehlo.dot_general (contraction rule): batch dims must be split alike on both sides and
// carry their split; free dims carry theirs; contracting dims split alike by axes G make the
// result a partial sum over G. A mesh axis may split only one dim of the result.

sdy.mesh @mesh = <["tp"=4]>

func.func @ref(%x: tensor<8x16xf32>, %w: tensor<16x32xf32>) -> tensor<8x32xf32> {
  %0 = stablehlo.dot_general %x, %w, contracting_dims = [1] x [0] : (tensor<8x16xf32>, tensor<16x32xf32>) -> tensor<8x32xf32>
  return %0 : tensor<8x32xf32>
}

// Column-parallel linear: replicated x, W split on columns -> result split on columns.
// CHECK-LABEL: func.func @column_parallel
// FULL: func.func @column_parallel{{.*}}entangle.rho = ["result#0 = concat over 'tp' along dim 1"], entangle.verdict = "proven"
func.func @column_parallel(%x: tensor<8x16xf32>, %w: tensor<16x32xf32>) -> tensor<8x32xf32> attributes {entangle.refines = @ref} {
  %0 = sdy.manual_computation(%x, %w) in_shardings=[<@mesh, [{}, {}]>, <@mesh, [{}, {"tp"}]>] out_shardings=[<@mesh, [{}, {"tp"}]>] manual_axes={"tp"} (%a: tensor<8x16xf32>, %b: tensor<16x8xf32>) {
    // CHECK: stablehlo.dot_general %{{.*}}entangle.relation = "tile [{}, {tp}] : dot_general(%arg0, %arg1)"
    %1 = stablehlo.dot_general %a, %b, contracting_dims = [1] x [0] : (tensor<8x16xf32>, tensor<16x8xf32>) -> tensor<8x8xf32>
    sdy.return %1 : tensor<8x8xf32>
  } : (tensor<8x16xf32>, tensor<16x32xf32>) -> tensor<8x32xf32>
  return %0 : tensor<8x32xf32>
}

// -----

sdy.mesh @mesh = <["tp"=4]>

func.func @ref(%x: tensor<8x16xf32>, %w: tensor<16x32xf32>) -> tensor<8x32xf32> {
  %0 = stablehlo.dot_general %x, %w, contracting_dims = [1] x [0] : (tensor<8x16xf32>, tensor<16x32xf32>) -> tensor<8x32xf32>
  return %0 : tensor<8x32xf32>
}

// Row-parallel linear: the contracting dim split over tp gives a partial sum; psum completes it.
// CHECK-LABEL: func.func @row_parallel
// FULL: func.func @row_parallel{{.*}}entangle.rho = ["result#0 = replicated on every device"], entangle.verdict = "proven"
func.func @row_parallel(%x: tensor<8x16xf32>, %w: tensor<16x32xf32>) -> tensor<8x32xf32> attributes {entangle.refines = @ref} {
  %0 = sdy.manual_computation(%x, %w) in_shardings=[<@mesh, [{}, {"tp"}]>, <@mesh, [{"tp"}, {}]>] out_shardings=[<@mesh, [{}, {}]>] manual_axes={"tp"} (%a: tensor<8x4xf32>, %b: tensor<4x32xf32>) {
    // CHECK: stablehlo.dot_general %{{.*}}entangle.relation = "partial sum {tp} : dot_general(%arg0, %arg1)"
    %1 = stablehlo.dot_general %a, %b, contracting_dims = [1] x [0] : (tensor<8x4xf32>, tensor<4x32xf32>) -> tensor<8x32xf32>
    %2 = "stablehlo.all_reduce"(%1) ({
      ^bb0(%u: tensor<f32>, %v: tensor<f32>):
        %s = stablehlo.add %u, %v : tensor<f32>
        stablehlo.return %s : tensor<f32>
    }) {replica_groups = dense<[[0, 1, 2, 3]]> : tensor<1x4xi64>, channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, use_global_device_ids} : (tensor<8x32xf32>) -> tensor<8x32xf32>
    sdy.return %2 : tensor<8x32xf32>
  } : (tensor<8x16xf32>, tensor<16x32xf32>) -> tensor<8x32xf32>
  return %0 : tensor<8x32xf32>
}

// -----

sdy.mesh @mesh = <["tp"=4]>

func.func @ref(%x: tensor<8x16xf32>, %w: tensor<16x32xf32>) -> tensor<8x32xf32> {
  // expected-note @+1 {{corresponds to the reference op stablehlo.dot_general}}
  %0 = stablehlo.dot_general %x, %w, contracting_dims = [1] x [0] : (tensor<8x16xf32>, tensor<16x32xf32>) -> tensor<8x32xf32>
  return %0 : tensor<8x32xf32>
}

// The same without the psum: the partial sum leaves shard_map.
// FULL: func.func @missing_psum{{.*}}entangle.verdict = "not proven"
func.func @missing_psum(%x: tensor<8x16xf32>, %w: tensor<16x32xf32>) -> tensor<8x32xf32> attributes {entangle.refines = @ref} {
  // expected-note @+1 {{the partial sum leaves shard_map here}}
  %0 = sdy.manual_computation(%x, %w) in_shardings=[<@mesh, [{}, {"tp"}]>, <@mesh, [{"tp"}, {}]>] out_shardings=[<@mesh, [{}, {}]>] manual_axes={"tp"} (%a: tensor<8x4xf32>, %b: tensor<4x32xf32>) {
    // expected-error @+1 {{value is still a partial sum over 'tp' when it leaves shard_map (result #0): missing all_reduce/psum}}
    %1 = stablehlo.dot_general %a, %b, contracting_dims = [1] x [0] : (tensor<8x4xf32>, tensor<4x32xf32>) -> tensor<8x32xf32>
    sdy.return %1 : tensor<8x32xf32>
  } : (tensor<8x16xf32>, tensor<16x32xf32>) -> tensor<8x32xf32>
  return %0 : tensor<8x32xf32>
}

// -----

sdy.mesh @mesh = <["dp"=2, "tp"=4]>

func.func @ref(%q: tensor<2x8x4x4xf32>, %k: tensor<2x8x4x4xf32>) -> tensor<2x4x8x8xf32> {
  %0 = stablehlo.dot_general %q, %k, batching_dims = [0, 2] x [0, 2], contracting_dims = [3] x [3] : (tensor<2x8x4x4xf32>, tensor<2x8x4x4xf32>) -> tensor<2x4x8x8xf32>
  return %0 : tensor<2x4x8x8xf32>
}

// Attention scores einsum('bqhd,bkhd->bhqk') with batch over dp and heads over tp: both batch
// dims carry their split into the result.
// CHECK-LABEL: func.func @batch_dims_2d
// FULL: func.func @batch_dims_2d{{.*}}entangle.verdict = "proven"
func.func @batch_dims_2d(%q: tensor<2x8x4x4xf32>, %k: tensor<2x8x4x4xf32>) -> tensor<2x4x8x8xf32> attributes {entangle.refines = @ref} {
  %0 = sdy.manual_computation(%q, %k) in_shardings=[<@mesh, [{"dp"}, {}, {"tp"}, {}]>, <@mesh, [{"dp"}, {}, {"tp"}, {}]>] out_shardings=[<@mesh, [{"dp"}, {"tp"}, {}, {}]>] manual_axes={"dp", "tp"} (%a: tensor<1x8x1x4xf32>, %b: tensor<1x8x1x4xf32>) {
    // CHECK: stablehlo.dot_general %{{.*}}entangle.relation = "tile [{dp}, {tp}, {}, {}] : dot_general(%arg0, %arg1)"
    %1 = stablehlo.dot_general %a, %b, batching_dims = [0, 2] x [0, 2], contracting_dims = [3] x [3] : (tensor<1x8x1x4xf32>, tensor<1x8x1x4xf32>) -> tensor<1x1x8x8xf32>
    sdy.return %1 : tensor<1x1x8x8xf32>
  } : (tensor<2x8x4x4xf32>, tensor<2x8x4x4xf32>) -> tensor<2x4x8x8xf32>
  return %0 : tensor<2x4x8x8xf32>
}

// -----

sdy.mesh @mesh = <["dp"=2, "tp"=4]>

func.func @ref(%x: tensor<8x16xf32>, %w: tensor<16x32xf32>) -> tensor<8x32xf32> {
  %0 = stablehlo.dot_general %x, %w, contracting_dims = [1] x [0] : (tensor<8x16xf32>, tensor<16x32xf32>) -> tensor<8x32xf32>
  return %0 : tensor<8x32xf32>
}

// 2-D mesh: rows over dp carried, contraction over tp partial; psum over tp only.
// CHECK-LABEL: func.func @rows_and_partial
// FULL: func.func @rows_and_partial{{.*}}entangle.rho = ["result#0 = concat over 'dp' along dim 0"], entangle.verdict = "proven"
func.func @rows_and_partial(%x: tensor<8x16xf32>, %w: tensor<16x32xf32>) -> tensor<8x32xf32> attributes {entangle.refines = @ref} {
  %0 = sdy.manual_computation(%x, %w) in_shardings=[<@mesh, [{"dp"}, {"tp"}]>, <@mesh, [{"tp"}, {}]>] out_shardings=[<@mesh, [{"dp"}, {}]>] manual_axes={"dp", "tp"} (%a: tensor<4x4xf32>, %b: tensor<4x32xf32>) {
    // CHECK: stablehlo.dot_general %{{.*}}entangle.relation = "tile [{dp}, {}] partial sum {tp} : dot_general(%arg0, %arg1)"
    %1 = stablehlo.dot_general %a, %b, contracting_dims = [1] x [0] : (tensor<4x4xf32>, tensor<4x32xf32>) -> tensor<4x32xf32>
    %2 = "stablehlo.all_reduce"(%1) ({
      ^bb0(%u: tensor<f32>, %v: tensor<f32>):
        %s = stablehlo.add %u, %v : tensor<f32>
        stablehlo.return %s : tensor<f32>
    }) {replica_groups = dense<[[0, 1, 2, 3], [4, 5, 6, 7]]> : tensor<2x4xi64>, channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, use_global_device_ids} : (tensor<4x32xf32>) -> tensor<4x32xf32>
    sdy.return %2 : tensor<4x32xf32>
  } : (tensor<8x16xf32>, tensor<16x32xf32>) -> tensor<8x32xf32>
  return %0 : tensor<8x32xf32>
}

// -----

sdy.mesh @mesh = <["dp"=4, "tp"=4]>

func.func @ref(%x: tensor<8x16xf32>, %y: tensor<16x8xf32>) -> tensor<8x8xf32> {
  // expected-note @+1 {{corresponds to the reference op stablehlo.dot_general}}
  %0 = stablehlo.dot_general %x, %y, contracting_dims = [1] x [0] : (tensor<8x16xf32>, tensor<16x8xf32>) -> tensor<8x8xf32>
  return %0 : tensor<8x8xf32>
}

// Refused: the contracting dims are split over different axes (tp vs dp), so the local
// products pair up the wrong blocks. ("dim 0" counts the contracting pairs.)
// CHECK-LABEL: func.func @contract_mismatch
// FULL: func.func @contract_mismatch{{.*}}entangle.verdict = "not proven"
func.func @contract_mismatch(%x: tensor<8x16xf32>, %y: tensor<16x8xf32>) -> tensor<8x8xf32> attributes {entangle.refines = @ref} {
  %0 = sdy.manual_computation(%x, %y) in_shardings=[<@mesh, [{}, {"tp"}]>, <@mesh, [{"dp"}, {}]>] out_shardings=[<@mesh, [{}, {}]>] manual_axes={"dp", "tp"} (%a: tensor<8x4xf32>, %b: tensor<4x8xf32>) {
    // expected-error @+2 {{dot_general: operands are laid out differently along dim 0 (split over 'tp' vs split over 'dp')}}
    // CHECK: stablehlo.dot_general %{{.*}}entangle.relation = "opaque: dot_general: operands are laid out differently along dim 0 (split over 'tp' vs split over 'dp')"
    %1 = stablehlo.dot_general %a, %b, contracting_dims = [1] x [0] : (tensor<8x4xf32>, tensor<4x8xf32>) -> tensor<8x8xf32>
    sdy.return %1 : tensor<8x8xf32>
  } : (tensor<8x16xf32>, tensor<16x8xf32>) -> tensor<8x8xf32>
  return %0 : tensor<8x8xf32>
}

// -----

sdy.mesh @mesh = <["tp"=4]>

func.func @ref(%x: tensor<8x16xf32>, %w: tensor<16x32xf32>) -> tensor<8x16xf32> {
  return %x : tensor<8x16xf32>
}

// Refused: rows and columns both split over tp: device i only computes block (i, i). (No
// out_shardings can describe that result, so the function returns x; only the relation is checked.)
// CHECK-LABEL: func.func @diagonal_blocks
// FULL: func.func @diagonal_blocks{{.*}}entangle.verdict = "proven"
func.func @diagonal_blocks(%x: tensor<8x16xf32>, %w: tensor<16x32xf32>) -> tensor<8x16xf32> attributes {entangle.refines = @ref} {
  %0 = sdy.manual_computation(%x, %w) in_shardings=[<@mesh, [{"tp"}, {}]>, <@mesh, [{}, {"tp"}]>] out_shardings=[<@mesh, [{"tp"}, {}]>] manual_axes={"tp"} (%a: tensor<2x16xf32>, %b: tensor<16x8xf32>) {
    // CHECK: stablehlo.dot_general %{{.*}}entangle.relation = "opaque: dot_general: mesh axis 'tp' splits more than one dim of the result (each device only computes diagonal blocks)"
    %1 = stablehlo.dot_general %a, %b, contracting_dims = [1] x [0] : (tensor<2x16xf32>, tensor<16x8xf32>) -> tensor<2x8xf32>
    sdy.return %a : tensor<2x16xf32>
  } : (tensor<8x16xf32>, tensor<16x32xf32>) -> tensor<8x16xf32>
  return %0 : tensor<8x16xf32>
}

// -----

sdy.mesh @mesh = <["tp"=4]>

func.func @ref(%x: tensor<8x16xf32>, %w: tensor<16x8xf32>, %v: tensor<8x8xf32>) -> tensor<8x8xf32> {
  // expected-note @+1 {{corresponds to the reference op stablehlo.dot_general}}
  %0 = stablehlo.dot_general %x, %w, contracting_dims = [1] x [0] : (tensor<8x16xf32>, tensor<16x8xf32>) -> tensor<8x8xf32>
  %1 = stablehlo.dot_general %0, %0, contracting_dims = [1] x [0] : (tensor<8x8xf32>, tensor<8x8xf32>) -> tensor<8x8xf32>
  return %1 : tensor<8x8xf32>
}

// Refused: a product of two partial sums (sum_i a_i)(sum_j b_j) is not sum_i a_i b_i. The error
// points at the op that made the partial sum, the note at its nonlinear use.
// CHECK-LABEL: func.func @two_partials
// FULL: func.func @two_partials{{.*}}entangle.verdict = "not proven"
func.func @two_partials(%x: tensor<8x16xf32>, %w: tensor<16x8xf32>, %v: tensor<8x8xf32>) -> tensor<8x8xf32> attributes {entangle.refines = @ref} {
  %0 = sdy.manual_computation(%x, %w) in_shardings=[<@mesh, [{}, {"tp"}]>, <@mesh, [{"tp"}, {}]>] out_shardings=[<@mesh, [{}, {}]>] manual_axes={"tp"} (%a: tensor<8x4xf32>, %b: tensor<4x8xf32>) {
    // expected-error @+1 {{dot_general multiplies two partial sums (over 'tp' and 'tp'): missing all_reduce/psum before it}}
    %p = stablehlo.dot_general %a, %b, contracting_dims = [1] x [0] : (tensor<8x4xf32>, tensor<4x8xf32>) -> tensor<8x8xf32>
    // expected-note @+2 {{the partial sum is used here by stablehlo.dot_general}}
    // CHECK: stablehlo.dot_general %{{.*}}entangle.relation = "opaque: dot_general multiplies two partial sums (over 'tp' and 'tp'): missing all_reduce/psum before it"
    %1 = stablehlo.dot_general %p, %p, contracting_dims = [1] x [0] : (tensor<8x8xf32>, tensor<8x8xf32>) -> tensor<8x8xf32>
    sdy.return %1 : tensor<8x8xf32>
  } : (tensor<8x16xf32>, tensor<16x8xf32>) -> tensor<8x8xf32>
  return %0 : tensor<8x8xf32>
}
