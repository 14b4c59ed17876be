// RUN: entangle-opt %s --split-input-file --entangle-normalize --entangle-import-shardings --entangle-infer-relations | filecheck %s
// RUN: entangle-opt %s --split-input-file --entangle-normalize --entangle-import-shardings --entangle-infer-relations --entangle-check-refinement --verify-diagnostics | filecheck %s --check-prefix=FULL

// Gathering a split value in per-device programs: stablehlo.all_gather, and the form where each
// device writes its block into a zero buffer at partition_id * size (dynamic_update_slice) and
// an all_reduce adds the buffers up.

module attributes {mhlo.num_partitions = 4 : i32} {
  func.func @ref(%x: tensor<16x8xf32>) -> tensor<16x8xf32> {
    %0 = stablehlo.tanh %x : tensor<16x8xf32>
    return %0 : tensor<16x8xf32>
  }
  // CHECK-LABEL: func.func @all_gather
  // FULL: func.func @all_gather{{.*}}entangle.rho = ["result#0 = replicated on every device"], entangle.verdict = "proven"
  func.func @all_gather(%x: tensor<4x8xf32> {mhlo.sharding = "{devices=[4,1]<=[4]}"}) -> (tensor<16x8xf32> {mhlo.sharding = "{replicated}"}) attributes {entangle.refines = @ref} {
    %0 = stablehlo.tanh %x : tensor<4x8xf32>
    // CHECK: "stablehlo.all_gather"{{.*}}entangle.relation = "replicated : tanh(%arg0)"
    %1 = "stablehlo.all_gather"(%0) <{all_gather_dim = 0 : i64, channel_handle = #stablehlo.channel_handle<handle = 1, type = 0>, replica_groups = dense<[[0, 1, 2, 3]]> : tensor<1x4xi64>, use_global_device_ids}> : (tensor<4x8xf32>) -> tensor<16x8xf32>
    return %1 : tensor<16x8xf32>
  }
}

// -----

module attributes {mhlo.num_partitions = 4 : i32} {
  func.func @ref(%x: tensor<16x8xf32>) -> tensor<16x8xf32> {
    // expected-note @+1 {{corresponds to the reference op stablehlo.tanh}}
    %0 = stablehlo.tanh %x : tensor<16x8xf32>
    return %0 : tensor<16x8xf32>
  }
  // The same gathered along the wrong dim (then reshaped back): blocks of columns, not rows.
  // CHECK-LABEL: func.func @wrong_dim
  // FULL: func.func @wrong_dim{{.*}}entangle.verdict = "not proven"
  func.func @wrong_dim(%x: tensor<4x8xf32> {mhlo.sharding = "{devices=[4,1]<=[4]}"}) -> (tensor<16x8xf32> {mhlo.sharding = "{replicated}"}) attributes {entangle.refines = @ref} {
    %0 = stablehlo.tanh %x : tensor<4x8xf32>
    // CHECK: "stablehlo.all_gather"{{.*}}entangle.relation = "opaque: all_gather concatenates along dim 1 but the value is split along dim 0 over ('d0', 'd1')"
    // expected-error @+1 {{all_gather concatenates along dim 1 but the value is split along dim 0 over ('d0', 'd1')}}
    %1 = "stablehlo.all_gather"(%0) <{all_gather_dim = 1 : i64, channel_handle = #stablehlo.channel_handle<handle = 1, type = 0>, replica_groups = dense<[[0, 1, 2, 3]]> : tensor<1x4xi64>, use_global_device_ids}> : (tensor<4x8xf32>) -> tensor<4x32xf32>
    %2 = stablehlo.reshape %1 : (tensor<4x32xf32>) -> tensor<16x8xf32>
    return %2 : tensor<16x8xf32>
  }
}

// -----

module attributes {mhlo.num_partitions = 4 : i32} {
  func.func @ref(%x: tensor<16x8xf32>) -> tensor<16x8xf32> {
    %0 = stablehlo.tanh %x : tensor<16x8xf32>
    return %0 : tensor<16x8xf32>
  }
  // CHECK-LABEL: func.func @update_and_sum
  // FULL: func.func @update_and_sum{{.*}}entangle.rho = ["result#0 = replicated on every device"], entangle.verdict = "proven"
  func.func @update_and_sum(%x: tensor<4x8xf32> {mhlo.sharding = "{devices=[4,1]<=[4]}"}) -> (tensor<16x8xf32> {mhlo.sharding = "{replicated}"}) attributes {entangle.refines = @ref} {
    %0 = stablehlo.tanh %x : tensor<4x8xf32>
    %zero = stablehlo.constant dense<0.0> : tensor<16x8xf32>
    %pid = stablehlo.partition_id : tensor<ui32>
    %i = stablehlo.convert %pid : (tensor<ui32>) -> tensor<i32>
    %c4 = stablehlo.constant dense<4> : tensor<i32>
    %off = stablehlo.multiply %i, %c4 : tensor<i32>
    %c0 = stablehlo.constant dense<0> : tensor<i32>
    // CHECK: stablehlo.dynamic_update_slice {{.*}}entangle.relation = "partial sum {d0, d1} : tanh(%arg0)"
    %1 = stablehlo.dynamic_update_slice %zero, %0, %off, %c0 : (tensor<16x8xf32>, tensor<4x8xf32>, tensor<i32>, tensor<i32>) -> tensor<16x8xf32>
    // CHECK: "stablehlo.all_reduce"
    // CHECK: entangle.relation = "replicated : tanh(%arg0)"
    %2 = "stablehlo.all_reduce"(%1) <{channel_handle = #stablehlo.channel_handle<handle = 1, type = 0>, replica_groups = dense<[[0, 1, 2, 3]]> : tensor<1x4xi64>, use_global_device_ids}> ({
    ^bb0(%a: tensor<f32>, %b: tensor<f32>):
      %s = stablehlo.add %a, %b : tensor<f32>
      stablehlo.return %s : tensor<f32>
    }) : (tensor<16x8xf32>) -> tensor<16x8xf32>
    return %2 : tensor<16x8xf32>
  }
}
