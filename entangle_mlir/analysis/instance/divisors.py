"""Whether two terms divide by the same values (`same_divisors`), for the term-equality check.

Z3 proves two terms equal only where every divisor either computes is nonzero; where one term
divides by zero it computes inf or NaN, so the other must divide by that value too. The two
terms are evaluated apart, each into its own z3 expressions, and the same value comes out
spelled differently when the terms differ: a pipeline's microbatched side and the whole-batch
reference build `x * rsqrt(v) * w` from different term nodes, whose factors the term builders
order by serial, so one side's product is `(* w x (rsqrt v))` and the other's
`(* x (rsqrt v) w)`. z3 hash-conses expressions (equal spellings share one id) but does not
order the operands of `+` and `*`, so the ids differ.

So divisors are compared by a canonical key (`CanonicalKeys`): the expression with the operands
of every `+` and `*` flattened and sorted; equal keys mean the two expressions are equal up to
commutativity and associativity of exact addition and multiplication, which z3's integers and
reals have. The few left unmatched (another regrouping: a distributed constant) are matched by
a Z3 equality proof, bounded in count, size and time; past the bounds they are not matched,
and the terms are not proven.
"""

from __future__ import annotations

import z3

from entangle_mlir.analysis.solver import prove
from entangle_mlir.semantics.element import is_z3

MAX_KEY_NODES = 200_000
"""The most distinct z3 nodes the canonical keys of one comparison walk (past it: no key, so
no match by key)."""

MAX_LONE_DIVISORS = 4
"""The most divisors (of both terms together) whose keys found no twin that Z3 proofs look a
twin for (at most 2 x 2 pairs, each way: 8 proofs a comparison)."""

MAX_LONE_NODES = 2_000
"""The largest divisor (distinct z3 nodes) a twin is looked for by a Z3 proof."""

LONE_TIMEOUT_MS = 1_000
"""Each twin proof's budget."""

_AC_KINDS = frozenset({z3.Z3_OP_ADD, z3.Z3_OP_MUL, z3.Z3_OP_AND, z3.Z3_OP_OR})
"""Operators whose operands may be regrouped and reordered without changing the value: exact
addition and multiplication of z3's integers and reals, conjunction and disjunction."""


class CanonicalKeys:
    """Canonical keys of z3 expressions, one table shared by every expression keyed: equal
    keys exactly when the expressions are equal up to the order and grouping of the operands
    of `+`, `*`, `and`, `or` (`_AC_KINDS`). Each distinct z3 node is visited once (memo by
    its id: expressions are DAGs), at most `MAX_KEY_NODES` in all."""

    def __init__(self, max_nodes: int = MAX_KEY_NODES) -> None:
        self.max_nodes = max_nodes
        self._by_id: dict[int, int] = {}
        self._table: dict[tuple, int] = {}
        self._flat: dict[int, tuple[int, tuple[int, ...]]] = {}

    def key(self, expr: z3.ExprRef) -> int | None:
        """The key of `expr`, or None past the node budget."""
        ctx = expr.ctx.ref()
        root = expr.as_ast()
        stack = [(root, False)]
        while stack:
            if len(self._by_id) > self.max_nodes:
                return None
            ast, expanded = stack.pop()
            ident = z3.Z3_get_ast_id(ctx, ast)
            if ident in self._by_id:
                continue
            if z3.Z3_get_ast_kind(ctx, ast) != z3.Z3_APP_AST:
                self._by_id[ident] = self._intern(("ast", ident))
                continue
            app = z3.Z3_to_app(ctx, ast)
            count = z3.Z3_get_app_num_args(ctx, app)
            if count == 0:
                self._by_id[ident] = self._intern(("ast", ident))  # hash-consed: id is exact
                continue
            args = [z3.Z3_get_app_arg(ctx, app, i) for i in range(count)]
            if not expanded:
                stack.append((ast, True))
                stack.extend((a, False) for a in args
                             if z3.Z3_get_ast_id(ctx, a) not in self._by_id)
                continue
            decl = z3.Z3_get_app_decl(ctx, app)
            decl_id = z3.Z3_get_ast_id(ctx, z3.Z3_func_decl_to_ast(ctx, decl))
            children = [self._by_id[z3.Z3_get_ast_id(ctx, a)] for a in args]
            if z3.Z3_get_decl_kind(ctx, decl) in _AC_KINDS:
                flat: list[int] = []
                for child in children:
                    inner = self._flat.get(child)
                    flat.extend(inner[1] if inner is not None and inner[0] == decl_id
                                else (child,))
                children = sorted(flat)
            shape = (decl_id, tuple(children))
            self._by_id[ident] = key = self._intern(shape)
            self._flat.setdefault(key, shape)
        return self._by_id[z3.Z3_get_ast_id(ctx, root)]

    def size(self, expr: z3.ExprRef) -> int:
        """The number of distinct z3 nodes under `expr` (counted up to `MAX_LONE_NODES` + 1)."""
        ctx = expr.ctx.ref()
        seen: set[int] = set()
        stack = [expr.as_ast()]
        while stack and len(seen) <= MAX_LONE_NODES:
            ast = stack.pop()
            ident = z3.Z3_get_ast_id(ctx, ast)
            if ident in seen:
                continue
            seen.add(ident)
            if z3.Z3_get_ast_kind(ctx, ast) == z3.Z3_APP_AST:
                app = z3.Z3_to_app(ctx, ast)
                stack.extend(z3.Z3_get_app_arg(ctx, app, i)
                             for i in range(z3.Z3_get_app_num_args(ctx, app)))
        return len(seen)

    def _intern(self, shape: tuple) -> int:
        return self._table.setdefault(shape, len(self._table))


def same_divisors(first: list, second: list) -> bool:
    """Whether the terms that divided by `first` and by `second` (z3 expressions, or concrete
    zeros) divide by the same values: each value of one list equals one of the other's, by
    z3 id, by canonical key (`CanonicalKeys`), or, for at most `MAX_LONE_DIVISORS` small ones
    left over, by a Z3 proof. False whenever a bound is passed."""
    def plain(value):
        return value.get_id() if is_z3(value) else ("c", value)

    plain_first, plain_second = {plain(d) for d in first}, {plain(d) for d in second}
    if plain_first == plain_second:
        return True
    lone_first = _distinct([d for d in first if plain(d) not in plain_second], plain)
    lone_second = _distinct([d for d in second if plain(d) not in plain_first], plain)
    if not all(is_z3(d) for d in lone_first + lone_second):
        return False
    keys = CanonicalKeys()
    by_key_first = _by_key(lone_first, keys)
    by_key_second = _by_key(lone_second, keys)
    if by_key_first is None or by_key_second is None:
        return False
    left = [d for k, d in by_key_first.items() if k not in by_key_second]
    right = [d for k, d in by_key_second.items() if k not in by_key_first]
    if not left and not right:
        return True
    if not left or not right or len(left) + len(right) > MAX_LONE_DIVISORS:
        return False
    if any(keys.size(d) > MAX_LONE_NODES for d in left + right):
        return False
    return (all(_has_twin(d, right) for d in left)
            and all(_has_twin(d, left) for d in right))


def _distinct(values: list, plain) -> list:
    """`values` without repeats (by z3 id)."""
    seen: dict = {}
    for value in values:
        seen.setdefault(plain(value), value)
    return list(seen.values())


def _by_key(values: list, keys: CanonicalKeys) -> dict[int, z3.ExprRef] | None:
    """The values by canonical key, or None past the key budget."""
    out: dict[int, z3.ExprRef] = {}
    for value in values:
        key = keys.key(value)
        if key is None:
            return None
        out.setdefault(key, value)
    return out


def _has_twin(divisor: z3.ExprRef, others: list) -> bool:
    """Whether Z3 proves `divisor` equal to one of `others` (for every value of everything in
    them), each proof within `LONE_TIMEOUT_MS`."""
    return any(prove(divisor == other, name="divisor_twin",
                     timeout_ms=LONE_TIMEOUT_MS).status == "proved" for other in others)
