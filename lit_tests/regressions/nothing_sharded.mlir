// RUN: not entangle check %s 2>&1 | filecheck %s

// `jax.jit(f, in_shardings=..., out_shardings=...).lower(...).as_text()`: shardings on the
// parameters and result, global shapes, no shard_map and no collectives. Its shardings only
// request a layout from XLA: the program computes globally, so a check would compare two
// global programs and prove nothing sharded. It was "verified ... computed globally"; it is
// bad input naming what to pass instead (exit 2).

// CHECK: error: nothing sharded to check: the sharded program has no shard_map
// CHECK-SAME: after_spmd-partitioning
// CHECK-SAME: entangle_mlir.jax.check_partitioned
// CHECK-NOT: verified

sdy.mesh @mesh = <["tp"=4]>

func.func @ref(%x: tensor<8x16xf32>, %w: tensor<16x32xf32>) -> tensor<8x32xf32> {
  %0 = stablehlo.dot_general %x, %w, contracting_dims = [1] x [0] : (tensor<8x16xf32>, tensor<16x32xf32>) -> tensor<8x32xf32>
  %1 = stablehlo.tanh %0 : tensor<8x32xf32>
  return %1 : tensor<8x32xf32>
}

func.func @sharded(%x: tensor<8x16xf32> {sdy.sharding = #sdy.sharding<@mesh, [{}, {}]>}, %w: tensor<16x32xf32> {sdy.sharding = #sdy.sharding<@mesh, [{}, {"tp"}]>}) -> (tensor<8x32xf32> {sdy.sharding = #sdy.sharding<@mesh, [{}, {"tp"}]>}) attributes {entangle.refines = @ref} {
  %0 = stablehlo.dot_general %x, %w, contracting_dims = [1] x [0] : (tensor<8x16xf32>, tensor<16x32xf32>) -> tensor<8x32xf32>
  %1 = stablehlo.tanh %0 : tensor<8x32xf32>
  return %1 : tensor<8x32xf32>
}
