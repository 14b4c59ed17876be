// RUN: entangle-opt %s --split-input-file --entangle-normalize --entangle-import-shardings --entangle-infer-relations --entangle-check-refinement --verify-diagnostics | filecheck %s

// Shardy's own partitioning (sdy-propagation-pipeline, sdy-insert-explicit-reshards,
// sdy-reshard-to-collectives, sdy-convert-global-to-local) leaves local shapes, stablehlo
// collectives and `sdy.sharding` on the parameters and results, with no manual computation.
// Against the reference (parameters are its shapes divided by their tiling) the shardings are
// read as mhlo.sharding strings over the mesh's devices (per_device.adopt_shardy_local).

sdy.mesh @mesh = <["dp"=2, "tp"=4]>

func.func @ref(%x: tensor<8x16xf32>, %w: tensor<16x32xf32>) -> tensor<8xf32> {
  %0 = stablehlo.dot_general %x, %w, contracting_dims = [1] x [0] : (tensor<8x16xf32>, tensor<16x32xf32>) -> tensor<8x32xf32>
  %1 = stablehlo.tanh %0 : tensor<8x32xf32>
  %cst = stablehlo.constant dense<0.0> : tensor<f32>
  %2 = stablehlo.reduce(%1 init: %cst) applies stablehlo.add across dimensions = [1] : (tensor<8x32xf32>, tensor<f32>) -> tensor<8xf32>
  return %2 : tensor<8xf32>
}

// CHECK-LABEL: func.func @shardy{{.*}}entangle.rho = ["result#0 = concat over 'd0' along dim 0"], entangle.verdict = "proven"
func.func @shardy(%x: tensor<4x16xf32> {sdy.sharding = #sdy.sharding<@mesh, [{"dp"}, {}]>}, %w: tensor<16x8xf32> {sdy.sharding = #sdy.sharding<@mesh, [{}, {"tp"}]>}) -> (tensor<4xf32> {sdy.sharding = #sdy.sharding<@mesh, [{"dp"}]>}) attributes {entangle.refines = @ref} {
  // CHECK: stablehlo.dot_general{{.*}}entangle.relation = "tile [{d0}, {d1, d2}] : dot_general(%arg0, %arg1)"
  %0 = stablehlo.dot_general %x, %w, contracting_dims = [1] x [0] {sdy.sharding = #sdy.sharding_per_value<[<@mesh, [{"dp"}, {"tp"}]>]>} : (tensor<4x16xf32>, tensor<16x8xf32>) -> tensor<4x8xf32>
  %1 = stablehlo.tanh %0 : tensor<4x8xf32>
  %cst = stablehlo.constant dense<0.0> : tensor<f32>
  %2 = stablehlo.reduce(%1 init: %cst) applies stablehlo.add across dimensions = [1] : (tensor<4x8xf32>, tensor<f32>) -> tensor<4xf32>
  %3 = "stablehlo.all_reduce"(%2) <{channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, replica_groups = dense<[[0, 1, 2, 3], [4, 5, 6, 7]]> : tensor<2x4xi64>, use_global_device_ids}> ({
  ^bb0(%a: tensor<f32>, %b: tensor<f32>):
    %4 = stablehlo.add %a, %b : tensor<f32>
    stablehlo.return %4 : tensor<f32>
  }) : (tensor<4xf32>) -> tensor<4xf32>
  return %3 : tensor<4xf32>
}

// -----

sdy.mesh @mesh = <["dp"=2, "tp"=4]>

func.func @ref(%x: tensor<8x16xf32>) -> tensor<8xf32> {
  %cst = stablehlo.constant dense<0.0> : tensor<f32>
  // expected-note @+1 {{corresponds to the reference op stablehlo.reduce}}
  %0 = stablehlo.reduce(%x init: %cst) applies stablehlo.add across dimensions = [1] : (tensor<8x16xf32>, tensor<f32>) -> tensor<8xf32>
  return %0 : tensor<8xf32>
}

// Shardy's default sdy-insert-explicit-reshards (without enable-full-version) leaves the sum
// over the split columns without its all_reduce.
// CHECK-LABEL: func.func @shardy_default{{.*}}entangle.verdict = "not proven"
func.func @shardy_default(%x: tensor<4x4xf32> {sdy.sharding = #sdy.sharding<@mesh, [{"dp"}, {"tp"}]>}) -> (tensor<4xf32> {sdy.sharding = #sdy.sharding<@mesh, [{"dp"}]>}) attributes {entangle.refines = @ref} {
  %cst = stablehlo.constant dense<0.0> : tensor<f32>
  // expected-error @+1 {{value is still a partial sum over ('d1', 'd2') when it leaves the program (result #0): missing all_reduce/psum}}
  %0 = stablehlo.reduce(%x init: %cst) applies stablehlo.add across dimensions = [1] : (tensor<4x4xf32>, tensor<f32>) -> tensor<4xf32>
  // expected-note @+1 {{the partial sum leaves}}
  return %0 : tensor<4xf32>
}
