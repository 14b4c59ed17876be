// RUN: entangle-opt %s --split-input-file --entangle-normalize --entangle-import-shardings --entangle-infer-relations | filecheck %s
// RUN: entangle-opt %s --split-input-file --entangle-normalize --entangle-import-shardings --entangle-infer-relations --entangle-check-refinement --verify-diagnostics | filecheck %s --check-prefix=FULL

// stablehlo.all_gather (collectives rule): gathering dim k over axes G removes G from the minor
// end of dim k's tiling. Gathering along the wrong dim, a replicated value (identical copies) or
// a partial sum is refused.

sdy.mesh @mesh = <["tp"=4]>

func.func @ref(%x: tensor<2x16x8xf32>) -> tensor<2x16x8xf32> {
  return %x : tensor<2x16x8xf32>
}

// Sequence parallelism: all_gather(seq) over tp.
// CHECK-LABEL: func.func @gather_seq
// FULL: func.func @gather_seq{{.*}}entangle.rho = ["result#0 = replicated on every device"], entangle.verdict = "proven"
func.func @gather_seq(%x: tensor<2x16x8xf32>) -> tensor<2x16x8xf32> attributes {entangle.refines = @ref} {
  %0 = sdy.manual_computation(%x) in_shardings=[<@mesh, [{}, {"tp"}, {}]>] out_shardings=[<@mesh, [{}, {}, {}]>] manual_axes={"tp"} (%a: tensor<2x4x8xf32>) {
    // CHECK: "stablehlo.all_gather"{{.*}}entangle.relation = "replicated : %arg0"
    %1 = "stablehlo.all_gather"(%a) {all_gather_dim = 1 : i64, replica_groups = dense<[[0, 1, 2, 3]]> : tensor<1x4xi64>, channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, use_global_device_ids} : (tensor<2x4x8xf32>) -> tensor<2x16x8xf32>
    sdy.return %1 : tensor<2x16x8xf32>
  } : (tensor<2x16x8xf32>) -> tensor<2x16x8xf32>
  return %0 : tensor<2x16x8xf32>
}

// -----

sdy.mesh @mesh = <["dp"=2, "tp"=4]>

func.func @ref(%x: tensor<16x4xf32>) -> tensor<16x4xf32> {
  return %x : tensor<16x4xf32>
}

// Rows split over (dp, tp), dp major: gathering over tp leaves the dp split.
// CHECK-LABEL: func.func @gather_minor_axis
// FULL: func.func @gather_minor_axis{{.*}}entangle.rho = ["result#0 = concat over 'dp' along dim 0"], entangle.verdict = "proven"
func.func @gather_minor_axis(%x: tensor<16x4xf32>) -> tensor<16x4xf32> attributes {entangle.refines = @ref} {
  %0 = sdy.manual_computation(%x) in_shardings=[<@mesh, [{"dp", "tp"}, {}]>] out_shardings=[<@mesh, [{"dp"}, {}]>] manual_axes={"dp", "tp"} (%a: tensor<2x4xf32>) {
    // CHECK: "stablehlo.all_gather"{{.*}}entangle.relation = "tile [{dp}, {}] : %arg0"
    %1 = "stablehlo.all_gather"(%a) {all_gather_dim = 0 : i64, replica_groups = dense<[[0, 1, 2, 3], [4, 5, 6, 7]]> : tensor<2x4xi64>, channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, use_global_device_ids} : (tensor<2x4xf32>) -> tensor<8x4xf32>
    sdy.return %1 : tensor<8x4xf32>
  } : (tensor<16x4xf32>) -> tensor<16x4xf32>
  return %0 : tensor<16x4xf32>
}

// -----

sdy.mesh @mesh = <["tp"=4]>

func.func @ref(%x: tensor<2x16x8xf32>) -> tensor<2x16x8xf32> {
  return %x : tensor<2x16x8xf32>
}

// The all_gather_wrong_dim bug: gathering the hidden dim of a sequence shard.
// CHECK-LABEL: func.func @wrong_dim
// FULL: func.func @wrong_dim{{.*}}entangle.verdict = "not proven"
func.func @wrong_dim(%x: tensor<2x16x8xf32>) -> tensor<2x16x8xf32> attributes {entangle.refines = @ref} {
  %0 = sdy.manual_computation(%x) in_shardings=[<@mesh, [{}, {"tp"}, {}]>] out_shardings=[<@mesh, [{}, {"tp"}, {}]>] manual_axes={"tp"} (%a: tensor<2x4x8xf32>) {
    // CHECK: "stablehlo.all_gather"{{.*}}entangle.relation = "opaque: all_gather concatenates along dim 2 but the value is split along dim 1 over 'tp'"
    // expected-error @+1 {{all_gather concatenates along dim 2 but the value is split along dim 1 over 'tp'}}
    %1 = "stablehlo.all_gather"(%a) {all_gather_dim = 2 : i64, replica_groups = dense<[[0, 1, 2, 3]]> : tensor<1x4xi64>, channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, use_global_device_ids} : (tensor<2x4x8xf32>) -> tensor<2x4x32xf32>
    %2 = stablehlo.slice %1 [0:2, 0:4, 0:8] : (tensor<2x4x32xf32>) -> tensor<2x4x8xf32>
    sdy.return %2 : tensor<2x4x8xf32>
  } : (tensor<2x16x8xf32>) -> tensor<2x16x8xf32>
  return %0 : tensor<2x16x8xf32>
}

// -----

sdy.mesh @mesh = <["tp"=4]>

func.func @ref(%x: tensor<8x16xf32>, %w: tensor<16x8xf32>) -> tensor<8x8xf32> {
  // expected-note @+1 {{corresponds to the reference op stablehlo.dot_general}}
  %0 = stablehlo.dot_general %x, %w, contracting_dims = [1] x [0] : (tensor<8x16xf32>, tensor<16x8xf32>) -> tensor<8x8xf32>
  return %0 : tensor<8x8xf32>
}

// Refused: gathering a replicated value concatenates identical copies; gathering a partial sum
// needs a psum (or a reduce_scatter) first.
// CHECK-LABEL: func.func @duplicate_and_partial
// FULL: func.func @duplicate_and_partial{{.*}}entangle.verdict = "not proven"
func.func @duplicate_and_partial(%x: tensor<8x16xf32>, %w: tensor<16x8xf32>) -> tensor<8x8xf32> attributes {entangle.refines = @ref} {
  %0 = sdy.manual_computation(%x, %w) in_shardings=[<@mesh, [{}, {"tp"}]>, <@mesh, [{"tp"}, {}]>] out_shardings=[<@mesh, [{}, {}]>] manual_axes={"tp"} (%a: tensor<8x4xf32>, %b: tensor<4x8xf32>) {
    // expected-error @+1 {{all_gather over 'tp' of a partial sum over 'tp': missing all_reduce/psum (or use reduce_scatter)}}
    %p = stablehlo.dot_general %a, %b, contracting_dims = [1] x [0] : (tensor<8x4xf32>, tensor<4x8xf32>) -> tensor<8x8xf32>
    %c = stablehlo.constant dense<1.0> : tensor<2x8xf32>
    // CHECK: "stablehlo.all_gather"{{.*}}entangle.relation = "opaque: all_gather over 'tp' of a value replicated over 'tp': it concatenates 4 identical copies"
    %1 = "stablehlo.all_gather"(%c) {all_gather_dim = 0 : i64, replica_groups = dense<[[0, 1, 2, 3]]> : tensor<1x4xi64>, channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, use_global_device_ids} : (tensor<2x8xf32>) -> tensor<8x8xf32>
    // CHECK: "stablehlo.all_gather"{{.*}}entangle.relation = "opaque: all_gather over 'tp' of a partial sum over 'tp': missing all_reduce/psum (or use reduce_scatter)"
    // expected-note @+1 {{the partial sum is used here by stablehlo.all_gather}}
    %2 = "stablehlo.all_gather"(%p) {all_gather_dim = 1 : i64, replica_groups = dense<[[0, 1, 2, 3]]> : tensor<1x4xi64>, channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, use_global_device_ids} : (tensor<8x8xf32>) -> tensor<8x32xf32>
    %3 = stablehlo.slice %2 [0:8, 0:8] : (tensor<8x32xf32>) -> tensor<8x8xf32>
    %4 = stablehlo.add %3, %1 : tensor<8x8xf32>
    sdy.return %4 : tensor<8x8xf32>
  } : (tensor<8x16xf32>, tensor<16x8xf32>) -> tensor<8x8xf32>
  return %0 : tensor<8x8xf32>
}
