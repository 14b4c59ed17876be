"""An iota whose dtype does not hold its positions: `jnp.arange(256, dtype=jnp.int8)` wraps
to -128 at position 128, a uint8 iota of 512 restarts at 0, a bf16 iota of 512 rounds 257 to
256. XLA computes exactly that; the verifier read every iota as its positions.

Found by the attacker (benchmarks/ATTACK_RESULTS.md, session 9): a device's slice of a
replicated int8 iota of 256 compared `>= 0` was proven to keep every column (the general tier
and the rule semantics evaluated the iota as 0..255), and a reference's uint8 iota of 512 was
proven equal to the sharded program's unwrapped column index. `terms.make_iota` now builds
such an iota as the narrowing (or rounding) convert of the positions' i64 iota, and the op
semantics (`ops._op_iota`) convert the positions to the result dtype. Checked here against
XLA's numbers, and by grounded program pairs (the correct twins stay proven)."""

from __future__ import annotations

import os

if "--xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                               + " --xla_force_host_platform_device_count=8").strip()

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.sharding import PartitionSpec as P

from entangle_mlir.core.terms import make_iota
from entangle_mlir.driver import check_texts
from entangle_mlir.mlir.opinfo import OpInfo, TensorType
from entangle_mlir.semantics.evaluate import evaluate_term
from entangle_mlir.semantics.ops import OP_SEMANTICS
from tests.jax_runs import run_and_lower

IOTAS = [("i8", jnp.int8, 256), ("ui8", jnp.uint8, 512), ("i16", jnp.int16, 40000),
         ("bf16", jnp.bfloat16, 512), ("f16", jnp.float16, 4100), ("i32", jnp.int32, 300)]


def _xla(dtype, n: int) -> list[float]:
    return [float(v) for v in np.asarray(jax.jit(lambda: lax.iota(dtype, n))())]


@pytest.mark.parametrize(("name", "dtype", "n"), IOTAS, ids=[i[0] for i in IOTAS])
def test_iota_values_are_xlas(name: str, dtype, n: int) -> None:
    """The iota term and the op semantics give XLA's values; reading the iota as its
    positions (the old model) is wrong wherever the dtype does not hold them."""
    want = _xla(dtype, n)
    term = [float(v) for v in evaluate_term(make_iota((n,), 0, name), {}).flat]
    info = OpInfo("stablehlo.iota", {"iota_dimension": 0}, [], [TensorType((n,), name)])
    op = [float(v) for v in OP_SEMANTICS["stablehlo.iota"](info, [])[0].flat]
    assert term == want and op == want
    assert (want == [float(k) for k in range(n)]) == (name == "i32")


def _slice_of(dtype, n: int):
    def body(x):
        mine = lax.dynamic_slice_in_dim(jnp.arange(n, dtype=dtype),
                                        lax.axis_index("d") * (n // 4), n // 4)
        return jnp.where(mine[None, :] < dtype(100), x, 0.0)
    return body


def _unwrapped_columns(x):
    return x * (lax.axis_index("d") * 128 + jnp.arange(128))[None, :].astype(jnp.float32)


def _wrapped_columns(x):
    cols = (lax.axis_index("d") * 128 + jnp.arange(128)) % 256
    return x * cols[None, :].astype(jnp.float32)


def _below_100(x):
    return jnp.where(jnp.arange(512)[None, :] < 100, x, 0.0)


def _uint8_columns(x):
    return x * jnp.arange(512, dtype=jnp.uint8)[None, :].astype(jnp.float32)


PAIRS = {
    # name: (reference, sharded body, computes the reference's numbers)
    "int8_iota_below_100": (_below_100, _slice_of(jnp.int8, 512), False),
    "int16_iota_below_100": (_below_100, _slice_of(jnp.int16, 512), True),
    "uint8_reference_unwrapped": (_uint8_columns, _unwrapped_columns, False),
    "uint8_reference_wrapped": (_uint8_columns, _wrapped_columns, True),
}


@pytest.mark.parametrize("name", list(PAIRS))
def test_narrow_iota_programs_are_judged(name: str) -> None:
    reference, body, correct = PAIRS[name]
    x = np.random.default_rng(0).standard_normal((4, 512)).astype(np.float32)
    want, got, texts = run_and_lower(reference, body, [x], (P(None, "d"),), P(None, "d"))
    assert np.array_equal(want, got) == correct
    report = check_texts(*texts, verify_rules=correct)
    assert report.proven == correct, report.render_text()
    if correct:
        assert " 0 refuted, 0 inconclusive" in report.mode, report.mode
