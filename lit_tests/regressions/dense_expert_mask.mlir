// RUN: entangle-opt %s --split-input-file --entangle-normalize --entangle-import-shardings --entangle-infer-relations | filecheck %s
// RUN: entangle-opt %s --split-input-file --entangle-normalize --entangle-import-shardings --entangle-infer-relations --entangle-check-refinement --verify-diagnostics | filecheck %s --check-prefix=FULL

// Dense expert parallelism: 8 experts split over ep=2 (4 per device), token ids replicated.
// One local expert at a time, by a scalar index (`ids == 4*axis_index + 1`, the unrolled loop of
// MaxText-style dense expert parallelism): entry 1 of each device's block of one_hot(ids, 8).
// Exact, but not related yet: named as such, not claimed to be an off-by-one bound.

sdy.mesh @mesh = <["ep"=2]>

func.func @ref(%x: tensor<6xf32>, %t: tensor<6xi32>) -> tensor<6xf32> {
  return %x : tensor<6xf32>
}

// FULL: func.func @sharded{{.*}}entangle.verdict = "not proven"
func.func @sharded(%x: tensor<6xf32>, %t: tensor<6xi32>) -> tensor<6xf32> attributes {entangle.refines = @ref} {
  %0 = sdy.manual_computation(%x, %t) in_shardings=[<@mesh, [{}]>, <@mesh, [{}]>] out_shardings=[<@mesh, [{}]>] manual_axes={"ep"} (%a: tensor<6xf32>, %ids: tensor<6xi32>) {
    %pid = stablehlo.partition_id : tensor<ui32>
    %i = stablehlo.convert %pid : (tensor<ui32>) -> tensor<i32>
    %four = stablehlo.constant dense<4> : tensor<i32>
    %start = stablehlo.multiply %i, %four : tensor<i32>
    %one = stablehlo.constant dense<1> : tensor<i32>
    %expert = stablehlo.add %start, %one : tensor<i32>
    %eb = stablehlo.broadcast_in_dim %expert, dims = [] : (tensor<i32>) -> tensor<6xi32>
    // CHECK: stablehlo.compare{{.*}}entangle.relation = "(1 <= x - 4*axis_index(ep) < 2) for x = replicated : %arg1"
    %mask = stablehlo.compare EQ, %ids, %eb, SIGNED : (tensor<6xi32>, tensor<6xi32>) -> tensor<6xi1>
    %zf = stablehlo.constant dense<0.0> : tensor<6xf32>
    // expected-error @+1 {{the mask tests x == 4*axis_index(ep) + 1: entry 1 of each device's block of one_hot(x) split over ep, one step of a loop}}
    %kept = stablehlo.select %mask, %a, %zf : tensor<6xi1>, tensor<6xf32>
    sdy.return %kept : tensor<6xf32>
  } : (tensor<6xf32>, tensor<6xi32>) -> tensor<6xf32>
  return %0 : tensor<6xf32>
}

// -----

// The nearest wrong index, one past the block (`ids == 4*axis_index + 4`: the next device's
// first expert): not an entry of the device's block, still called a mask off the block.

sdy.mesh @mesh = <["ep"=2]>

func.func @ref(%x: tensor<6xf32>, %t: tensor<6xi32>) -> tensor<6xf32> {
  return %x : tensor<6xf32>
}

// FULL: func.func @sharded{{.*}}entangle.verdict = "not proven"
func.func @sharded(%x: tensor<6xf32>, %t: tensor<6xi32>) -> tensor<6xf32> attributes {entangle.refines = @ref} {
  %0 = sdy.manual_computation(%x, %t) in_shardings=[<@mesh, [{}]>, <@mesh, [{}]>] out_shardings=[<@mesh, [{}]>] manual_axes={"ep"} (%a: tensor<6xf32>, %ids: tensor<6xi32>) {
    %pid = stablehlo.partition_id : tensor<ui32>
    %i = stablehlo.convert %pid : (tensor<ui32>) -> tensor<i32>
    %four = stablehlo.constant dense<4> : tensor<i32>
    %start = stablehlo.multiply %i, %four : tensor<i32>
    %expert = stablehlo.add %start, %four : tensor<i32>
    %eb = stablehlo.broadcast_in_dim %expert, dims = [] : (tensor<i32>) -> tensor<6xi32>
    // expected-error @+1 {{the mask is not the device's block: it tests ids x with 4 <= x - 4*axis_index(ep) < 5}}
    %mask = stablehlo.compare EQ, %ids, %eb, SIGNED : (tensor<6xi32>, tensor<6xi32>) -> tensor<6xi1>
    %zf = stablehlo.constant dense<0.0> : tensor<6xf32>
    // expected-note @+1 {{the mask is used here by stablehlo.select}}
    %kept = stablehlo.select %mask, %a, %zf : tensor<6xi1>, tensor<6xf32>
    sdy.return %kept : tensor<6xf32>
  } : (tensor<6xf32>, tensor<6xi32>) -> tensor<6xf32>
  return %0 : tensor<6xf32>
}
