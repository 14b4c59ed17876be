// RUN: entangle-opt %s --split-input-file --entangle-normalize --entangle-import-shardings --entangle-infer-relations | filecheck %s
// RUN: entangle-opt %s --split-input-file --entangle-normalize --entangle-import-shardings --entangle-infer-relations --entangle-check-refinement --verify-diagnostics | filecheck %s --check-prefix=FULL

// stablehlo.reduce (reduction rule): reducing a split dim leaves a partial reduction of the same
// kind (add -> sum, maximum -> max) over its axes; other dims keep their tiling. The init value
// must be the reducer's identity when a split dim is reduced (every device would add it once).

sdy.mesh @mesh = <["dp"=2, "tp"=4]>

func.func @ref(%x: tensor<8x16xf32>) -> tensor<8xf32> {
  %zero = stablehlo.constant dense<0.0> : tensor<f32>
  %0 = stablehlo.reduce(%x init: %zero) applies stablehlo.add across dimensions = [1] : (tensor<8x16xf32>, tensor<f32>) -> tensor<8xf32>
  return %0 : tensor<8xf32>
}

// LayerNorm statistics with the hidden dim split: local sums, then psum over tp.
// CHECK-LABEL: func.func @sum_split_dim
// FULL: func.func @sum_split_dim{{.*}}entangle.rho = ["result#0 = concat over 'dp' along dim 0"], entangle.verdict = "proven"
func.func @sum_split_dim(%x: tensor<8x16xf32>) -> tensor<8xf32> attributes {entangle.refines = @ref} {
  %0 = sdy.manual_computation(%x) in_shardings=[<@mesh, [{"dp"}, {"tp"}]>] out_shardings=[<@mesh, [{"dp"}]>] manual_axes={"dp", "tp"} (%a: tensor<4x4xf32>) {
    %zero = stablehlo.constant dense<0.0> : tensor<f32>
    // CHECK: stablehlo.reduce(%{{.*}}entangle.relation = "tile [{dp}] partial sum {tp} : reduce_sum(%arg0)"
    %1 = stablehlo.reduce(%a init: %zero) applies stablehlo.add across dimensions = [1] : (tensor<4x4xf32>, tensor<f32>) -> tensor<4xf32>
    %2 = "stablehlo.all_reduce"(%1) ({
      ^bb0(%u: tensor<f32>, %v: tensor<f32>):
        %s = stablehlo.add %u, %v : tensor<f32>
        stablehlo.return %s : tensor<f32>
    }) {replica_groups = dense<[[0, 1, 2, 3], [4, 5, 6, 7]]> : tensor<2x4xi64>, channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, use_global_device_ids} : (tensor<4xf32>) -> tensor<4xf32>
    sdy.return %2 : tensor<4xf32>
  } : (tensor<8x16xf32>) -> tensor<8xf32>
  return %0 : tensor<8xf32>
}

// -----

sdy.mesh @mesh = <["tp"=4]>

func.func @ref(%x: tensor<16x8xf32>) -> tensor<16xf32> {
  %zero = stablehlo.constant dense<0.0> : tensor<f32>
  %0 = stablehlo.reduce(%x init: %zero) applies stablehlo.add across dimensions = [1] : (tensor<16x8xf32>, tensor<f32>) -> tensor<16xf32>
  return %0 : tensor<16xf32>
}

// Sequence split: reducing the replicated hidden dim is purely local.
// CHECK-LABEL: func.func @sum_replicated_dim
// FULL: func.func @sum_replicated_dim{{.*}}entangle.rho = ["result#0 = concat over 'tp' along dim 0"], entangle.verdict = "proven"
func.func @sum_replicated_dim(%x: tensor<16x8xf32>) -> tensor<16xf32> attributes {entangle.refines = @ref} {
  %0 = sdy.manual_computation(%x) in_shardings=[<@mesh, [{"tp"}, {}]>] out_shardings=[<@mesh, [{"tp"}]>] manual_axes={"tp"} (%a: tensor<4x8xf32>) {
    %zero = stablehlo.constant dense<0.0> : tensor<f32>
    // CHECK: stablehlo.reduce(%{{.*}}entangle.relation = "tile [{tp}] : reduce_sum(%arg0)"
    %1 = stablehlo.reduce(%a init: %zero) applies stablehlo.add across dimensions = [1] : (tensor<4x8xf32>, tensor<f32>) -> tensor<4xf32>
    sdy.return %1 : tensor<4xf32>
  } : (tensor<16x8xf32>) -> tensor<16xf32>
  return %0 : tensor<16xf32>
}

// -----

sdy.mesh @mesh = <["tp"=4]>

func.func @ref(%x: tensor<8x16xf32>) -> tensor<8xf32> {
  %ninf = stablehlo.constant dense<0xFF800000> : tensor<f32>
  %0 = stablehlo.reduce(%x init: %ninf) applies stablehlo.maximum across dimensions = [1] : (tensor<8x16xf32>, tensor<f32>) -> tensor<8xf32>
  return %0 : tensor<8xf32>
}

// Vocab-parallel softmax max: local max, then pmax.
// CHECK-LABEL: func.func @max_split_dim
// FULL: func.func @max_split_dim{{.*}}entangle.verdict = "proven"
func.func @max_split_dim(%x: tensor<8x16xf32>) -> tensor<8xf32> attributes {entangle.refines = @ref} {
  %0 = sdy.manual_computation(%x) in_shardings=[<@mesh, [{}, {"tp"}]>] out_shardings=[<@mesh, [{}]>] manual_axes={"tp"} (%a: tensor<8x4xf32>) {
    %ninf = stablehlo.constant dense<0xFF800000> : tensor<f32>
    // CHECK: stablehlo.reduce(%{{.*}}entangle.relation = "partial max {tp} : reduce_max(%arg0)"
    %1 = stablehlo.reduce(%a init: %ninf) applies stablehlo.maximum across dimensions = [1] : (tensor<8x4xf32>, tensor<f32>) -> tensor<8xf32>
    %2 = "stablehlo.all_reduce"(%1) ({
      ^bb0(%u: tensor<f32>, %v: tensor<f32>):
        %s = stablehlo.maximum %u, %v : tensor<f32>
        stablehlo.return %s : tensor<f32>
    }) {replica_groups = dense<[[0, 1, 2, 3]]> : tensor<1x4xi64>, channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, use_global_device_ids} : (tensor<8xf32>) -> tensor<8xf32>
    sdy.return %2 : tensor<8xf32>
  } : (tensor<8x16xf32>) -> tensor<8xf32>
  return %0 : tensor<8xf32>
}

// -----

sdy.mesh @mesh = <["dp"=2, "tp"=4]>

func.func @ref(%x: tensor<8x16xf32>) -> tensor<f32> {
  %zero = stablehlo.constant dense<0.0> : tensor<f32>
  %0 = stablehlo.reduce(%x init: %zero) applies stablehlo.add across dimensions = [0, 1] : (tensor<8x16xf32>, tensor<f32>) -> tensor<f32>
  return %0 : tensor<f32>
}

// A loss: both dims split, reduced at once -> partial over both axes; one psum over both.
// CHECK-LABEL: func.func @sum_all_dims_2d
// FULL: func.func @sum_all_dims_2d{{.*}}entangle.verdict = "proven"
func.func @sum_all_dims_2d(%x: tensor<8x16xf32>) -> tensor<f32> attributes {entangle.refines = @ref} {
  %0 = sdy.manual_computation(%x) in_shardings=[<@mesh, [{"dp"}, {"tp"}]>] out_shardings=[<@mesh, []>] manual_axes={"dp", "tp"} (%a: tensor<4x4xf32>) {
    %zero = stablehlo.constant dense<0.0> : tensor<f32>
    // CHECK: stablehlo.reduce(%{{.*}}entangle.relation = "partial sum {dp, tp} : reduce_sum(%arg0)"
    %1 = stablehlo.reduce(%a init: %zero) applies stablehlo.add across dimensions = [0, 1] : (tensor<4x4xf32>, tensor<f32>) -> tensor<f32>
    %2 = "stablehlo.all_reduce"(%1) ({
      ^bb0(%u: tensor<f32>, %v: tensor<f32>):
        %s = stablehlo.add %u, %v : tensor<f32>
        stablehlo.return %s : tensor<f32>
    }) {replica_groups = dense<[[0, 1, 2, 3, 4, 5, 6, 7]]> : tensor<1x8xi64>, channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, use_global_device_ids} : (tensor<f32>) -> tensor<f32>
    sdy.return %2 : tensor<f32>
  } : (tensor<8x16xf32>) -> tensor<f32>
  return %0 : tensor<f32>
}

// -----

sdy.mesh @mesh = <["tp"=4]>

func.func @ref(%x: tensor<8x16xf32>) -> tensor<8xf32> {
  %one = stablehlo.constant dense<1.0> : tensor<f32>
  // expected-note @+1 {{corresponds to the reference op stablehlo.reduce}}
  %0 = stablehlo.reduce(%x init: %one) applies stablehlo.add across dimensions = [1] : (tensor<8x16xf32>, tensor<f32>) -> tensor<8xf32>
  return %0 : tensor<8xf32>
}

// Refused: init 1 over a split dim would be added once per device (4 in total).
// CHECK-LABEL: func.func @non_identity_init
// FULL: func.func @non_identity_init{{.*}}entangle.verdict = "not proven"
func.func @non_identity_init(%x: tensor<8x16xf32>) -> tensor<8xf32> attributes {entangle.refines = @ref} {
  %0 = sdy.manual_computation(%x) in_shardings=[<@mesh, [{}, {"tp"}]>] out_shardings=[<@mesh, [{}]>] manual_axes={"tp"} (%a: tensor<8x4xf32>) {
    %one = stablehlo.constant dense<1.0> : tensor<f32>
    // expected-error @+2 {{reduce over a split dim with init value 1 (not the identity of add): every device adds it once}}
    // CHECK: stablehlo.reduce(%{{.*}}entangle.relation = "opaque: reduce over a split dim with init value 1 (not the identity of add): every device adds it once"
    %1 = stablehlo.reduce(%a init: %one) applies stablehlo.add across dimensions = [1] : (tensor<8x4xf32>, tensor<f32>) -> tensor<8xf32>
    %2 = "stablehlo.all_reduce"(%1) ({
      ^bb0(%u: tensor<f32>, %v: tensor<f32>):
        %s = stablehlo.add %u, %v : tensor<f32>
        stablehlo.return %s : tensor<f32>
    }) {replica_groups = dense<[[0, 1, 2, 3]]> : tensor<1x4xi64>, channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, use_global_device_ids} : (tensor<8xf32>) -> tensor<8xf32>
    sdy.return %2 : tensor<8xf32>
  } : (tensor<8x16xf32>) -> tensor<8xf32>
  return %0 : tensor<8xf32>
}

// -----

sdy.mesh @mesh = <["tp"=4]>

func.func @ref(%x: tensor<8x16xf32>, %w: tensor<16x8xf32>) -> tensor<8xf32> {
  // expected-note @+1 {{corresponds to the reference op stablehlo.dot_general}}
  %0 = stablehlo.dot_general %x, %w, contracting_dims = [1] x [0] : (tensor<8x16xf32>, tensor<16x8xf32>) -> tensor<8x8xf32>
  %ninf = stablehlo.constant dense<0xFF800000> : tensor<f32>
  %1 = stablehlo.reduce(%0 init: %ninf) applies stablehlo.maximum across dimensions = [1] : (tensor<8x8xf32>, tensor<f32>) -> tensor<8xf32>
  return %1 : tensor<8xf32>
}

// Refused: the max of a partial sum (psum missing before it). Summing a partial sum is fine.
// CHECK-LABEL: func.func @max_of_partial_sum
// FULL: func.func @max_of_partial_sum{{.*}}entangle.verdict = "not proven"
func.func @max_of_partial_sum(%x: tensor<8x16xf32>, %w: tensor<16x8xf32>) -> tensor<8xf32> attributes {entangle.refines = @ref} {
  %0 = sdy.manual_computation(%x, %w) in_shardings=[<@mesh, [{}, {"tp"}]>, <@mesh, [{"tp"}, {}]>] out_shardings=[<@mesh, [{}]>] manual_axes={"tp"} (%a: tensor<8x4xf32>, %b: tensor<4x8xf32>) {
    // expected-error @+1 {{reduce (max) of a partial sum: missing all_reduce before it}}
    %p = stablehlo.dot_general %a, %b, contracting_dims = [1] x [0] : (tensor<8x4xf32>, tensor<4x8xf32>) -> tensor<8x8xf32>
    %zero = stablehlo.constant dense<0.0> : tensor<f32>
    // CHECK: stablehlo.reduce(%{{.*}}entangle.relation = "partial sum {tp} : reduce_sum(dot_general(%arg0, %arg1))"
    %s = stablehlo.reduce(%p init: %zero) applies stablehlo.add across dimensions = [1] : (tensor<8x8xf32>, tensor<f32>) -> tensor<8xf32>
    %ninf = stablehlo.constant dense<0xFF800000> : tensor<f32>
    // expected-note @+2 {{the partial sum is used here by stablehlo.reduce}}
    // CHECK: stablehlo.reduce(%{{.*}}entangle.relation = "opaque: reduce (max) of a partial sum: missing all_reduce before it"
    %1 = stablehlo.reduce(%p init: %ninf) applies stablehlo.maximum across dimensions = [1] : (tensor<8x8xf32>, tensor<f32>) -> tensor<8xf32>
    sdy.return %1 : tensor<8xf32>
  } : (tensor<8x16xf32>, tensor<16x8xf32>) -> tensor<8xf32>
  return %0 : tensor<8xf32>
}


// -----

sdy.mesh @mesh = <["tp"=4]>

func.func @ref(%x: tensor<8x16xf32>) -> tensor<8xi1> {
  %zero = stablehlo.constant dense<0.0> : tensor<8x16xf32>
  %p = stablehlo.compare GT, %x, %zero, FLOAT : (tensor<8x16xf32>, tensor<8x16xf32>) -> tensor<8x16xi1>
  %false = stablehlo.constant dense<false> : tensor<i1>
  %0 = stablehlo.reduce(%p init: %false) applies stablehlo.or across dimensions = [1] : (tensor<8x16xi1>, tensor<i1>) -> tensor<8xi1>
  return %0 : tensor<8xi1>
}

// jnp.any over a split dim: each device's `or` of its block is a partial max of booleans
// (false < true); jax's pmax of a boolean (an all_reduce with maximum on i1) completes it.
// CHECK-LABEL: func.func @any_split_dim
// FULL: func.func @any_split_dim{{.*}}entangle.verdict = "proven"
func.func @any_split_dim(%x: tensor<8x16xf32>) -> tensor<8xi1> attributes {entangle.refines = @ref} {
  %0 = sdy.manual_computation(%x) in_shardings=[<@mesh, [{}, {"tp"}]>] out_shardings=[<@mesh, [{}]>] manual_axes={"tp"} (%a: tensor<8x4xf32>) {
    %zero = stablehlo.constant dense<0.0> : tensor<8x4xf32>
    %p = stablehlo.compare GT, %a, %zero, FLOAT : (tensor<8x4xf32>, tensor<8x4xf32>) -> tensor<8x4xi1>
    %false = stablehlo.constant dense<false> : tensor<i1>
    // CHECK: stablehlo.reduce(%{{.*}}entangle.relation = "partial max {tp} : reduce_or(compare(%arg0, 0))"
    %1 = stablehlo.reduce(%p init: %false) applies stablehlo.or across dimensions = [1] : (tensor<8x4xi1>, tensor<i1>) -> tensor<8xi1>
    // CHECK: "stablehlo.all_reduce"
    // CHECK: entangle.relation = "replicated : reduce_or(compare(%arg0, 0))"
    %2 = "stablehlo.all_reduce"(%1) ({
      ^bb0(%u: tensor<i1>, %v: tensor<i1>):
        %s = stablehlo.maximum %u, %v : tensor<i1>
        stablehlo.return %s : tensor<i1>
    }) {replica_groups = dense<[[0, 1, 2, 3]]> : tensor<1x4xi64>, channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, use_global_device_ids} : (tensor<8xi1>) -> tensor<8xi1>
    sdy.return %2 : tensor<8xi1>
  } : (tensor<8x16xf32>) -> tensor<8xi1>
  return %0 : tensor<8xi1>
}

// -----

sdy.mesh @mesh = <["tp"=4]>

func.func @ref(%x: tensor<8x16xf32>) -> tensor<8xi1> {
  %zero = stablehlo.constant dense<0.0> : tensor<8x16xf32>
  %p = stablehlo.compare GT, %x, %zero, FLOAT : (tensor<8x16xf32>, tensor<8x16xf32>) -> tensor<8x16xi1>
  %false = stablehlo.constant dense<false> : tensor<i1>
  // expected-note @+1 {{corresponds to the reference op stablehlo.reduce, which computes reduce_or(compare(%arg0, 0))}}
  %0 = stablehlo.reduce(%p init: %false) applies stablehlo.or across dimensions = [1] : (tensor<8x16xi1>, tensor<i1>) -> tensor<8xi1>
  return %0 : tensor<8xi1>
}

// The `or` of each block combined with `and` (pmin): the reduction kind is wrong.
// CHECK-LABEL: func.func @any_combined_with_and
// FULL: func.func @any_combined_with_and{{.*}}entangle.verdict = "not proven"
func.func @any_combined_with_and(%x: tensor<8x16xf32>) -> tensor<8xi1> attributes {entangle.refines = @ref} {
  %0 = sdy.manual_computation(%x) in_shardings=[<@mesh, [{}, {"tp"}]>] out_shardings=[<@mesh, [{}]>] manual_axes={"tp"} (%a: tensor<8x4xf32>) {
    %zero = stablehlo.constant dense<0.0> : tensor<8x4xf32>
    %p = stablehlo.compare GT, %a, %zero, FLOAT : (tensor<8x4xf32>, tensor<8x4xf32>) -> tensor<8x4xi1>
    %false = stablehlo.constant dense<false> : tensor<i1>
    %1 = stablehlo.reduce(%p init: %false) applies stablehlo.or across dimensions = [1] : (tensor<8x4xi1>, tensor<i1>) -> tensor<8xi1>
    // CHECK: "stablehlo.all_reduce"
    // CHECK: entangle.relation = "opaque: all_reduce takes the min over 'tp' but the value is a partial max: the reduction kind is wrong"
    // expected-error @+1 {{all_reduce takes the min over 'tp' but the value is a partial max: the reduction kind is wrong}}
    %2 = "stablehlo.all_reduce"(%1) ({
      ^bb0(%u: tensor<i1>, %v: tensor<i1>):
        %s = stablehlo.and %u, %v : tensor<i1>
        stablehlo.return %s : tensor<i1>
    }) {replica_groups = dense<[[0, 1, 2, 3]]> : tensor<1x4xi64>, channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, use_global_device_ids} : (tensor<8xi1>) -> tensor<8xi1>
    sdy.return %2 : tensor<8xi1>
  } : (tensor<8x16xf32>) -> tensor<8xi1>
  return %0 : tensor<8xi1>
}

// -----

sdy.mesh @mesh = <["tp"=4]>

func.func @ref(%x: tensor<8x16xi32>) -> tensor<8xi32> {
  %low = stablehlo.constant dense<-2147483648> : tensor<i32>
  %0 = stablehlo.reduce(%x init: %low) applies stablehlo.maximum across dimensions = [1] : (tensor<8x16xi32>, tensor<i32>) -> tensor<8xi32>
  return %0 : tensor<8xi32>
}

// An integer max over a split dim: jax starts it from the least int32, the identity of max.
// CHECK-LABEL: func.func @int_max_split_dim
// FULL: func.func @int_max_split_dim{{.*}}entangle.verdict = "proven"
func.func @int_max_split_dim(%x: tensor<8x16xi32>) -> tensor<8xi32> attributes {entangle.refines = @ref} {
  %0 = sdy.manual_computation(%x) in_shardings=[<@mesh, [{}, {"tp"}]>] out_shardings=[<@mesh, [{}]>] manual_axes={"tp"} (%a: tensor<8x4xi32>) {
    %low = stablehlo.constant dense<-2147483648> : tensor<i32>
    // CHECK: stablehlo.reduce(%{{.*}}entangle.relation = "partial max {tp} : reduce_max(%arg0)"
    %1 = stablehlo.reduce(%a init: %low) applies stablehlo.maximum across dimensions = [1] : (tensor<8x4xi32>, tensor<i32>) -> tensor<8xi32>
    %2 = "stablehlo.all_reduce"(%1) ({
      ^bb0(%u: tensor<i32>, %v: tensor<i32>):
        %s = stablehlo.maximum %u, %v : tensor<i32>
        stablehlo.return %s : tensor<i32>
    }) {replica_groups = dense<[[0, 1, 2, 3]]> : tensor<1x4xi64>, channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, use_global_device_ids} : (tensor<8xi32>) -> tensor<8xi32>
    sdy.return %2 : tensor<8xi32>
  } : (tensor<8x16xi32>) -> tensor<8xi32>
  return %0 : tensor<8xi32>
}

// -----

sdy.mesh @mesh = <["tp"=4]>

func.func @ref(%x: tensor<8x16xi32>) -> tensor<8xi32> {
  %low = stablehlo.constant dense<-2147483648> : tensor<i32>
  %0 = stablehlo.reduce(%x init: %low) applies stablehlo.maximum across dimensions = [1] : (tensor<8x16xi32>, tensor<i32>) -> tensor<8xi32>
  return %0 : tensor<8xi32>
}

// Refused: a max starting from 0 over a split dim is not the max of the row (negative rows).
// CHECK-LABEL: func.func @int_max_from_zero
// FULL: func.func @int_max_from_zero{{.*}}entangle.verdict = "not proven"
func.func @int_max_from_zero(%x: tensor<8x16xi32>) -> tensor<8xi32> attributes {entangle.refines = @ref} {
  %0 = sdy.manual_computation(%x) in_shardings=[<@mesh, [{}, {"tp"}]>] out_shardings=[<@mesh, [{}]>] manual_axes={"tp"} (%a: tensor<8x4xi32>) {
    %c0 = stablehlo.constant dense<0> : tensor<i32>
    // CHECK: stablehlo.reduce(%{{.*}}entangle.relation = "opaque: reduce over a split dim with init value 0 (not the identity of max): every device adds it once"
    // expected-error @+1 {{reduce over a split dim with init value 0 (not the identity of max): every device adds it once}}
    %1 = stablehlo.reduce(%a init: %c0) applies stablehlo.maximum across dimensions = [1] : (tensor<8x4xi32>, tensor<i32>) -> tensor<8xi32>
    %2 = "stablehlo.all_reduce"(%1) ({
      ^bb0(%u: tensor<i32>, %v: tensor<i32>):
        %s = stablehlo.maximum %u, %v : tensor<i32>
        stablehlo.return %s : tensor<i32>
    }) {replica_groups = dense<[[0, 1, 2, 3]]> : tensor<1x4xi64>, channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, use_global_device_ids} : (tensor<8xi32>) -> tensor<8xi32>
    sdy.return %2 : tensor<8xi32>
  } : (tensor<8x16xi32>) -> tensor<8xi32>
  return %0 : tensor<8xi32>
}

// -----

// A reduce over (values, indices) with jax's argmax / argmin comparator: the region is read
// whole and must be exactly jax's (`p = v > w or v != v`, the value `select(p, v, w)`, the index `select(p or (v == w and i < j), i, j)`: on ties the first
// index). Over dims that are not split every device picks within whole rows, so the other dims
// keep their split. Refused: a reduced dim split (each device's answer is within its own block,
// with its own indices) and a region that picks the last index on ties (another function).

sdy.mesh @mesh = <["dp"=2, "tp"=4]>

func.func @ref(%x: tensor<16x8xf32>) -> tensor<16xi32> {
  %iota = stablehlo.iota dim = 1 : tensor<16x8xi32>
  %ninf = stablehlo.constant dense<0xFF800000> : tensor<f32>
  %c0 = stablehlo.constant dense<0> : tensor<i32>
  %0:2 = stablehlo.reduce(%x init: %ninf), (%iota init: %c0) across dimensions = [1] : (tensor<16x8xf32>, tensor<16x8xi32>, tensor<f32>, tensor<i32>) -> (tensor<16xf32>, tensor<16xi32>)
   reducer(%v: tensor<f32>, %w: tensor<f32>) (%i: tensor<i32>, %j: tensor<i32>)  {
    %1 = stablehlo.compare GT, %v, %w, FLOAT : (tensor<f32>, tensor<f32>) -> tensor<i1>
    %2 = stablehlo.compare NE, %v, %v, FLOAT : (tensor<f32>, tensor<f32>) -> tensor<i1>
    %3 = stablehlo.or %1, %2 : tensor<i1>
    %4 = stablehlo.compare EQ, %v, %w, FLOAT : (tensor<f32>, tensor<f32>) -> tensor<i1>
    %5 = stablehlo.compare LT, %i, %j, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
    %6 = stablehlo.and %4, %5 : tensor<i1>
    %7 = stablehlo.or %3, %6 : tensor<i1>
    %8 = stablehlo.select %3, %v, %w : tensor<i1>, tensor<f32>
    %9 = stablehlo.select %7, %i, %j : tensor<i1>, tensor<i32>
    stablehlo.return %8, %9 : tensor<f32>, tensor<i32>
  }
  return %0#1 : tensor<16xi32>
}

// Rows split over dp and tp: each device's argmax of its rows (jnp.argmax(x, axis=1)).
// CHECK-LABEL: func.func @rows_split
// FULL: func.func @rows_split{{.*}}entangle.verdict = "proven"
func.func @rows_split(%x: tensor<16x8xf32>) -> tensor<16xi32> attributes {entangle.refines = @ref} {
  %0 = sdy.manual_computation(%x) in_shardings=[<@mesh, [{"dp", "tp"}, {}]>] out_shardings=[<@mesh, [{"dp", "tp"}]>] manual_axes={"dp", "tp"} (%a: tensor<2x8xf32>) {
    %iota = stablehlo.iota dim = 1 : tensor<2x8xi32>
    %ninf = stablehlo.constant dense<0xFF800000> : tensor<f32>
    %c0 = stablehlo.constant dense<0> : tensor<i32>
    // CHECK: stablehlo.reduce
    // CHECK-SAME: entangle.relation = "tile [{dp, tp}] : argmax(%arg0, iota(dim 1), dims=[1], init=(-inf, 0)).values; tile [{dp, tp}] : argmax(%arg0, iota(dim 1), dims=[1], init=(-inf, 0)).indices"
    %1:2 = stablehlo.reduce(%a init: %ninf), (%iota init: %c0) across dimensions = [1] : (tensor<2x8xf32>, tensor<2x8xi32>, tensor<f32>, tensor<i32>) -> (tensor<2xf32>, tensor<2xi32>)
     reducer(%v: tensor<f32>, %w: tensor<f32>) (%i: tensor<i32>, %j: tensor<i32>)  {
      %4 = stablehlo.compare EQ, %v, %w, FLOAT : (tensor<f32>, tensor<f32>) -> tensor<i1>
      %1 = stablehlo.compare LT, %w, %v, FLOAT : (tensor<f32>, tensor<f32>) -> tensor<i1>
      %2 = stablehlo.compare NE, %v, %v, FLOAT : (tensor<f32>, tensor<f32>) -> tensor<i1>
      %3 = stablehlo.or %2, %1 : tensor<i1>
      %5 = stablehlo.compare LT, %i, %j, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
      %6 = stablehlo.and %5, %4 : tensor<i1>
      %7 = stablehlo.or %3, %6 : tensor<i1>
      %8 = stablehlo.select %3, %v, %w : tensor<i1>, tensor<f32>
      %9 = stablehlo.select %7, %i, %j : tensor<i1>, tensor<i32>
      stablehlo.return %8, %9 : tensor<f32>, tensor<i32>
    }
    sdy.return %1#1 : tensor<2xi32>
  } : (tensor<16x8xf32>) -> tensor<16xi32>
  return %0 : tensor<16xi32>
}

// -----

sdy.mesh @mesh = <["tp"=4]>

func.func @ref(%x: tensor<16x8xf32>) -> tensor<16xi32> {
  %iota = stablehlo.iota dim = 1 : tensor<16x8xi32>
  %ninf = stablehlo.constant dense<0xFF800000> : tensor<f32>
  %c0 = stablehlo.constant dense<0> : tensor<i32>
  %0:2 = stablehlo.reduce(%x init: %ninf), (%iota init: %c0) across dimensions = [1] : (tensor<16x8xf32>, tensor<16x8xi32>, tensor<f32>, tensor<i32>) -> (tensor<16xf32>, tensor<16xi32>)
   reducer(%v: tensor<f32>, %w: tensor<f32>) (%i: tensor<i32>, %j: tensor<i32>)  {
    %1 = stablehlo.compare GT, %v, %w, FLOAT : (tensor<f32>, tensor<f32>) -> tensor<i1>
    %2 = stablehlo.compare NE, %v, %v, FLOAT : (tensor<f32>, tensor<f32>) -> tensor<i1>
    %3 = stablehlo.or %1, %2 : tensor<i1>
    %4 = stablehlo.compare EQ, %v, %w, FLOAT : (tensor<f32>, tensor<f32>) -> tensor<i1>
    %5 = stablehlo.compare LT, %i, %j, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
    %6 = stablehlo.and %4, %5 : tensor<i1>
    %7 = stablehlo.or %3, %6 : tensor<i1>
    %8 = stablehlo.select %3, %v, %w : tensor<i1>, tensor<f32>
    %9 = stablehlo.select %7, %i, %j : tensor<i1>, tensor<i32>
    stablehlo.return %8, %9 : tensor<f32>, tensor<i32>
  }
  return %0#1 : tensor<16xi32>
}

// The reduced dim split: each device's argmax is within its own block, numbered from 0.
// CHECK-LABEL: func.func @reduced_dim_split
// FULL: func.func @reduced_dim_split{{.*}}entangle.verdict = "not proven"
func.func @reduced_dim_split(%x: tensor<16x8xf32>) -> tensor<16xi32> attributes {entangle.refines = @ref} {
  %0 = sdy.manual_computation(%x) in_shardings=[<@mesh, [{}, {"tp"}]>] out_shardings=[<@mesh, [{}]>] manual_axes={"tp"} (%a: tensor<16x2xf32>) {
    %iota = stablehlo.iota dim = 1 : tensor<16x2xi32>
    %ninf = stablehlo.constant dense<0xFF800000> : tensor<f32>
    %c0 = stablehlo.constant dense<0> : tensor<i32>
    // CHECK: stablehlo.reduce
    // CHECK-SAME: entangle.relation = "opaque: argmax over dim 1, which is split over 'tp': the answer within one block (with indices local to it); the layout tier does not relate per-block answers yet
    // expected-error @+1 {{argmax over dim 1, which is split over 'tp': the answer within one block (with indices local to it); the layout tier does not relate per-block answers yet}}
    %1:2 = stablehlo.reduce(%a init: %ninf), (%iota init: %c0) across dimensions = [1] : (tensor<16x2xf32>, tensor<16x2xi32>, tensor<f32>, tensor<i32>) -> (tensor<16xf32>, tensor<16xi32>)
     reducer(%v: tensor<f32>, %w: tensor<f32>) (%i: tensor<i32>, %j: tensor<i32>)  {
      %1 = stablehlo.compare GT, %v, %w, FLOAT : (tensor<f32>, tensor<f32>) -> tensor<i1>
      %2 = stablehlo.compare NE, %v, %v, FLOAT : (tensor<f32>, tensor<f32>) -> tensor<i1>
      %3 = stablehlo.or %1, %2 : tensor<i1>
      %4 = stablehlo.compare EQ, %v, %w, FLOAT : (tensor<f32>, tensor<f32>) -> tensor<i1>
      %5 = stablehlo.compare LT, %i, %j, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
      %6 = stablehlo.and %4, %5 : tensor<i1>
      %7 = stablehlo.or %3, %6 : tensor<i1>
      %8 = stablehlo.select %3, %v, %w : tensor<i1>, tensor<f32>
      %9 = stablehlo.select %7, %i, %j : tensor<i1>, tensor<i32>
      stablehlo.return %8, %9 : tensor<f32>, tensor<i32>
    }
    sdy.return %1#1 : tensor<16xi32>
  } : (tensor<16x8xf32>) -> tensor<16xi32>
  return %0 : tensor<16xi32>
}

// -----

sdy.mesh @mesh = <["tp"=4]>

func.func @ref(%x: tensor<16x8xf32>) -> tensor<16xi32> {
  %iota = stablehlo.iota dim = 1 : tensor<16x8xi32>
  %ninf = stablehlo.constant dense<0xFF800000> : tensor<f32>
  %c0 = stablehlo.constant dense<0> : tensor<i32>
  %0:2 = stablehlo.reduce(%x init: %ninf), (%iota init: %c0) across dimensions = [1] : (tensor<16x8xf32>, tensor<16x8xi32>, tensor<f32>, tensor<i32>) -> (tensor<16xf32>, tensor<16xi32>)
   reducer(%v: tensor<f32>, %w: tensor<f32>) (%i: tensor<i32>, %j: tensor<i32>)  {
    %1 = stablehlo.compare GT, %v, %w, FLOAT : (tensor<f32>, tensor<f32>) -> tensor<i1>
    %2 = stablehlo.compare NE, %v, %v, FLOAT : (tensor<f32>, tensor<f32>) -> tensor<i1>
    %3 = stablehlo.or %1, %2 : tensor<i1>
    %4 = stablehlo.compare EQ, %v, %w, FLOAT : (tensor<f32>, tensor<f32>) -> tensor<i1>
    %5 = stablehlo.compare LT, %i, %j, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
    %6 = stablehlo.and %4, %5 : tensor<i1>
    %7 = stablehlo.or %3, %6 : tensor<i1>
    %8 = stablehlo.select %3, %v, %w : tensor<i1>, tensor<f32>
    %9 = stablehlo.select %7, %i, %j : tensor<i1>, tensor<i32>
    stablehlo.return %8, %9 : tensor<f32>, tensor<i32>
  }
  return %0#1 : tensor<16xi32>
}

// A region that keeps the LAST index on ties (i > j): another function than argmax.
// CHECK-LABEL: func.func @last_index_on_ties
// FULL: func.func @last_index_on_ties{{.*}}entangle.verdict = "not proven"
func.func @last_index_on_ties(%x: tensor<16x8xf32>) -> tensor<16xi32> attributes {entangle.refines = @ref} {
  %0 = sdy.manual_computation(%x) in_shardings=[<@mesh, [{"tp"}, {}]>] out_shardings=[<@mesh, [{"tp"}]>] manual_axes={"tp"} (%a: tensor<4x8xf32>) {
    %iota = stablehlo.iota dim = 1 : tensor<4x8xi32>
    %ninf = stablehlo.constant dense<0xFF800000> : tensor<f32>
    %c0 = stablehlo.constant dense<0> : tensor<i32>
    // CHECK: stablehlo.reduce
    // CHECK-SAME: entangle.relation = "opaque: not a supported reduction: reduce over (values, indices) whose region is not jax's argmax/argmin comparator
    // expected-error @+1 {{not a supported reduction: reduce over (values, indices) whose region is not jax's argmax/argmin comparator (the larger/smaller value, on ties the first index)}}
    %1:2 = stablehlo.reduce(%a init: %ninf), (%iota init: %c0) across dimensions = [1] : (tensor<4x8xf32>, tensor<4x8xi32>, tensor<f32>, tensor<i32>) -> (tensor<4xf32>, tensor<4xi32>)
     reducer(%v: tensor<f32>, %w: tensor<f32>) (%i: tensor<i32>, %j: tensor<i32>)  {
      %1 = stablehlo.compare GT, %v, %w, FLOAT : (tensor<f32>, tensor<f32>) -> tensor<i1>
      %2 = stablehlo.compare NE, %v, %v, FLOAT : (tensor<f32>, tensor<f32>) -> tensor<i1>
      %3 = stablehlo.or %1, %2 : tensor<i1>
      %4 = stablehlo.compare EQ, %v, %w, FLOAT : (tensor<f32>, tensor<f32>) -> tensor<i1>
      %5 = stablehlo.compare GT, %i, %j, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
      %6 = stablehlo.and %4, %5 : tensor<i1>
      %7 = stablehlo.or %3, %6 : tensor<i1>
      %8 = stablehlo.select %3, %v, %w : tensor<i1>, tensor<f32>
      %9 = stablehlo.select %7, %i, %j : tensor<i1>, tensor<i32>
      stablehlo.return %8, %9 : tensor<f32>, tensor<i32>
    }
    sdy.return %1#1 : tensor<4xi32>
  } : (tensor<16x8xf32>) -> tensor<16xi32>
  return %0 : tensor<16xi32>
}

// -----

sdy.mesh @mesh = <["tp"=4]>

func.func @ref(%x: tensor<16x8xf32>) -> tensor<16xf32> {
  %two = stablehlo.constant dense<2.0> : tensor<f32>
  %0 = stablehlo.reduce(%x init: %two) applies stablehlo.multiply across dimensions = [1] : (tensor<16x8xf32>, tensor<f32>) -> tensor<16xf32>
  return %0 : tensor<16xf32>
}

// A product (jnp.prod, here from 2) over the replicated dim: purely local.
// CHECK-LABEL: func.func @prod_replicated_dim
// FULL: func.func @prod_replicated_dim{{.*}}entangle.rho = ["result#0 = concat over 'tp' along dim 0"], entangle.verdict = "proven"
func.func @prod_replicated_dim(%x: tensor<16x8xf32>) -> tensor<16xf32> attributes {entangle.refines = @ref} {
  %0 = sdy.manual_computation(%x) in_shardings=[<@mesh, [{"tp"}, {}]>] out_shardings=[<@mesh, [{"tp"}]>] manual_axes={"tp"} (%a: tensor<4x8xf32>) {
    %two = stablehlo.constant dense<2.0> : tensor<f32>
    // CHECK: stablehlo.reduce(%{{.*}}entangle.relation = "tile [{tp}] : (2*reduce_mul(%arg0))"
    %1 = stablehlo.reduce(%a init: %two) applies stablehlo.multiply across dimensions = [1] : (tensor<4x8xf32>, tensor<f32>) -> tensor<4xf32>
    sdy.return %1 : tensor<4xf32>
  } : (tensor<16x8xf32>) -> tensor<16xf32>
  return %0 : tensor<16xf32>
}
