// RUN: entangle-opt %s --split-input-file --entangle-normalize --entangle-import-shardings --entangle-infer-relations | filecheck %s
// RUN: entangle-opt %s --split-input-file --entangle-normalize --entangle-import-shardings --entangle-infer-relations --entangle-check-refinement --verify-diagnostics | filecheck %s --check-prefix=FULL

// stablehlo.reduce_window (reduction rule): windows along dims that are not split keep the
// layout (each device reduces whole windows of its block: jnp.cumsum along an unsplit dim);
// a split dim must have the trivial window. Partial sums stay partial through a sum window.

sdy.mesh @mesh = <["tp"=4]>

func.func @ref(%x: tensor<16x8xf32>) -> tensor<16x8xf32> {
  %zero = stablehlo.constant dense<0.0> : tensor<f32>
  %0 = "stablehlo.reduce_window"(%x, %zero) <{padding = dense<[[0, 0], [7, 0]]> : tensor<2x2xi64>, window_dimensions = array<i64: 1, 8>}> ({
  ^bb0(%a: tensor<f32>, %b: tensor<f32>):
    %s = stablehlo.add %a, %b : tensor<f32>
    stablehlo.return %s : tensor<f32>
  }) : (tensor<16x8xf32>, tensor<f32>) -> tensor<16x8xf32>
  return %0 : tensor<16x8xf32>
}

// cumsum along the columns, rows split over tp.
// CHECK-LABEL: func.func @cumsum_rows_split
// FULL: func.func @cumsum_rows_split{{.*}}entangle.rho = ["result#0 = concat over 'tp' along dim 0"], entangle.verdict = "proven"
func.func @cumsum_rows_split(%x: tensor<16x8xf32>) -> tensor<16x8xf32> attributes {entangle.refines = @ref} {
  %0 = sdy.manual_computation(%x) in_shardings=[<@mesh, [{"tp"}, {}]>] out_shardings=[<@mesh, [{"tp"}, {}]>] manual_axes={"tp"} (%a: tensor<4x8xf32>) {
    %zero = stablehlo.constant dense<0.0> : tensor<f32>
    // CHECK: "stablehlo.reduce_window"
    // CHECK: }) {entangle.relation = "tile [{tp}, {}] : reduce_window_sum(%arg0)"}
    %1 = "stablehlo.reduce_window"(%a, %zero) <{padding = dense<[[0, 0], [7, 0]]> : tensor<2x2xi64>, window_dimensions = array<i64: 1, 8>}> ({
    ^bb0(%u: tensor<f32>, %v: tensor<f32>):
      %s = stablehlo.add %u, %v : tensor<f32>
      stablehlo.return %s : tensor<f32>
    }) : (tensor<4x8xf32>, tensor<f32>) -> tensor<4x8xf32>
    sdy.return %1 : tensor<4x8xf32>
  } : (tensor<16x8xf32>) -> tensor<16x8xf32>
  return %0 : tensor<16x8xf32>
}

// -----

sdy.mesh @mesh = <["tp"=4]>

func.func @ref(%x: tensor<8x16xf32>) -> tensor<8x16xf32> {
  %zero = stablehlo.constant dense<0.0> : tensor<f32>
  // expected-note @+1 {{corresponds to the reference op stablehlo.reduce_window}}
  %0 = "stablehlo.reduce_window"(%x, %zero) <{padding = dense<[[0, 0], [15, 0]]> : tensor<2x2xi64>, window_dimensions = array<i64: 1, 16>}> ({
  ^bb0(%a: tensor<f32>, %b: tensor<f32>):
    %s = stablehlo.add %a, %b : tensor<f32>
    stablehlo.return %s : tensor<f32>
  }) : (tensor<8x16xf32>, tensor<f32>) -> tensor<8x16xf32>
  return %0 : tensor<8x16xf32>
}

// cumsum along the split columns, each device on its own block: the sums restart at every
// block edge.
// FULL: func.func @cumsum_of_each_block{{.*}}entangle.verdict = "not proven"
func.func @cumsum_of_each_block(%x: tensor<8x16xf32>) -> tensor<8x16xf32> attributes {entangle.refines = @ref} {
  %0 = sdy.manual_computation(%x) in_shardings=[<@mesh, [{}, {"tp"}]>] out_shardings=[<@mesh, [{}, {"tp"}]>] manual_axes={"tp"} (%a: tensor<8x4xf32>) {
    %zero = stablehlo.constant dense<0.0> : tensor<f32>
    // CHECK: "stablehlo.reduce_window"
    // CHECK: }) {entangle.relation = "opaque: reduce_window with a window along dim 1, which is split over 'tp': each device's windows stop at its block edge"
    // expected-error @+1 {{reduce_window with a window along dim 1, which is split over 'tp': each device's windows stop at its block edge}}
    %1 = "stablehlo.reduce_window"(%a, %zero) <{padding = dense<[[0, 0], [3, 0]]> : tensor<2x2xi64>, window_dimensions = array<i64: 1, 4>}> ({
    ^bb0(%u: tensor<f32>, %v: tensor<f32>):
      %s = stablehlo.add %u, %v : tensor<f32>
      stablehlo.return %s : tensor<f32>
    }) : (tensor<8x4xf32>, tensor<f32>) -> tensor<8x4xf32>
    sdy.return %1 : tensor<8x4xf32>
  } : (tensor<8x16xf32>) -> tensor<8x16xf32>
  return %0 : tensor<8x16xf32>
}

// -----

sdy.mesh @mesh = <["tp"=4]>

func.func @ref(%x: tensor<16x8xi32>) -> tensor<16x8xi32> {
  %one = stablehlo.constant dense<1> : tensor<i32>
  %0 = "stablehlo.reduce_window"(%x, %one) <{padding = dense<[[0, 0], [7, 0]]> : tensor<2x2xi64>, window_dimensions = array<i64: 1, 8>}> ({
  ^bb0(%a: tensor<i32>, %b: tensor<i32>):
    %s = stablehlo.multiply %a, %b : tensor<i32>
    stablehlo.return %s : tensor<i32>
  }) : (tensor<16x8xi32>, tensor<i32>) -> tensor<16x8xi32>
  return %0 : tensor<16x8xi32>
}

// jnp.cumprod (a window with a multiply reducer, init 1) along the columns, rows split over
// tp: each device multiplies whole rows (integers wrap alike on both sides).
// CHECK-LABEL: func.func @cumprod_rows_split
// FULL: func.func @cumprod_rows_split{{.*}}entangle.rho = ["result#0 = concat over 'tp' along dim 0"], entangle.verdict = "proven"
func.func @cumprod_rows_split(%x: tensor<16x8xi32>) -> tensor<16x8xi32> attributes {entangle.refines = @ref} {
  %0 = sdy.manual_computation(%x) in_shardings=[<@mesh, [{"tp"}, {}]>] out_shardings=[<@mesh, [{"tp"}, {}]>] manual_axes={"tp"} (%a: tensor<4x8xi32>) {
    %one = stablehlo.constant dense<1> : tensor<i32>
    // CHECK: "stablehlo.reduce_window"
    // CHECK: }) {entangle.relation = "tile [{tp}, {}] : reduce_window_mul(%arg0)"}
    %1 = "stablehlo.reduce_window"(%a, %one) <{padding = dense<[[0, 0], [7, 0]]> : tensor<2x2xi64>, window_dimensions = array<i64: 1, 8>}> ({
    ^bb0(%u: tensor<i32>, %v: tensor<i32>):
      %s = stablehlo.multiply %u, %v : tensor<i32>
      stablehlo.return %s : tensor<i32>
    }) : (tensor<4x8xi32>, tensor<i32>) -> tensor<4x8xi32>
    sdy.return %1 : tensor<4x8xi32>
  } : (tensor<16x8xi32>) -> tensor<16x8xi32>
  return %0 : tensor<16x8xi32>
}

// -----

sdy.mesh @mesh = <["tp"=4]>

func.func @ref(%x: tensor<8x16xf32>) -> tensor<8x16xf32> {
  %one = stablehlo.constant dense<1.0> : tensor<f32>
  // expected-note @+1 {{corresponds to the reference op stablehlo.reduce_window}}
  %0 = "stablehlo.reduce_window"(%x, %one) <{padding = dense<[[0, 0], [15, 0]]> : tensor<2x2xi64>, window_dimensions = array<i64: 1, 16>}> ({
  ^bb0(%a: tensor<f32>, %b: tensor<f32>):
    %s = stablehlo.multiply %a, %b : tensor<f32>
    stablehlo.return %s : tensor<f32>
  }) : (tensor<8x16xf32>, tensor<f32>) -> tensor<8x16xf32>
  return %0 : tensor<8x16xf32>
}

// cumprod along the split columns, each device on its own block: the products restart at
// every block edge (no product of the blocks before is multiplied in).
// FULL: func.func @cumprod_of_each_block{{.*}}entangle.verdict = "not proven"
func.func @cumprod_of_each_block(%x: tensor<8x16xf32>) -> tensor<8x16xf32> attributes {entangle.refines = @ref} {
  %0 = sdy.manual_computation(%x) in_shardings=[<@mesh, [{}, {"tp"}]>] out_shardings=[<@mesh, [{}, {"tp"}]>] manual_axes={"tp"} (%a: tensor<8x4xf32>) {
    %one = stablehlo.constant dense<1.0> : tensor<f32>
    // CHECK: "stablehlo.reduce_window"
    // CHECK: }) {entangle.relation = "opaque: reduce_window with a window along dim 1, which is split over 'tp': each device's windows stop at its block edge"
    // expected-error @+1 {{reduce_window with a window along dim 1, which is split over 'tp': each device's windows stop at its block edge}}
    %1 = "stablehlo.reduce_window"(%a, %one) <{padding = dense<[[0, 0], [3, 0]]> : tensor<2x2xi64>, window_dimensions = array<i64: 1, 4>}> ({
    ^bb0(%u: tensor<f32>, %v: tensor<f32>):
      %s = stablehlo.multiply %u, %v : tensor<f32>
      stablehlo.return %s : tensor<f32>
    }) : (tensor<8x4xf32>, tensor<f32>) -> tensor<8x4xf32>
    sdy.return %1 : tensor<8x4xf32>
  } : (tensor<8x16xf32>) -> tensor<8x16xf32>
  return %0 : tensor<8x16xf32>
}
