"""Hand-written wrong twins (`fuzz.twins`; `python benchmarks/attack.py --twins` runs them all):
each correct program computes its reference's numbers on the attacker's input sets and is
proven; each wrong twin computes other numbers and is not proven. The twins here are those of
the false proofs found in session 9 (a float -> int convert read as wrapping, an iota read as
its positions where its dtype wraps them), session 10's (a float compare decided over the
reals: `x + 1 > x`; an argmax of `x + 2` whose ties rounding makes; a compare of folded f32
constants; f32 -> bf16 rounding twice) and one per other family."""

from __future__ import annotations

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

import pytest

jax = pytest.importorskip("jax")

if len(jax.devices()) < 8:
    pytest.skip("needs 8 (simulated) devices", allow_module_level=True)

from fuzz.twins import judge_twin, twins

CHOSEN = ("tw_int8_through_float", "tw_uint8_through_float", "tw_narrow_iota",
          "tw_uint8_iota_reference", "tw_bool_count", "tw_device_offset", "tw_compare_rounded",
          "tw_argmax_rounded", "tw_constant_compare", "tw_double_rounding", "tw_flushed_difference",
          "tw_flushed_product", "tw_flushed_square")


@pytest.mark.parametrize("name", CHOSEN)
def test_wrong_twins_are_grounded_and_not_proven(name: str) -> None:
    (twin,) = [t for t in twins() if t.name == name]
    outcomes = judge_twin(twin, timeout=60)
    correct = outcomes[0]
    assert correct.variant == "correct" and correct.status == "proven", correct
    assert correct.numbers != "differ", correct
    wrong = outcomes[1:]
    assert len(wrong) == len(twin.wrongs) >= 1
    bad = [o for o in wrong if o.status != "caught" or o.numbers != "differ"]
    assert not bad, bad
