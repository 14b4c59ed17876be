// RUN: entangle-opt %s --split-input-file --pass-pipeline='builtin.module(entangle-normalize,entangle-import-shardings,entangle-infer-relations,entangle-check-refinement,entangle-verify-rules{inject-fault=stablehlo.add})' --verify-diagnostics

// "refuted" means Z3 found a rule instance false: an internal error of a rule, reported and never
// ignored (the verdict is withdrawn). No rule is known to be wrong, so this example injects a
// fault on purpose: the testing-only option `inject-fault=OP` of entangle-verify-rules doubles
// the inferred term of every OP before its instance check. The program itself is correct
// (a row-parallel matmul, psum, then a bias add).

sdy.mesh @mesh = <["tp"=4]>

func.func @ref(%x: tensor<2x8xf32>, %w: tensor<8x4xf32>, %b: tensor<2x4xf32>) -> tensor<2x4xf32> {
  %0 = stablehlo.dot_general %x, %w, contracting_dims = [1] x [0] : (tensor<2x8xf32>, tensor<8x4xf32>) -> tensor<2x4xf32>
  %1 = stablehlo.add %0, %b : tensor<2x4xf32>
  return %1 : tensor<2x4xf32>
}

func.func @sharded(%x: tensor<2x8xf32>, %w: tensor<8x4xf32>, %b: tensor<2x4xf32>) -> tensor<2x4xf32> attributes {entangle.refines = @ref} {
  %0 = sdy.manual_computation(%x, %w, %b) in_shardings=[<@mesh, [{}, {"tp"}]>, <@mesh, [{"tp"}, {}]>, <@mesh, [{}, {}]>] out_shardings=[<@mesh, [{}, {}]>] manual_axes={"tp"} (%a: tensor<2x2xf32>, %v: tensor<2x4xf32>, %c: tensor<2x4xf32>) {
    %1 = stablehlo.dot_general %a, %v, contracting_dims = [1] x [0] : (tensor<2x2xf32>, tensor<2x4xf32>) -> tensor<2x4xf32>
    %2 = "stablehlo.all_reduce"(%1) ({
      ^bb0(%u: tensor<f32>, %t: tensor<f32>):
        %s = stablehlo.add %u, %t : tensor<f32>
        stablehlo.return %s : tensor<f32>
    }) {replica_groups = dense<[[0, 1, 2, 3]]> : tensor<1x4xi64>, channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, use_global_device_ids} : (tensor<2x4xf32>) -> tensor<2x4xf32>
    // expected-error @+1 {{proof of the rule instance for stablehlo.add was refuted by Z3 (a rule is wrong: please report this)}}
    %3 = stablehlo.add %2, %c : tensor<2x4xf32>
    sdy.return %3 : tensor<2x4xf32>
  } : (tensor<2x8xf32>, tensor<8x4xf32>, tensor<2x4xf32>) -> tensor<2x4xf32>
  return %0 : tensor<2x4xf32>
}
