// RUN: entangle-opt %s --entangle-normalize --entangle-import-shardings --entangle-infer-relations | filecheck %s

// Global positions of a sequence shard: axis_index('tp') * 4 broadcast into a tensor is a zero
// tensor shifted per device; added to iota(4) it is the block of iota(16) split over tp.

sdy.mesh @mesh = <["tp"=4]>

// CHECK-LABEL: func.func @positions
func.func @positions(%x: tensor<16xf32>) -> tensor<16xf32> {
  %0 = sdy.manual_computation(%x) in_shardings=[<@mesh, [{"tp"}]>] out_shardings=[<@mesh, [{"tp"}]>] manual_axes={"tp"} (%a: tensor<4xf32>) {
    %pid = stablehlo.partition_id : tensor<ui32>
    %i = stablehlo.convert %pid : (tensor<ui32>) -> tensor<i32>
    %c4 = stablehlo.constant dense<4> : tensor<i32>
    %start = stablehlo.multiply %i, %c4 : tensor<i32>
    // CHECK: stablehlo.broadcast_in_dim{{.*}}entangle.relation = "replicated : 0 + device offsets [0, 4, 8, 12]"
    %b = stablehlo.broadcast_in_dim %start, dims = [] : (tensor<i32>) -> tensor<4xi32>
    %io = stablehlo.iota dim = 0 : tensor<4xi32>
    // CHECK: stablehlo.add{{.*}}entangle.relation = "tile [{tp}] : iota(dim 0)"
    %pos = stablehlo.add %b, %io : tensor<4xi32>
    %f = stablehlo.convert %pos : (tensor<4xi32>) -> tensor<4xf32>
    %y = stablehlo.multiply %a, %f : tensor<4xf32>
    // CHECK: stablehlo.abs{{.*}}entangle.relation = "opaque: device-dependent offset tensor used by stablehlo.abs
    %e = stablehlo.abs %b : tensor<4xi32>
    sdy.return %y : tensor<4xf32>
  } : (tensor<16xf32>) -> tensor<16xf32>
  return %0 : tensor<16xf32>
}
