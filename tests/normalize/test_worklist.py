"""The rewrite driver's worklist (`rewrites.Worklist`): it applies the same rewrites, at the
same ops, as retrying every op from the top after each rewrite, and tries each op a bounded
number of times, so the attempts grow linearly with the length of a ring (the exhaustive
retry was quadratic). `audit=True` compares the worklist's ops with a walk of the module
after every attempt (every new op found, every erased one forgotten)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jaxlib.mlir import ir

from entangle_mlir.mlir.ir import context, ops_in_order, parse_module
from entangle_mlir.normalize import idioms
from entangle_mlir.normalize.finite import active, judging
from entangle_mlir.normalize.match import erasures
from entangle_mlir.normalize.rewrites import budget, rewrite_idioms
from tests.judging import assuming_no_overflow


def _online(q, k, v, blocks: int):
    """Softmax attention of q over k/v with keys taken `blocks` at a time: a running max and
    accumulators rescaled as each block arrives (the forward of ring attention)."""
    n, width = q.shape[0], k.shape[0] // blocks
    m = jnp.full((n,), -jnp.inf)
    denom = jnp.zeros((n,))
    o = jnp.zeros((n, v.shape[1]))
    for i in range(blocks):
        s = q @ k[i * width:(i + 1) * width].T
        m_new = jnp.maximum(m, jnp.max(s, axis=-1))
        p = jnp.exp(s - m_new[:, None])
        corr = jnp.exp(m - m_new)
        denom = denom * corr + jnp.sum(p, axis=-1)
        o = o * corr[:, None] + p @ v[i * width:(i + 1) * width]
        m = m_new
    return o / denom[:, None]


def _text(blocks: int) -> str:
    args = [np.zeros(shape, np.float32) for shape in ((4, 2), (2 * blocks, 2), (2 * blocks, 3))]
    return jax.jit(lambda q, k, v: _online(q, k, v, blocks)).lower(*args).as_text()


def _retry_everything(module: ir.Module) -> int:
    """The driver the worklist replaced: after each rewrite, walk the module and try every op
    from the top until one fires."""
    count = 0
    with judging() as finiteness, ir.Location.unknown(), erasures() as erased:
        finiteness.forget()
        fired = True
        while fired:
            fired = False
            for name, op in ops_in_order(module):
                if name not in idioms.REWRITES:
                    continue
                active().attempt()
                fired = bool(idioms.REWRITES[name](op))
                if erased:
                    finiteness.forget_erased(erased)
                    erased.clear()
                if fired:
                    finiteness.fired()
                    count += 1
                    break
    return count


@pytest.mark.parametrize("blocks", [3, 6])
def test_worklist_rewrites_as_retrying_every_op(blocks: int) -> None:
    text = _text(blocks)
    with context(), assuming_no_overflow():
        by_worklist = parse_module(text)
        count = rewrite_idioms(by_worklist, audit=True)
        exhaustive = parse_module(text)
        assert _retry_everything(exhaustive) == count > 0
        assert str(by_worklist) == str(exhaustive)


def test_attempts_grow_linearly_with_the_ring() -> None:
    """Ops per attempt stay bounded: doubling the blocks doubles the ops and the rewrites,
    and at most doubles the attempts (retrying every op would quadruple them)."""
    found = {}
    for blocks in (4, 8, 16):
        stats: dict = {}
        with context(), assuming_no_overflow():
            module = parse_module(_text(blocks))
            ops = len(ops_in_order(module))
            rewrites = rewrite_idioms(module, stats=stats)
        found[blocks] = (ops, rewrites, stats["attempts"])
        assert stats["attempts"] <= 3 * ops, found
    for small, large in ((4, 8), (8, 16)):
        assert found[large][2] <= 2.2 * found[small][2], found


def _blocks_of_dots(same_weights: bool) -> str:
    """`concatenate(x1 @ w1, x2 @ w2)` marked as an online softmax's blocks: it sinks through
    the dots (to `concatenate(x1, x2) @ w`) only where both blocks share their weights."""
    w2 = "%w1" if same_weights else "%w2"
    return f"""
func.func @main(%x1: tensor<2x3xf32>, %x2: tensor<2x3xf32>, %w1: tensor<3x4xf32>,
                %w2: tensor<3x4xf32>) -> tensor<4x4xf32> {{
  %a = stablehlo.dot_general %x1, %w1, contracting_dims = [1] x [0]
      : (tensor<2x3xf32>, tensor<3x4xf32>) -> tensor<2x4xf32>
  %b = stablehlo.dot_general %x2, {w2}, contracting_dims = [1] x [0]
      : (tensor<2x3xf32>, tensor<3x4xf32>) -> tensor<2x4xf32>
  %c = stablehlo.concatenate %a, %b, dim = 0 {{entangle.blocks}}
      : (tensor<2x4xf32>, tensor<2x4xf32>) -> tensor<4x4xf32>
  return %c : tensor<4x4xf32>
}}"""


def test_blocks_sink_through_dots_sharing_their_weights() -> None:
    with context():
        module = parse_module(_blocks_of_dots(same_weights=True))
        assert rewrite_idioms(module, audit=True) == 1
        names = [name for name, _ in ops_in_order(module)]
        assert names.index("stablehlo.concatenate") < names.index("stablehlo.dot_general")
        assert names.count("stablehlo.dot_general") == 1


def test_blocks_of_other_weights_stay_and_the_module_with_them() -> None:
    """The nearest wrong program: each block has its own weights, so the concatenation does
    not sink, and the attempt leaves the module as it was. (It used to build the keys'
    concatenation before finding that the weights differ, and leave it dead: a marked
    concatenation that the worklist tried in turn, building another, without end.)"""
    text = _blocks_of_dots(same_weights=False)
    with context():
        module = parse_module(text)
        before = str(module)
        assert rewrite_idioms(module, audit=True) == 0
        assert str(module) == before


def test_a_rewrite_editing_without_firing_cannot_run_forever(monkeypatch) -> None:
    """Termination does not rest on every rewrite keeping its contract: one that builds a new
    marked concatenation each time it is tried, and never fires, is stopped by the budget
    (`audit` fails on its first attempt)."""

    def breaking(concat: ir.Operation) -> int:
        idioms.concat_blocks(list(concat.operands), 0, concat)
        return 0

    monkeypatch.setitem(idioms.REWRITES, "stablehlo.concatenate", breaking)
    with context():
        module = parse_module(_blocks_of_dots(same_weights=False))
        ops = len(ops_in_order(module))
        assert rewrite_idioms(module) == budget(ops)
        with pytest.raises(AssertionError, match="did not fire edited"):
            rewrite_idioms(parse_module(_blocks_of_dots(same_weights=False)), audit=True)
