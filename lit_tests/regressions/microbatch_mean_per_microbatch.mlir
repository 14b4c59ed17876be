// RUN: entangle-opt %s --split-input-file --entangle-normalize --entangle-import-shardings --entangle-infer-relations --entangle-check-refinement --verify-diagnostics | filecheck %s

// Gradient accumulation with a token mask (examples/real/accum.py): the loss is the mean over
// the valid tokens of the whole batch, sum(x * m) / sum(m). Each of 4 devices holds 4 rows and
// splits them into two micro-batches of 2 rows.

// Correct: every micro-batch's sum is divided by the global valid count (psum of the local
// count), the micro-batch losses add up and the all_reduce completes them.
module attributes {mhlo.num_partitions = 4 : i32} {
  func.func @ref(%x: tensor<16x4xf32>, %m: tensor<16x4xf32>) -> tensor<f32> {
    %z = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    %0 = stablehlo.multiply %x, %m : tensor<16x4xf32>
    %1 = stablehlo.reduce(%0 init: %z) applies stablehlo.add across dimensions = [0, 1] : (tensor<16x4xf32>, tensor<f32>) -> tensor<f32>
    %2 = stablehlo.reduce(%m init: %z) applies stablehlo.add across dimensions = [0, 1] : (tensor<16x4xf32>, tensor<f32>) -> tensor<f32>
    %3 = stablehlo.divide %1, %2 : tensor<f32>
    return %3 : tensor<f32>
  }
  // CHECK: func.func @per_token{{.*}}entangle.verdict = "proven"
  func.func @per_token(%x: tensor<4x4xf32> {mhlo.sharding = "{devices=[4,1]<=[4]}"}, %m: tensor<4x4xf32> {mhlo.sharding = "{devices=[4,1]<=[4]}"}) -> (tensor<f32> {mhlo.sharding = "{replicated}"}) attributes {entangle.refines = @ref} {
    %z = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    %c = stablehlo.reduce(%m init: %z) applies stablehlo.add across dimensions = [0, 1] : (tensor<4x4xf32>, tensor<f32>) -> tensor<f32>
    %count = "stablehlo.all_reduce"(%c) <{channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, replica_groups = dense<[[0, 1, 2, 3]]> : tensor<1x4xi64>, use_global_device_ids}> ({
    ^bb0(%a: tensor<f32>, %b: tensor<f32>):
      %s = stablehlo.add %a, %b : tensor<f32>
      stablehlo.return %s : tensor<f32>
    }) : (tensor<f32>) -> tensor<f32>
    %x0 = stablehlo.slice %x [0:2, 0:4] : (tensor<4x4xf32>) -> tensor<2x4xf32>
    %m0 = stablehlo.slice %m [0:2, 0:4] : (tensor<4x4xf32>) -> tensor<2x4xf32>
    %p0 = stablehlo.multiply %x0, %m0 : tensor<2x4xf32>
    %s0 = stablehlo.reduce(%p0 init: %z) applies stablehlo.add across dimensions = [0, 1] : (tensor<2x4xf32>, tensor<f32>) -> tensor<f32>
    %l0 = stablehlo.divide %s0, %count : tensor<f32>
    %x1 = stablehlo.slice %x [2:4, 0:4] : (tensor<4x4xf32>) -> tensor<2x4xf32>
    %m1 = stablehlo.slice %m [2:4, 0:4] : (tensor<4x4xf32>) -> tensor<2x4xf32>
    %p1 = stablehlo.multiply %x1, %m1 : tensor<2x4xf32>
    %s1 = stablehlo.reduce(%p1 init: %z) applies stablehlo.add across dimensions = [0, 1] : (tensor<2x4xf32>, tensor<f32>) -> tensor<f32>
    %l1 = stablehlo.divide %s1, %count : tensor<f32>
    %acc0 = stablehlo.add %z, %l0 : tensor<f32>
    %acc1 = stablehlo.add %acc0, %l1 : tensor<f32>
    %out = "stablehlo.all_reduce"(%acc1) <{channel_handle = #stablehlo.channel_handle<handle = 2, type = 1>, replica_groups = dense<[[0, 1, 2, 3]]> : tensor<1x4xi64>, use_global_device_ids}> ({
    ^bb0(%a: tensor<f32>, %b: tensor<f32>):
      %s = stablehlo.add %a, %b : tensor<f32>
      stablehlo.return %s : tensor<f32>
    }) : (tensor<f32>) -> tensor<f32>
    return %out : tensor<f32>
  }
}

// -----

// Bug: every micro-batch is normalised by its own valid count, the means averaged (over the
// 2 micro-batches, then over the 4 devices). It agrees with the reference only when all 8
// micro-batches hold the same number of valid tokens. Flagged at the division, as a wrong
// scale factor k = N/(8*N_i).
module attributes {mhlo.num_partitions = 4 : i32} {
  func.func @ref(%x: tensor<16x4xf32>, %m: tensor<16x4xf32>) -> tensor<f32> {
    %z = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    %0 = stablehlo.multiply %x, %m : tensor<16x4xf32>
    %1 = stablehlo.reduce(%0 init: %z) applies stablehlo.add across dimensions = [0, 1] : (tensor<16x4xf32>, tensor<f32>) -> tensor<f32>
    %2 = stablehlo.reduce(%m init: %z) applies stablehlo.add across dimensions = [0, 1] : (tensor<16x4xf32>, tensor<f32>) -> tensor<f32>
    %3 = stablehlo.divide %1, %2 : tensor<f32>
    return %3 : tensor<f32>
  }
  // CHECK: func.func @per_microbatch{{.*}}entangle.verdict = "not proven"
  func.func @per_microbatch(%x: tensor<4x4xf32> {mhlo.sharding = "{devices=[4,1]<=[4]}"}, %m: tensor<4x4xf32> {mhlo.sharding = "{devices=[4,1]<=[4]}"}) -> (tensor<f32> {mhlo.sharding = "{replicated}"}) attributes {entangle.refines = @ref} {
    %z = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    %x0 = stablehlo.slice %x [0:2, 0:4] : (tensor<4x4xf32>) -> tensor<2x4xf32>
    %m0 = stablehlo.slice %m [0:2, 0:4] : (tensor<4x4xf32>) -> tensor<2x4xf32>
    %p0 = stablehlo.multiply %x0, %m0 : tensor<2x4xf32>
    %s0 = stablehlo.reduce(%p0 init: %z) applies stablehlo.add across dimensions = [0, 1] : (tensor<2x4xf32>, tensor<f32>) -> tensor<f32>
    %c0 = stablehlo.reduce(%m0 init: %z) applies stablehlo.add across dimensions = [0, 1] : (tensor<2x4xf32>, tensor<f32>) -> tensor<f32>
    // expected-error @+1 {{divide by the sum of %arg1 over one micro-batch (rows [4b, 4b+2) of dim 0, split over ('d0', 'd1')): a mean per micro-batch. Averaging the 8 micro-batch means scales micro-batch i by k = N/(8*N_i) (N: the total over the whole batch, N_i: the micro-batch's), so k = 1 only when every micro-batch has the same total (the same number of valid tokens); the reference divides by N.}}
    %l0 = stablehlo.divide %s0, %c0 : tensor<f32>
    %x1 = stablehlo.slice %x [2:4, 0:4] : (tensor<4x4xf32>) -> tensor<2x4xf32>
    %m1 = stablehlo.slice %m [2:4, 0:4] : (tensor<4x4xf32>) -> tensor<2x4xf32>
    %p1 = stablehlo.multiply %x1, %m1 : tensor<2x4xf32>
    %s1 = stablehlo.reduce(%p1 init: %z) applies stablehlo.add across dimensions = [0, 1] : (tensor<2x4xf32>, tensor<f32>) -> tensor<f32>
    %c1 = stablehlo.reduce(%m1 init: %z) applies stablehlo.add across dimensions = [0, 1] : (tensor<2x4xf32>, tensor<f32>) -> tensor<f32>
    %l1 = stablehlo.divide %s1, %c1 : tensor<f32>
    %acc = stablehlo.add %l0, %l1 : tensor<f32>
    %half = stablehlo.constant dense<2.000000e+00> : tensor<f32>
    %mean = stablehlo.divide %acc, %half : tensor<f32>
    %out = "stablehlo.all_reduce"(%mean) <{channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, replica_groups = dense<[[0, 1, 2, 3]]> : tensor<1x4xi64>, use_global_device_ids}> ({
    ^bb0(%a: tensor<f32>, %b: tensor<f32>):
      %s = stablehlo.add %a, %b : tensor<f32>
      stablehlo.return %s : tensor<f32>
    }) : (tensor<f32>) -> tensor<f32>
    %n = stablehlo.constant dense<4.000000e+00> : tensor<f32>
    %pmean = stablehlo.divide %out, %n : tensor<f32>
    return %pmean : tensor<f32>
  }
}
