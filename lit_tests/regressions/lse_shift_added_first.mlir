// RUN: entangle check %s | filecheck %s

// Vocab-parallel log-sum-exp with the shift added first, `m + log(psum(sum(exp(x - m))))`
// (m the pmax of the shards' maxes), against `m + log(sum(exp(x - m)))`. The shifted-lse
// rewrite (entangle_mlir/normalize/idioms.py) leaves the max dead along two paths, the add's operand
// and the broadcast under the exp: erasing the dead ops reached it twice and used it after
// erasing it (a segmentation fault). ir.erase_dead never touches an erased op.

// CHECK: verified: the sharded program refines the reference on mesh tp=4

sdy.mesh @mesh = <["tp"=4]>

func.func @ref(%x: tensor<2x16xf32>) -> tensor<2xf32> {
  %ninf = stablehlo.constant dense<0xFF800000> : tensor<f32>
  %zero = stablehlo.constant dense<0.0> : tensor<f32>
  %m = stablehlo.reduce(%x init: %ninf) applies stablehlo.maximum across dimensions = [1] : (tensor<2x16xf32>, tensor<f32>) -> tensor<2xf32>
  %mb = stablehlo.broadcast_in_dim %m, dims = [0] : (tensor<2xf32>) -> tensor<2x16xf32>
  %d = stablehlo.subtract %x, %mb : tensor<2x16xf32>
  %e = stablehlo.exponential %d : tensor<2x16xf32>
  %s = stablehlo.reduce(%e init: %zero) applies stablehlo.add across dimensions = [1] : (tensor<2x16xf32>, tensor<f32>) -> tensor<2xf32>
  %l = stablehlo.log %s : tensor<2xf32>
  %r = stablehlo.add %m, %l : tensor<2xf32>
  return %r : tensor<2xf32>
}

func.func @sharded(%x: tensor<2x16xf32>) -> tensor<2xf32> attributes {entangle.refines = @ref} {
  %0 = sdy.manual_computation(%x) in_shardings=[<@mesh, [{}, {"tp"}]>] out_shardings=[<@mesh, [{}]>] manual_axes={"tp"} (%a: tensor<2x4xf32>) {
    %ninf = stablehlo.constant dense<0xFF800000> : tensor<f32>
    %zero = stablehlo.constant dense<0.0> : tensor<f32>
    %ml = stablehlo.reduce(%a init: %ninf) applies stablehlo.maximum across dimensions = [1] : (tensor<2x4xf32>, tensor<f32>) -> tensor<2xf32>
    %m = "stablehlo.all_reduce"(%ml) ({
      ^bb0(%u: tensor<f32>, %v: tensor<f32>):
        %z = stablehlo.maximum %u, %v : tensor<f32>
        stablehlo.return %z : tensor<f32>
    }) {replica_groups = dense<[[0, 1, 2, 3]]> : tensor<1x4xi64>, channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, use_global_device_ids} : (tensor<2xf32>) -> tensor<2xf32>
    %mb = stablehlo.broadcast_in_dim %m, dims = [0] : (tensor<2xf32>) -> tensor<2x4xf32>
    %d = stablehlo.subtract %a, %mb : tensor<2x4xf32>
    %e = stablehlo.exponential %d : tensor<2x4xf32>
    %s = stablehlo.reduce(%e init: %zero) applies stablehlo.add across dimensions = [1] : (tensor<2x4xf32>, tensor<f32>) -> tensor<2xf32>
    %t = "stablehlo.all_reduce"(%s) ({
      ^bb0(%u: tensor<f32>, %v: tensor<f32>):
        %z = stablehlo.add %u, %v : tensor<f32>
        stablehlo.return %z : tensor<f32>
    }) {replica_groups = dense<[[0, 1, 2, 3]]> : tensor<1x4xi64>, channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, use_global_device_ids} : (tensor<2xf32>) -> tensor<2xf32>
    %l = stablehlo.log %t : tensor<2xf32>
    %r = stablehlo.add %m, %l : tensor<2xf32>
    sdy.return %r : tensor<2xf32>
  } : (tensor<2x16xf32>) -> tensor<2xf32>
  return %0 : tensor<2xf32>
}
