// RUN: entangle-opt %s --split-input-file --pass-pipeline='builtin.module(entangle-normalize,entangle-import-shardings,entangle-infer-relations,entangle-check-refinement)' --verify-diagnostics

// Regression (fixed): with a dynamic shape in the body, the error lands on the last op of a dynamic type
// instead of the first.
//
// A dynamic shape inside the body (here from a dynamic_broadcast_in_dim, as shape-polymorphic
// exports emit) is "a shape the analysis cannot reason about": every op touching the dynamic
// value fails in opinfo.describe, and Walker._give_up makes it opaque with reason `internal`.
// But _give_up does not keep an operand's existing Opaque, so each later op replaces it with
// its own, and the error lands on the LAST op with a dynamic type (the reshape, line 30)
// instead of the first one (the dynamic_broadcast_in_dim, line 28). Today:
//   internal.dynamic_shape.mlir:30:10: error: cannot read the attributes of
//   stablehlo.reshape: dynamic shape tensor<?x16xf32>
// Wanted: the first op, as below (_give_up should propagate an Opaque operand, as _op does).

sdy.mesh @mesh = <["tp"=4]>

func.func @ref(%x: tensor<8x16xf32>) -> tensor<8x16xf32> {
  %0 = stablehlo.exponential %x : tensor<8x16xf32>
  return %0 : tensor<8x16xf32>
}

func.func @sharded(%x: tensor<8x16xf32>) -> tensor<8x16xf32> attributes {entangle.refines = @ref} {
  %0 = sdy.manual_computation(%x) in_shardings=[<@mesh, [{"tp"}, {}]>] out_shardings=[<@mesh, [{"tp"}, {}]>] manual_axes={"tp"} (%a: tensor<2x16xf32>) {
    %c = stablehlo.constant dense<[2, 16]> : tensor<2xi32>
    // expected-error @+1 {{cannot read the attributes of stablehlo.dynamic_broadcast_in_dim: dynamic shape tensor<?x16xf32>}}
    %d = stablehlo.dynamic_broadcast_in_dim %a, %c, dims = [0, 1] : (tensor<2x16xf32>, tensor<2xi32>) -> tensor<?x16xf32>
    %e = stablehlo.exponential %d : tensor<?x16xf32>
    %f = stablehlo.reshape %e : (tensor<?x16xf32>) -> tensor<2x16xf32>
    sdy.return %f : tensor<2x16xf32>
  } : (tensor<8x16xf32>) -> tensor<8x16xf32>
  return %0 : tensor<8x16xf32>
}
