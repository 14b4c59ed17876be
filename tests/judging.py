"""One judgement shared by the tests of rewrites: a program is grounded by running it against
its reference, and the verifier's verdict must be the grounded one."""

from __future__ import annotations

import numpy as np

from entangle_mlir.driver import check_texts
from entangle_mlir.normalize.finite import NO_OVERFLOW, Finiteness, judging
from examples.real.catalog import Example, lower_pair, run_pair


def assert_judged(ex: Example, correct: bool, atol: float = 1e-4,
                  assume_no_overflow: bool = False) -> None:
    """`ex` computes its reference's numbers exactly when `correct`, and is proven exactly
    then, every rule instance by Z3 (0 refuted, 0 inconclusive). `assume_no_overflow`:
    judged under `--assume-no-overflow` (an online softmax over scores that may overflow,
    which the strict default refuses), which a proof must then list."""
    ref, shd = run_pair(ex)
    same = all(np.allclose(a, b, atol=atol) for a, b in zip(ref, shd, strict=True))
    assert same == correct, f"{ex.name}: grounded {'equal' if same else 'different'}"
    report = check_texts(*lower_pair(ex), verify_rules=correct,
                         assume_no_overflow=assume_no_overflow)
    assert report.proven == correct, report.render_text()
    if correct:
        assert " 0 refuted, 0 inconclusive" in report.mode, report.mode
        assert (NO_OVERFLOW in report.assumptions) == assume_no_overflow, report.assumptions


def assuming_no_overflow():
    """Run normalize rewrites (called directly, outside entangle-normalize) as under
    `--assume-no-overflow`: the online softmax's folds, which the strict default refuses
    where the scores may overflow."""
    return judging(Finiteness(assume_no_overflow=True))
