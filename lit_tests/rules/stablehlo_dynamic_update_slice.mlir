// RUN: entangle-opt %s --split-input-file --entangle-normalize --entangle-import-shardings --entangle-infer-relations | filecheck %s
// RUN: entangle-opt %s --split-input-file --entangle-normalize --entangle-import-shardings --entangle-infer-relations --entangle-check-refinement --verify-diagnostics | filecheck %s --check-prefix=FULL

// stablehlo.dynamic_update_slice (gather_scatter rule): a split dim must be covered whole by an
// update split the same way at offset 0; an unsplit dim takes a device-independent offset (the
// global update offset). A device-dependent offset is accepted in one form: each device writes
// ITS block of the update at c + block_index * size into a zero buffer, which is a partial sum
// over those axes of the whole update (XLA's all_gather as dynamic_update_slice + all_reduce).

sdy.mesh @mesh = <["tp"=4]>

func.func @ref(%x: tensor<8x16xf32>, %y: tensor<8x2xf32>) -> tensor<8x16xf32> {
  %c0 = stablehlo.constant dense<0> : tensor<i32>
  %c2 = stablehlo.constant dense<2> : tensor<i32>
  %0 = stablehlo.dynamic_update_slice %x, %y, %c0, %c2 : (tensor<8x16xf32>, tensor<8x2xf32>, tensor<i32>, tensor<i32>) -> tensor<8x16xf32>
  return %0 : tensor<8x16xf32>
}

// Rows split over tp for both; the columns [2, 4) are replaced on every device.
// CHECK-LABEL: func.func @rows
// FULL: func.func @rows{{.*}}entangle.rho = ["result#0 = concat over 'tp' along dim 0"], entangle.verdict = "proven"
func.func @rows(%x: tensor<8x16xf32>, %y: tensor<8x2xf32>) -> tensor<8x16xf32> attributes {entangle.refines = @ref} {
  %0 = sdy.manual_computation(%x, %y) in_shardings=[<@mesh, [{"tp"}, {}]>, <@mesh, [{"tp"}, {}]>] out_shardings=[<@mesh, [{"tp"}, {}]>] manual_axes={"tp"} (%a: tensor<2x16xf32>, %b: tensor<2x2xf32>) {
    %c0 = stablehlo.constant dense<0> : tensor<i32>
    %c2 = stablehlo.constant dense<2> : tensor<i32>
    // CHECK: stablehlo.dynamic_update_slice %{{.*}}entangle.relation = "tile [{tp}, {}] : dynamic_update_slice(%arg0, %arg1, 0, 2)"
    %1 = stablehlo.dynamic_update_slice %a, %b, %c0, %c2 : (tensor<2x16xf32>, tensor<2x2xf32>, tensor<i32>, tensor<i32>) -> tensor<2x16xf32>
    sdy.return %1 : tensor<2x16xf32>
  } : (tensor<8x16xf32>, tensor<8x2xf32>) -> tensor<8x16xf32>
  return %0 : tensor<8x16xf32>
}

// -----

sdy.mesh @mesh = <["tp"=4]>

func.func @ref(%y: tensor<8x4xf32>) -> tensor<8x4xf32> {
  return %y : tensor<8x4xf32>
}

// all_gather written as "my block into a zero buffer at partition_id * 2, then all_reduce".
// CHECK-LABEL: func.func @placed_blocks
// FULL: func.func @placed_blocks{{.*}}entangle.rho = ["result#0 = replicated on every device"], entangle.verdict = "proven"
func.func @placed_blocks(%y: tensor<8x4xf32>) -> tensor<8x4xf32> attributes {entangle.refines = @ref} {
  %0 = sdy.manual_computation(%y) in_shardings=[<@mesh, [{"tp"}, {}]>] out_shardings=[<@mesh, [{}, {}]>] manual_axes={"tp"} (%b: tensor<2x4xf32>) {
    %zero = stablehlo.constant dense<0.0> : tensor<8x4xf32>
    %pid = stablehlo.partition_id : tensor<ui32>
    %i = stablehlo.convert %pid : (tensor<ui32>) -> tensor<i32>
    %c2 = stablehlo.constant dense<2> : tensor<i32>
    %c0 = stablehlo.constant dense<0> : tensor<i32>
    %off = stablehlo.multiply %i, %c2 : tensor<i32>
    // CHECK: stablehlo.dynamic_update_slice %{{.*}}entangle.relation = "partial sum {tp} : %arg0"
    %1 = stablehlo.dynamic_update_slice %zero, %b, %off, %c0 : (tensor<8x4xf32>, tensor<2x4xf32>, tensor<i32>, tensor<i32>) -> tensor<8x4xf32>
    // CHECK: "stablehlo.all_reduce"
    // CHECK: entangle.relation = "replicated : %arg0"
    %2 = "stablehlo.all_reduce"(%1) ({
      ^bb0(%u: tensor<f32>, %v: tensor<f32>):
        %s = stablehlo.add %u, %v : tensor<f32>
        stablehlo.return %s : tensor<f32>
    }) {replica_groups = dense<[[0, 1, 2, 3]]> : tensor<1x4xi64>, channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, use_global_device_ids} : (tensor<8x4xf32>) -> tensor<8x4xf32>
    sdy.return %2 : tensor<8x4xf32>
  } : (tensor<8x4xf32>) -> tensor<8x4xf32>
  return %0 : tensor<8x4xf32>
}

// -----

sdy.mesh @mesh = <["tp"=4]>

func.func @ref(%y: tensor<8x4xf32>) -> tensor<8x4xf32> {
  return %y : tensor<8x4xf32>
}

// The same with a wrong offset table: device 2 writes its rows where device 1's belong.
// CHECK-LABEL: func.func @placed_wrong
// FULL: func.func @placed_wrong{{.*}}entangle.verdict = "not proven"
func.func @placed_wrong(%y: tensor<8x4xf32>) -> tensor<8x4xf32> attributes {entangle.refines = @ref} {
  %0 = sdy.manual_computation(%y) in_shardings=[<@mesh, [{"tp"}, {}]>] out_shardings=[<@mesh, [{}, {}]>] manual_axes={"tp"} (%b: tensor<2x4xf32>) {
    %zero = stablehlo.constant dense<0.0> : tensor<8x4xf32>
    %pid = stablehlo.partition_id : tensor<ui32>
    %i = stablehlo.convert %pid : (tensor<ui32>) -> tensor<i32>
    %c2 = stablehlo.constant dense<2> : tensor<i32>
    %c0 = stablehlo.constant dense<0> : tensor<i32>
    %off = stablehlo.multiply %i, %c2 : tensor<i32>
    %is2 = stablehlo.compare EQ, %i, %c2, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
    %bad = stablehlo.select %is2, %c2, %off : tensor<i1>, tensor<i32>
    // CHECK: stablehlo.dynamic_update_slice %{{.*}}entangle.relation = "opaque: device-dependent offset is wrong along dim 0: device 2 writes its block to [2, 4) instead of [4, 6) over 'tp'
    // expected-error @+1 {{device-dependent offset is wrong along dim 0: device 2 writes its block to [2, 4) instead of [4, 6) over 'tp'}}
    %1 = stablehlo.dynamic_update_slice %zero, %b, %bad, %c0 : (tensor<8x4xf32>, tensor<2x4xf32>, tensor<i32>, tensor<i32>) -> tensor<8x4xf32>
    %2 = "stablehlo.all_reduce"(%1) ({
      ^bb0(%u: tensor<f32>, %v: tensor<f32>):
        %s = stablehlo.add %u, %v : tensor<f32>
        stablehlo.return %s : tensor<f32>
    }) {replica_groups = dense<[[0, 1, 2, 3]]> : tensor<1x4xi64>, channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, use_global_device_ids} : (tensor<8x4xf32>) -> tensor<8x4xf32>
    sdy.return %2 : tensor<8x4xf32>
  } : (tensor<8x4xf32>) -> tensor<8x4xf32>
  return %0 : tensor<8x4xf32>
}

// -----

sdy.mesh @mesh = <["tp"=4]>

func.func @ref(%x: tensor<8x16xf32>, %y: tensor<8x2xf32>) -> tensor<8x16xf32> {
  %c0 = stablehlo.constant dense<0> : tensor<i32>
  %c2 = stablehlo.constant dense<2> : tensor<i32>
  %0 = stablehlo.dynamic_update_slice %x, %y, %c2, %c0 : (tensor<8x16xf32>, tensor<8x2xf32>, tensor<i32>, tensor<i32>) -> tensor<8x16xf32>
  return %0 : tensor<8x16xf32>
}

// Updating rows [1, 3) of a value whose rows are split: every device would write into its own
// block, at its local row 1.
// CHECK-LABEL: func.func @split_dim
// FULL: func.func @split_dim{{.*}}entangle.verdict = "not proven"
func.func @split_dim(%x: tensor<8x16xf32>, %y: tensor<8x2xf32>) -> tensor<8x16xf32> attributes {entangle.refines = @ref} {
  %0 = sdy.manual_computation(%x, %y) in_shardings=[<@mesh, [{"tp"}, {}]>, <@mesh, [{}, {}]>] out_shardings=[<@mesh, [{"tp"}, {}]>] manual_axes={"tp"} (%a: tensor<2x16xf32>, %b: tensor<8x2xf32>) {
    %c0 = stablehlo.constant dense<0> : tensor<i32>
    %c1 = stablehlo.constant dense<1> : tensor<i32>
    %s = stablehlo.slice %b [0:1, 0:2] : (tensor<8x2xf32>) -> tensor<1x2xf32>
    // CHECK: stablehlo.dynamic_update_slice %{{.*}}entangle.relation = "opaque: dynamic_update_slice into dim 0: the operand is split over 'tp', the update not split, at offset 1
    // expected-error @+1 {{dynamic_update_slice into dim 0: the operand is split over 'tp', the update not split, at offset 1}}
    %1 = stablehlo.dynamic_update_slice %a, %s, %c1, %c0 : (tensor<2x16xf32>, tensor<1x2xf32>, tensor<i32>, tensor<i32>) -> tensor<2x16xf32>
    sdy.return %1 : tensor<2x16xf32>
  } : (tensor<8x16xf32>, tensor<8x2xf32>) -> tensor<8x16xf32>
  return %0 : tensor<8x16xf32>
}
