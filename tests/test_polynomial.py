"""`polynomial.is_zero`: a value is zero in real arithmetic when its einsum polynomial over
the values it reads cancels. Each case is grounded by evaluating the function on random
inputs: the identities evaluate to zero up to rounding, the near misses (a contraction's
operands swapped, a sum taken over the wrong dim, a bound index paired the other way, a
denominator that differs) do not, and the procedure must say "zero" for the former only. A
random search over expressions (`test_random_expressions_are_never_called_zero_wrongly`)
checks that "zero" is never said of a value that is not."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from entangle_mlir import polynomial
from entangle_mlir.ir import parse_module


def _root_of(fn, *shapes):
    """The module of `fn` lowered at `shapes` and the value its main function returns."""
    specs = [jax.ShapeDtypeStruct(s, jnp.float32) for s in shapes]
    module = parse_module(jax.jit(fn).lower(*specs).as_text())
    main = next(op for op in module.body.operations if "main" in str(op.attributes["sym_name"]))
    ret = list(main.regions[0].blocks[0].operations)[-1]
    return module, ret.operands[0]


def _evaluated(fn, *shapes, seed: int = 0) -> float:
    rng = np.random.default_rng(seed)
    args = [rng.uniform(0.5, 1.5, s).astype(np.float32) for s in shapes]
    return float(np.max(np.abs(np.asarray(fn(*args)))))


def _decides(fn, *shapes) -> bool:
    module, root = _root_of(fn, *shapes)
    with module.context:
        return polynomial.is_zero(root)


IDENTITIES = {
    "commuted_product": (lambda a, b: a * b - b * a, (3, 4), (3, 4)),
    "sum_of_matmul": (lambda a, b: jnp.sum(a @ b, axis=1) - a @ jnp.sum(b, axis=1),
                      (3, 4), (4, 5)),
    "transpose_of_matmul": (lambda a, b: (a @ b).T - b.T @ a.T, (3, 4), (4, 5)),
    "distributed": (lambda a, b, c: a @ (b + c) - a @ b - a @ c, (2, 3), (3, 4), (3, 4)),
    "bound_renamed": (lambda a, b: jnp.einsum("ij,jk->", a, b) - jnp.einsum("kj,ji->", a, b),
                      (3, 3), (3, 3)),
    "cleared_denominator": (lambda x, w: jnp.sum(x @ w, axis=1) / jnp.sum(x, axis=1)
                            - jnp.sum(x @ w, axis=1) * jnp.sum(x, axis=1)
                            / (jnp.sum(x, axis=1) * jnp.sum(x, axis=1)), (3, 4), (4, 2)),
    "online_step": (lambda c, p, v, o, l, g: (
        jnp.sum(g * (o * c[:, None] + p @ v), axis=1) + jnp.sum(g, axis=1) * (l * c + p.sum(1))
        - c * (jnp.sum(g * o, axis=1) + jnp.sum(g, axis=1) * l)
        - jnp.sum((g @ v.T + jnp.sum(g, axis=1)[:, None]) * p, axis=1)),
        (3,), (3, 4), (4, 2), (3, 2), (3,), (3, 2)),
}

NEAR_MISSES = {
    "swapped_matmul": (lambda a, b: a @ b - b @ a, (3, 3), (3, 3)),
    "product_of_sums": (lambda a, b: jnp.sum(a * b) - jnp.sum(a) * jnp.sum(b), (3,), (3,)),
    "paired_other_way": (lambda a, b: jnp.einsum("ij,ji->", a, b) - jnp.einsum("ij,ij->", a, b),
                         (3, 3), (3, 3)),
    "wrong_dim": (lambda a: jnp.sum(a, axis=0) - jnp.sum(a, axis=1), (3, 3)),
    "other_denominator": (lambda x, y: x / jnp.sum(y) - x / jnp.sum(x), (3,), (3,)),
    "online_step_missing_term": (lambda c, p, v, o, l, g: (
        jnp.sum(g * (o * c[:, None] + p @ v), axis=1) + jnp.sum(g, axis=1) * (l * c + p.sum(1))
        - c * (jnp.sum(g * o, axis=1) + jnp.sum(g, axis=1) * l)
        - jnp.sum((g @ v.T) * p, axis=1)),
        (3,), (3, 4), (4, 2), (3, 2), (3,), (3, 2)),
}


@pytest.mark.parametrize("name", list(IDENTITIES))
def test_identities_are_zero(name: str) -> None:
    fn, *shapes = IDENTITIES[name]
    assert _evaluated(fn, *shapes) < 1e-4
    assert _decides(fn, *shapes)


@pytest.mark.parametrize("name", list(NEAR_MISSES))
def test_near_misses_are_not_zero(name: str) -> None:
    fn, *shapes = NEAR_MISSES[name]
    assert _evaluated(fn, *shapes) > 1e-3
    assert not _decides(fn, *shapes)


def test_an_atom_that_may_be_infinite_is_refused() -> None:
    """`x * e - e * x` cancels as a polynomial, but with e = exp(-inf - -inf) = NaN it is NaN."""
    def fn(x):
        m = jnp.full((3,), -jnp.inf) + 0 * x
        e = jnp.exp(m - m)
        return x * e - e * x

    assert np.isnan(np.asarray(fn(np.ones(3, np.float32)))).all()
    assert not _decides(fn, (3,))


def _random_expression(rng: np.random.Generator, depth: int):
    """A random expression over three (3, 3) inputs and its "twin" (equal by algebra, or
    changed by one mutation)."""
    ops = ["add", "sub", "mul", "matmul", "transpose", "rowsum"]

    def build(d):
        if d == 0 or rng.random() < 0.2:
            i = int(rng.integers(3))
            return (lambda a, i=i: a[i]), f"x{i}"
        op = ops[int(rng.integers(len(ops)))]
        left, lt = build(d - 1)
        right, rt = build(d - 1)
        if op == "add":
            return (lambda a: left(a) + right(a)), f"({lt}+{rt})"
        if op == "sub":
            return (lambda a: left(a) - right(a)), f"({lt}-{rt})"
        if op == "mul":
            return (lambda a: left(a) * right(a)), f"({lt}*{rt})"
        if op == "matmul":
            return (lambda a: left(a) @ right(a)), f"({lt}@{rt})"
        if op == "transpose":
            return (lambda a: left(a).T), f"{lt}.T"
        return (lambda a: jnp.broadcast_to(jnp.sum(left(a), axis=1)[:, None], (3, 3))), \
            f"rows({lt})"

    return build(depth)


def test_random_expressions_are_never_called_zero_wrongly() -> None:
    """Differences of two random expressions (often equal: an expression against itself
    rebuilt, or with its operands commuted where that is exact) are called zero only when they
    evaluate to zero."""
    rng = np.random.default_rng(7)
    said_zero = 0
    for trial in range(60):
        f, ft = _random_expression(rng, 3)
        g, gt = (f, ft) if trial % 3 == 0 else _random_expression(rng, 3)

        def diff(x0, x1, x2, f=f, g=g):
            return f((x0, x1, x2)) - g((x0, x1, x2))

        shapes = [(3, 3)] * 3
        value = _evaluated(diff, *shapes, seed=trial)
        scale = 1 + _evaluated(lambda *a, f=f: f(a), *shapes, seed=trial)
        zero = _decides(diff, *shapes)
        if zero:
            said_zero += 1
            assert value <= 1e-4 * scale, (ft, gt, value)
    assert said_zero >= 15
