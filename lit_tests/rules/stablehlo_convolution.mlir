// RUN: entangle-opt %s --split-input-file --entangle-normalize --entangle-import-shardings --entangle-infer-relations | filecheck %s
// RUN: entangle-opt %s --split-input-file --entangle-normalize --entangle-import-shardings --entangle-infer-relations --entangle-check-refinement --verify-diagnostics | filecheck %s --check-prefix=FULL

// stablehlo.convolution (contraction rule, a member of the dot_general family): the input's
// batch dim and the kernel's output features carry their split; input features split alike in
// the kernel make a partial sum; spatial dims must not be split (each device's windows would
// stop at its block edge). A window of one element (no padding, strides or dilations) is a dot.

sdy.mesh @mesh = <["i"=4]>

func.func @ref(%x: tensor<16x32xf32>, %w: tensor<32x8xf32>) -> tensor<16x8xf32> {
  %0 = stablehlo.dot_general %x, %w, contracting_dims = [1] x [0] : (tensor<16x32xf32>, tensor<32x8xf32>) -> tensor<16x8xf32>
  return %0 : tensor<16x8xf32>
}

// jax's conv_general_dilated of 2-D operands (no spatial dims) is a dot: features split over
// 'i', a partial sum completed by the psum (jax's test_conv_general_dilated).
// CHECK-LABEL: func.func @conv_as_dot_psum
// FULL: func.func @conv_as_dot_psum{{.*}}entangle.verdict = "proven"
func.func @conv_as_dot_psum(%x: tensor<16x32xf32>, %w: tensor<32x8xf32>) -> tensor<16x8xf32> attributes {entangle.refines = @ref} {
  %0 = sdy.manual_computation(%x, %w) in_shardings=[<@mesh, [{}, {"i"}]>, <@mesh, [{"i"}, {}]>] out_shardings=[<@mesh, [{}, {}]>] manual_axes={"i"} (%a: tensor<16x8xf32>, %b: tensor<8x8xf32>) {
    // CHECK: stablehlo.convolution{{.*}}entangle.relation = "partial sum {i} : dot_general(%arg0, %arg1)"
    %1 = stablehlo.convolution(%a, %b) dim_numbers = [b, f]x[i, o]->[b, f], window = {stride = [], pad = [], lhs_dilate = [], rhs_dilate = [], reverse = []} {batch_group_count = 1 : i64, feature_group_count = 1 : i64} : (tensor<16x8xf32>, tensor<8x8xf32>) -> tensor<16x8xf32>
    %2 = "stablehlo.all_reduce"(%1) ({
      ^bb0(%u: tensor<f32>, %v: tensor<f32>):
        %s = stablehlo.add %u, %v : tensor<f32>
        stablehlo.return %s : tensor<f32>
    }) {replica_groups = dense<[[0, 1, 2, 3]]> : tensor<1x4xi64>, channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, use_global_device_ids} : (tensor<16x8xf32>) -> tensor<16x8xf32>
    sdy.return %2 : tensor<16x8xf32>
  } : (tensor<16x32xf32>, tensor<32x8xf32>) -> tensor<16x8xf32>
  return %0 : tensor<16x8xf32>
}

// -----

sdy.mesh @mesh = <["dp"=2, "tp"=4]>

func.func @ref(%x: tensor<4x6x6x8xf32>, %w: tensor<3x3x8x8xf32>) -> tensor<4x6x6x8xf32> {
  %0 = stablehlo.convolution(%x, %w) dim_numbers = [b, 0, 1, f]x[0, 1, i, o]->[b, 0, 1, f], window = {stride = [1, 1], pad = [[1, 1], [1, 1]], lhs_dilate = [1, 1], rhs_dilate = [1, 1], reverse = [false, false]} {batch_group_count = 1 : i64, feature_group_count = 1 : i64} : (tensor<4x6x6x8xf32>, tensor<3x3x8x8xf32>) -> tensor<4x6x6x8xf32>
  return %0 : tensor<4x6x6x8xf32>
}

// An NHWC 3x3 'SAME' convolution: the batch over dp, the output features over tp.
// CHECK-LABEL: func.func @batch_and_out_features_split
// FULL: func.func @batch_and_out_features_split{{.*}}entangle.verdict = "proven"
func.func @batch_and_out_features_split(%x: tensor<4x6x6x8xf32>, %w: tensor<3x3x8x8xf32>) -> tensor<4x6x6x8xf32> attributes {entangle.refines = @ref} {
  %0 = sdy.manual_computation(%x, %w) in_shardings=[<@mesh, [{"dp"}, {}, {}, {}]>, <@mesh, [{}, {}, {}, {"tp"}]>] out_shardings=[<@mesh, [{"dp"}, {}, {}, {"tp"}]>] manual_axes={"dp", "tp"} (%a: tensor<2x6x6x8xf32>, %b: tensor<3x3x8x2xf32>) {
    // CHECK: stablehlo.convolution{{.*}}entangle.relation = "tile [{dp}, {}, {}, {tp}] : convolution(%arg0, %arg1)"
    %1 = stablehlo.convolution(%a, %b) dim_numbers = [b, 0, 1, f]x[0, 1, i, o]->[b, 0, 1, f], window = {stride = [1, 1], pad = [[1, 1], [1, 1]], lhs_dilate = [1, 1], rhs_dilate = [1, 1], reverse = [false, false]} {batch_group_count = 1 : i64, feature_group_count = 1 : i64} : (tensor<2x6x6x8xf32>, tensor<3x3x8x2xf32>) -> tensor<2x6x6x2xf32>
    sdy.return %1 : tensor<2x6x6x2xf32>
  } : (tensor<4x6x6x8xf32>, tensor<3x3x8x8xf32>) -> tensor<4x6x6x8xf32>
  return %0 : tensor<4x6x6x8xf32>
}

// -----

sdy.mesh @mesh = <["tp"=2]>

func.func @ref(%x: tensor<4x6x6x8xf32>, %w: tensor<3x3x8x8xf32>) -> tensor<4x6x6x8xf32> {
  // expected-note @+1 {{corresponds to the reference op stablehlo.convolution}}
  %0 = stablehlo.convolution(%x, %w) dim_numbers = [b, 0, 1, f]x[0, 1, i, o]->[b, 0, 1, f], window = {stride = [1, 1], pad = [[1, 1], [1, 1]], lhs_dilate = [1, 1], rhs_dilate = [1, 1], reverse = [false, false]} {batch_group_count = 1 : i64, feature_group_count = 1 : i64} : (tensor<4x6x6x8xf32>, tensor<3x3x8x8xf32>) -> tensor<4x6x6x8xf32>
  return %0 : tensor<4x6x6x8xf32>
}

// Refused: the height split over tp without a halo exchange (spatial parallelism done wrong).
// CHECK-LABEL: func.func @spatial_dim_split
// FULL: func.func @spatial_dim_split{{.*}}entangle.verdict = "not proven"
func.func @spatial_dim_split(%x: tensor<4x6x6x8xf32>, %w: tensor<3x3x8x8xf32>) -> tensor<4x6x6x8xf32> attributes {entangle.refines = @ref} {
  %0 = sdy.manual_computation(%x, %w) in_shardings=[<@mesh, [{}, {"tp"}, {}, {}]>, <@mesh, [{}, {}, {}, {}]>] out_shardings=[<@mesh, [{}, {"tp"}, {}, {}]>] manual_axes={"tp"} (%a: tensor<4x3x6x8xf32>, %b: tensor<3x3x8x8xf32>) {
    // CHECK: stablehlo.convolution{{.*}}entangle.relation = "opaque: convolution windows along dim 1 of the input, which is split over 'tp': each device's windows stop at its block edge"
    // expected-error @+1 {{convolution windows along dim 1 of the input, which is split over 'tp': each device's windows stop at its block edge}}
    %1 = stablehlo.convolution(%a, %b) dim_numbers = [b, 0, 1, f]x[0, 1, i, o]->[b, 0, 1, f], window = {stride = [1, 1], pad = [[1, 1], [1, 1]], lhs_dilate = [1, 1], rhs_dilate = [1, 1], reverse = [false, false]} {batch_group_count = 1 : i64, feature_group_count = 1 : i64} : (tensor<4x3x6x8xf32>, tensor<3x3x8x8xf32>) -> tensor<4x3x6x8xf32>
    sdy.return %1 : tensor<4x3x6x8xf32>
  } : (tensor<4x6x6x8xf32>, tensor<3x3x8x8xf32>) -> tensor<4x6x6x8xf32>
  return %0 : tensor<4x6x6x8xf32>
}
