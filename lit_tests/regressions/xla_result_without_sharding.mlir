// RUN: not entangle check %s 2>&1 | filecheck %s

// XLA's HLO text dump after SPMD partitioning without --xla_keep_shardings_after_spmd=true:
// the parameters keep their shardings, the result has none, so its layout is unknown. Bad
// input naming the flag and the proto dump (exit 2); it was "not proven" (exit 3).

// CHECK: error: the per-device program records no sharding for result #0
// CHECK-SAME: --xla_keep_shardings_after_spmd=true
// CHECK-SAME: after_spmd-partitioning*.hlo.pb
// CHECK-NOT: not proven

module attributes {mhlo.num_partitions = 8 : i32} {
func.func @ref(%x: tensor<8x16xf32>, %w: tensor<16x32xf32>) -> tensor<8x32xf32> {
  %0 = stablehlo.dot_general %x, %w, contracting_dims = [1] x [0] : (tensor<8x16xf32>, tensor<16x32xf32>) -> tensor<8x32xf32>
  %1 = stablehlo.tanh %0 : tensor<8x32xf32>
  return %1 : tensor<8x32xf32>
}

func.func @sharded(%x: tensor<4x4xf32> {mhlo.sharding = "{devices=[2,4]<=[8]}"}, %w: tensor<4x32xf32> {mhlo.sharding = "{devices=[4,1,2]<=[2,4]T(1,0) last_tile_dim_replicate}"}) -> tensor<4x32xf32> attributes {entangle.refines = @ref} {
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
