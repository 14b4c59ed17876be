// RUN: not entangle check %s | filecheck %s

// Regression (issue 16, class 6): `x * 0` was folded to 0 for every x, so a sharded
// `y + exp(x) * 0` (result #0) and `y + (exp(x) - exp(x))` (result #1) were proven against a
// reference computing `y`, although exp(100) is inf in float32 and inf * 0 = inf - inf = NaN.
// A zero now folds only where the other factor (the cancelled term) is shown finite
// (`terms.term_interval`): `x * 0` of the input x (result #2, finite by assumption) and
// `exp(tanh(x)) * 0` (result #3, exp of a value in [-1, 1]) still fold. Grounded in
// tests/core/test_exact_zero.py (executed: NaN against finite numbers).

// CHECK: note: result #0 differs from the reference
// CHECK: note: 0 * exponential(%arg0) (a product with zero, or a difference that cancels) is not 0: exponential(%arg0) is not shown finite
// CHECK: not proven:
// CHECK-NEXT: result#0 = concat over 'tp' along dim 0  [P('tp')]  (not proven)
// CHECK-NEXT: result#1 = concat over 'tp' along dim 0  [P('tp')]  (not proven)
// CHECK-NEXT: result#2 = concat over 'tp' along dim 0  [P('tp')]{{$}}
// CHECK-NEXT: result#3 = concat over 'tp' along dim 0  [P('tp')]{{$}}

sdy.mesh @mesh = <["tp"=4]>

func.func @ref(%x: tensor<16xf32>, %y: tensor<16xf32>) -> (tensor<16xf32>, tensor<16xf32>, tensor<16xf32>, tensor<16xf32>) {
  return %y, %y, %y, %y : tensor<16xf32>, tensor<16xf32>, tensor<16xf32>, tensor<16xf32>
}

func.func @sharded(%x: tensor<16xf32>, %y: tensor<16xf32>) -> (tensor<16xf32>, tensor<16xf32>, tensor<16xf32>, tensor<16xf32>) attributes {entangle.refines = @ref} {
  %0:4 = sdy.manual_computation(%x, %y) in_shardings=[<@mesh, [{"tp"}]>, <@mesh, [{"tp"}]>] out_shardings=[<@mesh, [{"tp"}]>, <@mesh, [{"tp"}]>, <@mesh, [{"tp"}]>, <@mesh, [{"tp"}]>] manual_axes={"tp"} (%a: tensor<4xf32>, %b: tensor<4xf32>) {
    %zero = stablehlo.constant dense<0.0> : tensor<4xf32>
    %e = stablehlo.exponential %a : tensor<4xf32>
    %ez = stablehlo.multiply %e, %zero : tensor<4xf32>
    %r0 = stablehlo.add %b, %ez : tensor<4xf32>
    %d = stablehlo.subtract %e, %e : tensor<4xf32>
    %r1 = stablehlo.add %b, %d : tensor<4xf32>
    %az = stablehlo.multiply %a, %zero : tensor<4xf32>
    %r2 = stablehlo.add %b, %az : tensor<4xf32>
    %t = stablehlo.tanh %a : tensor<4xf32>
    %et = stablehlo.exponential %t : tensor<4xf32>
    %etz = stablehlo.multiply %et, %zero : tensor<4xf32>
    %r3 = stablehlo.add %b, %etz : tensor<4xf32>
    sdy.return %r0, %r1, %r2, %r3 : tensor<4xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>
  } : (tensor<16xf32>, tensor<16xf32>) -> (tensor<16xf32>, tensor<16xf32>, tensor<16xf32>, tensor<16xf32>)
  return %0#0, %0#1, %0#2, %0#3 : tensor<16xf32>, tensor<16xf32>, tensor<16xf32>, tensor<16xf32>
}
