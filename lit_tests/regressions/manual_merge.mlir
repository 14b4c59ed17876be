// RUN: entangle-opt %s --split-input-file --entangle-normalize | filecheck %s

// jax.grad of a shard_map'd function: the forward returns residuals split over every manual
// axis (each device's own value) and a psum'd value (the same on every device); the backward
// reads them back with the same specs. The two manual computations are one
// (normalize/manual_merge.py); the cotangent between them (a constant, broadcast) moves up.

// CHECK-LABEL: func.func @merged
// CHECK: stablehlo.constant dense<1.000000e+00>
// CHECK: stablehlo.broadcast_in_dim
// CHECK: sdy.manual_computation(%arg0, %{{.*}}) in_shardings=[<@mesh, [{"tp"}]>, <@mesh, [{}]>] out_shardings=[<@mesh, [{"tp"}]>]
// CHECK: stablehlo.exponential
// CHECK: stablehlo.all_reduce
// CHECK: stablehlo.multiply
// CHECK: sdy.return
// CHECK-NOT: sdy.manual_computation
module {
  sdy.mesh @mesh = <["tp"=4]>
  func.func @merged(%arg0: tensor<16xf32>) -> tensor<16xf32> {
    %0:2 = sdy.manual_computation(%arg0) in_shardings=[<@mesh, [{"tp"}]>] out_shardings=[<@mesh, [{"tp"}]>, <@mesh, [{}]>] manual_axes={"tp"} (%a: tensor<4xf32>) {
      %e = stablehlo.exponential %a : tensor<4xf32>
      %s = "stablehlo.all_reduce"(%e) <{channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, replica_groups = dense<[[0, 1, 2, 3]]> : tensor<1x4xi64>, use_global_device_ids}> ({
      ^bb0(%x: tensor<f32>, %y: tensor<f32>):
        %t = stablehlo.add %x, %y : tensor<f32>
        stablehlo.return %t : tensor<f32>
      }) : (tensor<4xf32>) -> tensor<4xf32>
      sdy.return %e, %s : tensor<4xf32>, tensor<4xf32>
    } : (tensor<16xf32>) -> (tensor<16xf32>, tensor<4xf32>)
    %c = stablehlo.constant dense<1.0> : tensor<f32>
    %cb = stablehlo.broadcast_in_dim %c, dims = [] : (tensor<f32>) -> tensor<4xf32>
    %1 = sdy.manual_computation(%cb, %0#0, %0#1) in_shardings=[<@mesh, [{}]>, <@mesh, [{"tp"}]>, <@mesh, [{}]>] out_shardings=[<@mesh, [{"tp"}]>] manual_axes={"tp"} (%gb: tensor<4xf32>, %r: tensor<4xf32>, %q: tensor<4xf32>) {
      %m = stablehlo.multiply %gb, %r : tensor<4xf32>
      %n = stablehlo.multiply %m, %q : tensor<4xf32>
      sdy.return %n : tensor<4xf32>
    } : (tensor<4xf32>, tensor<16xf32>, tensor<4xf32>) -> tensor<16xf32>
    return %1 : tensor<16xf32>
  }
}

// -----

// Must stay apart: a residual returned replicated (out_specs P()) that is not the same on
// every device (no all_reduce made it so): the global result holds one device's value, and
// the others do not get theirs back.

// CHECK-LABEL: func.func @replicated_residual
// CHECK: sdy.manual_computation
// CHECK: sdy.manual_computation
module {
  sdy.mesh @mesh = <["tp"=4]>
  func.func @replicated_residual(%arg0: tensor<16xf32>) -> tensor<16xf32> {
    %0 = sdy.manual_computation(%arg0) in_shardings=[<@mesh, [{"tp"}]>] out_shardings=[<@mesh, [{}]>] manual_axes={"tp"} (%a: tensor<4xf32>) {
      %e = stablehlo.exponential %a : tensor<4xf32>
      sdy.return %e : tensor<4xf32>
    } : (tensor<16xf32>) -> tensor<4xf32>
    %1 = sdy.manual_computation(%0) in_shardings=[<@mesh, [{}]>] out_shardings=[<@mesh, [{"tp"}]>] manual_axes={"tp"} (%r: tensor<4xf32>) {
      %n = stablehlo.negate %r : tensor<4xf32>
      sdy.return %n : tensor<4xf32>
    } : (tensor<4xf32>) -> tensor<16xf32>
    return %1 : tensor<16xf32>
  }
}

// -----

// Must stay apart: read back with other specs (split along another dim): the devices do not
// get their own values.

// CHECK-LABEL: func.func @other_specs
// CHECK: sdy.manual_computation
// CHECK: sdy.manual_computation
module {
  sdy.mesh @mesh = <["tp"=4]>
  func.func @other_specs(%arg0: tensor<8x8xf32>) -> tensor<8x8xf32> {
    %0 = sdy.manual_computation(%arg0) in_shardings=[<@mesh, [{"tp"}, {}]>] out_shardings=[<@mesh, [{"tp"}, {}]>] manual_axes={"tp"} (%a: tensor<2x8xf32>) {
      %e = stablehlo.exponential %a : tensor<2x8xf32>
      sdy.return %e : tensor<2x8xf32>
    } : (tensor<8x8xf32>) -> tensor<8x8xf32>
    %1 = sdy.manual_computation(%0) in_shardings=[<@mesh, [{}, {"tp"}]>] out_shardings=[<@mesh, [{}, {"tp"}]>] manual_axes={"tp"} (%r: tensor<8x2xf32>) {
      %n = stablehlo.negate %r : tensor<8x2xf32>
      sdy.return %n : tensor<8x2xf32>
    } : (tensor<8x8xf32>) -> tensor<8x8xf32>
    return %1 : tensor<8x8xf32>
  }
}

// -----

// Must stay apart: another operand of the second computation is computed from the first's
// result outside both (it cannot be an operand of the merged computation).

// CHECK-LABEL: func.func @operand_from_the_result
// CHECK: sdy.manual_computation
// CHECK: stablehlo.negate
// CHECK: sdy.manual_computation
module {
  sdy.mesh @mesh = <["tp"=4]>
  func.func @operand_from_the_result(%arg0: tensor<16xf32>) -> tensor<16xf32> {
    %0 = sdy.manual_computation(%arg0) in_shardings=[<@mesh, [{"tp"}]>] out_shardings=[<@mesh, [{"tp"}]>] manual_axes={"tp"} (%a: tensor<4xf32>) {
      %e = stablehlo.exponential %a : tensor<4xf32>
      sdy.return %e : tensor<4xf32>
    } : (tensor<16xf32>) -> tensor<16xf32>
    %g = stablehlo.negate %0 : tensor<16xf32>
    %1 = sdy.manual_computation(%0, %g) in_shardings=[<@mesh, [{"tp"}]>, <@mesh, [{"tp"}]>] out_shardings=[<@mesh, [{"tp"}]>] manual_axes={"tp"} (%r: tensor<4xf32>, %s: tensor<4xf32>) {
      %n = stablehlo.add %r, %s : tensor<4xf32>
      sdy.return %n : tensor<4xf32>
    } : (tensor<16xf32>, tensor<16xf32>) -> tensor<16xf32>
    return %1 : tensor<16xf32>
  }
}
