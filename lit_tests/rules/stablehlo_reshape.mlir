// RUN: entangle-opt %s --split-input-file --entangle-normalize --entangle-import-shardings --entangle-infer-relations | filecheck %s

// stablehlo.reshape (movement rule): dims are matched in groups; a split dim must be the major
// non-unit dim of its group, and the tiling goes to the major-most dim of the target group.
// Anything else mixes blocks and is refused. Partial sums are kept (reshape is linear).

sdy.mesh @mesh = <["dp"=2, "tp"=4]>

// Attention heads: hidden 32 split over tp -> (8 heads, head_dim 4) with the heads split.
// CHECK-LABEL: func.func @split_heads
func.func @split_heads(%x: tensor<2x8x32xf32>) -> tensor<2x8x32xf32> {
  %0 = sdy.manual_computation(%x) in_shardings=[<@mesh, [{"dp"}, {}, {"tp"}]>] out_shardings=[<@mesh, [{"dp"}, {}, {"tp"}]>] manual_axes={"dp", "tp"} (%a: tensor<1x8x8xf32>) {
    // CHECK: stablehlo.reshape %{{.*}}entangle.relation = "tile [{dp}, {}, {tp}, {}] : reshape(%arg0)"
    %h = stablehlo.reshape %a : (tensor<1x8x8xf32>) -> tensor<1x8x2x4xf32>
    // CHECK: stablehlo.reshape %{{.*}}entangle.relation = "tile [{dp}, {}, {tp}] : %arg0"
    %1 = stablehlo.reshape %h : (tensor<1x8x2x4xf32>) -> tensor<1x8x8xf32>
    sdy.return %1 : tensor<1x8x8xf32>
  } : (tensor<2x8x32xf32>) -> tensor<2x8x32xf32>
  return %0 : tensor<2x8x32xf32>
}

// -----

sdy.mesh @mesh = <["tp"=4]>

// One head per device: local 2x8x1x8 from 2x8x8 is ambiguous (global 2x8x4x8 or 2x8x1x32);
// the tiling is put on the major-most dim of the group: 4 heads of 8. Transposes compose.
// CHECK-LABEL: func.func @unit_head
func.func @unit_head(%x: tensor<2x8x32xf32>) -> tensor<2x8x32xf32> {
  %0 = sdy.manual_computation(%x) in_shardings=[<@mesh, [{}, {}, {"tp"}]>] out_shardings=[<@mesh, [{}, {}, {"tp"}]>] manual_axes={"tp"} (%a: tensor<2x8x8xf32>) {
    // CHECK: stablehlo.reshape %{{.*}}entangle.relation = "tile [{}, {}, {tp}, {}] : reshape(%arg0)"
    %h = stablehlo.reshape %a : (tensor<2x8x8xf32>) -> tensor<2x8x1x8xf32>
    %t = stablehlo.transpose %h, dims = [0, 2, 1, 3] : (tensor<2x8x1x8xf32>) -> tensor<2x1x8x8xf32>
    // CHECK: stablehlo.transpose %{{.*}}entangle.relation = "tile [{}, {tp}, {}, {}] : transpose(reshape(%arg0))"
    // CHECK: stablehlo.transpose %{{.*}}entangle.relation = "tile [{}, {}, {tp}, {}] : reshape(%arg0)"
    %u = stablehlo.transpose %t, dims = [0, 2, 1, 3] : (tensor<2x1x8x8xf32>) -> tensor<2x8x1x8xf32>
    // CHECK: stablehlo.reshape %{{.*}}entangle.relation = "tile [{}, {}, {tp}] : %arg0"
    %1 = stablehlo.reshape %u : (tensor<2x8x1x8xf32>) -> tensor<2x8x8xf32>
    sdy.return %1 : tensor<2x8x8xf32>
  } : (tensor<2x8x32xf32>) -> tensor<2x8x32xf32>
  return %0 : tensor<2x8x32xf32>
}

// -----

sdy.mesh @mesh = <["tp"=4]>

// Flattening tokens: (batch, seq split over tp) -> rows. seq is not the major dim of the
// group, so each device's rows are not one contiguous block: refused.
// CHECK-LABEL: func.func @mixes_blocks
func.func @mixes_blocks(%x: tensor<2x16x8xf32>) -> tensor<2x16x8xf32> {
  %0 = sdy.manual_computation(%x) in_shardings=[<@mesh, [{}, {"tp"}, {}]>] out_shardings=[<@mesh, [{}, {"tp"}, {}]>] manual_axes={"tp"} (%a: tensor<2x4x8xf32>) {
    // CHECK: stablehlo.reshape %{{.*}}entangle.relation = "opaque: reshape regroups dim 1, which is split over 'tp', in a way that mixes blocks"
    %r = stablehlo.reshape %a : (tensor<2x4x8xf32>) -> tensor<8x8xf32>
    sdy.return %a : tensor<2x4x8xf32>
  } : (tensor<2x16x8xf32>) -> tensor<2x16x8xf32>
  return %0 : tensor<2x16x8xf32>
}

// -----

sdy.mesh @mesh = <["tp"=4]>

// A partial sum reshapes freely.
// CHECK-LABEL: func.func @partial
func.func @partial(%x: tensor<8x16xf32>, %w: tensor<16x8xf32>) -> tensor<64xf32> {
  %0 = sdy.manual_computation(%x, %w) in_shardings=[<@mesh, [{}, {"tp"}]>, <@mesh, [{"tp"}, {}]>] out_shardings=[<@mesh, [{}]>] manual_axes={"tp"} (%a: tensor<8x4xf32>, %b: tensor<4x8xf32>) {
    %p = stablehlo.dot_general %a, %b, contracting_dims = [1] x [0] : (tensor<8x4xf32>, tensor<4x8xf32>) -> tensor<8x8xf32>
    // CHECK: stablehlo.reshape %{{.*}}entangle.relation = "partial sum {tp} : reshape(dot_general(%arg0, %arg1))"
    %1 = stablehlo.reshape %p : (tensor<8x8xf32>) -> tensor<64xf32>
    sdy.return %1 : tensor<64xf32>
  } : (tensor<8x16xf32>, tensor<16x8xf32>) -> tensor<64xf32>
  return %0 : tensor<64xf32>
}

// -----

sdy.mesh @mesh = <["y"=2, "z"=2]>

// Merging split dims (the scaling book's decode attention: O[B, K_Y, M_Z, H] -> O[B, N_YZ, H]):
// the KV-head dim holds one element per device, so each device's (k, m) rows are one block of
// the merged heads, split over (y, z), y major.
// CHECK-LABEL: func.func @merge_split_dims
func.func @merge_split_dims(%x: tensor<4x2x4x8xf32>) -> tensor<4x8x8xf32> {
  %0 = sdy.manual_computation(%x) in_shardings=[<@mesh, [{}, {"y"}, {"z"}, {}]>] out_shardings=[<@mesh, [{}, {"y", "z"}, {}]>] manual_axes={"y", "z"} (%a: tensor<4x1x2x8xf32>) {
    // CHECK: stablehlo.reshape %{{.*}}entangle.relation = "tile [{}, {y, z}, {}] : reshape(%arg0)"
    %1 = stablehlo.reshape %a : (tensor<4x1x2x8xf32>) -> tensor<4x2x8xf32>
    sdy.return %1 : tensor<4x2x8xf32>
  } : (tensor<4x2x4x8xf32>) -> tensor<4x8x8xf32>
  return %0 : tensor<4x8x8xf32>
}

// -----

sdy.mesh @mesh = <["y"=2, "z"=2]>

// The major split dim holds two elements per device: each device's rows interleave with the
// other devices' in the merged dim: refused.
// CHECK-LABEL: func.func @merge_wide_major
func.func @merge_wide_major(%x: tensor<4x4x8xf32>) -> tensor<4x4x8xf32> {
  %0 = sdy.manual_computation(%x) in_shardings=[<@mesh, [{"y"}, {"z"}, {}]>] out_shardings=[<@mesh, [{"y"}, {"z"}, {}]>] manual_axes={"y", "z"} (%a: tensor<2x2x8xf32>) {
    // CHECK: stablehlo.reshape %{{.*}}entangle.relation = "opaque: reshape regroups dim 0, which is split over 'y', in a way that mixes blocks"
    %r = stablehlo.reshape %a : (tensor<2x2x8xf32>) -> tensor<4x8xf32>
    sdy.return %a : tensor<2x2x8xf32>
  } : (tensor<4x4x8xf32>) -> tensor<4x4x8xf32>
  return %0 : tensor<4x4x8xf32>
}
