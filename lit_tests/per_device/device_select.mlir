// RUN: entangle-opt %s --split-input-file --entangle-normalize --entangle-import-shardings --entangle-infer-relations --entangle-check-refinement --verify-diagnostics | filecheck %s

// A select on a per-device predicate: XLA keeps a scatter-add's operand on one device
// (`partition_id != 0` zeroes it elsewhere) so that the all_reduce counts it once. Every
// group of devices differing only on the predicate's axes keeps it on exactly one device:
// a partial sum of the operand over those axes (rules/shifted.device_select).

module attributes {mhlo.num_partitions = 2 : i32} {
  func.func @ref(%x: tensor<8x2xf32>, %u: tensor<8x2xf32>) -> tensor<8x2xf32> {
    %0 = stablehlo.add %x, %u : tensor<8x2xf32>
    return %0 : tensor<8x2xf32>
  }
  // CHECK-LABEL: func.func @kept_on_device_0{{.*}}entangle.verdict = "proven"
  func.func @kept_on_device_0(%x: tensor<8x2xf32> {mhlo.sharding = "{replicated}"}, %u: tensor<4x2xf32> {mhlo.sharding = "{devices=[2,1]<=[2]}"}) -> (tensor<8x2xf32> {mhlo.sharding = "{replicated}"}) attributes {entangle.refines = @ref} {
    %pid = stablehlo.partition_id : tensor<ui32>
    %c0 = stablehlo.constant dense<0> : tensor<ui32>
    %p = stablehlo.compare NE, %pid, %c0 : (tensor<ui32>, tensor<ui32>) -> tensor<i1>
    %pb = stablehlo.broadcast_in_dim %p, dims = [] : (tensor<i1>) -> tensor<8x2xi1>
    %zero = stablehlo.constant dense<0.0> : tensor<8x2xf32>
    // CHECK: stablehlo.select{{.*}}entangle.relation = "partial sum {d0} : %arg0"
    %mine = stablehlo.select %pb, %zero, %x : tensor<8x2xi1>, tensor<8x2xf32>
    %i = stablehlo.convert %pid : (tensor<ui32>) -> tensor<i32>
    %c4 = stablehlo.constant dense<4> : tensor<i32>
    %off = stablehlo.multiply %i, %c4 : tensor<i32>
    %z = stablehlo.constant dense<0> : tensor<i32>
    %placed = stablehlo.dynamic_update_slice %zero, %u, %off, %z : (tensor<8x2xf32>, tensor<4x2xf32>, tensor<i32>, tensor<i32>) -> tensor<8x2xf32>
    %sum = stablehlo.add %mine, %placed : tensor<8x2xf32>
    %r = "stablehlo.all_reduce"(%sum) <{channel_handle = #stablehlo.channel_handle<handle = 1, type = 0>, replica_groups = dense<[[0, 1]]> : tensor<1x2xi64>, use_global_device_ids}> ({
    ^bb0(%a: tensor<f32>, %b: tensor<f32>):
      %t = stablehlo.add %a, %b : tensor<f32>
      stablehlo.return %t : tensor<f32>
    }) : (tensor<8x2xf32>) -> tensor<8x2xf32>
    return %r : tensor<8x2xf32>
  }
}

// -----

module attributes {mhlo.num_partitions = 2 : i32} {
  func.func @ref(%x: tensor<8x2xf32>) -> tensor<8x2xf32> {
    return %x : tensor<8x2xf32>
  }
  // `partition_id == 5` is false on every device, so every device keeps x: summed twice.
  // CHECK-LABEL: func.func @kept_everywhere{{.*}}entangle.verdict = "not proven"
  func.func @kept_everywhere(%x: tensor<8x2xf32> {mhlo.sharding = "{replicated}"}) -> (tensor<8x2xf32> {mhlo.sharding = "{replicated}"}) attributes {entangle.refines = @ref} {
    %pid = stablehlo.partition_id : tensor<ui32>
    %c5 = stablehlo.constant dense<5> : tensor<ui32>
    %p = stablehlo.compare EQ, %pid, %c5 : (tensor<ui32>, tensor<ui32>) -> tensor<i1>
    %pb = stablehlo.broadcast_in_dim %p, dims = [] : (tensor<i1>) -> tensor<8x2xi1>
    %zero = stablehlo.constant dense<0.0> : tensor<8x2xf32>
    // CHECK: stablehlo.select{{.*}}entangle.relation = "replicated : %arg0"
    %mine = stablehlo.select %pb, %zero, %x : tensor<8x2xi1>, tensor<8x2xf32>
    // expected-error @+1 {{all_reduce sums over 'd0', but the value is already replicated over 'd0': the result is 2 x the value}}
    %r = "stablehlo.all_reduce"(%mine) <{channel_handle = #stablehlo.channel_handle<handle = 1, type = 0>, replica_groups = dense<[[0, 1]]> : tensor<1x2xi64>, use_global_device_ids}> ({
    ^bb0(%a: tensor<f32>, %b: tensor<f32>):
      %t = stablehlo.add %a, %b : tensor<f32>
      stablehlo.return %t : tensor<f32>
    }) : (tensor<8x2xf32>) -> tensor<8x2xf32>
    // expected-note @+1 {{result #0 is 2 x the reference}}
    return %r : tensor<8x2xf32>
  }
}
