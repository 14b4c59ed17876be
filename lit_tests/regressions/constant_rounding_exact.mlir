// RUN: entangle check %s | filecheck %s
// RUN: entangle check %s --json | filecheck %s --check-prefix=JSON

// Regression (issue 16, class 4): constants compare exactly. XLA (and jax users) spell the
// reference's `x / 768` as `x * float32(1/768)`: accepted only because 0.00130208337 IS 1/768
// rounded to float32 (nearest, ties to even, computed exactly), and stated as the assumption
// the proof rests on. constant_off_by_relative_epsilon.mlir holds the constants that are merely
// close (the old 2^-21 relative tolerance took them as equal).

// CHECK: verified: the sharded program refines the reference on mesh tp=4
// CHECK: note: proven assuming XLA's exact constant rounding (result #0: reference `x / 768` vs sharded `x * 0.00130208337` (float32(1/768)))
// JSON: "verdict": "proven"
// JSON: proven assuming XLA's exact constant rounding (result #0: reference `x / 768`

sdy.mesh @mesh = <["tp"=4]>

func.func @ref(%x: tensor<8x16xf32>) -> tensor<8x16xf32> {
  %c = stablehlo.constant dense<768.0> : tensor<8x16xf32>
  %0 = stablehlo.divide %x, %c : tensor<8x16xf32>
  return %0 : tensor<8x16xf32>
}

func.func @sharded(%x: tensor<8x16xf32>) -> tensor<8x16xf32> attributes {entangle.refines = @ref} {
  %0 = sdy.manual_computation(%x) in_shardings=[<@mesh, [{}, {"tp"}]>] out_shardings=[<@mesh, [{}, {"tp"}]>] manual_axes={"tp"} (%a: tensor<8x4xf32>) {
    %c = stablehlo.constant dense<0.00130208337> : tensor<8x4xf32>
    %1 = stablehlo.multiply %a, %c : tensor<8x4xf32>
    sdy.return %1 : tensor<8x4xf32>
  } : (tensor<8x16xf32>) -> tensor<8x16xf32>
  return %0 : tensor<8x16xf32>
}
