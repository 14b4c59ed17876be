// Twin of ../token_dims_sequence_parallel.mlir (not a test: lit runs only the parent dir's files).
sdy.mesh @mesh = <["tp"=4]>

func.func @ref(%x: tensor<2x8x4xf32>, %w: tensor<4x4xf32>) -> tensor<2x8x4xf32> {
  %t = stablehlo.reshape %x : (tensor<2x8x4xf32>) -> tensor<16x4xf32>
  %h = stablehlo.dot_general %t, %w, contracting_dims = [1] x [0] : (tensor<16x4xf32>, tensor<4x4xf32>) -> tensor<16x4xf32>
  %y = stablehlo.tanh %h : tensor<16x4xf32>
  %r = stablehlo.reshape %y : (tensor<16x4xf32>) -> tensor<2x8x4xf32>
  return %r : tensor<2x8x4xf32>
}

func.func @sharded(%x: tensor<2x8x4xf32>, %w: tensor<4x4xf32>) -> tensor<2x8x4xf32> attributes {entangle.refines = @ref} {
  %0 = sdy.manual_computation(%x, %w) in_shardings=[<@mesh, [{}, {"tp"}, {}]>, <@mesh, [{}, {}]>] out_shardings=[<@mesh, [{}, {"tp"}, {}]>] manual_axes={"tp"} (%a: tensor<2x2x4xf32>, %v: tensor<4x4xf32>) {
    %t = stablehlo.reshape %a : (tensor<2x2x4xf32>) -> tensor<4x4xf32>
    %h = stablehlo.dot_general %t, %v, contracting_dims = [1] x [0] : (tensor<4x4xf32>, tensor<4x4xf32>) -> tensor<4x4xf32>
    %y = stablehlo.tanh %h : tensor<4x4xf32>
    %s = stablehlo.transpose %y, dims = [1, 0] : (tensor<4x4xf32>) -> tensor<4x4xf32>
    %r = stablehlo.reshape %s : (tensor<4x4xf32>) -> tensor<2x2x4xf32>
    sdy.return %r : tensor<2x2x4xf32>
  } : (tensor<2x8x4xf32>, tensor<4x4xf32>) -> tensor<2x8x4xf32>
  return %0 : tensor<2x8x4xf32>
}
