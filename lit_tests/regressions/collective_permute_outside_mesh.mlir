// RUN: not entangle check %s 2>&1 | filecheck %s

// A collective_permute sending to device 9 on a mesh of 4 devices: XLA rejects the program,
// MLIR's verifier cannot (it does not know the device count). Bad input at the op (exit 2);
// it was an internal KeyError in the permute rule, reported as "not proven".

// CHECK: collective_permute_outside_mesh.mlir:18:10: error: collective_permute: partition id 9 in source_target_pairs {{.*}} is outside the 4 partitions
// CHECK-NOT: verified

sdy.mesh @mesh = <["tp"=4]>

func.func @ref(%x: tensor<8x4xf32>) -> tensor<8x4xf32> {
  return %x : tensor<8x4xf32>
}

func.func @sharded(%x: tensor<8x4xf32>) -> tensor<8x4xf32> attributes {entangle.refines = @ref} {
  %0 = sdy.manual_computation(%x) in_shardings=[<@mesh, [{"tp"}, {}]>] out_shardings=[<@mesh, [{"tp"}, {}]>] manual_axes={"tp"} (%a: tensor<2x4xf32>) {
    %1 = "stablehlo.collective_permute"(%a) <{channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, source_target_pairs = dense<[[0, 9], [1, 0]]> : tensor<2x2xi64>}> : (tensor<2x4xf32>) -> tensor<2x4xf32>
    sdy.return %1 : tensor<2x4xf32>
  } : (tensor<8x4xf32>) -> tensor<8x4xf32>
  return %0 : tensor<8x4xf32>
}
