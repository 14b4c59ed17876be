// RUN: not entangle-opt %s --split-input-file 2>%t.err | filecheck %s
// RUN: filecheck %s --check-prefix=ERR --input-file %t.err

// A chunk that does not parse is reported at its line in the FILE (not in the chunk), the
// other chunks are still printed, and the exit code is 2 (unusable input).

// CHECK: func.func @good
// CHECK-NOT: @bad
// CHECK: func.func @also_good

// ERR: split_input_file_errors.mlir:[[# @LINE + 8]]:8: error: cannot parse MLIR: custom op 'stablehlo.bogus' is unknown
func.func @good() {
  return
}

// -----

func.func @bad(%x: tensor<4xf32>) -> tensor<4xf32> {
  %0 = stablehlo.bogus %x : tensor<4xf32>
  return %0 : tensor<4xf32>
}

// -----

func.func @also_good() {
  return
}
