// RUN: entangle-opt %s --split-input-file --entangle-normalize --entangle-import-shardings --entangle-infer-relations | filecheck %s

// stablehlo.divide (elementwise rule): linear in the numerator only. A partial sum divided by a
// replicated value stays a partial sum (division by a constant is a 1/k scale; a mean's `sum / d` before the psum); dividing by a
// partial sum is refused. Integer division of device scalars truncates like C.

sdy.mesh @mesh = <["dp"=2, "tp"=4]>

// CHECK-LABEL: func.func @tiled
func.func @tiled(%x: tensor<8x16xf32>) -> tensor<8x16xf32> {
  %0 = sdy.manual_computation(%x) in_shardings=[<@mesh, [{"dp"}, {"tp"}]>] out_shardings=[<@mesh, [{"dp"}, {"tp"}]>] manual_axes={"dp", "tp"} (%a: tensor<4x4xf32>) {
    %c = stablehlo.constant dense<2.0> : tensor<4x4xf32>
    // CHECK: stablehlo.divide %{{.*}}entangle.relation = "tile [{dp}, {tp}] : (1/2*%arg0)"
    %1 = stablehlo.divide %a, %c : tensor<4x4xf32>
    sdy.return %1 : tensor<4x4xf32>
  } : (tensor<8x16xf32>) -> tensor<8x16xf32>
  return %0 : tensor<8x16xf32>
}

// -----

sdy.mesh @mesh = <["tp"=4]>

// CHECK-LABEL: func.func @partial
func.func @partial(%x: tensor<8x16xf32>, %r: tensor<8xf32>) -> tensor<8xf32> {
  %0 = sdy.manual_computation(%x, %r) in_shardings=[<@mesh, [{}, {"tp"}]>, <@mesh, [{}]>] out_shardings=[<@mesh, [{}]>] manual_axes={"tp"} (%a: tensor<8x4xf32>, %rl: tensor<8xf32>) {
    %zero = stablehlo.constant dense<0.0> : tensor<f32>
    %s = stablehlo.reduce(%a init: %zero) applies stablehlo.add across dimensions = [1] : (tensor<8x4xf32>, tensor<f32>) -> tensor<8xf32>
    %d = stablehlo.constant dense<16.0> : tensor<8xf32>
    // CHECK: stablehlo.divide %{{.*}}entangle.relation = "partial sum {tp} : (1/16*reduce_sum(%arg0))"
    %1 = stablehlo.divide %s, %d : tensor<8xf32>
    // CHECK: stablehlo.divide %{{.*}}entangle.relation = "opaque: nonlinear op divide applied to a partial sum over 'tp': missing all_reduce/psum before it"
    %2 = stablehlo.divide %rl, %s : tensor<8xf32>
    sdy.return %1 : tensor<8xf32>
  } : (tensor<8x16xf32>, tensor<8xf32>) -> tensor<8xf32>
  return %0 : tensor<8xf32>
}

// -----

sdy.mesh @mesh = <["dp"=2, "tp"=4]>

// axis_index('dp') = partition_id / 4 on a dp=2 x tp=4 mesh; -7 / 4 truncates to -1.
// CHECK-LABEL: func.func @device_scalar
func.func @device_scalar(%x: tensor<8x16xf32>) -> tensor<8x16xf32> {
  %0 = sdy.manual_computation(%x) in_shardings=[<@mesh, [{}, {}]>] out_shardings=[<@mesh, [{}, {}]>] manual_axes={"dp", "tp"} (%a: tensor<8x16xf32>) {
    %pid = stablehlo.partition_id : tensor<ui32>
    %i = stablehlo.convert %pid : (tensor<ui32>) -> tensor<i32>
    %c4 = stablehlo.constant dense<4> : tensor<i32>
    // CHECK: stablehlo.divide %{{.*}}entangle.relation = "device scalar [0, 0, 0, 0, 1, 1, 1, 1]"
    %1 = stablehlo.divide %i, %c4 : tensor<i32>
    %m7 = stablehlo.constant dense<-7> : tensor<i32>
    %n = stablehlo.add %i, %m7 : tensor<i32>
    // CHECK: stablehlo.divide %{{.*}}entangle.relation = "device scalar [-1, -1, -1, -1, 0, 0, 0, 0]"
    %2 = stablehlo.divide %n, %c4 : tensor<i32>
    sdy.return %a : tensor<8x16xf32>
  } : (tensor<8x16xf32>) -> tensor<8x16xf32>
  return %0 : tensor<8x16xf32>
}
