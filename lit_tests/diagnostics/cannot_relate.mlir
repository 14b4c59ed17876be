// RUN: entangle-opt %s --split-input-file --pass-pipeline='builtin.module(entangle-normalize,entangle-import-shardings,entangle-infer-relations,entangle-check-refinement)' --verify-diagnostics
// RUN: not entangle check %s --no-general-tier --json | filecheck %s
// RUN: not entangle check %s --no-general-tier | filecheck --check-prefix=TEXT %s
// RUN: not entangle check %s --no-general-tier --no-confirm | filecheck --check-prefix=RAW %s
// RUN: entangle check %s | filecheck --check-prefix=GENERAL %s

// A correct program the layout tier reads as a bug. Each device holds one block of x and the
// psum adds the blocks together: the block sums are what the reference computes (the shard_map
// notebook's first psum example):
//
//   def ref(x):                                   # x: [16]
//       return x.reshape(4, 4).sum(0)             # the sum of the 4 blocks
//   def body(x_block):
//       return jax.lax.psum(x_block, 'i')         # by design: no bug
//   shard_map(body, mesh, in_specs=P('i'), out_specs=P())
//
// The layout tier only relates values it can name in the reference; a psum of a split value is,
// read that way, a reduction of different blocks (`wrong_axis`: what entangle-opt and
// `--no-confirm` report). `entangle check` runs both programs before claiming a bug: the outputs
// agree on every random input, so the claim is withdrawn and the diagnostic says what could not
// be related, quoting the reading. Not proven (exit code 1), no bug claimed.

// Without the general tier (`--no-general-tier`, as here) nothing relates the block sums; with
// it (per-device expansion), `entangle check` proves the program: it prints "verified".

// GENERAL: verified

// CHECK: "verdict": "not proven"
// CHECK: "diagnostics": [
// CHECK: "message": "cannot relate the value of all_reduce to the reference (the layout tier's reading \"all_reduce sums over 'i' of a value split over 'i': it combines different blocks\" was not confirmed: result #0 agrees with the reference on 4 random inputs)"
// CHECK: "reason": "cannot_relate"
// CHECK: "confirmation": {
// CHECK: "ran": true,
// CHECK-NEXT: "confirmed": false,

// TEXT: error: cannot relate the value of all_reduce to the reference (the layout tier's reading
// TEXT: not proven: cannot relate the value of all_reduce to the reference
// TEXT: evidence: the outputs agree with the reference on 4 random inputs

// RAW: error: all_reduce sums over 'i' of a value split over 'i': it combines different blocks
// RAW-NOT: evidence:

sdy.mesh @mesh = <["i"=4]>

func.func @ref(%x: tensor<16xf32>) -> tensor<4xf32> {
  // expected-note @+1 {{corresponds to the reference op stablehlo.reshape}}
  %r = stablehlo.reshape %x : (tensor<16xf32>) -> tensor<4x4xf32>
  %z = stablehlo.constant dense<0.000000e+00> : tensor<f32>
  %s = stablehlo.reduce(%r init: %z) applies stablehlo.add across dimensions = [0] : (tensor<4x4xf32>, tensor<f32>) -> tensor<4xf32>
  return %s : tensor<4xf32>
}

func.func @sharded(%x: tensor<16xf32>) -> tensor<4xf32> attributes {entangle.refines = @ref} {
  %0 = sdy.manual_computation(%x) in_shardings=[<@mesh, [{"i"}]>] out_shardings=[<@mesh, [{}]>] manual_axes={"i"} (%a: tensor<4xf32>) {
    // expected-error @+1 {{all_reduce sums over 'i' of a value split over 'i': it combines different blocks}}
    %1 = "stablehlo.all_reduce"(%a) ({
      ^bb0(%u: tensor<f32>, %v: tensor<f32>):
        %s = stablehlo.add %u, %v : tensor<f32>
        stablehlo.return %s : tensor<f32>
    }) {replica_groups = dense<[[0, 1, 2, 3]]> : tensor<1x4xi64>, channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, use_global_device_ids} : (tensor<4xf32>) -> tensor<4xf32>
    sdy.return %1 : tensor<4xf32>
  } : (tensor<16xf32>) -> tensor<4xf32>
  return %0 : tensor<4xf32>
}
