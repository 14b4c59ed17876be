"""Flash-decoding's combine (`idioms._shift_moved`, `_division_under_sum`, `_normalized_after`
through an all_reduce): each device's softmax accumulators over its block of a KV cache,
rescaled to the pmax of the devices' maxima by exp(m - M), psum'd, and the output divided by
the psum'd denominator, are the softmax over the whole cache.

The identities are checked by Z3 on small shapes (exp an unknown function obeying
exp(a) exp(b) = exp(a + b) at the points the identity uses), each with its nearest wrong
variant refuted; programs are grounded by execution: the correct combine computes the
reference's numbers and is proven (under --assume-no-overflow: scores of unbounded inputs may
overflow to -inf in a whole block, where the program is NaN and the softmax finite; the
strict default says so), the near misses (no rescale, the rescale inverted, the denominator
left unrescaled) compute other numbers and are not proven."""

from __future__ import annotations

import os

if "--xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                               + " --xla_force_host_platform_device_count=8").strip()

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import z3
from jax import lax
from jax.sharding import PartitionSpec as P

from entangle_mlir.analysis import solver
from entangle_mlir.driver import check_texts
from entangle_mlir.normalize.finite import NO_OVERFLOW
from tests.jax_runs import run_and_lower

# ----- the identities, by Z3 ----------------------------------------------------------------------


def _prove(claim, hypotheses) -> str:
    """The product's entry point, in a fresh Z3 context: a budget of work, not of wall time,
    and a search order that does not depend on what the test worker built before (the
    largest shape, 1.2 s alone, ran past a 20 s wall timeout in a CI worker)."""
    with solver.fresh_contexts():
        return solver.prove(claim, hypotheses, name="flash_combine", timeout_ms=20_000).status


def _shift_moved_lemma(rows: int, keys: int, width: int, variant: str) -> str:
    """sum_k exp(y - m) v * exp(m - M) == sum_k exp(y - M) v for every row and column, m the
    row max of y, M any value per row; `variant` "inverted" rescales by exp(M - m), "other_row"
    by the next row's exp(m - M) (their inputs pinned: a refutation needs one witness)."""
    exp = z3.Function("exp", z3.RealSort(), z3.RealSort())
    y = [[z3.Real(f"y_{r}_{k}") for k in range(keys)] for r in range(rows)]
    v = [[z3.Real(f"v_{k}_{c}") for c in range(width)] for k in range(keys)]
    big_m = [z3.Real(f"M_{r}") for r in range(rows)]
    facts = []
    if variant != "right":  # a refutation may pick its inputs: pin them (a quicker query)
        facts += [y[r][k] == r + 2 * k for r in range(rows) for k in range(keys)]
        facts += [v[k][c] == 1 for k in range(keys) for c in range(width)]
        facts += [big_m[r] == 3 * keys + 2 * r for r in range(rows)]
    m = []
    for r in range(rows):
        top = y[r][0]
        for k in range(1, keys):
            top = z3.If(y[r][k] > top, y[r][k], top)
        m.append(top)
    claims = []
    for r in range(rows):
        source = (r + 1) % rows if variant == "other_row" else r
        scale = (exp(big_m[r] - m[r]) if variant == "inverted"
                 else exp(m[source] - big_m[source]))
        for k in range(keys):
            a, b = y[r][k] - m[r], m[r] - big_m[r]
            facts.append(exp(a + b) == exp(a) * exp(b))
            facts.append(exp(a) > 0)
        facts.append(exp(m[r] - big_m[r]) > 0)
        for c in range(width):
            lhs = z3.Sum([exp(y[r][k] - m[r]) * v[k][c] for k in range(keys)]) * scale
            rhs = z3.Sum([exp(y[r][k] - big_m[r]) * v[k][c] for k in range(keys)])
            claims.append(lhs == rhs)
    return _prove(z3.And(claims), facts)


def _division_under_sum_lemma(devices: int, width: int, variant: str) -> str:
    """(sum_j x_j) / d == sum_j x_j / d for d the same on every device and nonzero; "varying"
    divides each device's x_j by its own d_j."""
    x = [[z3.Real(f"x_{j}_{c}") for c in range(width)] for j in range(devices)]
    d = [[z3.Real(f"d_{j}_{c}") for c in range(width)] for j in range(devices)]
    facts = [d[j][c] != 0 for j in range(devices) for c in range(width)]
    claims = []
    for c in range(width):
        own = [d[j][c] if variant == "varying" else d[0][c] for j in range(devices)]
        claims.append(z3.Sum([x[j][c] for j in range(devices)]) / d[0][c]
                      == z3.Sum([x[j][c] / own[j] for j in range(devices)]))
    return _prove(z3.And(claims), facts)


def _normalized_after_lemma(keys: int, devices: int, variant: str) -> str:
    """sum_k e_k v_k / D == sum_k (e_k / D) v_k for D = sum_j den_j constant along k (the
    psum'd denominator); "along_k" divides each term by a D that varies along k."""
    e = [z3.Real(f"e_{k}") for k in range(keys)]
    v = [z3.Real(f"v_{k}") for k in range(keys)]
    den = [[z3.Real(f"den_{j}_{k}") for k in range(keys)] for j in range(devices)]
    total = [z3.Sum([den[j][k if variant == "along_k" else 0] for j in range(devices)])
             for k in range(keys)]
    facts = [t != 0 for t in total]
    claim = (z3.Sum([e[k] * v[k] for k in range(keys)]) / total[0]
             == z3.Sum([e[k] / total[k] * v[k] for k in range(keys)]))
    return _prove(claim, facts)


@pytest.mark.parametrize("shape", [(1, 2, 1), (2, 2, 1), (2, 3, 2)])
def test_shift_moved_identity(shape) -> None:
    assert _shift_moved_lemma(*shape, "right") == "proved"
    assert _shift_moved_lemma(*shape, "inverted") == "refuted"
    if shape[0] > 1:
        assert _shift_moved_lemma(*shape, "other_row") == "refuted"


@pytest.mark.parametrize("shape", [(2, 1), (4, 2), (3, 3)])
def test_division_under_sum_identity(shape) -> None:
    assert _division_under_sum_lemma(*shape, "same") == "proved"
    assert _division_under_sum_lemma(*shape, "varying") == "refuted"


@pytest.mark.parametrize("shape", [(2, 2), (3, 4), (4, 2)])
def test_normalized_after_a_sum_over_devices_identity(shape) -> None:
    assert _normalized_after_lemma(*shape, "same") == "proved"
    assert _normalized_after_lemma(*shape, "along_k") == "refuted"


# ----- programs, grounded -------------------------------------------------------------------------


def _reference(q, k, v):
    scores = jnp.einsum("bhd,bshd->bhs", q, k) / np.float32(np.sqrt(q.shape[-1]))
    return jnp.einsum("bhs,bshd->bhd", jax.nn.softmax(scores, axis=-1), v)


def _combine(rescale: str):
    def body(q, k, v):
        scores = jnp.einsum("bhd,bshd->bhs", q, k) / np.float32(np.sqrt(q.shape[-1]))
        m = jnp.max(scores, axis=-1)
        p = jnp.exp(scores - m[..., None])
        lsum = jnp.sum(p, axis=-1)
        out = jnp.einsum("bhs,bshd->bhd", p, v)
        m_all = lax.pmax(m, "sp")
        corr = jnp.exp(m_all - m) if rescale == "inverted" else jnp.exp(m - m_all)
        if rescale != "none":
            out = out * corr[..., None]
        if rescale not in ("none", "output_only"):
            lsum = lsum * corr
        return lax.psum(out, "sp") / lax.psum(lsum, "sp")[..., None]
    return body


CASES = {"right": True, "none": False, "inverted": False, "output_only": False}


def _args() -> list[np.ndarray]:
    rng = np.random.default_rng(3)
    q = rng.standard_normal((2, 4, 8)).astype(np.float32)
    k = rng.standard_normal((2, 16, 4, 8)).astype(np.float32)
    k[:, :4] *= 4
    v = rng.standard_normal((2, 16, 4, 8)).astype(np.float32)
    return [q, k, v]


@pytest.mark.parametrize("rescale", list(CASES))
def test_flash_decoding_combine_is_judged(rescale: str) -> None:
    correct = CASES[rescale]
    specs = (P(), P(None, "sp", None, None), P(None, "sp", None, None))
    want, got, texts = run_and_lower(_reference, _combine(rescale), _args(), specs, P(),
                                     mesh=(("sp", 4),))
    assert np.allclose(want, got, atol=1e-5) == correct
    strict = check_texts(*texts, verify_rules=False)
    assert not strict.proven
    if correct:
        assert "pass --assume-no-overflow" in strict.diagnostics[0].message
    report = check_texts(*texts, verify_rules=correct, assume_no_overflow=True)
    assert report.proven == correct, report.render_text()
    if correct:
        assert " 0 refuted, 0 inconclusive" in report.mode, report.mode
        assert NO_OVERFLOW in report.assumptions
