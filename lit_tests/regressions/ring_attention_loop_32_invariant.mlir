// RUN: entangle check --assume-no-overflow %S/Inputs/ring_attention_loop_32.ref.mlir %S/Inputs/ring_attention_loop_32.sharded.mlir | filecheck %s
// RUN: not entangle check --no-confirm --no-verify-rules --assume-no-overflow %S/Inputs/ring_attention_loop_32.ref.mlir %S/Inputs/ring_attention_loop_32_backwards.sharded.mlir | filecheck %s --check-prefix=BACKWARDS

// Causal ring attention forward in a fori_loop over a ring of 32 devices (examples/ring_loop.py;
// `python -m examples.ring_loop --write-lit lit_tests/regressions/Inputs`): 32 steps, past
// the 16 entangle-normalize unrolls. The loop is folded by its invariant
// (entangle_mlir/normalize/ring_fold.py): the body read as one generic step, the K/V blocks
// rotate by collective_permute, the running max and the accumulators (denominator, weighted
// values) are an online softmax over the blocks of the steps before i; at step 32 that is the
// softmax over the 32 blocks concatenated in arrival order, which the layout tier proves as it
// proves the Python-unrolled ring.

// CHECK: verified: the sharded program refines the reference on mesh cp=32
// CHECK: note: the ring loop at examples/ring_loop.py:{{[0-9]+}}:26 is folded by its invariant over 32 trips: #3: step index i in [0, 32); #4: a counter: += 1 each step
// CHECK-SAME: #5: an online-softmax sum over the blocks of steps < i against their values, shifted by the running max
// CHECK-SAME: #6: the running max over the blocks of steps < i
// CHECK-SAME: #7: an online-softmax sum over the blocks of steps < i, shifted by the running max
// CHECK-SAME: #8, #9: rotates: collective_permute each step (the block rotated i times)
// CHECK-SAME: #0, #1, #2: loop-invariant
// CHECK: - no intermediate overflow

// Must fail: K/V passed to the previous device while the key positions assume the next one.
// BACKWARDS: error: stablehlo.select combines blocks assembled in different orders
// BACKWARDS-SAME: the blocks that came through the collective_permute here are [0, 1, 2, 3,
// BACKWARDS-SAME: the other operand's [0, 31, 30, 29,
// BACKWARDS: not proven
