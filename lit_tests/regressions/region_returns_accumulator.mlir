// RUN: entangle-opt %s --entangle-normalize --entangle-import-shardings --entangle-infer-relations | filecheck %s

// Regression (fixed, issue 16 class 1): a reducer region was classified by the op inside it,
// not by what it returns. A region that computes add but returns its accumulator, or adds an
// argument to itself, was read as a sum (reduce, all_reduce, scatter). Now the region is read
// whole (opinfo.region_kind): the returned value must be op(%arg0, %arg1).

sdy.mesh @mesh = <["tp"=4]>

// CHECK-LABEL: func.func @regions
func.func @regions(%x: tensor<8x16xf32>) -> (tensor<8xf32>, tensor<8xf32>, tensor<8xf32>) {
  %0:3 = sdy.manual_computation(%x) in_shardings=[<@mesh, [{}, {"tp"}]>] out_shardings=[<@mesh, [{}]>, <@mesh, [{}]>, <@mesh, [{}]>] manual_axes={"tp"} (%a: tensor<8x4xf32>) {
    %zero = stablehlo.constant dense<0.0> : tensor<f32>
    // CHECK: stablehlo.reduce{{.*}}entangle.relation = "partial sum {tp}
    %s = stablehlo.reduce(%a init: %zero) applies stablehlo.add across dimensions = [1] : (tensor<8x4xf32>, tensor<f32>) -> tensor<8xf32>
    // CHECK: entangle.relation = "opaque: not a supported reduction: reduce's region returns its argument %arg0 (the accumulator)
    %acc = "stablehlo.reduce"(%a, %zero) <{dimensions = array<i64: 1>}> ({
      ^bb0(%u: tensor<f32>, %v: tensor<f32>):
        %t = stablehlo.add %u, %v : tensor<f32>
        stablehlo.return %u : tensor<f32>
    }) : (tensor<8x4xf32>, tensor<f32>) -> tensor<8xf32>
    // CHECK: entangle.relation = "opaque: not a supported reduction: all_reduce's region returns stablehlo.add(%arg0, %arg0)
    %twice = "stablehlo.all_reduce"(%s) <{channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, replica_groups = dense<[[0, 1, 2, 3]]> : tensor<1x4xi64>, use_global_device_ids}> ({
      ^bb0(%u: tensor<f32>, %v: tensor<f32>):
        %t = stablehlo.add %u, %u : tensor<f32>
        stablehlo.return %t : tensor<f32>
    }) : (tensor<8xf32>) -> tensor<8xf32>
    // CHECK: entangle.relation = "replicated : reduce_sum(%arg0)"
    %sum = "stablehlo.all_reduce"(%s) <{channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, replica_groups = dense<[[0, 1, 2, 3]]> : tensor<1x4xi64>, use_global_device_ids}> ({
      ^bb0(%u: tensor<f32>, %v: tensor<f32>):
        %t = stablehlo.add %v, %u : tensor<f32>
        stablehlo.return %t : tensor<f32>
    }) : (tensor<8xf32>) -> tensor<8xf32>
    sdy.return %acc, %twice, %sum : tensor<8xf32>, tensor<8xf32>, tensor<8xf32>
  } : (tensor<8x16xf32>) -> (tensor<8xf32>, tensor<8xf32>, tensor<8xf32>)
  return %0#0, %0#1, %0#2 : tensor<8xf32>, tensor<8xf32>, tensor<8xf32>
}
