// RUN: entangle-opt %s --split-input-file --entangle-normalize --entangle-import-shardings --entangle-infer-relations | filecheck %s
// RUN: entangle-opt %s --split-input-file --entangle-normalize --entangle-import-shardings --entangle-infer-relations --entangle-check-refinement --verify-diagnostics | filecheck %s --check-prefix=FULL

// stablehlo.case (control rule; lax.switch, lax.cond): every branch's region is walked whole,
// then the results are the select chain of the branches' results on the index (an index out of
// range runs the last branch). When every device reads the same index the results keep the
// layout the branches agree on, partial sums included; an index that differs between devices
// (a partial value) is left to the general tier.

sdy.mesh @mesh = <["x"=2, "y"=2]>

func.func @ref(%n: tensor<i32>, %x: tensor<8xf32>) -> tensor<8xf32> {
  %c0 = stablehlo.constant dense<0> : tensor<i32>
  %c2 = stablehlo.constant dense<2> : tensor<i32>
  %i = stablehlo.clamp %c0, %n, %c2 : tensor<i32>
  %0 = "stablehlo.case"(%i) ({
    stablehlo.return %x : tensor<8xf32>
  }, {
    %one = stablehlo.constant dense<1.0> : tensor<8xf32>
    %1 = stablehlo.add %x, %one : tensor<8xf32>
    stablehlo.return %1 : tensor<8xf32>
  }, {
    %two = stablehlo.constant dense<2.0> : tensor<8xf32>
    %1 = stablehlo.add %x, %two : tensor<8xf32>
    stablehlo.return %1 : tensor<8xf32>
  }) : (tensor<i32>) -> tensor<8xf32>
  return %0 : tensor<8xf32>
}

// lax.switch on a replicated index, x split over 'x': each device runs the same branch.
// CHECK-LABEL: func.func @switch_replicated_index
// FULL: func.func @switch_replicated_index{{.*}}entangle.verdict = "proven"
func.func @switch_replicated_index(%n: tensor<i32>, %x: tensor<8xf32>) -> tensor<8xf32> attributes {entangle.refines = @ref} {
  %0 = sdy.manual_computation(%n, %x) in_shardings=[<@mesh, []>, <@mesh, [{"x"}]>] out_shardings=[<@mesh, [{"x"}]>] manual_axes={"x", "y"} (%m: tensor<i32>, %a: tensor<4xf32>) {
    %c0 = stablehlo.constant dense<0> : tensor<i32>
    %c2 = stablehlo.constant dense<2> : tensor<i32>
    %i = stablehlo.clamp %c0, %m, %c2 : tensor<i32>
    // CHECK: "stablehlo.case"
    // CHECK: entangle.relation = "tile [{x}] : select(broadcast(compare(clamp(0, %arg0, 2), 0)), %arg1, select(broadcast(compare(clamp(0, %arg0, 2), 1)), (%arg1 + 1), (%arg1 + 2)))"
    %1 = "stablehlo.case"(%i) ({
      stablehlo.return %a : tensor<4xf32>
    }, {
      %one = stablehlo.constant dense<1.0> : tensor<4xf32>
      %2 = stablehlo.add %a, %one : tensor<4xf32>
      stablehlo.return %2 : tensor<4xf32>
    }, {
      %two = stablehlo.constant dense<2.0> : tensor<4xf32>
      %2 = stablehlo.add %a, %two : tensor<4xf32>
      stablehlo.return %2 : tensor<4xf32>
    }) : (tensor<i32>) -> tensor<4xf32>
    sdy.return %1 : tensor<4xf32>
  } : (tensor<i32>, tensor<8xf32>) -> tensor<8xf32>
  return %0 : tensor<8xf32>
}

// -----

sdy.mesh @mesh = <["tp"=4]>

func.func @ref(%n: tensor<i32>, %x: tensor<8x16xf32>, %w: tensor<16x8xf32>) -> tensor<8x8xf32> {
  %0 = "stablehlo.case"(%n) ({
    %1 = stablehlo.dot_general %x, %w, contracting_dims = [1] x [0] : (tensor<8x16xf32>, tensor<16x8xf32>) -> tensor<8x8xf32>
    stablehlo.return %1 : tensor<8x8xf32>
  }, {
    %1 = stablehlo.dot_general %x, %w, contracting_dims = [1] x [0] : (tensor<8x16xf32>, tensor<16x8xf32>) -> tensor<8x8xf32>
    %2 = stablehlo.negate %1 : tensor<8x8xf32>
    stablehlo.return %2 : tensor<8x8xf32>
  }) : (tensor<i32>) -> tensor<8x8xf32>
  return %0 : tensor<8x8xf32>
}

// Partial sums out of both branches (a row-parallel matmul, negated in the second): the
// select of the partial sums is the partial sum of the selects; one psum after the case.
// CHECK-LABEL: func.func @partial_sums_then_psum
// FULL: func.func @partial_sums_then_psum{{.*}}entangle.verdict = "proven"
func.func @partial_sums_then_psum(%n: tensor<i32>, %x: tensor<8x16xf32>, %w: tensor<16x8xf32>) -> tensor<8x8xf32> attributes {entangle.refines = @ref} {
  %0 = sdy.manual_computation(%n, %x, %w) in_shardings=[<@mesh, []>, <@mesh, [{}, {"tp"}]>, <@mesh, [{"tp"}, {}]>] out_shardings=[<@mesh, [{}, {}]>] manual_axes={"tp"} (%m: tensor<i32>, %a: tensor<8x4xf32>, %b: tensor<4x8xf32>) {
    // CHECK: "stablehlo.case"
    // CHECK: entangle.relation = "partial sum {tp} : select(broadcast(compare(%arg0, 0)), dot_general(%arg1, %arg2), (-1*dot_general(%arg1, %arg2)))"
    %1 = "stablehlo.case"(%m) ({
      %2 = stablehlo.dot_general %a, %b, contracting_dims = [1] x [0] : (tensor<8x4xf32>, tensor<4x8xf32>) -> tensor<8x8xf32>
      stablehlo.return %2 : tensor<8x8xf32>
    }, {
      %2 = stablehlo.dot_general %a, %b, contracting_dims = [1] x [0] : (tensor<8x4xf32>, tensor<4x8xf32>) -> tensor<8x8xf32>
      %3 = stablehlo.negate %2 : tensor<8x8xf32>
      stablehlo.return %3 : tensor<8x8xf32>
    }) : (tensor<i32>) -> tensor<8x8xf32>
    %s = "stablehlo.all_reduce"(%1) ({
      ^bb0(%u: tensor<f32>, %v: tensor<f32>):
        %t = stablehlo.add %u, %v : tensor<f32>
        stablehlo.return %t : tensor<f32>
    }) {replica_groups = dense<[[0, 1, 2, 3]]> : tensor<1x4xi64>, channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, use_global_device_ids} : (tensor<8x8xf32>) -> tensor<8x8xf32>
    sdy.return %s : tensor<8x8xf32>
  } : (tensor<i32>, tensor<8x16xf32>, tensor<16x8xf32>) -> tensor<8x8xf32>
  return %0 : tensor<8x8xf32>
}

// -----

sdy.mesh @mesh = <["tp"=4]>

func.func @ref(%x: tensor<8xf32>) -> tensor<8xf32> {
  %zero = stablehlo.constant dense<0.0> : tensor<8xf32>
  %p = stablehlo.compare GT, %x, %zero, FLOAT : (tensor<8xf32>, tensor<8xf32>) -> tensor<8xi1>
  %one = stablehlo.constant dense<1.0> : tensor<8xf32>
  // expected-note @+1 {{corresponds to the reference op stablehlo.add, which computes (%arg0 + 1)}}
  %y = stablehlo.add %x, %one : tensor<8xf32>
  %0 = stablehlo.select %p, %x, %y : tensor<8xi1>, tensor<8xf32>
  return %0 : tensor<8xf32>
}

// lax.cond on jnp.any of the device's own block: each device runs its own branch (the index
// is a partial max over 'tp'), which the layout tier does not relate.
// CHECK-LABEL: func.func @cond_on_own_block
// FULL: func.func @cond_on_own_block{{.*}}entangle.verdict = "not proven"
func.func @cond_on_own_block(%x: tensor<8xf32>) -> tensor<8xf32> attributes {entangle.refines = @ref} {
  %0 = sdy.manual_computation(%x) in_shardings=[<@mesh, [{"tp"}]>] out_shardings=[<@mesh, [{"tp"}]>] manual_axes={"tp"} (%a: tensor<2xf32>) {
    %zero = stablehlo.constant dense<0.0> : tensor<2xf32>
    %p = stablehlo.compare GT, %a, %zero, FLOAT : (tensor<2xf32>, tensor<2xf32>) -> tensor<2xi1>
    %false = stablehlo.constant dense<false> : tensor<i1>
    %any = stablehlo.reduce(%p init: %false) applies stablehlo.or across dimensions = [0] : (tensor<2xi1>, tensor<i1>) -> tensor<i1>
    %i = stablehlo.convert %any : (tensor<i1>) -> tensor<i32>
    // CHECK: "stablehlo.case"
    // CHECK: entangle.relation = "opaque: case on a partial max over 'tp' (each device runs the branch of its own piece): not supported by the layout tier"
    // expected-error @+1 {{case on a partial max over 'tp' (each device runs the branch of its own piece): not supported by the layout tier}}
    %1 = "stablehlo.case"(%i) ({
      %one = stablehlo.constant dense<1.0> : tensor<2xf32>
      %2 = stablehlo.add %a, %one : tensor<2xf32>
      stablehlo.return %2 : tensor<2xf32>
    }, {
      stablehlo.return %a : tensor<2xf32>
    }) : (tensor<i32>) -> tensor<2xf32>
    sdy.return %1 : tensor<2xf32>
  } : (tensor<8xf32>) -> tensor<8xf32>
  return %0 : tensor<8xf32>
}
