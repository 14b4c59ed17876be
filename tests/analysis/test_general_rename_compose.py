"""A renaming of a term that is itself a renaming (`Symmetry._composed`): t = u[sigma_delta]
renamed by gamma is u[sigma_(gamma + delta)], taken from the renamings of u already built
(u itself when gamma + delta is the identity) instead of walking and rebuilding t's DAG.
Exact by the group law; the term taken is the one the walk builds. On a pipeline (dp 2 x pp 2
x tp 2, MLP stages, grounded by execution) the correct program is still proven with the
composition taken, and the twin sending gradients to a wrong stage (a wrong permute pair)
computes other numbers and is not proven."""

from __future__ import annotations

import os

if "--xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                               + " --xla_force_host_platform_device_count=8").strip()

import itertools
from dataclasses import replace

import numpy as np
import pytest

from entangle_mlir.analysis.general import expand
from entangle_mlir.analysis.general.symmetry import Symmetry
from entangle_mlir.core.mesh import Mesh
from entangle_mlir.core.terms import Term, make_arg, make_elementwise, make_mul
from entangle_mlir.driver import check_texts
from entangle_mlir.semantics.evaluate import evaluate_term

MESH = Mesh((("dp", 2), ("tp", 4)))
GAMMAS = [g for g in itertools.product(range(2), range(4)) if any(g)]
X = np.random.default_rng(3).standard_normal((4, 8)).astype(np.float32)


def _symmetry() -> tuple[Symmetry, Term]:
    sym = Symmetry(MESH, ("dp", "tp"))
    x = make_arg(0, (4, 8), "f32")
    sym.permute_argument(x, (("dp",), ("tp",)))
    u = make_mul(x, make_elementwise("stablehlo.tanh", (x,), (), "f32"))
    return sym, u


def _sum(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...]:
    return ((a[0] + b[0]) % 2, (a[1] + b[1]) % 4)


@pytest.mark.parametrize("delta", GAMMAS)
def test_renaming_a_renaming_is_the_renaming_by_the_sum(delta) -> None:
    """With every renaming of u built, t = u renamed by delta renamed by each gamma is the
    renaming of u by gamma + delta (a wrong sum would pick another of them), each taken
    without a walk (one memo entry: t's), and computes what a walk from scratch builds
    (that term may spell the rotated blocks as slices of concatenations)."""
    sym, u = _symmetry()
    renamed = {g: sym.rename(u, g) for g in GAMMAS}
    assert len({t.serial for t in renamed.values()}) == len(GAMMAS)
    t = renamed[delta]
    for gamma in GAMMAS:
        before = len(sym.memo[gamma])
        got = sym.rename(t, gamma)
        total = _sum(gamma, delta)
        assert got is (renamed[total] if any(total) else u), (gamma, delta)
        assert len(sym.memo[gamma]) == before + 1  # t's entry only: no walk
        fresh, _ = _symmetry()
        walked = fresh.rename(fresh.rename(u, delta), gamma)
        assert np.array_equal(evaluate_term(got, {0: X}), evaluate_term(walked, {0: X}))


def test_renaming_back_is_the_term_itself() -> None:
    sym, u = _symmetry()
    t = sym.rename(u, (1, 1))
    assert sym.rename(t, (1, 3)) is u


def test_without_the_renaming_by_the_sum_the_term_is_walked() -> None:
    """Nothing known for gamma + delta: t is walked (its subterms enter the memo)."""
    sym, u = _symmetry()
    t = sym.rename(u, (0, 1))
    got = sym.rename(t, (1, 0))
    assert len(sym.memo[(1, 0)]) > 1
    assert got is sym.rename(u, (1, 1))


def _pipeline(bug: str | None):
    from examples import frontier as fr

    cfg = replace(fr.tiny(fr.LLAMA_70B, 2), batch=2)
    return fr.pipeline_step(cfg, 2, 2, 2, micro=2, attention=False, bug=bug)


@pytest.fixture
def composed(monkeypatch):
    """How many renamings were taken as compositions."""
    count = [0]
    original = Symmetry._composed

    def counting(self, term, gamma):
        found = original(self, term, gamma)
        count[0] += found is not None
        return found

    monkeypatch.setattr(expand, "SYMMETRIC", True)
    monkeypatch.setattr(Symmetry, "_composed", counting)
    return count


def test_pipeline_is_proven_with_renamings_composed(composed) -> None:
    from examples.heldout.corpus import grounded_correct, lower_pair

    example = _pipeline(None)
    assert grounded_correct(example)[0]
    report = check_texts(*lower_pair(example), verify_rules=False)
    assert report.proven, report.render_text()
    assert report.stats["general_tier"]["symmetric_axes"] == ["dp", "tp"]
    assert composed[0] > 0


def test_pipeline_with_gradients_to_a_wrong_stage_is_not_proven(composed) -> None:
    from examples.heldout.corpus import input_sets, lower_pair, max_error

    example = _pipeline("gradients_to_a_wrong_stage")
    assert max_error(example, input_sets(example)[0]) > 1e-3
    report = check_texts(*lower_pair(example), verify_rules=False)
    assert not report.proven
