// RUN: entangle check %s | filecheck %s
// RUN: not entangle check %S/Inputs/token_dims_seq_major.mlir | filecheck %s --check-prefix=BUG

// Tokens flattened from (batch, seq) with the sequence split over tp (MoE / token-wise MLP under
// sequence parallelism): each device's 4 tokens are 2 strided runs of the 16 global tokens, which
// no tiling of the flattened dim describes. entangle-normalize keeps (batch, seq) apart through
// the per-token ops of both functions (entangle_mlir/normalize/token_dims.py), so the split is a tiling.
// The twin in Inputs/ flattens its block seq-major (a transpose first): its tokens are not the
// reference's, the region is not rewritten, and the reshape is reported.

// CHECK: verified: the sharded program refines the reference on mesh tp=4
// CHECK-NEXT: result#0 = concat over 'tp' along dim 1
// BUG: error: reshape regroups dim 1, which is split over 'tp', in a way that mixes blocks
// BUG: not proven

sdy.mesh @mesh = <["tp"=4]>

func.func @ref(%x: tensor<2x8x4xf32>, %w: tensor<4x4xf32>) -> tensor<2x8x4xf32> {
  %t = stablehlo.reshape %x : (tensor<2x8x4xf32>) -> tensor<16x4xf32>
  %h = stablehlo.dot_general %t, %w, contracting_dims = [1] x [0] : (tensor<16x4xf32>, tensor<4x4xf32>) -> tensor<16x4xf32>
  %y = stablehlo.tanh %h : tensor<16x4xf32>
  %r = stablehlo.reshape %y : (tensor<16x4xf32>) -> tensor<2x8x4xf32>
  return %r : tensor<2x8x4xf32>
}

func.func @sharded(%x: tensor<2x8x4xf32>, %w: tensor<4x4xf32>) -> tensor<2x8x4xf32> attributes {entangle.refines = @ref} {
  %0 = sdy.manual_computation(%x, %w) in_shardings=[<@mesh, [{}, {"tp"}, {}]>, <@mesh, [{}, {}]>] out_shardings=[<@mesh, [{}, {"tp"}, {}]>] manual_axes={"tp"} (%a: tensor<2x2x4xf32>, %v: tensor<4x4xf32>) {
    %t = stablehlo.reshape %a : (tensor<2x2x4xf32>) -> tensor<4x4xf32>
    %h = stablehlo.dot_general %t, %v, contracting_dims = [1] x [0] : (tensor<4x4xf32>, tensor<4x4xf32>) -> tensor<4x4xf32>
    %y = stablehlo.tanh %h : tensor<4x4xf32>
    %r = stablehlo.reshape %y : (tensor<4x4xf32>) -> tensor<2x2x4xf32>
    sdy.return %r : tensor<2x2x4xf32>
  } : (tensor<2x8x4xf32>, tensor<4x4xf32>) -> tensor<2x8x4xf32>
  return %0 : tensor<2x8x4xf32>
}
