"""Issue 16, class 6: `x * 0 -> 0` (and `x - x -> 0`) only where `x` is shown finite.

`0 * x` is NaN where `x` is inf, and `x - x` is NaN there too. The inputs hold no NaN/Inf
(a stated liberty), but values computed from them can overflow: `exp(100)` and
`3e38 + 3e38` are inf in float32. So the term builder folds a multiplication by zero, a
cancellation in a linear form and a zero-scaled sum to zero only where the other factor (the
cancelled term) is shown finite by `terms.term_interval`; elsewhere the term keeps the zero
multiple (`zero_multiple`), which a twin computing the same product meets again.

Grounded: each pair runs on 4 simulated devices with chosen inputs (x = 100 where exp
overflows, x = 3e38 where x + x does). A sharded program adding such a zero where the
reference adds nothing computes NaN where the reference is finite, and is not proven; its
correct twins (the product in both programs, a finite factor, relu's backward, a
`where(mask, exp(x), 0)`) compute the same numbers and are proven.
"""

from __future__ import annotations

import os

if "--xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                               + " --xla_force_host_platform_device_count=8")

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from entangle_mlir.core import terms
from entangle_mlir.core.terms import term_finite, term_interval
from entangle_mlir.driver import check_texts
from examples.real.catalog import Example, custom, lower_pair, make_mesh, sharded_fn
from examples.real.programs import ArgDef

TP = "tp"
MESH = (("tp", 4),)
ARGS = (ArgDef("x", (8, 16), "float32", "data", P(None, TP)),
        ArgDef("y", (8, 16), "float32", "data", P(None, TP)))


def _ex(name: str, reference, body) -> Example:
    return custom(f"zero_{name}", MESH, reference, body, ARGS, P(None, TP), name)


def _inputs(x_value: float) -> tuple[np.ndarray, np.ndarray]:
    """x around `x_value` (a few elements exactly it), y ordinary values."""
    rng = np.random.default_rng(0)
    x = np.full((8, 16), x_value, dtype=np.float32)
    x[::2] = rng.standard_normal((4, 16)).astype(np.float32)
    return x, rng.standard_normal((8, 16)).astype(np.float32)


def _run(ex: Example, x_value: float) -> tuple[np.ndarray, np.ndarray]:
    """(reference, sharded) outputs on the chosen inputs, the sharded one on 4 devices."""
    x, y = _inputs(x_value)
    ref = np.asarray(jax.jit(ex.reference)(x, y))
    mesh = make_mesh(ex)
    placed = [jax.device_put(v, NamedSharding(mesh, a.spec)) for v, a in zip((x, y), ex.args)]
    out = jax.tree.leaves(sharded_fn(ex)(*placed))
    return ref, np.asarray(out[0])


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    """Equal numbers, NaN where the other is NaN (both programs computing NaN agree)."""
    return a.shape == b.shape and bool(np.all(np.isnan(a) == np.isnan(b))) and np.allclose(
        a[~np.isnan(a)], b[~np.isnan(b)], rtol=1e-5, atol=1e-5)


# ----- programs -------------------------------------------------------------------------------

def plain_y(x, y):
    """The reference: `x * 0` of the (finite) input is zero, so this is `2 y` (jax drops an
    unused argument, so the reference reads x this way)."""
    return y * 2.0 + x * 0.0


def y_plus_exp_times_zero(x, y):
    return y * 2.0 + jnp.exp(x) * 0.0


def y_plus_doubled_times_zero(x, y):
    return y * 2.0 + (x + x) * 0.0


def y_plus_exp_minus_exp(x, y):
    e = jnp.exp(x)
    return y * 2.0 + (e - e)


def y_plus_x_times_zero(x, y):
    """A finite factor: the input x is finite (assumed), so x * 0 is 0."""
    return y * 2.0 + 0.0 * x


def y_plus_x_minus_x(x, y):
    return y * 2.0 + (x - x)


def y_plus_bounded_exp_times_zero(x, y):
    """exp(tanh(x)) lies in [1/e, e]: finite, so times 0 is 0."""
    return y * 2.0 + jnp.exp(jnp.tanh(x)) * 0.0


def y_plus_shifted_exp_times_zero(x, y):
    """exp(x - max(x)) lies in (0, 1]: finite, so times 0 is 0 (the softmax shift)."""
    return y * 2.0 + jnp.exp(x - jnp.max(x, axis=0, keepdims=True)) * 0.0


def exp_ref(x, y):
    return jnp.exp(x) * 0.0 + y


def relu_grad(x, y):
    """relu's backward: jax transposes it to `select(x > 0, g, 0)`."""
    return jax.grad(lambda a: jnp.sum(jax.nn.relu(a) * y))(x)


def where_exp(x, y):
    return jnp.where(x > y, jnp.exp(x), 0.0)


def plain_zeros(x, y):
    return y + x[:, :1] * 0.0


def contraction_ref(x, y):
    return y + jnp.exp(x) @ jnp.zeros((16, 16), jnp.float32)


def contraction_with_zeros(x, y):
    """`exp(x) @ 0` over the split dim, psummed: NaN rows where exp(x) overflows."""
    return y + lax.psum(jnp.exp(x) @ jnp.zeros((4, 16), jnp.float32), TP)


WRONG = [
    ("exp_times_zero", plain_y, y_plus_exp_times_zero, 100.0),
    ("doubled_times_zero", plain_y, y_plus_doubled_times_zero, 3e38),
    ("exp_minus_exp", plain_y, y_plus_exp_minus_exp, 100.0),
]

RIGHT = [
    ("x_times_zero", plain_y, y_plus_x_times_zero, 3e38),
    ("x_minus_x", plain_y, y_plus_x_minus_x, 3e38),
    ("bounded_exp_times_zero", plain_y, y_plus_bounded_exp_times_zero, 100.0),
    ("shifted_exp_times_zero", plain_y, y_plus_shifted_exp_times_zero, 100.0),
    ("same_overflowing_product", exp_ref, exp_ref, 100.0),
    ("same_doubled_product", y_plus_doubled_times_zero, y_plus_doubled_times_zero, 3e38),
    ("relu_grad", relu_grad, relu_grad, 3e38),
    ("where_exp", where_exp, where_exp, 100.0),
]


@pytest.mark.parametrize("name,reference,body,x_value", WRONG, ids=[w[0] for w in WRONG])
def test_a_zero_from_an_overflowing_value_is_not_proven(name, reference, body, x_value) -> None:
    ex = _ex(name, reference, body)
    ref, shd = _run(ex, x_value)
    assert np.isfinite(ref).all() and np.isnan(shd).any() and not _same(ref, shd), shd
    report = check_texts(*lower_pair(ex))
    assert not report.proven, report.render_text()


@pytest.mark.parametrize("name,reference,body,x_value", RIGHT, ids=[r[0] for r in RIGHT])
def test_the_correct_twins_are_proven_and_equal(name, reference, body, x_value) -> None:
    ex = _ex(name, reference, body)
    for value in (0.0, x_value):
        ref, shd = _run(ex, value)
        assert _same(ref, shd), (value, ref, shd)
    report = check_texts(*lower_pair(ex))
    assert report.proven, report.render_text()


CONTRACTION_ARGS = (ArgDef("x", (8, 16), "float32", "data", P(None, TP)),
                    ArgDef("y", (8, 16), "float32", "data", P()))


@pytest.mark.parametrize("reference,proven", [(plain_zeros, False), (contraction_ref, True)],
                         ids=["against_zeros", "against_the_same_contraction"])
def test_a_contraction_with_a_zero_operand(reference, proven) -> None:
    """Against the reference's zeros the psummed `exp(x) @ 0` is NaN where exp overflows:
    not proven; against the same contraction in the reference it is proven."""
    ex = custom(f"zero_contraction_{reference.__name__}", MESH, reference,
                contraction_with_zeros, CONTRACTION_ARGS, P(), "contraction with zeros")
    ref, shd = _run(ex, 100.0)
    assert np.isnan(shd).any() and _same(ref, shd) == proven, (ref, shd)
    report = check_texts(*lower_pair(ex))
    assert report.proven == proven, report.render_text()


# ----- the term builder and the bound analysis ------------------------------------------------

def test_term_zero_folds_need_a_finite_factor() -> None:
    x = terms.make_arg(0, (4,), "f32")
    zero = terms.make_splat(0, (4,), "f32")
    e = terms.make_elementwise("stablehlo.exponential", (x,))
    doubled = terms.make_add(x, x)
    bounded = terms.make_elementwise("stablehlo.exponential", (
        terms.make_elementwise("stablehlo.tanh", (x,)),))
    assert terms.make_mul(x, zero) is zero and terms.make_sub(x, x) is zero
    assert terms.make_mul(bounded, zero) is zero
    for t in (e, doubled):
        kept = terms.make_mul(t, zero)
        assert terms.is_zero_multiple(kept) and kept is terms.zero_multiple(t)
        assert terms.make_mul(zero, t) is kept
    assert terms.make_sub(e, e) is terms.zero_multiple(e)
    y = terms.make_arg(1, (4,), "f32")
    assert terms.make_sub(terms.make_add(y, e), e) is terms.make_add(y, terms.zero_multiple(e))
    # a zero multiple absorbs further zeros and cancels to itself (0 * nan = nan - nan = nan)
    z = terms.zero_multiple(e)
    assert terms.make_mul(z, zero) is z and terms.make_sub(z, z) is z
    # integers wrap: 0 * x and x - x are exactly 0 at any width
    i = terms.make_arg(2, (4,), "i32")
    izero = terms.make_splat(0, (4,), "i32")
    assert terms.make_mul(terms.make_add(i, i), izero) is izero


def test_term_interval_follows_the_dtype() -> None:
    x = terms.make_arg(3, (4,), "f32")
    h = terms.make_arg(4, (4,), "f16")
    assert term_finite(x) and not term_finite(terms.make_add(x, x))
    assert term_interval(terms.make_elementwise("stablehlo.logistic", (x,))) == (0.0, 1.0)
    small = terms.make_elementwise("stablehlo.tanh", (x,))
    assert term_finite(terms.make_elementwise("stablehlo.exponential", (small,)))
    assert not term_finite(terms.make_elementwise("stablehlo.exponential", (x,)))
    # sqrt of a possibly negative value may be NaN: not finite though bounded
    assert not term_finite(terms.make_elementwise("stablehlo.sqrt", (small,)))
    assert term_finite(terms.make_elementwise("stablehlo.sqrt", (
        terms.make_elementwise("stablehlo.logistic", (x,)),)))
    # 300 * tanh fits f32 but not ... a product of two f16 values of 300 overflows f16
    k = terms.scale(terms.make_elementwise("stablehlo.tanh", (h,)), 300)
    assert term_finite(k) and not term_finite(terms.make_mul(k, k))
    # the softmax shift: x - max(x) <= 0, so its exp is in (0, 1]; not so for x - min(x)
    wide = terms.make_arg(7, (8, 16), "f32")
    for reducer, bounded in (("reduce_max", True), ("reduce_min", False)):
        top = terms.intern(reducer, (wide,), ((0,),), (16,), "f32")
        shift = terms.make_broadcast(terms.make_reshape(top, (1, 16)), (0, 1), (8, 16))
        shifted = terms.make_elementwise("stablehlo.exponential", (terms.make_sub(wide, shift),))
        assert term_finite(shifted) == bounded
    iota = terms.make_iota((16,), 0, "f32")
    assert term_interval(iota) == (0.0, 15.0)
    dot = terms.make_dot(terms.make_elementwise("stablehlo.tanh", (
        terms.make_arg(5, (2, 8), "f32"),)), terms.make_elementwise("stablehlo.tanh", (
            terms.make_arg(6, (8, 3), "f32"),)), ((), (), (1,), (0,)), (2, 3), "f32")
    assert term_interval(dot) == (-8.0, 8.0)
