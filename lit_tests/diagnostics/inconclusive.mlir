// RUN: entangle-opt %s --split-input-file --pass-pipeline='builtin.module(entangle-normalize,entangle-import-shardings,entangle-infer-relations,entangle-check-refinement,entangle-verify-rules)' --verify-diagnostics
// RUN: not entangle check %s --json | filecheck %s

// A normalisation by a constant that folded to zero (say, dividing by the number of padding
// tokens in a configuration without padding). Reference and sharded program agree term for
// term, but exact real-number semantics leave x / 0 undefined: the instance check assumes every
// divisor is nonzero, cannot pose the query for this one, and answers "unknown" (Z3 is never
// asked, and the message says why). The divide can be neither proved
// nor refuted: the check is inconclusive and the verdict is "not proven". The reference
// walk's instance is checked first (issue 16, class 7) and is inconclusive alike.
//
//   def ref(x):  return x / 0.0
//   def body(x_l):  return x_l / 0.0
//   shard_map(body, mesh, in_specs=P('tp', None), out_specs=P('tp', None))

// CHECK: "verdict": "not proven"
// CHECK: "diagnostics": [
// CHECK: "message": "proof of the rule instance for stablehlo.divide in the reference walk is inconclusive: a division by zero"
// CHECK: "reason": "inconclusive"
// CHECK: "message": "proof of the rule instance for stablehlo.divide is inconclusive: a division by zero"
// CHECK: "reason": "inconclusive"
// CHECK: "rule_check_mode": "Z3 checked 4 rule instances: 2 proved, 0 refuted, 2 inconclusive; 2 of them in the reference walk"

sdy.mesh @mesh = <["tp"=4]>

func.func @ref(%x: tensor<8x16xf32>) -> tensor<8x16xf32> {
  %c0 = stablehlo.constant dense<0.0> : tensor<8x16xf32>
  // expected-error @+1 {{proof of the rule instance for stablehlo.divide in the reference walk is inconclusive: a division by zero}}
  %d = stablehlo.divide %x, %c0 : tensor<8x16xf32>
  return %d : tensor<8x16xf32>
}

func.func @sharded(%x: tensor<8x16xf32>) -> tensor<8x16xf32> attributes {entangle.refines = @ref} {
  %0 = sdy.manual_computation(%x) in_shardings=[<@mesh, [{"tp"}, {}]>] out_shardings=[<@mesh, [{"tp"}, {}]>] manual_axes={"tp"} (%a: tensor<2x16xf32>) {
    %c0 = stablehlo.constant dense<0.0> : tensor<2x16xf32>
    // expected-error @+1 {{proof of the rule instance for stablehlo.divide is inconclusive: a division by zero}}
    %d = stablehlo.divide %a, %c0 : tensor<2x16xf32>
    sdy.return %d : tensor<2x16xf32>
  } : (tensor<8x16xf32>) -> tensor<8x16xf32>
  return %0 : tensor<8x16xf32>
}
