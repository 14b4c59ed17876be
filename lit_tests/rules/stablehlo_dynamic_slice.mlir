// RUN: entangle-opt %s --split-input-file --entangle-normalize --entangle-import-shardings --entangle-infer-relations | filecheck %s
// RUN: entangle-opt %s --split-input-file --entangle-normalize --entangle-import-shardings --entangle-infer-relations --entangle-check-refinement --verify-diagnostics | filecheck %s --check-prefix=FULL

// stablehlo.dynamic_slice (index rule): a device-dependent offset table over a replicated dim
// that equals block_index(A, d) * size for some mesh axes A makes the result a tiling over A; any
// other table is a wrong offset (reported with a witness device). Constant offsets slice the
// global tensor (replicated dims) or must take a split dim whole.

sdy.mesh @mesh = <["tp"=4]>

func.func @ref(%x: tensor<8x16xf32>) -> tensor<8x16xf32> {
  return %x : tensor<8x16xf32>
}

// Each device slices its own columns: offset axis_index('tp') * 4.
// CHECK-LABEL: func.func @own_block
// FULL: func.func @own_block{{.*}}entangle.rho = ["result#0 = concat over 'tp' along dim 1"], entangle.verdict = "proven"
func.func @own_block(%x: tensor<8x16xf32>) -> tensor<8x16xf32> attributes {entangle.refines = @ref} {
  %0 = sdy.manual_computation(%x) in_shardings=[<@mesh, [{}, {}]>] out_shardings=[<@mesh, [{}, {"tp"}]>] manual_axes={"tp"} (%a: tensor<8x16xf32>) {
    %pid = stablehlo.partition_id : tensor<ui32>
    %i = stablehlo.convert %pid : (tensor<ui32>) -> tensor<i32>
    %c4 = stablehlo.constant dense<4> : tensor<i32>
    %off = stablehlo.multiply %i, %c4 : tensor<i32>
    %c0 = stablehlo.constant dense<0> : tensor<i32>
    // CHECK: stablehlo.dynamic_slice %{{.*}}entangle.relation = "tile [{}, {tp}] : %arg0"
    %1 = stablehlo.dynamic_slice %a, %c0, %off, sizes = [8, 4] : (tensor<8x16xf32>, tensor<i32>, tensor<i32>) -> tensor<8x4xf32>
    sdy.return %1 : tensor<8x4xf32>
  } : (tensor<8x16xf32>) -> tensor<8x16xf32>
  return %0 : tensor<8x16xf32>
}

// -----

sdy.mesh @mesh = <["dp"=2, "tp"=4]>

func.func @ref(%x: tensor<8x16xf32>) -> tensor<8x16xf32> {
  return %x : tensor<8x16xf32>
}

// 2-D: rows by axis_index('dp') * 4, columns by axis_index('tp') * 4.
// CHECK-LABEL: func.func @own_block_2d
// FULL: func.func @own_block_2d{{.*}}entangle.verdict = "proven"
func.func @own_block_2d(%x: tensor<8x16xf32>) -> tensor<8x16xf32> attributes {entangle.refines = @ref} {
  %0 = sdy.manual_computation(%x) in_shardings=[<@mesh, [{}, {}]>] out_shardings=[<@mesh, [{"dp"}, {"tp"}]>] manual_axes={"dp", "tp"} (%a: tensor<8x16xf32>) {
    %pid = stablehlo.partition_id : tensor<ui32>
    %i = stablehlo.convert %pid : (tensor<ui32>) -> tensor<i32>
    %c4 = stablehlo.constant dense<4> : tensor<i32>
    %tp = stablehlo.remainder %i, %c4 : tensor<i32>
    %dp = stablehlo.divide %i, %c4 : tensor<i32>
    %row = stablehlo.multiply %dp, %c4 : tensor<i32>
    %col = stablehlo.multiply %tp, %c4 : tensor<i32>
    // CHECK: stablehlo.dynamic_slice %{{.*}}entangle.relation = "tile [{dp}, {tp}] : %arg0"
    %1 = stablehlo.dynamic_slice %a, %row, %col, sizes = [4, 4] : (tensor<8x16xf32>, tensor<i32>, tensor<i32>) -> tensor<4x4xf32>
    sdy.return %1 : tensor<4x4xf32>
  } : (tensor<8x16xf32>) -> tensor<8x16xf32>
  return %0 : tensor<8x16xf32>
}

// -----

sdy.mesh @mesh = <["dp"=2, "tp"=4]>

func.func @ref(%x: tensor<8x16xf32>) -> tensor<8x16xf32> {
  return %x : tensor<8x16xf32>
}

// Columns split over (dp, tp) by partition_id * 2; a constant offset slices rows globally.
// CHECK-LABEL: func.func @both_axes_one_dim
// FULL: func.func @both_axes_one_dim{{.*}}entangle.verdict = "not proven"
func.func @both_axes_one_dim(%x: tensor<8x16xf32>) -> tensor<8x16xf32> attributes {entangle.refines = @ref} {
  %0 = sdy.manual_computation(%x) in_shardings=[<@mesh, [{}, {}]>] out_shardings=[<@mesh, [{}, {"dp", "tp"}]>] manual_axes={"dp", "tp"} (%a: tensor<8x16xf32>) {
    %pid = stablehlo.partition_id : tensor<ui32>
    %i = stablehlo.convert %pid : (tensor<ui32>) -> tensor<i32>
    %c2 = stablehlo.constant dense<2> : tensor<i32>
    %col = stablehlo.multiply %i, %c2 : tensor<i32>
    %c0 = stablehlo.constant dense<0> : tensor<i32>
    // CHECK: stablehlo.dynamic_slice %{{.*}}entangle.relation = "tile [{}, {dp, tp}] : %arg0"
    %1 = stablehlo.dynamic_slice %a, %c0, %col, sizes = [8, 2] : (tensor<8x16xf32>, tensor<i32>, tensor<i32>) -> tensor<8x2xf32>
    // CHECK: stablehlo.dynamic_slice %{{.*}}entangle.relation = "tile [{}, {dp, tp}] : slice(%arg0)"
    // expected-error @+1 {{dynamic_slice computes slice(%arg0), which the reference never computes}}
    %2 = stablehlo.dynamic_slice %1, %c2, %c0, sizes = [4, 2] : (tensor<8x2xf32>, tensor<i32>, tensor<i32>) -> tensor<4x2xf32>
    %3 = stablehlo.concatenate %2, %2, dim = 0 : (tensor<4x2xf32>, tensor<4x2xf32>) -> tensor<8x2xf32>
    sdy.return %3 : tensor<8x2xf32>
  } : (tensor<8x16xf32>) -> tensor<8x16xf32>
  // expected-note @+1 {{result #0 differs from the reference}}
  return %0 : tensor<8x16xf32>
}

// -----

sdy.mesh @mesh = <["tp"=4]>

func.func @ref(%x: tensor<8x16xf32>) -> tensor<8x16xf32> {
  return %x : tensor<8x16xf32>
}

// A wrong offset table: device 2 reads columns [4, 8) instead of its own [8, 12).
// CHECK-LABEL: func.func @wrong_offset
// FULL: func.func @wrong_offset{{.*}}entangle.verdict = "not proven"
func.func @wrong_offset(%x: tensor<8x16xf32>) -> tensor<8x16xf32> attributes {entangle.refines = @ref} {
  %0 = sdy.manual_computation(%x) in_shardings=[<@mesh, [{}, {}]>] out_shardings=[<@mesh, [{}, {"tp"}]>] manual_axes={"tp"} (%a: tensor<8x16xf32>) {
    %pid = stablehlo.partition_id : tensor<ui32>
    %i = stablehlo.convert %pid : (tensor<ui32>) -> tensor<i32>
    %c2 = stablehlo.constant dense<2> : tensor<i32>
    %c4 = stablehlo.constant dense<4> : tensor<i32>
    %off = stablehlo.multiply %i, %c4 : tensor<i32>
    %is2 = stablehlo.compare EQ, %i, %c2, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
    // CHECK: stablehlo.select %{{.*}}entangle.relation = "device scalar [0, 4, 4, 12]"
    %bad = stablehlo.select %is2, %c4, %off : tensor<i1>, tensor<i32>
    %c0 = stablehlo.constant dense<0> : tensor<i32>
    // CHECK: stablehlo.dynamic_slice %{{.*}}entangle.relation = "opaque: device-dependent offset is wrong along dim 1: device 2 reads [4, 8) instead of its own block [8, 12); found offsets [0, 4, 4, 12], expected offset = 4 * axis_index('tp')"
    // expected-error @+1 {{device-dependent offset is wrong along dim 1: device 2 reads [4, 8) instead of its own block [8, 12); found offsets [0, 4, 4, 12], expected offset = 4 * axis_index('tp')}}
    %1 = stablehlo.dynamic_slice %a, %c0, %bad, sizes = [8, 4] : (tensor<8x16xf32>, tensor<i32>, tensor<i32>) -> tensor<8x4xf32>
    sdy.return %1 : tensor<8x4xf32>
  } : (tensor<8x16xf32>) -> tensor<8x16xf32>
  return %0 : tensor<8x16xf32>
}

// -----

sdy.mesh @mesh = <["dp"=2, "tp"=4]>

func.func @ref(%x: tensor<8x16xf32>) -> tensor<8x16xf32> {
  return %x : tensor<8x16xf32>
}

// A wrong offset on a 2-D mesh: partition_id * 4 runs past the 16 columns for dp = 1, and
// the clamped offsets are no block offsets.
// CHECK-LABEL: func.func @wrong_offset_2d
// FULL: func.func @wrong_offset_2d{{.*}}entangle.verdict = "not proven"
func.func @wrong_offset_2d(%x: tensor<8x16xf32>) -> tensor<8x16xf32> attributes {entangle.refines = @ref} {
  %0 = sdy.manual_computation(%x) in_shardings=[<@mesh, [{}, {}]>] out_shardings=[<@mesh, [{}, {"tp"}]>] manual_axes={"dp", "tp"} (%a: tensor<8x16xf32>) {
    %pid = stablehlo.partition_id : tensor<ui32>
    %i = stablehlo.convert %pid : (tensor<ui32>) -> tensor<i32>
    %c4 = stablehlo.constant dense<4> : tensor<i32>
    %off = stablehlo.multiply %i, %c4 : tensor<i32>
    %c0 = stablehlo.constant dense<0> : tensor<i32>
    // CHECK: stablehlo.dynamic_slice %{{.*}}entangle.relation = "opaque: device-dependent offset is wrong along dim 1: device 4 reads [12, 16) instead of its own block [0, 4); found offsets [0, 4, 8, 12, 12, 12, 12, 12], expected offset = 4 * axis_index('tp')"
    // expected-error @+1 {{device 4 reads [12, 16) instead of its own block [0, 4); found offsets [0, 4, 8, 12, 12, 12, 12, 12], expected offset = 4 * axis_index('tp')}}
    %1 = stablehlo.dynamic_slice %a, %c0, %off, sizes = [8, 4] : (tensor<8x16xf32>, tensor<i32>, tensor<i32>) -> tensor<8x4xf32>
    sdy.return %1 : tensor<8x4xf32>
  } : (tensor<8x16xf32>) -> tensor<8x16xf32>
  return %0 : tensor<8x16xf32>
}

// -----

sdy.mesh @mesh = <["tp"=4]>

func.func @ref(%x: tensor<8x16xf32>) -> tensor<8x16xf32> {
  return %x : tensor<8x16xf32>
}

// Refused: a device-dependent offset into a dim that is already split, and a constant partial
// slice of a split dim.
// CHECK-LABEL: func.func @split_dim
// FULL: func.func @split_dim{{.*}}entangle.verdict = "not proven"
func.func @split_dim(%x: tensor<8x16xf32>) -> tensor<8x16xf32> attributes {entangle.refines = @ref} {
  %0 = sdy.manual_computation(%x) in_shardings=[<@mesh, [{}, {"tp"}]>] out_shardings=[<@mesh, [{}, {"tp"}]>] manual_axes={"tp"} (%a: tensor<8x4xf32>) {
    %pid = stablehlo.partition_id : tensor<ui32>
    %i = stablehlo.convert %pid : (tensor<ui32>) -> tensor<i32>
    %c0 = stablehlo.constant dense<0> : tensor<i32>
    %c1 = stablehlo.constant dense<1> : tensor<i32>
    // CHECK: stablehlo.dynamic_slice %{{.*}}entangle.relation = "opaque: dynamic_slice with a device-dependent offset in dim 1, which is already split over 'tp', that selects no sub-block of it"
    %1 = stablehlo.dynamic_slice %a, %c0, %i, sizes = [8, 1] : (tensor<8x4xf32>, tensor<i32>, tensor<i32>) -> tensor<8x1xf32>
    // CHECK: stablehlo.dynamic_slice %{{.*}}entangle.relation = "opaque: dynamic_slice of dim 1, which is split over 'tp': each device slices its own block"
    // expected-error @+1 {{dynamic_slice of dim 1, which is split over 'tp': each device slices its own block}}
    %2 = stablehlo.dynamic_slice %a, %c0, %c1, sizes = [8, 2] : (tensor<8x4xf32>, tensor<i32>, tensor<i32>) -> tensor<8x2xf32>
    %3 = stablehlo.concatenate %2, %2, dim = 1 : (tensor<8x2xf32>, tensor<8x2xf32>) -> tensor<8x4xf32>
    sdy.return %3 : tensor<8x4xf32>
  } : (tensor<8x16xf32>) -> tensor<8x16xf32>
  return %0 : tensor<8x16xf32>
}
