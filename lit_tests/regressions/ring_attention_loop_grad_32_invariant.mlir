// RUN: entangle check --assume-no-overflow %S/Inputs/ring_attention_loop_grad_32.ref.mlir %S/Inputs/ring_attention_loop_grad_32.sharded.mlir | filecheck %s
// RUN: entangle-opt --pass-pipeline='builtin.module(entangle-normalize{assume-no-overflow})' %S/Inputs/ring_attention_loop_grad_32.sharded.mlir | filecheck %s --check-prefix=NORMALIZED
// RUN: not entangle check --no-confirm --no-verify-rules --assume-no-overflow %S/Inputs/ring_attention_loop_grad_32.ref.mlir %S/Inputs/ring_attention_loop_grad_32_backwards.sharded.mlir | filecheck %s --check-prefix=BACKWARDS

// Ring attention training with the ring in a fori_loop over 32 devices (examples/ring_loop.py
// `ring_grad`; `python -m examples.ring_loop --write-lit lit_tests/regressions/Inputs --grad`):
// jax's gradient of the loop is a pair of while loops, the forward storing each step's
// residuals at its counter's row, the backward reading them at n - 1 - t and passing dK and dV
// back around the ring. 32 trips, past the 16 entangle-normalize unrolls; the pair is folded by
// its invariant (entangle_mlir/normalize/ring_pair.py), shown for one generic step: the running
// max's cotangent (#16) is the pairing of the forward's accumulators after step j with their
// cotangents (#15: the output's, #17: the denominator's), so what it sends to the scores is
// zero; those cotangents are their initial values times exp(m_(j+1) - m_n); the contributions
// of a step are then read off the blocks of forward step j and exp(s_j - m_n), and dq, dK, dV
// are their sums (dK, dV passed back around the ring once a step).

// CHECK: verified: the sharded program refines the reference on mesh cp=32
// CHECK: note: the differentiated ring loops at examples/real/repro.py:{{[0-9]+}}:{{[0-9]+}} are folded by their invariant over 32 trips
// CHECK-SAME: #22, #23, #24, #25, #26, #27, #28, #29, #30, #31, #32, #33: a residual buffer: its rows < i hold the values of steps < i
// CHECK-SAME: backward: #13: step index t in [0, 32), undoing forward step j = n - 1 - t
// CHECK-SAME: #14: the sum of the contributions of steps < t
// CHECK-SAME: #15, #17: its initial value times exp(m_(j+1) - m_n), m the forward's running max #18
// CHECK-SAME: #16: the running max's cotangent, <forward #17 after step j, #15> + <forward #19 after step j, #17> summed onto m's rows (what it sends to the scores is zero)
// CHECK-SAME: #18, #19: the contributions of steps < t, each passed back around the ring once a step
// CHECK-SAME: #0, #1, #2, #3, #4, #5, #6, #7, #8, #9, #10, #11: a residual buffer read at row n - 1 - t (forward step j's values)
// CHECK: - no intermediate overflow
// CHECK: rule checks: Z3 checked {{[0-9]+}} rule instances: {{[0-9]+}} proved, 0 refuted, 0 inconclusive

// No loop is left in the shard_map body.
// NORMALIZED: sdy.manual_computation
// NORMALIZED-NOT: stablehlo.while
// NORMALIZED: sdy.return

// Must fail: K/V passed to the previous device while the key positions assume the next one
// (the pair folds alike; its blocks arrive in the other order).
// BACKWARDS: error: stablehlo.select combines blocks assembled in different orders
// BACKWARDS: not proven
