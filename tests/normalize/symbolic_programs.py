"""Programs lowered by jax, rewritten by entangle-normalize's rewrites, and compared by Z3.

A lemma of a rewrite is checked on the rewrite as built: the program before and after
`rewrites.rewrite_idioms` run on the same symbolic inputs (integers as Z3 integers in their
dtype's range, floats as reals) with the verifier's semantics (`semantics/ops.py`), and Z3
asked whether every output element agrees, under optional hypotheses on the inputs. Two
different programs are compared the same way (a wrong variant must be refuted)."""

from __future__ import annotations

from collections.abc import Callable

import jax
import numpy as np
import z3

from entangle_mlir.mlir.ir import parse_module
from entangle_mlir.mlir.program import inline_calls
from entangle_mlir.normalize.rewrites import rewrite_idioms
from entangle_mlir.semantics.element import to_z3
from entangle_mlir.semantics.tensor import obj_array
from tests.semantics.test_semantics import _functions, _interpret

INT32 = (-(1 << 31), (1 << 31) - 1)


def lowered(fn: Callable, *avals):
    """The module of `jax.jit(fn)` at `avals`, calls inlined."""
    module = parse_module(jax.jit(fn).lower(*avals).as_text())
    inline_calls(module, "-")
    return module


def rewritten(fn: Callable, *avals) -> tuple[object, object, int]:
    """(the module before, the module after the rewrites, the number applied)."""
    before = lowered(fn, *avals)
    after = lowered(fn, *avals)
    with after.context:
        count = rewrite_idioms(after)
    return before, after, count


def op_names(module) -> set[str]:
    """The names of the ops of `main` (the callees inlined into it stay behind, unused)."""
    names: set[str] = set()

    def visit(op):
        names.add(op.name)
        return 0  # ir.WalkResult.ADVANCE

    _functions(module)["main"].walk(visit)
    return names


def symbols(avals, prefix: str = "a") -> tuple[list[np.ndarray], list]:
    """Symbolic inputs for `avals` and the facts that integers lie in their dtype's range."""
    inputs, facts = [], []
    for k, aval in enumerate(avals):
        array = np.empty(aval.shape, dtype=object)
        integer = np.issubdtype(aval.dtype, np.integer)
        for idx in np.ndindex(aval.shape):
            name = f"{prefix}{k}_" + "_".join(map(str, idx))
            array[idx] = z3.Int(name) if integer else z3.Real(name)
            if integer:
                facts += [array[idx] >= INT32[0], array[idx] <= INT32[1]]
        inputs.append(obj_array(array))
    return inputs, facts


def outputs(module, inputs: list) -> list:
    return _interpret(_functions(module)["main"], inputs, _functions(module), set())


def compare(first, second, avals, hypotheses: Callable[[list], list] = lambda xs: []
            ) -> str:
    """"proved" when the two modules' outputs agree on every input satisfying
    `hypotheses(inputs)`, "refuted" when Z3 finds one where they differ, else "unknown"."""
    inputs, facts = symbols(avals)
    a, b = outputs(first, inputs), outputs(second, inputs)
    claims = [to_z3(x) == to_z3(y) for out_a, out_b in zip(a, b, strict=True)
              for x, y in zip(np.ravel(out_a), np.ravel(out_b), strict=True)]
    # A fresh context: Z3's search order follows its terms' ids, which depend on what the
    # process asked before (an argsort of 4 rows, 0.7 s here, ran past 60 s in a CI worker).
    context = z3.Context()
    solver = z3.Solver(ctx=context)
    solver.set("timeout", 60_000)
    for fact in (*facts, *hypotheses(inputs), z3.Not(z3.And(claims))):
        solver.add(fact.translate(context))
    answer = solver.check()
    return "proved" if answer == z3.unsat else "refuted" if answer == z3.sat else "unknown"
