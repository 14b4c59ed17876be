// RUN: entangle check %S/Inputs/rotating_carries.ref.mlir %S/Inputs/rotating_carries.sharded.mlir | filecheck %s
// RUN: not entangle check --no-confirm %S/Inputs/rotating_carries.ref.mlir %S/Inputs/rotating_carries_four_steps.sharded.mlir | filecheck %s --check-prefix=FOUR

// JAX's shard_map test of a while loop whose body rotates three carries of different
// variance (replicated, a partial sum over 'x', a partial sum over ('x', 'y'); held-out
// `while_rotates_carries`): the layout tier cannot give each carry one layout (each slot
// holds every value in turn), the general tier unrolls the 5 trips and proves it. With 4
// trips the values end in other slots: the layout tier once claimed a missing psum inside
// the loop (the body computes nothing); now it says the carries rotate, and the general
// tier's refutation, with a counterexample, comes first.

// CHECK: verified: the sharded program refines the reference on mesh x=2 x y=2

// FOUR: error: general tier (per-device expansion on 4 devices): result #0 differs from the reference for some inputs; Z3 counterexample:
// FOUR: note: the layout tier: the loop moves carried value #2 into #1 unchanged, and they enter with other layouts (partial sum {x}, replicated): carries that rotate are not supported by the layout tier
// FOUR-NOT: missing all_reduce/psum inside the loop
