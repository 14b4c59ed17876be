// RUN: entangle-opt %s --split-input-file --entangle-normalize --entangle-import-shardings --entangle-infer-relations | filecheck %s
// RUN: entangle-opt %s --split-input-file --entangle-normalize --entangle-import-shardings --entangle-infer-relations --entangle-check-refinement --verify-diagnostics | filecheck %s --check-prefix=FULL

// stablehlo.all_reduce (collectives rule): replica groups are read as mesh axes G (row-major
// device order: on dp=2 x tp=4, psum('tp') is [[0,1,2,3],[4,5,6,7]] and psum('dp') is
// [[0,4],[1,5],[2,6],[3,7]]). It removes G from the partial axes; summing over an axis the
// value is replicated on multiplies it by |G|; over an axis it is split on it is refused.

sdy.mesh @mesh = <["dp"=2, "tp"=4]>

func.func @ref(%x: tensor<8x16xf32>, %w: tensor<16x32xf32>) -> tensor<8x32xf32> {
  %0 = stablehlo.dot_general %x, %w, contracting_dims = [1] x [0] : (tensor<8x16xf32>, tensor<16x32xf32>) -> tensor<8x32xf32>
  return %0 : tensor<8x32xf32>
}

// psum('tp') of a partial sum over tp (rows split over dp stay split).
// CHECK-LABEL: func.func @psum_tp
// FULL: func.func @psum_tp{{.*}}entangle.rho = ["result#0 = concat over 'dp' along dim 0"], entangle.verdict = "proven"
func.func @psum_tp(%x: tensor<8x16xf32>, %w: tensor<16x32xf32>) -> tensor<8x32xf32> attributes {entangle.refines = @ref} {
  %0 = sdy.manual_computation(%x, %w) in_shardings=[<@mesh, [{"dp"}, {"tp"}]>, <@mesh, [{"tp"}, {}]>] out_shardings=[<@mesh, [{"dp"}, {}]>] manual_axes={"dp", "tp"} (%a: tensor<4x4xf32>, %b: tensor<4x32xf32>) {
    %p = stablehlo.dot_general %a, %b, contracting_dims = [1] x [0] : (tensor<4x4xf32>, tensor<4x32xf32>) -> tensor<4x32xf32>
    // CHECK: "stablehlo.all_reduce"
    // CHECK: entangle.relation = "tile [{dp}, {}] : dot_general(%arg0, %arg1)"
    %1 = "stablehlo.all_reduce"(%p) ({
      ^bb0(%u: tensor<f32>, %v: tensor<f32>):
        %s = stablehlo.add %u, %v : tensor<f32>
        stablehlo.return %s : tensor<f32>
    }) {replica_groups = dense<[[0, 1, 2, 3], [4, 5, 6, 7]]> : tensor<2x4xi64>, channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, use_global_device_ids} : (tensor<4x32xf32>) -> tensor<4x32xf32>
    sdy.return %1 : tensor<4x32xf32>
  } : (tensor<8x16xf32>, tensor<16x32xf32>) -> tensor<8x32xf32>
  return %0 : tensor<8x32xf32>
}

// -----

sdy.mesh @mesh = <["dp"=2, "tp"=4]>

func.func @ref(%x: tensor<8x16xf32>, %w: tensor<16x32xf32>) -> tensor<8x32xf32> {
  // expected-note @+1 {{corresponds to the reference op stablehlo.dot_general}}
  %0 = stablehlo.dot_general %x, %w, contracting_dims = [1] x [0] : (tensor<8x16xf32>, tensor<16x32xf32>) -> tensor<8x32xf32>
  return %0 : tensor<8x32xf32>
}

// The psum_wrong_axis bug: psum('dp') of a value split over dp combines different rows.
// CHECK-LABEL: func.func @psum_wrong_axis
// FULL: func.func @psum_wrong_axis{{.*}}entangle.verdict = "not proven"
func.func @psum_wrong_axis(%x: tensor<8x16xf32>, %w: tensor<16x32xf32>) -> tensor<8x32xf32> attributes {entangle.refines = @ref} {
  %0 = sdy.manual_computation(%x, %w) in_shardings=[<@mesh, [{"dp"}, {"tp"}]>, <@mesh, [{"tp"}, {}]>] out_shardings=[<@mesh, [{"dp"}, {}]>] manual_axes={"dp", "tp"} (%a: tensor<4x4xf32>, %b: tensor<4x32xf32>) {
    %p = stablehlo.dot_general %a, %b, contracting_dims = [1] x [0] : (tensor<4x4xf32>, tensor<4x32xf32>) -> tensor<4x32xf32>
    // CHECK: "stablehlo.all_reduce"
    // CHECK: entangle.relation = "opaque: all_reduce sums over 'dp' of a value split over 'dp': it combines different blocks"
    // expected-error @+1 {{all_reduce sums over 'dp' of a value split over 'dp': it combines different blocks}}
    %1 = "stablehlo.all_reduce"(%p) ({
      ^bb0(%u: tensor<f32>, %v: tensor<f32>):
        %s = stablehlo.add %u, %v : tensor<f32>
        stablehlo.return %s : tensor<f32>
    }) {replica_groups = dense<[[0, 4], [1, 5], [2, 6], [3, 7]]> : tensor<4x2xi64>, channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, use_global_device_ids} : (tensor<4x32xf32>) -> tensor<4x32xf32>
    sdy.return %1 : tensor<4x32xf32>
  } : (tensor<8x16xf32>, tensor<16x32xf32>) -> tensor<8x32xf32>
  return %0 : tensor<8x32xf32>
}

// -----

sdy.mesh @mesh = <["tp"=4]>

func.func @ref(%x: tensor<8xf32>) -> tensor<8xf32> {
  return %x : tensor<8xf32>
}

// psum of a replicated value is 4x the value: the output check reports the factor.
// CHECK-LABEL: func.func @psum_replicated
// FULL: func.func @psum_replicated{{.*}}entangle.verdict = "not proven"
func.func @psum_replicated(%x: tensor<8xf32>) -> tensor<8xf32> attributes {entangle.refines = @ref} {
  %0 = sdy.manual_computation(%x) in_shardings=[<@mesh, [{}]>] out_shardings=[<@mesh, [{}]>] manual_axes={"tp"} (%a: tensor<8xf32>) {
    // CHECK: "stablehlo.all_reduce"
    // CHECK: entangle.relation = "replicated : (4*%arg0)"
    // expected-error @+1 {{all_reduce sums over 'tp', but the value is already replicated over 'tp': the result is 4 x the value}}
    %1 = "stablehlo.all_reduce"(%a) ({
      ^bb0(%u: tensor<f32>, %v: tensor<f32>):
        %s = stablehlo.add %u, %v : tensor<f32>
        stablehlo.return %s : tensor<f32>
    }) {replica_groups = dense<[[0, 1, 2, 3]]> : tensor<1x4xi64>, channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, use_global_device_ids} : (tensor<8xf32>) -> tensor<8xf32>
    sdy.return %1 : tensor<8xf32>
  } : (tensor<8xf32>) -> tensor<8xf32>
  // expected-note @+1 {{result #0 is 4 x the reference}}
  return %0 : tensor<8xf32>
}

// -----

sdy.mesh @mesh = <["tp"=4]>

func.func @ref(%x: tensor<8x16xf32>) -> tensor<8xf32> {
  %zero = stablehlo.constant dense<0.0> : tensor<f32>
  // expected-note @+1 {{corresponds to the reference op stablehlo.reduce}}
  %0 = stablehlo.reduce(%x init: %zero) applies stablehlo.add across dimensions = [1] : (tensor<8x16xf32>, tensor<f32>) -> tensor<8xf32>
  return %0 : tensor<8xf32>
}

// Refused: pmax of a partial sum (wrong reducer).
// CHECK-LABEL: func.func @wrong_reducer
// FULL: func.func @wrong_reducer{{.*}}entangle.verdict = "not proven"
func.func @wrong_reducer(%x: tensor<8x16xf32>) -> tensor<8xf32> attributes {entangle.refines = @ref} {
  %0 = sdy.manual_computation(%x) in_shardings=[<@mesh, [{}, {"tp"}]>] out_shardings=[<@mesh, [{}]>] manual_axes={"tp"} (%a: tensor<8x4xf32>) {
    %zero = stablehlo.constant dense<0.0> : tensor<f32>
    %s = stablehlo.reduce(%a init: %zero) applies stablehlo.add across dimensions = [1] : (tensor<8x4xf32>, tensor<f32>) -> tensor<8xf32>
    // CHECK: "stablehlo.all_reduce"
    // CHECK: entangle.relation = "opaque: all_reduce takes the max over 'tp' but the value is a partial sum: the reduction kind is wrong"
    // expected-error @+1 {{all_reduce takes the max over 'tp' but the value is a partial sum: the reduction kind is wrong}}
    %1 = "stablehlo.all_reduce"(%s) ({
      ^bb0(%u: tensor<f32>, %v: tensor<f32>):
        %m = stablehlo.maximum %u, %v : tensor<f32>
        stablehlo.return %m : tensor<f32>
    }) {replica_groups = dense<[[0, 1, 2, 3]]> : tensor<1x4xi64>, channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, use_global_device_ids} : (tensor<8xf32>) -> tensor<8xf32>
    sdy.return %1 : tensor<8xf32>
  } : (tensor<8x16xf32>) -> tensor<8xf32>
  return %0 : tensor<8xf32>
}

// -----

sdy.mesh @mesh = <["dp"=2, "tp"=4]>

func.func @ref(%x: tensor<8x16xf32>) -> tensor<f32> {
  %zero = stablehlo.constant dense<0.0> : tensor<f32>
  %0 = stablehlo.reduce(%x init: %zero) applies stablehlo.add across dimensions = [0, 1] : (tensor<8x16xf32>, tensor<f32>) -> tensor<f32>
  return %0 : tensor<f32>
}

// Two steps: psum('tp') leaves a partial sum over dp (a variadic all_reduce carries both
// operands); groups that are no mesh axes are refused.
// CHECK-LABEL: func.func @two_steps
// FULL: func.func @two_steps{{.*}}entangle.verdict = "proven"
func.func @two_steps(%x: tensor<8x16xf32>) -> tensor<f32> attributes {entangle.refines = @ref} {
  %0 = sdy.manual_computation(%x) in_shardings=[<@mesh, [{"dp"}, {"tp"}]>] out_shardings=[<@mesh, []>] manual_axes={"dp", "tp"} (%a: tensor<4x4xf32>) {
    %zero = stablehlo.constant dense<0.0> : tensor<f32>
    %s = stablehlo.reduce(%a init: %zero) applies stablehlo.add across dimensions = [0, 1] : (tensor<4x4xf32>, tensor<f32>) -> tensor<f32>
    // CHECK: "stablehlo.all_reduce"
    // CHECK: entangle.relation = "partial sum {dp} : reduce_sum(%arg0); partial sum {dp} : reduce_sum(%arg0)"
    %1:2 = "stablehlo.all_reduce"(%s, %s) ({
      ^bb0(%u: tensor<f32>, %v: tensor<f32>):
        %t = stablehlo.add %u, %v : tensor<f32>
        stablehlo.return %t : tensor<f32>
    }) {replica_groups = dense<[[0, 1, 2, 3], [4, 5, 6, 7]]> : tensor<2x4xi64>, channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, use_global_device_ids} : (tensor<f32>, tensor<f32>) -> (tensor<f32>, tensor<f32>)
    // CHECK: "stablehlo.all_reduce"
    // CHECK: entangle.relation = "replicated : reduce_sum(%arg0)"
    %2 = "stablehlo.all_reduce"(%1#0) ({
      ^bb0(%u: tensor<f32>, %v: tensor<f32>):
        %t = stablehlo.add %u, %v : tensor<f32>
        stablehlo.return %t : tensor<f32>
    }) {replica_groups = dense<[[0, 4], [1, 5], [2, 6], [3, 7]]> : tensor<4x2xi64>, channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, use_global_device_ids} : (tensor<f32>) -> tensor<f32>
    // CHECK: "stablehlo.all_reduce"
    // CHECK: entangle.relation = "opaque: stablehlo.all_reduce: replica groups {{\[\[}}0, 1], [2, 3], [4, 5], [6, 7]] do not correspond to any mesh axes of dp=2 x tp=4"
    %3 = "stablehlo.all_reduce"(%1#1) ({
      ^bb0(%u: tensor<f32>, %v: tensor<f32>):
        %t = stablehlo.add %u, %v : tensor<f32>
        stablehlo.return %t : tensor<f32>
    }) {replica_groups = dense<[[0, 1], [2, 3], [4, 5], [6, 7]]> : tensor<4x2xi64>, channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, use_global_device_ids} : (tensor<f32>) -> tensor<f32>
    sdy.return %2 : tensor<f32>
  } : (tensor<8x16xf32>) -> tensor<f32>
  return %0 : tensor<f32>
}
