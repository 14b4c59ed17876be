// RUN: entangle-opt %s --entangle-normalize --entangle-import-shardings --entangle-infer-relations | filecheck %s

// Regression (fixed, issue 16 class 8): replica groups are read as StableHLO defines them
// (groups.py). With one replica and 4 partitions, an all_reduce without a channel is
// cross_replica: each group is one process, a no-op on every partition (it was "replica ids
// are not supported"); with a channel but no use_global_device_ids the group [[0]] is a
// replica group times every partition: the sum over all partitions (it was opaque).

module attributes {mhlo.num_partitions = 4 : i32, mhlo.num_replicas = 1 : i32} {
sdy.mesh @mesh = <["tp"=4]>

// CHECK-LABEL: func.func @groups
func.func @groups(%x: tensor<8x16xf32>) -> (tensor<8xf32>, tensor<8xf32>) {
  %0:2 = sdy.manual_computation(%x) in_shardings=[<@mesh, [{}, {"tp"}]>] out_shardings=[<@mesh, [{}]>, <@mesh, [{}]>] manual_axes={"tp"} (%a: tensor<8x4xf32>) {
    %zero = stablehlo.constant dense<0.0> : tensor<f32>
    %s = stablehlo.reduce(%a init: %zero) applies stablehlo.add across dimensions = [1] : (tensor<8x4xf32>, tensor<f32>) -> tensor<8xf32>
    // CHECK: entangle.relation = "partial sum {tp} : reduce_sum(%arg0)"
    %local = "stablehlo.all_reduce"(%s) <{replica_groups = dense<[[0]]> : tensor<1x1xi64>}> ({
      ^bb0(%u: tensor<f32>, %v: tensor<f32>):
        %t = stablehlo.add %u, %v : tensor<f32>
        stablehlo.return %t : tensor<f32>
    }) : (tensor<8xf32>) -> tensor<8xf32>
    // CHECK: entangle.relation = "replicated : reduce_sum(%arg0)"
    %sum = "stablehlo.all_reduce"(%s) <{channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, replica_groups = dense<[[0]]> : tensor<1x1xi64>}> ({
      ^bb0(%u: tensor<f32>, %v: tensor<f32>):
        %t = stablehlo.add %u, %v : tensor<f32>
        stablehlo.return %t : tensor<f32>
    }) : (tensor<8xf32>) -> tensor<8xf32>
    sdy.return %local, %sum : tensor<8xf32>, tensor<8xf32>
  } : (tensor<8x16xf32>) -> (tensor<8xf32>, tensor<8xf32>)
  return %0#0, %0#1 : tensor<8xf32>, tensor<8xf32>
}
}
