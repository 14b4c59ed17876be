// RUN: entangle-opt %s --entangle-normalize --entangle-import-shardings --entangle-infer-relations --entangle-check-refinement --verify-diagnostics

// Regression (fixed): a misleading message for a collective_permute that moves blocks.
// The value is split over dp (rows) and tp (cols); the permutation is a ring shift along tp
// only (every pair keeps its dp coordinate). Refusing is right, but
// rules/collectives.collective_permute names every axis the value uses, not the axes the
// permutation actually moves along:
//   opaque: collective_permute moves blocks along ('dp', 'tp'): device 1 receives device 0's block

sdy.mesh @mesh = <["dp"=2, "tp"=4]>

func.func @ref(%x: tensor<8x16xf32>) -> tensor<8x16xf32> {
  return %x : tensor<8x16xf32>
}

func.func @ring_shift_2d(%x: tensor<8x16xf32>) -> tensor<8x16xf32> attributes {entangle.refines = @ref} {
  %0 = sdy.manual_computation(%x) in_shardings=[<@mesh, [{"dp"}, {"tp"}]>] out_shardings=[<@mesh, [{"dp"}, {"tp"}]>] manual_axes={"dp", "tp"} (%a: tensor<4x4xf32>) {
    // expected-error @+1 {{collective_permute moves blocks along 'tp': device 1 receives device 0's block}}
    %1 = "stablehlo.collective_permute"(%a) {source_target_pairs = dense<[[0, 1], [1, 2], [2, 3], [3, 0], [4, 5], [5, 6], [6, 7], [7, 4]]> : tensor<8x2xi64>, channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>} : (tensor<4x4xf32>) -> tensor<4x4xf32>
    sdy.return %1 : tensor<4x4xf32>
  } : (tensor<8x16xf32>) -> tensor<8x16xf32>
  // expected-note @+1 {{result #0 differs from the reference}}
  return %0 : tensor<8x16xf32>
}
