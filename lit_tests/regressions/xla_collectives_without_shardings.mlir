// RUN: not entangle check %s 2>&1 | filecheck %s

// A per-device program (local shapes, an all_reduce) with every sharding stripped: which
// block each device holds is unknown. Bad input naming the dump that keeps them (exit 2),
// not a shape mismatch between the reference's global shapes and the local ones.

// CHECK: error: the sharded program holds a collective (stablehlo.all_reduce) but records no sharding on its parameters
// CHECK-SAME: --xla_dump_hlo_pass_re=spmd-partitioning
// CHECK-NOT: argument #0 is

module attributes {mhlo.num_partitions = 8 : i32} {
func.func @ref(%x: tensor<8x16xf32>, %w: tensor<16x32xf32>) -> tensor<8x32xf32> {
  %0 = stablehlo.dot_general %x, %w, contracting_dims = [1] x [0] : (tensor<8x16xf32>, tensor<16x32xf32>) -> tensor<8x32xf32>
  %1 = stablehlo.tanh %0 : tensor<8x32xf32>
  return %1 : tensor<8x32xf32>
}

func.func @sharded(%x: tensor<4x4xf32>, %w: tensor<4x32xf32>) -> tensor<4x32xf32> attributes {entangle.refines = @ref} {
  %0 = stablehlo.dot %x, %w : (tensor<4x4xf32>, tensor<4x32xf32>) -> tensor<4x32xf32>
  %1 = "stablehlo.all_reduce"(%0) <{channel_handle = #stablehlo.channel_handle<handle = 1, type = 0>, replica_groups = dense<[[0, 1, 2, 3], [4, 5, 6, 7]]> : tensor<2x4xi64>, use_global_device_ids}> ({
  ^bb0(%a: tensor<f32>, %b: tensor<f32>):
    %s = stablehlo.add %a, %b : tensor<f32>
    stablehlo.return %s : tensor<f32>
  }) : (tensor<4x32xf32>) -> tensor<4x32xf32>
  %2 = stablehlo.tanh %1 : tensor<4x32xf32>
  return %2 : tensor<4x32xf32>
}
}
