// RUN: not entangle check %s 2>&1 | filecheck %s
// REQUIRES: stablehlo-future

// XLA's module after optimizations on a GPU: all-reduce-start/-done, which jaxlib converts to
// stablehlo.async_start/async_done around the all_reduce. Bad input naming the dump to pass
// (exit 2), never "unsupported op stablehlo.async_start" (exit 3).

// CHECK: error: the sharded program is XLA's module after optimizations (it holds asynchronous ops (all-reduce-start/-done, copy-start/-done, ...))
// CHECK-SAME: --xla_dump_hlo_pass_re=spmd-partitioning
// CHECK-NOT: unsupported

module attributes {mhlo.num_partitions = 8 : i32} {
func.func @ref(%x: tensor<8x16xf32>, %w: tensor<16x32xf32>) -> tensor<8x32xf32> {
  %0 = stablehlo.dot_general %x, %w, contracting_dims = [1] x [0] : (tensor<8x16xf32>, tensor<16x32xf32>) -> tensor<8x32xf32>
  %1 = stablehlo.tanh %0 : tensor<8x32xf32>
  return %1 : tensor<8x32xf32>
}

func.func @sharded(%x: tensor<4x4xf32> {mhlo.sharding = "{devices=[2,4]<=[8]}"}, %w: tensor<4x32xf32> {mhlo.sharding = "{devices=[4,1,2]<=[2,4]T(1,0) last_tile_dim_replicate}"}) -> (tensor<4x32xf32> {mhlo.sharding = "{devices=[2,1,4]<=[8] last_tile_dim_replicate}"}) attributes {entangle.refines = @ref} {
  %0 = stablehlo.dot %x, %w : (tensor<4x4xf32>, tensor<4x32xf32>) -> tensor<4x32xf32>
  %1 = "stablehlo.async_start"(%0) ({
  ^bb0(%p: tensor<4x32xf32>):
    %r = "stablehlo.all_reduce"(%p) <{channel_handle = #stablehlo.channel_handle<handle = 1, type = 0>, replica_groups = dense<[[0, 1, 2, 3], [4, 5, 6, 7]]> : tensor<2x4xi64>, use_global_device_ids}> ({
  ^bb0(%a: tensor<f32>, %b: tensor<f32>):
    %s = stablehlo.add %a, %b : tensor<f32>
    stablehlo.return %s : tensor<f32>
  }) : (tensor<4x32xf32>) -> tensor<4x32xf32>
    stablehlo.return %r : tensor<4x32xf32>
  }) : (tensor<4x32xf32>) -> !stablehlo.future<tensor<4x32xf32>>
  %2 = "stablehlo.async_done"(%1) : (!stablehlo.future<tensor<4x32xf32>>) -> tensor<4x32xf32>
  %3 = stablehlo.tanh %2 : tensor<4x32xf32>
  return %3 : tensor<4x32xf32>
}
}
