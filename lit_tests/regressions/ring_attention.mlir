// RUN: entangle check --assume-no-overflow %S/Inputs/ring_attention.ref.mlir %S/Inputs/ring_attention.sharded.mlir | filecheck %s --check-prefix=RING
// RUN: not entangle check --assume-no-overflow %S/Inputs/ring_attention.ref.mlir %S/Inputs/ring_attention_backwards.sharded.mlir | filecheck %s --check-prefix=BACKWARDS
// RUN: not entangle check --no-verify-rules %S/Inputs/ring_attention.ref.mlir %S/Inputs/ring_attention.sharded.mlir | filecheck %s --check-prefix=STRICT

// Causal ring attention over cp=4 (examples/real/repro.py `ring_attention`): K/V blocks pass
// around the ring by collective_permute, an online softmax (running max, rescaled
// denominator and accumulator) combines them. entangle-normalize folds the online softmax into
// a softmax over the blocks concatenated in arrival order and moves the concatenation down to
// the K/V/position blocks (entangle_mlir/normalize/idioms.py); the concatenation is K with its blocks in
// a per-device order (`Reordered`, rules/reordered.py), which a softmax over the keys and the
// contraction with V in the same order do not depend on.
// Inputs: the reproducer and its wrong-direction twin (`ring_attention_backwards`), lowered
// by examples/real/catalog.lower_pair with the repo root stripped from file names.

// RING: verified: the sharded program refines the reference on mesh cp=4
// RING-NEXT: result#0 = concat over 'cp' along dim 0
// RING: - no intermediate overflow: sums and products of finite values computed by the programs stay finite (--assume-no-overflow)
// RING: rule checks: Z3 checked {{[0-9]+}} rule instances: {{[0-9]+}} proved, 0 refuted, 0 inconclusive

// The scores q . k may overflow: these run under --assume-no-overflow, which the proof lists
// (by default the fold is refused, the reason at the running max: STRICT, and
// lit_tests/diagnostics/overflow.mlir).
// STRICT: error: the online softmax's running max may be -inf where a whole block of scores overflows
// STRICT: not proven: the online softmax's running max may be -inf

// The twin passes K/V to the previous device while the key positions assume the next: the
// error is at its ppermute, with both block orders.
// BACKWARDS: examples/real/repro.py:{{[0-9]+}}:16: error: stablehlo.select combines blocks assembled in different orders (blocks assembled in the wrong order or from the wrong devices): on device 0, position by position, the blocks that came through the collective_permute here are [0, 1, 2, 3], the other operand's [0, 3, 2, 1]
// BACKWARDS: not proven: stablehlo.select combines blocks assembled in different orders
