// RUN: entangle-opt %s --split-input-file --entangle-normalize --entangle-import-shardings --entangle-infer-relations | filecheck %s
// RUN: entangle-opt %s --split-input-file --entangle-normalize --entangle-import-shardings --entangle-infer-relations --entangle-check-refinement --verify-diagnostics | filecheck %s --check-prefix=FULL

// stablehlo.dynamic_update_slice (gather_scatter rule): constant offsets into replicated dims
// update the global tensor; a split dim must be covered whole by an update split alike. A
// device-dependent offset that puts each device's block at block_index * size into a ZERO
// buffer gives a partial sum (the zero-buffer + psum spelling of an all_gather); any other
// table is a wrong offset.

sdy.mesh @mesh = <["tp"=4]>

func.func @ref(%x: tensor<16x8xf32>) -> tensor<16x8xf32> {
  return %x : tensor<16x8xf32>
}

// all_gather written as "write my rows into zeros, then psum".
// CHECK-LABEL: func.func @gather_by_psum
// FULL: func.func @gather_by_psum{{.*}}entangle.rho = ["result#0 = replicated on every device"], entangle.verdict = "proven"
func.func @gather_by_psum(%x: tensor<16x8xf32>) -> tensor<16x8xf32> attributes {entangle.refines = @ref} {
  %0 = sdy.manual_computation(%x) in_shardings=[<@mesh, [{"tp"}, {}]>] out_shardings=[<@mesh, [{}, {}]>] manual_axes={"tp"} (%a: tensor<4x8xf32>) {
    %pid = stablehlo.partition_id : tensor<ui32>
    %i = stablehlo.convert %pid : (tensor<ui32>) -> tensor<i32>
    %c4 = stablehlo.constant dense<4> : tensor<i32>
    %c0 = stablehlo.constant dense<0> : tensor<i32>
    %off = stablehlo.multiply %i, %c4 : tensor<i32>
    %z = stablehlo.constant dense<0.0> : tensor<16x8xf32>
    // CHECK: stablehlo.dynamic_update_slice %{{.*}}entangle.relation = "partial sum {tp} : %arg0"
    %1 = stablehlo.dynamic_update_slice %z, %a, %off, %c0 : (tensor<16x8xf32>, tensor<4x8xf32>, tensor<i32>, tensor<i32>) -> tensor<16x8xf32>
    %2 = "stablehlo.all_reduce"(%1) ({
      ^bb0(%p: tensor<f32>, %q: tensor<f32>):
        %s = stablehlo.add %p, %q : tensor<f32>
        stablehlo.return %s : tensor<f32>
    }) {replica_groups = dense<[[0, 1, 2, 3]]> : tensor<1x4xi64>, channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, use_global_device_ids} : (tensor<16x8xf32>) -> tensor<16x8xf32>
    sdy.return %2 : tensor<16x8xf32>
  } : (tensor<16x8xf32>) -> tensor<16x8xf32>
  return %0 : tensor<16x8xf32>
}

// -----

sdy.mesh @mesh = <["tp"=4]>

func.func @ref(%x: tensor<16x8xf32>, %u: tensor<4x8xf32>) -> tensor<16x8xf32> {
  %c2 = stablehlo.constant dense<2> : tensor<i32>
  %c0 = stablehlo.constant dense<0> : tensor<i32>
  %0 = stablehlo.dynamic_update_slice %x, %u, %c2, %c0 : (tensor<16x8xf32>, tensor<4x8xf32>, tensor<i32>, tensor<i32>) -> tensor<16x8xf32>
  return %0 : tensor<16x8xf32>
}

// Constant offsets into replicated dims (a KV-cache write on every device).
// CHECK-LABEL: func.func @constant_offset
// FULL: func.func @constant_offset{{.*}}entangle.verdict = "proven"
func.func @constant_offset(%x: tensor<16x8xf32>, %u: tensor<4x8xf32>) -> tensor<16x8xf32> attributes {entangle.refines = @ref} {
  %0 = sdy.manual_computation(%x, %u) in_shardings=[<@mesh, [{}, {}]>, <@mesh, [{}, {}]>] out_shardings=[<@mesh, [{}, {}]>] manual_axes={"tp"} (%a: tensor<16x8xf32>, %b: tensor<4x8xf32>) {
    %c2 = stablehlo.constant dense<2> : tensor<i32>
    %c0 = stablehlo.constant dense<0> : tensor<i32>
    // CHECK: stablehlo.dynamic_update_slice %{{.*}}entangle.relation = "replicated : dynamic_update_slice(%arg0, %arg1, 2, 0)"
    %1 = stablehlo.dynamic_update_slice %a, %b, %c2, %c0 : (tensor<16x8xf32>, tensor<4x8xf32>, tensor<i32>, tensor<i32>) -> tensor<16x8xf32>
    sdy.return %1 : tensor<16x8xf32>
  } : (tensor<16x8xf32>, tensor<4x8xf32>) -> tensor<16x8xf32>
  return %0 : tensor<16x8xf32>
}

// -----

sdy.mesh @mesh = <["tp"=4]>

func.func @ref(%x: tensor<16x8xf32>) -> tensor<16x8xf32> {
  return %x : tensor<16x8xf32>
}

// Refused: offsets partition_id * 2 put device 1's rows at [2, 6) instead of [4, 8); writing
// the blocks into a buffer that is not zero; a replicated update at device-dependent offsets.
// CHECK-LABEL: func.func @refused
// FULL: func.func @refused{{.*}}entangle.verdict = "not proven"
func.func @refused(%x: tensor<16x8xf32>) -> tensor<16x8xf32> attributes {entangle.refines = @ref} {
  %0 = sdy.manual_computation(%x) in_shardings=[<@mesh, [{"tp"}, {}]>] out_shardings=[<@mesh, [{}, {}]>] manual_axes={"tp"} (%a: tensor<4x8xf32>) {
    %pid = stablehlo.partition_id : tensor<ui32>
    %i = stablehlo.convert %pid : (tensor<ui32>) -> tensor<i32>
    %c2 = stablehlo.constant dense<2> : tensor<i32>
    %c4 = stablehlo.constant dense<4> : tensor<i32>
    %c0 = stablehlo.constant dense<0> : tensor<i32>
    %z = stablehlo.constant dense<0.0> : tensor<16x8xf32>
    %one = stablehlo.constant dense<1.0> : tensor<16x8xf32>
    %half = stablehlo.multiply %i, %c2 : tensor<i32>
    %off = stablehlo.multiply %i, %c4 : tensor<i32>
    // CHECK: stablehlo.dynamic_update_slice %{{.*}}entangle.relation = "opaque: device-dependent offset is wrong along dim 0: device 1 writes its block to [2, 6) instead of [4, 8) over 'tp' (offsets found [0, 2, 4, 6], expected [0, 4, 8, 12])"
    // expected-error @+1 {{device-dependent offset is wrong along dim 0: device 1 writes its block to [2, 6) instead of [4, 8) over 'tp'}}
    %1 = stablehlo.dynamic_update_slice %z, %a, %half, %c0 : (tensor<16x8xf32>, tensor<4x8xf32>, tensor<i32>, tensor<i32>) -> tensor<16x8xf32>
    // CHECK: stablehlo.dynamic_update_slice %{{.*}}entangle.relation = "opaque: dynamic_update_slice places each device's block (over 'tp') into a buffer that is not zero: the devices hold different mixtures of the buffer and the update"
    %2 = stablehlo.dynamic_update_slice %one, %a, %off, %c0 : (tensor<16x8xf32>, tensor<4x8xf32>, tensor<i32>, tensor<i32>) -> tensor<16x8xf32>
    %r = stablehlo.slice %one [0:4, 0:8] : (tensor<16x8xf32>) -> tensor<4x8xf32>
    // CHECK: stablehlo.dynamic_update_slice %{{.*}}entangle.relation = "opaque: dynamic_update_slice with a device-dependent offset in dim 0 but an update replicated along it: devices write the same rows at different places (offsets [0, 4, 8, 12])"
    %3 = stablehlo.dynamic_update_slice %z, %r, %off, %c0 : (tensor<16x8xf32>, tensor<4x8xf32>, tensor<i32>, tensor<i32>) -> tensor<16x8xf32>
    %4 = stablehlo.add %1, %2 : tensor<16x8xf32>
    %5 = stablehlo.add %4, %3 : tensor<16x8xf32>
    sdy.return %5 : tensor<16x8xf32>
  } : (tensor<16x8xf32>) -> tensor<16x8xf32>
  return %0 : tensor<16x8xf32>
}
