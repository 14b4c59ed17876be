"""Dense expert parallelism (every device holds a block of experts, `ids == shard offset + i`
selects its local expert i) in two spellings, grounded by running both programs on simulated
CPU devices:

* vectorized over the local experts (`ids[..., None] == axis_index * E_local + arange(E_local)`,
  one einsum over the block): the device's block of one_hot(ids), a partial sum over the expert
  axis; proven, and its stride-1 twin (offset `axis_index * 1`) computes something else and is
  not proven;
* one local expert at a time (`ids == axis_index * E_local + i`, the held-out
  `gathered_experts`): correct, not proven yet, and the first diagnostic names the mask as one
  entry of each device's block of one_hot(ids) rather than claiming an off-by-one bound."""

from __future__ import annotations

import functools
from dataclasses import replace

import jax
import jax.numpy as jnp
from jax import lax

from entangle_mlir.confirm import is_claim
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


def test_one_expert_at_a_time_is_named_not_claimed() -> None:
    ex = by_name("gathered_experts_ep4")
    same, errors = grounded_correct(ex)
    assert same, errors
    report = _report(ex, False)
    assert not report.proven
    first = report.diagnostics[0]
    assert not is_claim(first), first.message
    assert "entry 0 of each device's block of one_hot(x)" in first.message, first.message
