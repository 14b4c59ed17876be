// RUN: entangle-opt %s --split-input-file --entangle-infer-relations | filecheck %s
// RUN: entangle-opt %s --entangle-infer-relations | FileCheck %s --check-prefix=WHOLE

// --split-input-file: every `// -----` chunk is parsed and run on its own, and the printed
// modules are joined by `// -----` lines, in input order. Without the flag the markers are
// plain comments and the file is one module.

// CHECK: module {
// CHECK-NEXT: func.func @first
// CHECK-NEXT: stablehlo.negate %arg0 {entangle.relation = "global : (-1*%arg0)"}
// CHECK: {{^}}}{{$}}
// CHECK-EMPTY:
// CHECK-NEXT: // -----
// CHECK-NEXT: module {
// CHECK-NEXT: func.func @second
// CHECK-NEXT: stablehlo.abs %arg0 {entangle.relation = "global : abs(%arg0)"}
// CHECK: {{^}}}{{$}}
// CHECK-EMPTY:
// CHECK-NEXT: // -----
// CHECK-NEXT: module {
// CHECK-NEXT: func.func @third
// CHECK-NOT: // -----

// WHOLE: module {
// WHOLE-NEXT: func.func @first
// WHOLE-NOT: // -----
// WHOLE: func.func @second
// WHOLE-NOT: // -----
// WHOLE: func.func @third

func.func @first(%x: tensor<4xf32>) -> tensor<4xf32> {
  %0 = stablehlo.negate %x : tensor<4xf32>
  return %0 : tensor<4xf32>
}

// -----

func.func @second(%x: tensor<4xf32>) -> tensor<4xf32> {
  %0 = stablehlo.abs %x : tensor<4xf32>
  return %0 : tensor<4xf32>
}

// -----

func.func @third(%x: tensor<4xf32>) -> tensor<4xf32> {
  return %x : tensor<4xf32>
}
