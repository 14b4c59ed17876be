// RUN: entangle-opt %s --split-input-file --pass-pipeline='builtin.module(entangle-normalize,entangle-import-shardings,entangle-infer-relations,entangle-check-refinement)' --verify-diagnostics
// RUN: not entangle check %s --json | filecheck %s

// A residual add whose two inputs were given different in_specs on a dp=2 x tp=2 mesh: the
// activations are split over dp, the residual over tp. The local shapes agree, so jax runs it,
// but each device adds rows of x to unrelated rows of r.
//
//   def body(x_l, r_l):
//       return x_l + r_l
//   shard_map(body, mesh, in_specs=(P('dp', None), P('tp', None)),   # BUG: P('dp', None) twice
//             out_specs=P('dp', None))

// CHECK: "verdict": "not proven"
// CHECK: "diagnostics": [
// CHECK: "message": "add: operands are laid out differently along dim 0 (split over 'dp' vs split over 'tp')"
// CHECK: "reason": "layout_mismatch"

sdy.mesh @mesh = <["dp"=2, "tp"=2]>

func.func @ref(%x: tensor<8x16xf32>, %r: tensor<8x16xf32>) -> tensor<8x16xf32> {
  // expected-note @+1 {{corresponds to the reference op stablehlo.add}}
  %0 = stablehlo.add %x, %r : tensor<8x16xf32>
  return %0 : tensor<8x16xf32>
}

func.func @sharded(%x: tensor<8x16xf32>, %r: tensor<8x16xf32>) -> tensor<8x16xf32> attributes {entangle.refines = @ref} {
  %0 = sdy.manual_computation(%x, %r) in_shardings=[<@mesh, [{"dp"}, {}]>, <@mesh, [{"tp"}, {}]>] out_shardings=[<@mesh, [{"dp"}, {}]>] manual_axes={"dp", "tp"} (%a: tensor<4x16xf32>, %b: tensor<4x16xf32>) {
    // expected-error @+1 {{add: operands are laid out differently along dim 0 (split over 'dp' vs split over 'tp')}}
    %1 = stablehlo.add %a, %b : tensor<4x16xf32>
    sdy.return %1 : tensor<4x16xf32>
  } : (tensor<8x16xf32>, tensor<8x16xf32>) -> tensor<8x16xf32>
  return %0 : tensor<8x16xf32>
}
