"""The general tier's refutation is a bug claim like the layout tier's (entangle_mlir/confirm.py):
made only when running both programs shows it, on the general tier's counterexample first,
then on random inputs; otherwise it is "cannot relate", quoting the general tier's reading.

Every program is grounded by execution on simulated CPU devices (`_run` runs both): the bugs
compute other numbers, the correct program the reference's. A correct program the general tier
is forced to refute (its decision monkeypatched to "different") gets no bug claim.
"""

from __future__ import annotations

from dataclasses import replace

import jax.numpy as jnp
import numpy as np
import pytest

from entangle_mlir.analysis.general.decide import Decider, Decision
from entangle_mlir.analysis.instance.term_equality import complete_inputs, shown_inputs
from entangle_mlir.confirm import is_claim, is_confirmed
from entangle_mlir.driver import check_texts
from tests.analysis.test_general_tier import CORRECT, TWINS, P, Program, V, _run
from tests.shared import confirmed

GENERAL = "general tier (per-device expansion on 4 devices): "


def test_a_bug_the_general_tier_refutes_is_confirmed_on_its_counterexample() -> None:
    """The vocab-parallel embedding with its offset off by one: the layout tier can only say
    it cannot relate the mask, the general tier's refutation is the claim, and running both
    programs on its counterexample confirms it."""
    want, got, (ref, sharded) = _run(TWINS[0])
    assert not np.array_equal(got, want)  # grounded: a bug
    raw = check_texts(ref, sharded)
    first = raw.diagnostics[0]
    assert first.message.startswith(GENERAL) and is_claim(first) and not is_confirmed(first)
    assert raw.counterexample is not None
    instances = raw.stats["general_tier"]["rule_instances"]  # checked before refuting
    assert instances["proved"] > 0 and instances["refuted"] == instances["unknown"] == 0
    report = confirmed(raw, ref, sharded)
    first = report.diagnostics[0]
    assert (first.category, first.message) == ("different_function", raw.diagnostics[0].message)
    assert is_confirmed(first)
    notes = [n.message for n in first.notes
             if n.message.startswith("confirmed on the counterexample")]
    assert notes and "result #0 differs from the reference by up to" in notes[0], notes
    on_counterexample = report.evidence["confirmation"]["counterexample"]
    assert [o["differs"] for o in on_counterexample] == [True]


IDS = np.arange(10, 26, dtype=np.int32)
ONE_ID_WRONG = Program("one_id_wrong", lambda x: x + 1,
                       lambda x: jnp.where(x == 17, x + 2, x + 1), (IDS,), (P("tp"),), P("tp"))


def test_a_claim_random_inputs_miss_is_confirmed_on_the_counterexample() -> None:
    """Wrong only where an input is 17: the random draws (small integers) never meet it, Z3
    does. The layout tier's claim ("which the reference never computes") is confirmed on the
    general tier's counterexample; without it, running withdraws the claim."""
    want, got, (ref, sharded) = _run(ONE_ID_WRONG)
    assert not np.array_equal(got, want) and np.array_equal(got[IDS != 17], want[IDS != 17])
    raw = check_texts(ref, sharded)
    assert raw.counterexample is not None and 17 in raw.counterexample[0].tolist()
    assert is_claim(raw.diagnostics[0])
    report = confirmed(raw, ref, sharded)
    first = report.diagnostics[0]
    assert first.message == raw.diagnostics[0].message and is_confirmed(first)
    assert any(n.message.startswith("confirmed on the counterexample") for n in first.notes)
    without = confirmed(replace(raw, counterexample=None), ref, sharded)
    assert without.diagnostics[0].category == "cannot_relate"


def _refute_everything(self, want, got, name):
    """A wrong decision procedure: every equality "refuted", on valid random inputs."""
    inputs = complete_inputs(None, [want, got], {0: (0, V - 1)})
    return Decision("refuted", counterexample=shown_inputs(inputs), inputs=inputs)


@pytest.mark.xfail(strict=True, reason="needs a correct program where the layout tier stops "
                   "short (STOPPED) and the general tier proves: the vocab embeddings this used "
                   "are proven by the layout tier since the vocab rule, and on the per-shard "
                   "cumsum the layout tier's claim comes first")
def test_a_correct_program_the_general_tier_wrongly_refutes_is_no_bug(monkeypatch) -> None:
    """A correct program the general tier proves (a per-shard cumsum); with its decision
    forced to "different", its claim is not confirmed by running both programs (on its
    counterexample, nor on random inputs): no bug is claimed, the general tier's reading is
    quoted as "cannot relate"."""
    want, got, (ref, sharded) = _run(CORRECT[0])
    np.testing.assert_allclose(got, want, rtol=1e-6)  # grounded: correct
    monkeypatch.setattr(Decider, "decide", _refute_everything)
    raw = check_texts(ref, sharded)
    general = [d for d in raw.diagnostics if d.message.startswith(GENERAL)]
    assert general and is_claim(general[0]), raw.render_text()
    report = confirmed(raw, ref, sharded)
    assert not report.proven and not any(is_claim(d) for d in report.diagnostics), \
        report.render_text()
    assert any(d.category == "cannot_relate" and "the general tier's reading" in d.message
               for d in report.diagnostics), report.render_text()
    assert not any(is_claim(d) for d in report.diagnostics), report.render_text()
    assert "the general tier's bug claims are withdrawn" in report.render_text()
    assert raw.exit_code == 1 and report.exit_code == 3    # withdrawn: inconclusive
