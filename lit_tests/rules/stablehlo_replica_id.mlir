// RUN: entangle-opt %s --split-input-file --entangle-normalize --entangle-import-shardings --entangle-infer-relations | filecheck %s

// stablehlo.replica_id (index rule): in a per-device program compiled as replicas it is the
// device id, a per-device integer table like partition_id.

sdy.mesh @mesh = <["dp"=2, "tp"=2]>

// CHECK-LABEL: func.func @replicas
func.func @replicas(%x: tensor<8xf32>) -> tensor<8xf32> {
  %0 = sdy.manual_computation(%x) in_shardings=[<@mesh, [{}]>] out_shardings=[<@mesh, [{}]>] manual_axes={"dp", "tp"} (%a: tensor<8xf32>) {
    // CHECK: stablehlo.replica_id {entangle.relation = "device scalar [0, 1, 2, 3]"}
    %rid = stablehlo.replica_id : tensor<ui32>
    sdy.return %a : tensor<8xf32>
  } : (tensor<8xf32>) -> tensor<8xf32>
  return %0 : tensor<8xf32>
}
