"""Mutation testing (a subset; `python benchmarks/mutation.py` runs every example): single-site
mutants of the catalogue's sharded StableHLO are compiled, executed on 8 simulated CPU devices
and checked. A mutant whose numbers differ must never be proven, and nothing may crash."""

from __future__ import annotations

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

import pytest

jax = pytest.importorskip("jax")

from fuzz.mlir_mutate import mutants, parse_mesh

if len(jax.devices()) < 8:
    pytest.skip("needs 8 (simulated) devices", allow_module_level=True)

from examples.catalog import by_name
from fuzz.mutation import run_example, score

COLLECTIVE_WORDS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all",
                    "collective_permute", "partition_id", "dynamic_slice")

CASES = [
    ("row_linear_gelu_tp4", None),
    ("rmsnorm_hidden_tp4", None),
    ("seqpar_mlp_tp8", lambda d: any(w in d for w in COLLECTIVE_WORDS) or "constant" in d),
    # 2-D mesh: every collective regrouped over the other axis / device order, dropped, ...
    ("gpt2_block_dp2_tp2", lambda d: any(w in d for w in COLLECTIVE_WORDS)),
]


@pytest.mark.parametrize("name, select", CASES, ids=[c[0] for c in CASES])
def test_differing_mutants_are_never_proven(name, select) -> None:
    outcomes = run_example(by_name(name), select=select)
    s = score(outcomes)
    bad = [o for o in outcomes if o.status in ("false_proof", "crash", "timeout",
                                               "input_error")]
    assert not bad, "\n\n".join(f"[{o.status}] {o.mutation}: {o.message}\n{o.text}"
                                for o in bad[:3])
    assert s["differing"] >= 10, s
    assert s["score_pct"] == 100.0, s


def test_mutants_cover_every_collective_kind() -> None:
    from examples.catalog import lower_pair

    _, text = lower_pair(by_name("gpt2_block_dp2_tp4"))
    descs = [d for d, _ in mutants(text)]
    for what in ("drop all_reduce", "duplicate all_reduce", "all_reduce groups of",
                 "device order swapped", "add -> maximum", "constant"):
        assert any(what in d for d in descs), what
    assert parse_mesh(text).axes == (("dp", 2), ("tp", 4))
    _, text = lower_pair(by_name("seqpar_mlp_tp4"))
    descs = [d for d, _ in mutants(text)]
    for what in ("all_gather dim", "reduce_scatter dim", "drop all_gather"):
        assert any(what in d for d in descs), what
