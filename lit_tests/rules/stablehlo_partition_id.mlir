// RUN: entangle-opt %s --split-input-file --entangle-normalize --entangle-import-shardings --entangle-infer-relations | filecheck %s

// stablehlo.partition_id (index rule): inside a fully manual computation it starts a per-device
// integer table, device ids in row-major mesh order. Elsewhere it is refused.

sdy.mesh @mesh = <["tp"=4]>

// CHECK-LABEL: func.func @one_axis
func.func @one_axis(%x: tensor<8xf32>) -> tensor<8xf32> {
  %0 = sdy.manual_computation(%x) in_shardings=[<@mesh, [{}]>] out_shardings=[<@mesh, [{}]>] manual_axes={"tp"} (%a: tensor<8xf32>) {
    // CHECK: stablehlo.partition_id {entangle.relation = "device scalar [0, 1, 2, 3]"}
    %pid = stablehlo.partition_id : tensor<ui32>
    sdy.return %a : tensor<8xf32>
  } : (tensor<8xf32>) -> tensor<8xf32>
  return %0 : tensor<8xf32>
}

// -----

sdy.mesh @mesh = <["dp"=2, "tp"=4]>

// jax's axis_index('tp') and axis_index('dp') on a dp=2 x tp=4 mesh.
// CHECK-LABEL: func.func @two_axes
func.func @two_axes(%x: tensor<8xf32>) -> tensor<8xf32> {
  %0 = sdy.manual_computation(%x) in_shardings=[<@mesh, [{}]>] out_shardings=[<@mesh, [{}]>] manual_axes={"dp", "tp"} (%a: tensor<8xf32>) {
    // CHECK: stablehlo.partition_id {entangle.relation = "device scalar [0, 1, 2, 3, 4, 5, 6, 7]"}
    %pid = stablehlo.partition_id : tensor<ui32>
    %i = stablehlo.convert %pid : (tensor<ui32>) -> tensor<i32>
    %c4 = stablehlo.constant dense<4> : tensor<i32>
    // CHECK: stablehlo.remainder %{{.*}}entangle.relation = "device scalar [0, 1, 2, 3, 0, 1, 2, 3]"
    %tp = stablehlo.remainder %i, %c4 : tensor<i32>
    // CHECK: stablehlo.divide %{{.*}}entangle.relation = "device scalar [0, 0, 0, 0, 1, 1, 1, 1]"
    %dp = stablehlo.divide %i, %c4 : tensor<i32>
    sdy.return %a : tensor<8xf32>
  } : (tensor<8xf32>) -> tensor<8xf32>
  return %0 : tensor<8xf32>
}

// -----

sdy.mesh @mesh = <["dp"=2, "tp"=4]>

// Refused: only tp is manual, so the device's dp coordinate is not part of the program.
// CHECK-LABEL: func.func @partially_manual
func.func @partially_manual(%x: tensor<8xf32>) -> tensor<8xf32> {
  %0 = sdy.manual_computation(%x) in_shardings=[<@mesh, [{}]>] out_shardings=[<@mesh, [{}]>] manual_axes={"tp"} (%a: tensor<8xf32>) {
    // CHECK: stablehlo.partition_id {entangle.relation = "opaque: partition_id in a partially manual computation is not supported"}
    %pid = stablehlo.partition_id : tensor<ui32>
    sdy.return %a : tensor<8xf32>
  } : (tensor<8xf32>) -> tensor<8xf32>
  return %0 : tensor<8xf32>
}

// -----

// Refused: outside a manual computation there is no device.
// CHECK-LABEL: func.func @global
func.func @global() -> tensor<ui32> {
  // CHECK: stablehlo.partition_id {entangle.relation = "opaque: partition_id outside a manual computation"}
  %pid = stablehlo.partition_id : tensor<ui32>
  return %pid : tensor<ui32>
}
