// RUN: entangle check %S/Inputs/gpipe_loop.ref.mlir %S/Inputs/gpipe_loop.sharded.mlir | filecheck %s
// RUN: not entangle-opt %S/Inputs/gpipe_loop.combined.mlir --entangle-normalize --entangle-import-shardings --entangle-infer-relations --entangle-check-refinement --entangle-general-tier | filecheck %s --check-prefix=INVARIANT
// RUN: not entangle check --no-confirm %S/Inputs/gpipe_loop.ref.mlir %S/Inputs/gpipe_loop_backwards.sharded.mlir | filecheck %s --check-prefix=BACKWARDS

// A GPipe forward in a fori_loop (benchmarks/pipeline.py `gpipe`, 4 stages x 16 micro-batches:
// 19 steps, past the 16 entangle-normalize unrolls): stage s applies MLP block s, hands its
// activations to stage s + 1 (ppermute), and the last stage writes micro-batch i - 3 of the
// outputs at step i, masked during the bubble. The general tier reads the loop by its
// invariant (analysis/general/loops.py): the body expanded once with the step index and the
// carries symbolic, each carry's relation to the carries a step earlier read off, the exit
// values that relation read at step 19. Inputs: `python benchmarks/pipeline.py --write-lit
// lit_tests/regressions/Inputs` (the combined file holds both functions for entangle-opt).

// CHECK: verified: the sharded program refines the reference on mesh stages=4
// CHECK: note: the loop at {{.*}} is read by its invariant over 19 trips: #6: step index i in [0, 19)
// CHECK-SAME: #7: a counter: += 1 each step
// CHECK-SAME: #8: a function of i and #8@stages-1 on devices 0, 2, 3; a function of i and #7@stages-1, reading windows of xs at i on device 1
// CHECK-SAME: #9: unchanged on devices 0..2; buffer updated at an index computed from i from #7@d, #8@d on device 3
// CHECK-SAME: #0, #1, #2, #3, #4, #5: loop-invariant

// The invariant is attached to the loop: the state a stage holds is a function of the
// previous stage's a step earlier (#8@stages-1; stage 1 takes the window of the
// micro-batches xs at stage 0's counter, #7@stages-1), the outputs change on the last stage
// only. (entangle-opt exits 1: it prints the layout tier's diagnostic, which the general
// tier then does not confirm.)
// INVARIANT: stablehlo.while
// INVARIANT-SAME: entangle.invariant = "#6: step index i in [0, 19); #7: a counter: += 1 each step; #8: a function of i and #8@stages-1 on devices 0, 2, 3

// Must fail: the activations handed to the previous stage.
// BACKWARDS: not proven
