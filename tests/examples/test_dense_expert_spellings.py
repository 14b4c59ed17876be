"""Dense expert parallelism (every device holds a block of experts, `ids == shard offset + i`
selects its local expert i) in two spellings, grounded by running both programs on simulated
CPU devices:

* vectorized over the local experts (`ids[..., None] == axis_index * E_local + arange(E_local)`,
  one einsum over the block): the device's block of one_hot(ids), a partial sum over the expert
  axis; proven, and its stride-1 twin (offset `axis_index * 1`) computes something else and is
  not proven;
* one local expert at a time (`ids == axis_index * E_local + i`, the held-out
  `gathered_experts`): each mask is entry i of each device's block of one_hot(ids), each
  `w[i]` entry i of the device's block of w, and the unrolled loop's sum over i is the block's
  partial sum (rules/kinds/entries.py); proven with 2 and 4 local experts, and its nearest
  wrong neighbours (a mask off by one expert, an expert skipped, masks paired with another
  expert's weights) compute something else and are not proven."""

from __future__ import annotations

import functools
from dataclasses import replace

import jax
import jax.numpy as jnp
import pytest
from jax import lax

from entangle_mlir.driver import check_texts
from examples.heldout import newer_sources as ns
from examples.heldout.corpus import Example, by_name, grounded_correct, lower_pair


def _vectorized(x, idx, weights, wi0, wi1, wo, *, stride: int | None = None):
    """All tokens gathered, the device's experts applied as one batch, psum_scatter back."""
    xs, ids_, ws = (lax.all_gather(t, "ep", tiled=True) for t in (x, idx, weights))
    local = wi0.shape[0]
    experts = lax.axis_index("ep") * (stride or local) + jnp.arange(local)
    combine = jnp.einsum("tk,tke->te", ws, (ids_[..., None] == experts).astype(ws.dtype))
    ys = jax.vmap(ns._swiglu, in_axes=(None, 0, 0, 0))(xs, wi0, wi1, wo)
    return lax.psum_scatter(jnp.einsum("te,etd->td", combine, ys), "ep", tiled=True)


def _example(body, bug: str | None = None) -> Example:
    base = by_name("gathered_experts_ep4")
    return replace(base, name=f"vectorized_experts{'_' + bug if bug else ''}_ep4", body=body,
                   bug=bug, check_vma=bug is None)


@functools.cache
def _report(ex: Example, verify_rules: bool):
    return check_texts(*lower_pair(ex), verify_rules=verify_rules)


def test_vectorized_local_experts_proven_and_grounded() -> None:
    ex = _example(_vectorized)
    same, errors = grounded_correct(ex)
    assert same, errors
    report = _report(ex, True)
    assert report.proven, report.render_text()
    counts = report.stats.get("rule_instances", {})
    assert counts.get("refuted", 0) == 0 and counts.get("unknown", 0) == 0


def test_vectorized_stride_one_twin_differs_and_is_not_proven() -> None:
    ex = _example(functools.partial(_vectorized, stride=1), bug="stride_1")
    _, errors = grounded_correct(ex)
    assert max(errors) > 1e-2, errors
    report = _report(ex, False)
    assert not report.proven and report.diagnostics, report.render_text()


def _looped(x, idx, weights, wi0, wi1, wo, *, shift: int = 0, skip: int | None = None,
            rotate: int = 0):
    """One local expert at a time (the held-out `gathered_experts`); the wrong neighbours:
    every mask `shift` experts off, local expert `skip` left out, and mask i paired with the
    weights of local expert i + `rotate` (modulo the block)."""
    xs, ids_, ws = (lax.all_gather(t, "ep", tiled=True) for t in (x, idx, weights))
    local = wi0.shape[0]
    first = lax.axis_index("ep") * local
    out = jnp.zeros_like(xs)
    for i in range(local):
        if i == skip:
            continue
        chosen = jnp.sum(ws * (ids_ == first + i + shift), axis=-1)
        j = (i + rotate) % local
        out = out + chosen[:, None] * ns._swiglu(xs, wi0[j], wi1[j], wo[j])
    return lax.psum_scatter(out, "ep", tiled=True)


def _looped_example(ep: int, bug: str | None = None, **wrong) -> Example:
    base = by_name("gathered_experts_ep4")
    body = functools.partial(_looped, **wrong)
    return replace(base, name=f"looped_experts{'_' + bug if bug else ''}_ep{ep}", body=body,
                   bug=bug, check_vma=bug is None, mesh_axes=(("ep", ep),))


@pytest.mark.parametrize("ep", [2, 4])
def test_one_expert_at_a_time_proven_and_grounded(ep: int) -> None:
    """ep=2: 4 local experts per device; ep=4: 2. The masks are entries of each device's block
    of one_hot(ids), the loop re-rolled into the block's partial sum; every rule instance
    proved by Z3."""
    ex = by_name("gathered_experts_ep4") if ep == 4 else _looped_example(ep)
    same, errors = grounded_correct(ex)
    assert same, errors
    report = _report(ex, True)
    assert report.proven, report.render_text()
    counts = report.stats.get("rule_instances", {})
    assert counts.get("refuted", 0) == 0 and counts.get("unknown", 0) == 0, counts


WRONG_LOOPS = [("mask_one_expert_off", {"shift": 1}), ("last_expert_skipped", {"skip": -1}),
               ("middle_expert_skipped", {"skip": 1}), ("experts_rotated", {"rotate": 1})]


@pytest.mark.parametrize("ep", [2, 4])
@pytest.mark.parametrize(("bug", "wrong"), WRONG_LOOPS, ids=[b for b, _ in WRONG_LOOPS])
def test_wrong_expert_loops_differ_and_are_not_proven(ep: int, bug: str, wrong: dict) -> None:
    """The nearest wrong loops (a mask off by one expert, an expert left out, masks paired
    with another expert's weights) compute something else and are not proven."""
    if wrong.get("skip") == -1:
        wrong = {"skip": ns.N_EXPERTS // ep - 1}
    ex = _looped_example(ep, bug, **wrong)
    _, errors = grounded_correct(ex)
    assert max(errors) > 1e-2, errors
    report = _report(ex, False)
    assert not report.proven and report.diagnostics, report.render_text()
