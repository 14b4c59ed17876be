// RUN: entangle check %S/Inputs/ring_loop_32.ref.mlir %S/Inputs/ring_loop_32.sharded.mlir | filecheck %s
// RUN: not entangle check --no-confirm %S/Inputs/ring_loop_32.ref.mlir %S/Inputs/ring_loop_32_shift_right.sharded.mlir | filecheck %s --check-prefix=SHIFT

// The all-gather collective matmul over a ring of 32 devices in a fori_loop
// (benchmarks/pipeline.py `ring_matmul`: 32 steps, past the 16 entangle-normalize unrolls):
// each device multiplies the chunk of A it holds by the matching rows of W and passes the chunk
// on. Read by its invariant: the chunk rotates (device d holds device ring+1's a step earlier, on
// every device, the wrap included), the accumulator is a sum over the steps before i.

// CHECK: verified: the sharded program refines the reference on mesh ring=32
// CHECK: note: the loop at {{.*}} is read by its invariant over 32 trips: #2: step index i in [0, 32); #3: a counter: += 1 each step; #4: sum over the steps before i of a function of i and #3@d, #5@d, reading windows of w at i; #5: rotates: device ring+1's a step earlier; #0, #1: loop-invariant

// Must fail: the chunks rotated the other way (device d takes device d-1's chunk and
// multiplies it by the rows of chunk d + i): the devices' results differ.
// SHIFT: not proven: general tier (per-device expansion on 32 devices): device 1's result #0 (replicated over 'ring') differs from device 0's for some inputs
