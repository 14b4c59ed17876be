// RUN: entangle-opt %s --split-input-file --entangle-normalize --entangle-import-shardings --entangle-infer-relations | filecheck %s
// RUN: entangle-opt %s --split-input-file --entangle-normalize --entangle-import-shardings --entangle-infer-relations --entangle-check-refinement --verify-diagnostics | filecheck %s --check-prefix=FULL

// stablehlo.reduce_precision (elementwise rule): rounds to a float format of `exponent_bits`
// and `mantissa_bits` and back (jax emits it at f32's own format, e8m23, in gradients). A format
// that holds every value of the dtype is the identity: it keeps any layout, partial sums
// included. A narrower one rounds: a term of its own (never the identity), which a partial max
// keeps (rounding is monotone) and a partial sum refuses (each device's piece would be rounded,
// then summed: precision lost).

sdy.mesh @mesh = <["dp"=2, "tp"=4]>

func.func @ref(%x: tensor<8x16xf32>, %w: tensor<16x8xf32>) -> tensor<8x8xf32> {
  %0 = stablehlo.dot_general %x, %w, contracting_dims = [1] x [0] : (tensor<8x16xf32>, tensor<16x8xf32>) -> tensor<8x8xf32>
  return %0 : tensor<8x8xf32>
}

// At f32's own format on a partial sum: the identity, and the program is proven.
// CHECK-LABEL: func.func @same_format_partial
// FULL: func.func @same_format_partial{{.*}}entangle.verdict = "proven"
func.func @same_format_partial(%x: tensor<8x16xf32>, %w: tensor<16x8xf32>) -> tensor<8x8xf32> attributes {entangle.refines = @ref} {
  %0 = sdy.manual_computation(%x, %w) in_shardings=[<@mesh, [{"dp"}, {"tp"}]>, <@mesh, [{"tp"}, {}]>] out_shardings=[<@mesh, [{"dp"}, {}]>] manual_axes={"dp", "tp"} (%a: tensor<4x4xf32>, %b: tensor<4x8xf32>) {
    %p = stablehlo.dot_general %a, %b, contracting_dims = [1] x [0] : (tensor<4x4xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>
    // CHECK: stablehlo.reduce_precision %{{.*}}entangle.relation = "tile [{dp}, {}] partial sum {tp} : dot_general(%arg0, %arg1)"
    %r = stablehlo.reduce_precision %p, format = e8m23 : tensor<4x8xf32>
    %s = "stablehlo.all_reduce"(%r) <{channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, replica_groups = dense<[[0, 1, 2, 3], [4, 5, 6, 7]]> : tensor<2x4xi64>, use_global_device_ids}> ({
    ^bb0(%u: tensor<f32>, %v: tensor<f32>):
      %t = stablehlo.add %u, %v : tensor<f32>
      stablehlo.return %t : tensor<f32>
    }) : (tensor<4x8xf32>) -> tensor<4x8xf32>
    sdy.return %s : tensor<4x8xf32>
  } : (tensor<8x16xf32>, tensor<16x8xf32>) -> tensor<8x8xf32>
  return %0 : tensor<8x8xf32>
}

// -----

sdy.mesh @mesh = <["dp"=2, "tp"=4]>

func.func @ref(%x: tensor<8x16xf32>) -> tensor<8x16xf32> {
  return %x : tensor<8x16xf32>
}

// To bf16's format (e8m7) on an f32 value: a rounding, which the reference lacks.
// CHECK-LABEL: func.func @narrower_format
// FULL: func.func @narrower_format{{.*}}entangle.verdict = "not proven"
func.func @narrower_format(%x: tensor<8x16xf32>) -> tensor<8x16xf32> attributes {entangle.refines = @ref} {
  %0 = sdy.manual_computation(%x) in_shardings=[<@mesh, [{"dp"}, {"tp"}]>] out_shardings=[<@mesh, [{"dp"}, {"tp"}]>] manual_axes={"dp", "tp"} (%a: tensor<4x4xf32>) {
    // CHECK: stablehlo.reduce_precision %{{.*}}entangle.relation = "tile [{dp}, {tp}] : reduce_precision(%arg0)"
    // expected-error @+1 {{precision lost: reduce_precision to e8m7 (in f32) rounds where the reference does not}}
    %r = stablehlo.reduce_precision %a, format = e8m7 : tensor<4x4xf32>
    sdy.return %r : tensor<4x4xf32>
  } : (tensor<8x16xf32>) -> tensor<8x16xf32>
  // expected-note @+1 {{result #0 differs from the reference: at top level: %arg0 vs reduce_precision(%arg0)}}
  return %0 : tensor<8x16xf32>
}

// -----

sdy.mesh @mesh = <["tp"=4]>

func.func @ref(%x: tensor<8x16xf32>, %w: tensor<16x8xf32>) -> tensor<8x8xf32> {
  %0 = stablehlo.dot_general %x, %w, contracting_dims = [1] x [0] : (tensor<8x16xf32>, tensor<16x8xf32>) -> tensor<8x8xf32>
  // expected-note @+1 {{corresponds to the reference op stablehlo.reduce_precision, which computes reduce_precision(dot_general(%arg0, %arg1))}}
  %1 = stablehlo.reduce_precision %0, format = e5m10 : tensor<8x8xf32>
  return %1 : tensor<8x8xf32>
}

// A narrower format on a partial sum: each device's piece is rounded before the sum.
// CHECK-LABEL: func.func @narrower_partial_sum
func.func @narrower_partial_sum(%x: tensor<8x16xf32>, %w: tensor<16x8xf32>) -> tensor<8x8xf32> attributes {entangle.refines = @ref} {
  %0 = sdy.manual_computation(%x, %w) in_shardings=[<@mesh, [{}, {"tp"}]>, <@mesh, [{"tp"}, {}]>] out_shardings=[<@mesh, [{}, {}]>] manual_axes={"tp"} (%a: tensor<8x4xf32>, %b: tensor<4x8xf32>) {
    %p = stablehlo.dot_general %a, %b, contracting_dims = [1] x [0] : (tensor<8x4xf32>, tensor<4x8xf32>) -> tensor<8x8xf32>
    // CHECK: stablehlo.reduce_precision %{{.*}}entangle.relation = "opaque: precision lost: reduce_precision to e5m10 (in f32) rounds each device's partial sum over 'tp' before the sum over devices
    // expected-error @+1 {{precision lost: reduce_precision to e5m10 (in f32) rounds each device's partial sum over 'tp' before the sum over devices (rounded pieces do not add up to the rounded sum)}}
    %r = stablehlo.reduce_precision %p, format = e5m10 : tensor<8x8xf32>
    sdy.return %r : tensor<8x8xf32>
  } : (tensor<8x16xf32>, tensor<16x8xf32>) -> tensor<8x8xf32>
  return %0 : tensor<8x8xf32>
}

// -----

sdy.mesh @mesh = <["tp"=4]>

func.func @ref(%x: tensor<8x16xf32>) -> tensor<8xf32> {
  %cst = stablehlo.constant dense<0xFF800000> : tensor<f32>
  %m = stablehlo.reduce(%x init: %cst) applies stablehlo.maximum across dimensions = [1] : (tensor<8x16xf32>, tensor<f32>) -> tensor<8xf32>
  %r = stablehlo.reduce_precision %m, format = e8m7 : tensor<8xf32>
  return %r : tensor<8xf32>
}

// A narrower format on a partial max: rounding is monotone, so the max of the rounded pieces
// is the rounded max.
// CHECK-LABEL: func.func @narrower_partial_max
// FULL: func.func @narrower_partial_max{{.*}}entangle.verdict = "proven"
func.func @narrower_partial_max(%x: tensor<8x16xf32>) -> tensor<8xf32> attributes {entangle.refines = @ref} {
  %0 = sdy.manual_computation(%x) in_shardings=[<@mesh, [{}, {"tp"}]>] out_shardings=[<@mesh, [{}]>] manual_axes={"tp"} (%a: tensor<8x4xf32>) {
    %cst = stablehlo.constant dense<0xFF800000> : tensor<f32>
    %m = stablehlo.reduce(%a init: %cst) applies stablehlo.maximum across dimensions = [1] : (tensor<8x4xf32>, tensor<f32>) -> tensor<8xf32>
    // CHECK: stablehlo.reduce_precision %{{.*}}entangle.relation = "partial max {tp} : reduce_precision(reduce_max(%arg0))"
    %r = stablehlo.reduce_precision %m, format = e8m7 : tensor<8xf32>
    %s = "stablehlo.all_reduce"(%r) <{channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, replica_groups = dense<[[0, 1, 2, 3]]> : tensor<1x4xi64>, use_global_device_ids}> ({
    ^bb0(%u: tensor<f32>, %v: tensor<f32>):
      %t = stablehlo.maximum %u, %v : tensor<f32>
      stablehlo.return %t : tensor<f32>
    }) : (tensor<8xf32>) -> tensor<8xf32>
    sdy.return %s : tensor<8xf32>
  } : (tensor<8x16xf32>) -> tensor<8xf32>
  return %0 : tensor<8xf32>
}
