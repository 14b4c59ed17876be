// RUN: entangle-opt %s --split-input-file --entangle-normalize --entangle-import-shardings --entangle-infer-relations | filecheck %s
// RUN: entangle-opt %s --split-input-file --entangle-normalize --entangle-import-shardings --entangle-infer-relations --entangle-check-refinement --verify-diagnostics | filecheck %s --check-prefix=FULL

// stablehlo.reduce_scatter (collectives rule): sums over axes G like all_reduce (partial sum over
// G -> complete; replicated over G -> |G| x) and splits the scatter dim over G (appended as the
// minor axes of its tiling). Summing over an axis the value is split on is refused.

sdy.mesh @mesh = <["tp"=4]>

func.func @ref(%x: tensor<2x16x8xf32>, %w: tensor<8x8xf32>) -> tensor<2x16x8xf32> {
  %0 = stablehlo.dot_general %x, %w, contracting_dims = [2] x [0] : (tensor<2x16x8xf32>, tensor<8x8xf32>) -> tensor<2x16x8xf32>
  return %0 : tensor<2x16x8xf32>
}

// End of a sequence-parallel MLP: psum_scatter(seq) of the row-parallel partial sums.
// CHECK-LABEL: func.func @psum_scatter_seq
// FULL: func.func @psum_scatter_seq{{.*}}entangle.rho = ["result#0 = concat over 'tp' along dim 1"], entangle.verdict = "proven"
func.func @psum_scatter_seq(%x: tensor<2x16x8xf32>, %w: tensor<8x8xf32>) -> tensor<2x16x8xf32> attributes {entangle.refines = @ref} {
  %0 = sdy.manual_computation(%x, %w) in_shardings=[<@mesh, [{}, {}, {"tp"}]>, <@mesh, [{"tp"}, {}]>] out_shardings=[<@mesh, [{}, {"tp"}, {}]>] manual_axes={"tp"} (%a: tensor<2x16x2xf32>, %b: tensor<2x8xf32>) {
    %p = stablehlo.dot_general %a, %b, contracting_dims = [2] x [0] : (tensor<2x16x2xf32>, tensor<2x8xf32>) -> tensor<2x16x8xf32>
    // CHECK: "stablehlo.reduce_scatter"
    // CHECK: entangle.relation = "tile [{}, {tp}, {}] : dot_general(%arg0, %arg1)"
    %1 = "stablehlo.reduce_scatter"(%p) ({
      ^bb0(%u: tensor<f32>, %v: tensor<f32>):
        %s = stablehlo.add %u, %v : tensor<f32>
        stablehlo.return %s : tensor<f32>
    }) {scatter_dimension = 1 : i64, replica_groups = dense<[[0, 1, 2, 3]]> : tensor<1x4xi64>, channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, use_global_device_ids} : (tensor<2x16x8xf32>) -> tensor<2x4x8xf32>
    sdy.return %1 : tensor<2x4x8xf32>
  } : (tensor<2x16x8xf32>, tensor<8x8xf32>) -> tensor<2x16x8xf32>
  return %0 : tensor<2x16x8xf32>
}

// -----

sdy.mesh @mesh = <["dp"=2, "tp"=4]>

func.func @ref(%x: tensor<8x16xf32>, %w: tensor<16x8xf32>) -> tensor<8x8xf32> {
  %0 = stablehlo.dot_general %x, %w, contracting_dims = [1] x [0] : (tensor<8x16xf32>, tensor<16x8xf32>) -> tensor<8x8xf32>
  return %0 : tensor<8x8xf32>
}

// Rows already split over dp: scattering them over tp splits them over (dp, tp).
// CHECK-LABEL: func.func @scatter_split_dim
// FULL: func.func @scatter_split_dim{{.*}}entangle.rho = ["result#0 = concat over ('dp', 'tp') along dim 0"], entangle.verdict = "proven"
func.func @scatter_split_dim(%x: tensor<8x16xf32>, %w: tensor<16x8xf32>) -> tensor<8x8xf32> attributes {entangle.refines = @ref} {
  %0 = sdy.manual_computation(%x, %w) in_shardings=[<@mesh, [{"dp"}, {"tp"}]>, <@mesh, [{"tp"}, {}]>] out_shardings=[<@mesh, [{"dp", "tp"}, {}]>] manual_axes={"dp", "tp"} (%a: tensor<4x4xf32>, %b: tensor<4x8xf32>) {
    %p = stablehlo.dot_general %a, %b, contracting_dims = [1] x [0] : (tensor<4x4xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>
    // CHECK: "stablehlo.reduce_scatter"
    // CHECK: entangle.relation = "tile [{dp, tp}, {}] : dot_general(%arg0, %arg1)"
    %1 = "stablehlo.reduce_scatter"(%p) ({
      ^bb0(%u: tensor<f32>, %v: tensor<f32>):
        %s = stablehlo.add %u, %v : tensor<f32>
        stablehlo.return %s : tensor<f32>
    }) {scatter_dimension = 0 : i64, replica_groups = dense<[[0, 1, 2, 3], [4, 5, 6, 7]]> : tensor<2x4xi64>, channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, use_global_device_ids} : (tensor<4x8xf32>) -> tensor<1x8xf32>
    sdy.return %1 : tensor<1x8xf32>
  } : (tensor<8x16xf32>, tensor<16x8xf32>) -> tensor<8x8xf32>
  return %0 : tensor<8x8xf32>
}

// -----

sdy.mesh @mesh = <["tp"=4]>

func.func @ref(%x: tensor<16x8xf32>) -> tensor<16x8xf32> {
  return %x : tensor<16x8xf32>
}

// Scattering a replicated value sums 4 copies.
// CHECK-LABEL: func.func @scatter_replicated
// FULL: func.func @scatter_replicated{{.*}}entangle.verdict = "not proven"
func.func @scatter_replicated(%x: tensor<16x8xf32>) -> tensor<16x8xf32> attributes {entangle.refines = @ref} {
  %0 = sdy.manual_computation(%x) in_shardings=[<@mesh, [{}, {}]>] out_shardings=[<@mesh, [{"tp"}, {}]>] manual_axes={"tp"} (%a: tensor<16x8xf32>) {
    // CHECK: "stablehlo.reduce_scatter"
    // CHECK: entangle.relation = "tile [{tp}, {}] : (4*%arg0)"
    // expected-error @+1 {{reduce_scatter sums over 'tp', but the value is already replicated over 'tp': the result is 4 x the value}}
    %1 = "stablehlo.reduce_scatter"(%a) ({
      ^bb0(%u: tensor<f32>, %v: tensor<f32>):
        %s = stablehlo.add %u, %v : tensor<f32>
        stablehlo.return %s : tensor<f32>
    }) {scatter_dimension = 0 : i64, replica_groups = dense<[[0, 1, 2, 3]]> : tensor<1x4xi64>, channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, use_global_device_ids} : (tensor<16x8xf32>) -> tensor<4x8xf32>
    sdy.return %1 : tensor<4x8xf32>
  } : (tensor<16x8xf32>) -> tensor<16x8xf32>
  // expected-note @+1 {{result #0 is 4 x the reference}}
  return %0 : tensor<16x8xf32>
}

// -----

sdy.mesh @mesh = <["dp"=2, "tp"=4]>

func.func @ref(%x: tensor<8x16xf32>) -> tensor<8x16xf32> {
  return %x : tensor<8x16xf32>
}

// Refused: summing over dp a value split over dp adds different rows together.
// CHECK-LABEL: func.func @wrong_axis
// FULL: func.func @wrong_axis{{.*}}entangle.verdict = "not proven"
func.func @wrong_axis(%x: tensor<8x16xf32>) -> tensor<8x16xf32> attributes {entangle.refines = @ref} {
  %0 = sdy.manual_computation(%x) in_shardings=[<@mesh, [{"dp"}, {}]>] out_shardings=[<@mesh, [{"dp"}, {}]>] manual_axes={"dp", "tp"} (%a: tensor<4x16xf32>) {
    // CHECK: "stablehlo.reduce_scatter"
    // CHECK: entangle.relation = "opaque: reduce_scatter sums over 'dp' a value split over 'dp': it combines different blocks"
    // expected-error @+1 {{reduce_scatter sums over 'dp' a value split over 'dp': it combines different blocks}}
    %1 = "stablehlo.reduce_scatter"(%a) ({
      ^bb0(%u: tensor<f32>, %v: tensor<f32>):
        %s = stablehlo.add %u, %v : tensor<f32>
        stablehlo.return %s : tensor<f32>
    }) {scatter_dimension = 1 : i64, replica_groups = dense<[[0, 4], [1, 5], [2, 6], [3, 7]]> : tensor<4x2xi64>, channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, use_global_device_ids} : (tensor<4x16xf32>) -> tensor<4x8xf32>
    %2 = stablehlo.concatenate %1, %1, dim = 1 : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x16xf32>
    sdy.return %2 : tensor<4x16xf32>
  } : (tensor<8x16xf32>) -> tensor<8x16xf32>
  return %0 : tensor<8x16xf32>
}
