// RUN: entangle-opt %s --split-input-file --entangle-normalize --entangle-import-shardings --entangle-infer-relations | filecheck %s

// stablehlo.iota (movement rule): replicated, and NOT poly: an iota built at the local shape
// counts from 0 on every device, so it is not the device's slice of the global iota (the
// classic "position ids restart on every sequence shard" bug).

sdy.mesh @mesh = <["tp"=4]>

// CHECK-LABEL: func.func @replicated
func.func @replicated(%x: tensor<8x16xf32>) -> tensor<8x16xf32> {
  %0 = sdy.manual_computation(%x) in_shardings=[<@mesh, [{}, {}]>] out_shardings=[<@mesh, [{}, {}]>] manual_axes={"tp"} (%a: tensor<8x16xf32>) {
    // CHECK: stablehlo.iota dim = 1 {entangle.relation = "replicated : iota(dim 1)"}
    %i = stablehlo.iota dim = 1 : tensor<8x16xf32>
    // CHECK: stablehlo.add %{{.*}}entangle.relation = "replicated : (%arg0 + iota(dim 1))"
    %1 = stablehlo.add %a, %i : tensor<8x16xf32>
    sdy.return %1 : tensor<8x16xf32>
  } : (tensor<8x16xf32>) -> tensor<8x16xf32>
  return %0 : tensor<8x16xf32>
}

// -----

sdy.mesh @mesh = <["tp"=4]>

// CHECK-LABEL: func.func @local_positions
func.func @local_positions(%x: tensor<16x8xf32>) -> tensor<16x8xf32> {
  %0 = sdy.manual_computation(%x) in_shardings=[<@mesh, [{"tp"}, {}]>] out_shardings=[<@mesh, [{"tp"}, {}]>] manual_axes={"tp"} (%a: tensor<4x8xf32>) {
    // CHECK: stablehlo.iota dim = 0 {entangle.relation = "replicated : iota(dim 0)"}
    %i = stablehlo.iota dim = 0 : tensor<4x8xf32>
    // CHECK: stablehlo.add %{{.*}}entangle.relation = "opaque: add: operands are laid out differently along dim 0 (split over 'tp' vs not split)"
    %1 = stablehlo.add %a, %i : tensor<4x8xf32>
    sdy.return %1 : tensor<4x8xf32>
  } : (tensor<16x8xf32>) -> tensor<16x8xf32>
  return %0 : tensor<16x8xf32>
}
