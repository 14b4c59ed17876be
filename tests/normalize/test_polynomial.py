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

from entangle_mlir.mlir.ir import parse_module
from entangle_mlir.normalize import polynomial
from entangle_mlir.normalize.finite import Finiteness, judging


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


def _decides(fn, *shapes, assume_no_overflow: bool = True) -> bool:
    """`is_zero` on `fn`'s result; the algebra under `--assume-no-overflow` by default (the
    atoms' finiteness is `finite.py`'s, tested apart)."""
    module, root = _root_of(fn, *shapes)
    with module.context, judging(Finiteness(assume_no_overflow)):
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


def test_an_atom_that_may_overflow_is_refused_by_default() -> None:
    """`cleared_denominator` cancels as a polynomial, but its atoms are sums and products of
    inputs, which overflow for large ones (inf / inf is NaN, not 0): zero only under
    `--assume-no-overflow`."""
    fn, *shapes = IDENTITIES["cleared_denominator"]
    with np.errstate(all="ignore"):
        value = np.asarray(fn(np.full((3, 4), 3e38, np.float32), np.ones((4, 2), np.float32)))
    assert np.isnan(value).any()
    assert not _decides(fn, *shapes, assume_no_overflow=False)
    assert _decides(fn, *shapes)


def _leaf(rng) -> tuple:
    return ("x", int(rng.integers(3)))


def _random_tree(rng, depth: int) -> tuple:
    """A random expression tree over three (3, 3) inputs."""
    if depth == 0 or rng.random() < 0.2:
        return _leaf(rng)
    op = ["add", "sub", "mul", "mm", "T", "rows", "div"][int(rng.integers(7))]
    if op in ("T", "rows"):
        return (op, _random_tree(rng, depth - 1))
    if op == "div":
        return (op, _random_tree(rng, depth - 1), ("den", int(rng.integers(3))))
    return (op, _random_tree(rng, depth - 1), _random_tree(rng, depth - 1))


def _evaluate(tree, xs):
    op = tree[0]
    if op == "x":
        return xs[tree[1]]
    if op == "den":
        return jnp.broadcast_to(jnp.sum(xs[tree[1]] ** 2, axis=1)[:, None] + 1.0, (3, 3))
    args = [_evaluate(t, xs) for t in tree[1:]]
    if op == "T":
        return args[0].T
    if op == "rows":
        return jnp.broadcast_to(jnp.sum(args[0], axis=1)[:, None], (3, 3))
    return {"add": jnp.add, "sub": jnp.subtract, "mul": jnp.multiply, "mm": jnp.matmul,
            "div": jnp.divide}[op](*args)


def _rewrite(tree, rng, valid: bool):
    """`tree` with one identity of real arithmetic applied at a random node (`valid`), or
    one change that is usually not one (swapped matmul operands, a transpose dropped, a sum
    over the other dim)."""
    nodes = []

    def walk(t, path):
        nodes.append(path)
        if t[0] not in ("x", "den"):
            for i, child in enumerate(t[1:], 1):
                walk(child, path + (i,))

    walk(tree, ())
    for _ in range(20):
        path = nodes[int(rng.integers(len(nodes)))]
        node = tree
        for i in path:
            node = node[i]
        new = (_identity if valid else _mutation)(node, rng)
        if new is not None:
            return _replace_at(tree, path, new)
    return None


def _identity(t, rng):
    op = t[0]
    choices = []
    if op in ("add", "mul"):
        choices.append((op, t[2], t[1]))
    if op == "mm" and t[2][0] == "add":
        choices.append(("add", ("mm", t[1], t[2][1]), ("mm", t[1], t[2][2])))
    if op == "mul" and t[2][0] == "sub":
        choices.append(("sub", ("mul", t[1], t[2][1]), ("mul", t[1], t[2][2])))
    if op == "T" and t[1][0] == "mm":
        choices.append(("mm", ("T", t[1][2]), ("T", t[1][1])))
    if op == "T" and t[1][0] in ("add", "sub", "mul"):
        choices.append((t[1][0], ("T", t[1][1]), ("T", t[1][2])))
    if op == "mm" and t[1][0] == "mm":
        choices.append(("mm", t[1][1], ("mm", t[1][2], t[2])))
    if op == "rows" and t[1][0] in ("add", "sub"):
        choices.append((t[1][0], ("rows", t[1][1]), ("rows", t[1][2])))
    if op == "div":
        choices.append(("div", ("mul", t[1], t[2]), ("mul", t[2], t[2])))
    choices.append(("T", ("T", t)))
    return choices[int(rng.integers(len(choices)))]


def _mutation(t, rng):
    op = t[0]
    if op == "mm":
        return ("mm", t[2], t[1])
    if op == "T":
        return t[1]
    if op == "rows":
        return ("rows", ("T", t[1]))
    if op == "sub":
        return ("sub", t[2], t[1])
    if op == "div" and t[2][0] == "den":
        return ("div", t[1], ("den", (t[2][1] + 1) % 3))
    return None


def _replace_at(tree, path, new):
    if not path:
        return new
    i = path[0]
    return tree[:i] + (_replace_at(tree[i], path[1:], new),) + tree[i + 1:]


def _difference(a, b):
    return lambda x0, x1, x2: _evaluate(a, (x0, x1, x2)) - _evaluate(b, (x0, x1, x2))


def test_random_identities_are_zero_and_changes_never_called_zero_wrongly() -> None:
    """Random expressions against a twin rewritten by identities of real arithmetic (operands
    commuted, products distributed, transposes of products and sums, matmuls reassociated,
    row sums split, a quotient expanded) are zero; against a twin changed so that it usually
    differs (matmul operands swapped, a transpose dropped, a difference reversed, the other
    denominator) they are called zero only when they evaluate to zero."""
    rng = np.random.default_rng(11)
    shapes = [(3, 3)] * 3
    changed_zero = changed_nonzero = 0
    for trial in range(100):
        tree = _random_tree(rng, 4)
        twin = tree
        for _ in range(1 + int(rng.integers(3))):
            twin = _rewrite(twin, rng, valid=True)
        same = _difference(tree, twin)
        scale = 1 + _evaluated(lambda *x, t=tree: _evaluate(t, x), *shapes, seed=trial)
        assert _evaluated(same, *shapes, seed=trial) <= 1e-4 * scale
        assert _decides(same, *shapes), (tree, twin)
        wrong = _rewrite(twin, rng, valid=False)
        if wrong is None:
            continue
        changed = _difference(tree, wrong)
        value = _evaluated(changed, *shapes, seed=trial)
        if value > 1e-3 * scale:
            changed_nonzero += 1
            assert not _decides(changed, *shapes), (tree, wrong, value)
        else:
            changed_zero += 1
    assert changed_nonzero >= 40
