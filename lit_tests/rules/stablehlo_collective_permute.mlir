// RUN: entangle-opt %s --split-input-file --entangle-normalize --entangle-import-shardings --entangle-infer-relations | filecheck %s
// RUN: entangle-opt %s --split-input-file --entangle-normalize --entangle-import-shardings --entangle-infer-relations --entangle-check-refinement --verify-diagnostics | filecheck %s --check-prefix=FULL

// stablehlo.collective_permute (collectives rule): a permutation that only moves data between
// devices holding the same block (it changes no coordinate of an axis the value is split or
// partial over) keeps the layout. A cyclic shift of the blocks of a split dim is a roll of the
// global tensor (proven when the reference rolls too, else an error at the permute). Any other
// order is kept as a permuted value that a later permute may undo. Leaving devices without data
// (they receive zeros) is refused.

sdy.mesh @mesh = <["dp"=2, "tp"=4]>

func.func @ref(%x: tensor<8x16xf32>) -> tensor<8x16xf32> {
  return %x : tensor<8x16xf32>
}

// Columns split over tp; the permutation swaps dp = 0 <-> 1, along which the value is replicated.
// CHECK-LABEL: func.func @along_replicated_axis
// FULL: func.func @along_replicated_axis{{.*}}entangle.rho = ["result#0 = concat over 'tp' along dim 1"], entangle.verdict = "proven"
func.func @along_replicated_axis(%x: tensor<8x16xf32>) -> tensor<8x16xf32> attributes {entangle.refines = @ref} {
  %0 = sdy.manual_computation(%x) in_shardings=[<@mesh, [{}, {"tp"}]>] out_shardings=[<@mesh, [{}, {"tp"}]>] manual_axes={"dp", "tp"} (%a: tensor<8x4xf32>) {
    // CHECK: "stablehlo.collective_permute"{{.*}}entangle.relation = "tile [{}, {tp}] : %arg0"
    %1 = "stablehlo.collective_permute"(%a) {source_target_pairs = dense<[[0, 4], [4, 0], [1, 5], [5, 1], [2, 6], [6, 2], [3, 7], [7, 3]]> : tensor<8x2xi64>, channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>} : (tensor<8x4xf32>) -> tensor<8x4xf32>
    sdy.return %1 : tensor<8x4xf32>
  } : (tensor<8x16xf32>) -> tensor<8x16xf32>
  return %0 : tensor<8x16xf32>
}

// -----

sdy.mesh @mesh = <["tp"=4]>

func.func @ref(%x: tensor<8x16xf32>) -> tensor<8x16xf32> {
  return %x : tensor<8x16xf32>
}

// A ring shift of a tp-split value hands every device its neighbour's block: a roll of the
// global columns, which this reference does not compute.
// CHECK-LABEL: func.func @ring_shift
// FULL: func.func @ring_shift{{.*}}entangle.verdict = "not proven"
func.func @ring_shift(%x: tensor<8x16xf32>) -> tensor<8x16xf32> attributes {entangle.refines = @ref} {
  %0 = sdy.manual_computation(%x) in_shardings=[<@mesh, [{}, {"tp"}]>] out_shardings=[<@mesh, [{}, {"tp"}]>] manual_axes={"tp"} (%a: tensor<8x4xf32>) {
    // CHECK: "stablehlo.collective_permute"{{.*}}entangle.relation = "tile [{}, {tp}] : concatenate(slice(%arg0), slice(%arg0))"
    // expected-error @+1 {{collective_permute moves blocks along 'tp': device 1 receives device 0's block: the global tensor is rolled by 4 along dim 1}}
    %1 = "stablehlo.collective_permute"(%a) {source_target_pairs = dense<[[0, 1], [1, 2], [2, 3], [3, 0]]> : tensor<4x2xi64>, channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>} : (tensor<8x4xf32>) -> tensor<8x4xf32>
    sdy.return %1 : tensor<8x4xf32>
  } : (tensor<8x16xf32>) -> tensor<8x16xf32>
  // expected-note @+1 {{result #0 differs from the reference}}
  return %0 : tensor<8x16xf32>
}

// -----

sdy.mesh @mesh = <["tp"=4]>

// jnp.roll(x, 4, axis=1) as jax lowers it.
func.func @ref(%x: tensor<8x16xf32>) -> tensor<8x16xf32> {
  %0 = stablehlo.slice %x [0:8, 12:16] : (tensor<8x16xf32>) -> tensor<8x4xf32>
  %1 = stablehlo.slice %x [0:8, 0:12] : (tensor<8x16xf32>) -> tensor<8x12xf32>
  %2 = stablehlo.concatenate %0, %1, dim = 1 : (tensor<8x4xf32>, tensor<8x12xf32>) -> tensor<8x16xf32>
  return %2 : tensor<8x16xf32>
}

// The same ring shift where the reference rolls the columns by one block: proven.
// CHECK-LABEL: func.func @roll
// FULL: func.func @roll{{.*}}entangle.verdict = "proven"
func.func @roll(%x: tensor<8x16xf32>) -> tensor<8x16xf32> attributes {entangle.refines = @ref} {
  %0 = sdy.manual_computation(%x) in_shardings=[<@mesh, [{}, {"tp"}]>] out_shardings=[<@mesh, [{}, {"tp"}]>] manual_axes={"tp"} (%a: tensor<8x4xf32>) {
    // CHECK: "stablehlo.collective_permute"{{.*}}entangle.relation = "tile [{}, {tp}] : concatenate(slice(%arg0), slice(%arg0))"
    %1 = "stablehlo.collective_permute"(%a) {source_target_pairs = dense<[[0, 1], [1, 2], [2, 3], [3, 0]]> : tensor<4x2xi64>, channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>} : (tensor<8x4xf32>) -> tensor<8x4xf32>
    sdy.return %1 : tensor<8x4xf32>
  } : (tensor<8x16xf32>) -> tensor<8x16xf32>
  return %0 : tensor<8x16xf32>
}

// -----

sdy.mesh @mesh = <["tp"=4]>

func.func @ref(%x: tensor<8x16xf32>) -> tensor<8x16xf32> {
  return %x : tensor<8x16xf32>
}

// Swapping blocks 0 and 2 is no roll: the value is kept permuted, and the inverse permute
// (the same swap) puts every block back. A roll and the opposite roll cancel too.
// CHECK-LABEL: func.func @permute_and_undo
// FULL: func.func @permute_and_undo{{.*}}entangle.verdict = "proven"
func.func @permute_and_undo(%x: tensor<8x16xf32>) -> tensor<8x16xf32> attributes {entangle.refines = @ref} {
  %0 = sdy.manual_computation(%x) in_shardings=[<@mesh, [{"tp"}, {}]>] out_shardings=[<@mesh, [{"tp"}, {}]>] manual_axes={"tp"} (%a: tensor<2x16xf32>) {
    // CHECK: "stablehlo.collective_permute"{{.*}}entangle.relation = "tile [{tp}, {}] : %arg0 with blocks from devices [2, 1, 0, 3]"
    %1 = "stablehlo.collective_permute"(%a) {source_target_pairs = dense<[[0, 2], [2, 0], [1, 1], [3, 3]]> : tensor<4x2xi64>, channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>} : (tensor<2x16xf32>) -> tensor<2x16xf32>
    // CHECK: "stablehlo.collective_permute"{{.*}}entangle.relation = "tile [{tp}, {}] : %arg0"
    %2 = "stablehlo.collective_permute"(%1) {source_target_pairs = dense<[[0, 2], [2, 0], [1, 1], [3, 3]]> : tensor<4x2xi64>, channel_handle = #stablehlo.channel_handle<handle = 2, type = 1>} : (tensor<2x16xf32>) -> tensor<2x16xf32>
    // CHECK: "stablehlo.collective_permute"{{.*}}entangle.relation = "tile [{tp}, {}] : concatenate(slice(%arg0), slice(%arg0))"
    %3 = "stablehlo.collective_permute"(%2) {source_target_pairs = dense<[[0, 1], [1, 2], [2, 3], [3, 0]]> : tensor<4x2xi64>, channel_handle = #stablehlo.channel_handle<handle = 3, type = 1>} : (tensor<2x16xf32>) -> tensor<2x16xf32>
    // CHECK: "stablehlo.collective_permute"{{.*}}entangle.relation = "tile [{tp}, {}] : %arg0"
    %4 = "stablehlo.collective_permute"(%3) {source_target_pairs = dense<[[1, 0], [2, 1], [3, 2], [0, 3]]> : tensor<4x2xi64>, channel_handle = #stablehlo.channel_handle<handle = 4, type = 1>} : (tensor<2x16xf32>) -> tensor<2x16xf32>
    sdy.return %4 : tensor<2x16xf32>
  } : (tensor<8x16xf32>) -> tensor<8x16xf32>
  return %0 : tensor<8x16xf32>
}

// -----

sdy.mesh @mesh = <["tp"=4]>

func.func @ref(%x: tensor<8x16xf32>) -> tensor<8x16xf32> {
  // expected-note @+1 {{moves blocks of the value that the reference op stablehlo.tanh computes}}
  %0 = stablehlo.tanh %x : tensor<8x16xf32>
  return %0 : tensor<8x16xf32>
}

// A permuted value used by any other op: the blocks are in the wrong place, reported at the
// permute.
// CHECK-LABEL: func.func @permuted_then_used
// FULL: func.func @permuted_then_used{{.*}}entangle.verdict = "not proven"
func.func @permuted_then_used(%x: tensor<8x16xf32>) -> tensor<8x16xf32> attributes {entangle.refines = @ref} {
  %0 = sdy.manual_computation(%x) in_shardings=[<@mesh, [{"tp"}, {}]>] out_shardings=[<@mesh, [{"tp"}, {}]>] manual_axes={"tp"} (%a: tensor<2x16xf32>) {
    // expected-error @+1 {{collective_permute moves blocks along 'tp': device 2 receives device 0's block}}
    %1 = "stablehlo.collective_permute"(%a) {source_target_pairs = dense<[[0, 2], [2, 0], [1, 1], [3, 3]]> : tensor<4x2xi64>, channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>} : (tensor<2x16xf32>) -> tensor<2x16xf32>
    // CHECK: stablehlo.tanh{{.*}}entangle.relation = "opaque: collective_permute moves blocks along 'tp': device 2 receives device 0's block"
    %2 = stablehlo.tanh %1 : tensor<2x16xf32>
    sdy.return %2 : tensor<2x16xf32>
  } : (tensor<8x16xf32>) -> tensor<8x16xf32>
  return %0 : tensor<8x16xf32>
}

// -----

sdy.mesh @mesh = <["tp"=4]>

func.func @ref(%x: tensor<8x16xf32>) -> tensor<8x16xf32> {
  return %x : tensor<8x16xf32>
}

// A ring shift of a replicated value is harmless; a partial permutation is not (devices 0 and
// 2 receive nothing, i.e. zeros).
// CHECK-LABEL: func.func @replicated_and_incomplete
// FULL: func.func @replicated_and_incomplete{{.*}}entangle.verdict = "not proven"
func.func @replicated_and_incomplete(%x: tensor<8x16xf32>) -> tensor<8x16xf32> attributes {entangle.refines = @ref} {
  %0 = sdy.manual_computation(%x) in_shardings=[<@mesh, [{}, {}]>] out_shardings=[<@mesh, [{}, {}]>] manual_axes={"tp"} (%a: tensor<8x16xf32>) {
    // CHECK: "stablehlo.collective_permute"{{.*}}entangle.relation = "replicated : %arg0"
    %1 = "stablehlo.collective_permute"(%a) {source_target_pairs = dense<[[0, 1], [1, 2], [2, 3], [3, 0]]> : tensor<4x2xi64>, channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>} : (tensor<8x16xf32>) -> tensor<8x16xf32>
    // CHECK: "stablehlo.collective_permute"{{.*}}entangle.relation = "opaque: collective_permute leaves devices [0, 2] without data (they receive zeros)"
    // expected-error @+1 {{collective_permute leaves devices [0, 2] without data (they receive zeros)}}
    %2 = "stablehlo.collective_permute"(%1) {source_target_pairs = dense<[[0, 1], [2, 3]]> : tensor<2x2xi64>, channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>} : (tensor<8x16xf32>) -> tensor<8x16xf32>
    sdy.return %2 : tensor<8x16xf32>
  } : (tensor<8x16xf32>) -> tensor<8x16xf32>
  return %0 : tensor<8x16xf32>
}
