"""The Z3 entry point and the rule-instance checker: statuses, dumps, abstraction, reduced
shapes, cache, budget, and the term constructors the abstraction relies on."""

from __future__ import annotations

import math
import random
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
import z3

from entangle_mlir.analysis import solver
from entangle_mlir.analysis.instance.abstraction import abstract_instance
from entangle_mlir.analysis.instance.checker import InstanceChecker, check_instance
from entangle_mlir.analysis.instance.reduce import reduced_info
from entangle_mlir.analysis.instance.shapes import reduced_types
from entangle_mlir.analysis.instance.solve import find_counterexample, run_check
from entangle_mlir.analysis.instance.sources import Concrete, Failure
from entangle_mlir.analysis.instance.term_equality import check_term_equality
from entangle_mlir.core import terms as T
from entangle_mlir.core.mesh import Mesh
from entangle_mlir.core.relations import DeviceScalar, Opaque, Rel
from entangle_mlir.mlir.opinfo import OpInfo, TensorType
from entangle_mlir.rules import RULES
from entangle_mlir.rules.base import RuleContext
from entangle_mlir.semantics.element import compare, equal, maximum, mul, select
from entangle_mlir.semantics.evaluate import evaluate_term
from entangle_mlir.semantics.tensor import (
    apply,
    broadcast_in_dim,
    dot_general,
    full,
    iota,
    pad,
    reduce_dims,
    reshape,
    slice_,
    transpose,
)
from tests.shared import EXAMPLES_MLIR

M1 = Mesh((("tp", 2),))
M2 = Mesh((("dp", 2), ("tp", 2)))
M4 = Mesh((("tp", 4),))

_ids = iter(range(50_000, 10**6))


def arg(shape, dtype: str = "f32") -> T.Term:
    return T.make_arg(next(_ids), tuple(shape), dtype)


def tiled(term: T.Term, *tiling, partial=(), kind="") -> Rel:
    tiles = [(t,) if isinstance(t, str) else tuple(t) for t in tiling]
    tiles += [()] * (len(term.shape) - len(tiles))
    return Rel(term, tuple(tiles), tuple(partial), kind or ("sum" if partial else ""))


def info_for(op: str, ins, results, mesh: Mesh, attrs=None) -> OpInfo:
    types = []
    for v in ins:
        shape = tuple(s // mesh.group_size(a) if d not in v.poly else s
                      for d, (s, a) in enumerate(zip(v.term.shape, v.tiling)))
        types.append(TensorType(shape, v.term.dtype))
    return OpInfo(op, dict(attrs or {}), types, [TensorType(tuple(s), d) for s, d in results])


def ctx_for(mesh: Mesh) -> RuleContext:
    return RuleContext(mesh=mesh, manual_axes=mesh.names)


def run_rule(info: OpInfo, ins, mesh: Mesh):
    return RULES[info.name](info, list(ins), ctx_for(mesh))


# ----- solver -----------------------------------------------------------------------------------

def test_prove_statuses() -> None:
    x = z3.Real("x")
    assert solver.prove(x + 1 > x, name="t.proved").status == "proved"
    refuted = solver.prove(x * x > 0, name="t.refuted")
    assert refuted.status == "refuted" and refuted.counterexample == {"x": "0"}
    assert solver.prove(x > 0, [x > 1], name="t.hyp").status == "proved"
    assert solver.prove(True).status == "proved"
    assert solver.prove(False).status == "refuted"


def test_unknown_is_never_proved() -> None:
    a, b, c = z3.Ints("a b c")
    hard = z3.Not(z3.And(a > 0, b > 0, c > 0, a * a * a + b * b * b == c * c * c))
    result = solver.prove(hard, name="t.fermat", timeout_ms=20)
    assert result.status == "unknown" and not result.proved
    assert solver.prove("not a formula").status == "unknown"


def test_dump_dir_writes_named_queries(tmp_path: Path, monkeypatch) -> None:
    x = z3.Real("x")
    try:
        solver.set_dump_dir(tmp_path / "a")
        solver.prove(x + 0 == x, name="dot_general@12/odd name")
        solver.prove(x + 0 == x, name="dot_general@12/odd name")
        files = sorted(p.name for p in (tmp_path / "a").iterdir())
        assert files == ["dot_general_12_odd_name.1.smt2", "dot_general_12_odd_name.smt2"]
        text = (tmp_path / "a" / files[1]).read_text()
        assert "(check-sat)" in text and "declare-fun x" in text
        solver.set_dump_dir(None)
        monkeypatch.setenv("ENTANGLE_DUMP_SMT", str(tmp_path / "b"))
        solver.prove(x + 0 == x, name="from-env")
        assert not (tmp_path / "b").exists()
        solver.follow_env_dump_dir()
        solver.prove(x + 0 == x, name="from-env")
        assert [p.name for p in (tmp_path / "b").iterdir()] == ["from-env.smt2"]
    finally:
        solver.follow_env_dump_dir()


# ----- instance checks: modes, cache, budget ----------------------------------------------------

def _layer(checker: InstanceChecker, x: T.Term, w1: T.Term, w2: T.Term, mesh: Mesh):
    """A Megatron MLP layer through rules + checks; returns the statuses and the output term."""
    statuses = []
    b, s, d = x.shape
    f = w1.shape[1]
    n = mesh.size("tp")
    ins = [tiled(x), tiled(w1, (), "tp")]
    dot = {"lhs_batch": (), "rhs_batch": (), "lhs_contract": (2,), "rhs_contract": (0,)}
    info = info_for("stablehlo.dot_general", ins, [((b, s, f // n), "f32")], mesh, dot)
    (h,) = run_rule(info, ins, mesh)
    statuses.append(checker.check(info, ins, [h], mesh))
    info = info_for("stablehlo.tanh", [h], [((b, s, f // n), "f32")], mesh)
    (g,) = run_rule(info, [h], mesh)
    statuses.append(checker.check(info, [h], [g], mesh))
    ins = [g, tiled(w2, "tp")]
    info = info_for("stablehlo.dot_general", ins, [((b, s, d), "f32")], mesh, dot)
    (p,) = run_rule(info, ins, mesh)
    statuses.append(checker.check(info, ins, [p], mesh))
    groups = {"replica_groups": mesh.groups_for(("tp",)), "use_global_device_ids": True, "channel_handle": 1,
              "reducer": "add"}
    info = info_for("stablehlo.all_reduce", [p], [((b, s, d), "f32")], mesh, groups)
    (y,) = run_rule(info, [p], mesh)
    statuses.append(checker.check(info, [p], [y], mesh))
    return statuses, y


def test_large_layers_are_reduced_and_cached() -> None:
    checker = InstanceChecker()
    x = arg((2, 16, 64))
    for layer in range(3):
        statuses, y = _layer(checker, x, arg((64, 256)), arg((256, 64)), M4)
        assert [r.status for r in statuses] == ["proved"] * 4, [r.describe() for r in statuses]
        assert all(r.details["mode"] == "reduced" for r in statuses)
        assert all(r.cached for r in statuses) == (layer > 0)
        assert y.is_replicated and y.term.op == "stablehlo.dot_general"
        x = y.term
    stats = checker.stats["stablehlo.dot_general"]
    assert stats.checks == 6 and stats.cache_hits == 4


def test_deep_input_terms_are_abstracted() -> None:
    """A whole-network input term is not evaluated: the check is generic in it."""
    term = arg((4, 8))
    for _ in range(200):
        term = T.make_elementwise("stablehlo.tanh", (T.make_add(term, arg((4, 8))),))
    ins = [tiled(term, (), "tp"), tiled(arg((4, 8)), (), "tp")]
    info = info_for("stablehlo.multiply", ins, [((4, 4), "f32")], M1)
    outs = run_rule(info, ins, M1)
    result = check_instance(info, ins, outs, M1, checker=InstanceChecker())
    assert result.status == "proved" and result.details["mode"] == "abstract"
    assert result.seconds < 1.0


def test_skips_and_budget() -> None:
    checker = InstanceChecker(budget_s=0.0)
    ins = [tiled(arg((4,)), "tp")]
    info = info_for("stablehlo.negate", ins, [((2,), "f32")], M1)
    outs = run_rule(info, ins, M1)
    skipped = checker.check(info, ins, outs, M1)
    assert skipped.status == "skipped" and "budget" in skipped.reason
    fresh = InstanceChecker()
    assert fresh.check(info, ins, [Opaque("x")], M1).status == "skipped"
    unknown_op = OpInfo("stablehlo.fft", {}, info.operand_types, info.result_types)
    assert fresh.check(unknown_op, ins, outs, M1).status == "skipped"
    # Too large and not shape-reducible (a strided slice keeps the dim it strides, whose
    # 8192 rows stay too many at the reduced shape).
    big = [tiled(arg((8192, 64)), (), "tp")]
    info = info_for("stablehlo.slice", big, [((4096, 32), "f32")], M1,
                    {"start_indices": (0, 0), "limit_indices": (8192, 32), "strides": (2, 1)})
    outs = run_rule(info, big, M1)
    result = fresh.check(info, big, outs, M1)
    assert result.status == "skipped" and "not reducible" in result.reason


def test_reduced_info_keeps_blocks_and_ties() -> None:
    ins = [tiled(arg((8, 64)), "dp", "tp"), tiled(arg((64, 32)), "tp")]
    dot = {"lhs_batch": (), "rhs_batch": (), "lhs_contract": (1,), "rhs_contract": (0,)}
    info = info_for("stablehlo.dot_general", ins, [((4, 32), "f32")], M2, dot)
    abstract = abstract_instance(info, ins, run_rule(info, ins, M2), M2, ctx_for(M2))
    assert abstract is not None
    reduced = reduced_info(info, abstract[0], M2)
    assert reduced is not None
    r_info, r_ins = reduced
    assert [t.shape for t in r_info.operand_types] == [(2, 2), (2, 2)]
    assert r_info.result_types[0].shape == (2, 2)
    assert [v.term.shape for v in r_ins] == [(4, 4), (4, 2)]
    gather = OpInfo("stablehlo.all_gather", {"all_gather_dim": 1},
                    [TensorType((3, 16), "f32")], [TensorType((3, 64), "f32")])
    assert reduced_types(gather, 2) == ([(2, 2)], [(2, 8)])


def test_refutes_with_a_counterexample_and_never_proves_contradictions() -> None:
    x = arg((2, 2))
    wrong = [tiled(T.make_elementwise("stablehlo.exponential", (x,)), partial=("tp",))]
    ins = [tiled(x, partial=("tp",))]
    info = info_for("stablehlo.exponential", ins, [((2, 2), "f32")], M1)
    result = check_instance(info, ins, wrong, M1, checker=InstanceChecker())
    assert result.status == "refuted" and result.counterexample
    witness = find_counterexample(info, ins, wrong, M1, ctx_for(M1))
    assert witness is not None
    right_ins = [tiled(x, (), "tp")]
    right_info = info_for("stablehlo.exponential", right_ins, [((2, 1), "f32")], M1)
    right = run_rule(right_info, right_ins, M1)
    assert find_counterexample(right_info, right_ins, right, M1, ctx_for(M1)) is None
    # Dividing by a value that is always zero makes the nonzero-divisor assumption
    # contradictory: that must not count as a proof of an arbitrary claim.
    a, b = arg((2,)), arg((2,))
    always_zero = T.intern("stablehlo.subtract", (b, b), (), (2,), "f32")
    ins = [tiled(a), tiled(always_zero)]
    info = info_for("stablehlo.divide", ins, [((2,), "f32")], M1)
    claim = [tiled(T.make_splat(7, (2,), "f32"))]
    result = run_check(info, ins, claim, M1, ctx_for(M1))
    assert result.status == "unknown" and "contradictory" in result.reason


def test_device_scalar_outputs() -> None:
    info = OpInfo("stablehlo.partition_id", {}, [], [TensorType((), "ui32")])
    outs = run_rule(info, [], M2)
    assert check_instance(info, [], outs, M2, checker=InstanceChecker()).status == "proved"
    wrong = [DeviceScalar((0, 1, 3, 2), ())]
    result = check_instance(info, [], wrong, M2, checker=InstanceChecker())
    assert result.status == "refuted"


def test_global_scope_instance() -> None:
    from entangle_mlir.core.relations import GLOBAL

    x, y = arg((3, 2)), arg((2, 4))
    ins = [Rel(x, ((), ()), scope=GLOBAL), Rel(y, ((), ()), scope=GLOBAL)]
    info = OpInfo("stablehlo.dot_general", {"lhs_batch": (), "rhs_batch": (),
                                            "lhs_contract": (1,), "rhs_contract": (0,)},
                  [TensorType((3, 2), "f32"), TensorType((2, 4), "f32")],
                  [TensorType((3, 4), "f32")])
    outs = RULES[info.name](info, ins, RuleContext())
    assert check_instance(info, ins, outs, None).status == "proved"


def test_bundled_example_instances_all_prove() -> None:
    """Every rule instance of a real shard_map program (GPT-2 block, dp2 x tp4) proves."""
    from entangle_mlir.analysis.infer import Walker
    from entangle_mlir.mlir.load import load_file

    path = EXAMPLES_MLIR / "gpt2_block_dp2_tp4.sharded.mlir"
    if not path.exists():
        pytest.skip("bundled example missing")
    module = load_file(str(path))
    func = next(op.operation for op in module.body.operations
                if op.operation.name == "func.func"
                and op.operation.attributes["sym_name"].value == "main")
    walk = Walker(func, module, str(path)).run()
    checker = InstanceChecker()
    statuses = {}
    for record in walk.records:
        if not any(isinstance(v, Rel) for v in record.outputs) or any(
                isinstance(v, Opaque) for v in record.inputs + record.outputs):
            continue
        mesh = walk.mesh if record.manual_axes else None
        ctx = RuleContext(mesh=mesh, manual_axes=record.manual_axes) if mesh else None
        result = checker.check(record.info, record.inputs, record.outputs, mesh, ctx)
        statuses[result.status] = statuses.get(result.status, 0) + 1
    assert set(statuses) == {"proved"}, statuses
    assert statuses["proved"] > 50
    assert checker.spent < 10


# ----- the term constructors preserve meaning (the abstraction's substitution relies on it) ---

def _fresh(shape, env, rng):
    term = arg(shape)
    value = np.empty(shape, dtype=object)
    for idx in np.ndindex(shape):
        value[idx] = Fraction(rng.randint(-9, 9), rng.choice((1, 2, 3)))
    env[term.attrs[0]] = value
    return term, value


def _factorization(n: int, rng: random.Random) -> tuple[int, ...]:
    dims, rest = [], n
    while rest > 1 and len(dims) < 4:
        dims.append(rng.choice([f for f in range(2, rest + 1) if rest % f == 0]))
        rest //= dims[-1]
    while rng.random() < 0.3:
        dims.insert(rng.randrange(len(dims) + 1), 1)
    return tuple(dims)


def _random_composition(seed: int) -> None:
    rng = random.Random(seed)
    env: dict = {}
    pool = [_fresh(tuple(rng.choice([1, 2, 3]) for _ in range(rng.randint(1, 3))), env, rng)
            for _ in range(2)]
    size = rng.choice([2, 3, 5])
    pool.append((T.make_iota((size,), 0, "f32"), iota((size,), 0)))
    for _ in range(10):
        t, v = rng.choice(pool)
        shape = t.shape
        op = rng.choice(["reshape", "transpose", "broadcast", "lin", "mul", "div", "dot",
                         "reduce", "slice", "max", "mask", "pad"])
        if not shape and op in ("dot", "reduce", "slice", "mask", "pad"):
            continue
        if op == "reshape":
            new = _factorization(math.prod(shape), rng)
            nt, nv = T.make_reshape(t, new), reshape(v, new)
        elif op == "transpose":
            perm = tuple(rng.sample(range(len(shape)), len(shape)))
            nt, nv = T.make_transpose(t, perm), transpose(v, perm)
        elif op == "broadcast":
            rank = len(shape) + rng.randint(0, 2)
            dims = tuple(sorted(rng.sample(range(rank), len(shape))))
            if rng.random() < 0.3:
                dims = tuple(rng.sample(range(rank), len(shape)))
            new = [rng.choice([1, 2, 3]) for _ in range(rank)]
            for i, d in enumerate(dims):
                new[d] = shape[i] if shape[i] != 1 else rng.choice([1, 2])
            nt, nv = T.make_broadcast(t, dims, tuple(new)), broadcast_in_dim(v, dims, new)
        elif op == "lin":
            o, ov = _fresh(shape, env, rng) if rng.random() < 0.5 else (t, v)
            k, c = Fraction(rng.randint(-3, 3), 2), Fraction(rng.randint(-2, 2))
            nt = T.make_lin([(Fraction(1), t), (k, o)], c, shape, "f32")
            nv = apply(lambda a, b, k=k, c=c: a + k * b + c, v, ov)
        elif op == "mul":
            o, ov = _fresh(shape, env, rng) if rng.random() < 0.6 else (t, v)
            nt, nv = T.make_mul(t, o), apply(mul, v, ov)
        elif op == "div":
            o, ov = _fresh(shape, env, rng)
            den = T.make_lin([(Fraction(1), T.make_mul(o, o))], 1, shape, "f32")
            nt, nv = T.make_div(t, den), apply(lambda a, b: a / (b * b + 1), v, ov)
        elif op == "dot":
            if not shape:
                continue
            free = tuple(rng.choice([1, 2, 3]) for _ in range(rng.randint(0, 2)))
            o, ov = _fresh((shape[-1],) + free, env, rng)
            attrs = ((), (), (len(shape) - 1,), (0,))
            nt = T.make_dot(t, o, attrs, shape[:-1] + free, "f32")
            nv = dot_general(v, ov, *attrs)
        elif op == "reduce":
            dims = tuple(sorted(rng.sample(range(len(shape)), rng.randint(1, len(shape)))))
            out = tuple(s for d, s in enumerate(shape) if d not in dims)
            nt = T.make_op("reduce_sum", (t,), (dims,), out, "f32", linear_in=0)
            nv = reduce_dims(v, dims, "sum")
        elif op == "slice":
            starts = tuple(rng.randrange(s) for s in shape)
            limits = tuple(rng.randint(a + 1, s) for a, s in zip(starts, shape))
            strides = tuple(rng.choice([1, 1, 2]) for _ in shape)
            out = tuple(len(range(a, b, st)) for a, b, st in zip(starts, limits, strides))
            nt = T.make_op("slice", (t,), (starts, limits, strides), out, "f32", linear_in=0)
            nv = slice_(v, starts, limits, strides)
        elif op == "mask":
            # select on `iota + k <direction> c` (XLA's padding masks), constant elsewhere
            dim = rng.randrange(len(shape))
            k, c = rng.randint(-2, 2), rng.randint(-1, 2 * shape[dim])
            direction = rng.choice(["LT", "LE", "GT", "GE", "EQ"])
            position = T.make_lin([(Fraction(1), T.make_iota(shape, dim, "i32"))], k, shape,
                                  "i32")
            bound = T.make_splat(c, shape, "i32")
            pair = (position, bound) if rng.random() < 0.5 else (bound, position)
            flipped = {"LT": "GT", "LE": "GE", "GT": "LT", "GE": "LE", "EQ": "EQ"}
            pred = T.make_elementwise("stablehlo.compare", pair, (direction,), dtype="i1")
            fill = T.make_splat(rng.randint(-1, 1), shape, "f32")
            true_first = rng.random() < 0.5
            nt = T.make_elementwise("stablehlo.select",
                                    (pred, t, fill) if true_first else (pred, fill, t))
            real = direction if pair[0] is position else flipped[direction]
            want = apply(lambda i, k=k, c=c, d=real: compare(i + k, c, d),
                         iota(shape, dim))
            fill_v = full(shape, fill.attrs[0])
            nv = apply(select, want, v, fill_v) if true_first else apply(
                select, want, fill_v, v)
        elif op == "pad":
            low = tuple(rng.randint(0, 2) for _ in shape)
            high = tuple(rng.randint(0, 2) for _ in shape)
            nt = T.make_pad(t, T.make_splat(0, (), "f32"), low, high, (0,) * len(shape))
            nv = pad(v, Fraction(0), low, high, (0,) * len(shape))
        else:
            o, ov = _fresh(shape, env, rng)
            nt, nv = T.make_elementwise("stablehlo.maximum", (t, o)), apply(maximum, v, ov)
        got = evaluate_term(nt, env)
        assert got.shape == nv.shape, (seed, op, T.pretty(t), T.pretty(nt))
        assert all(equal(a, b) for a, b in zip(got.reshape(-1), nv.reshape(-1))), (
            seed, op, T.pretty(t), T.pretty(nt))
        pool.append((nt, nv))


@pytest.mark.parametrize("block", range(4))
def test_term_constructors_preserve_meaning(block: int) -> None:
    for seed in range(block * 100, block * 100 + 100):
        _random_composition(seed)


# ----- regressions: bugs these checks found in terms.py and the rules (fixed in fb29686) ---------

def test_regression_xor_is_not_idempotent() -> None:
    a = arg((2,), "i1")
    ins = [tiled(a), tiled(a)]
    info = info_for("stablehlo.xor", ins, [((2,), "i1")], M1)
    outs = run_rule(info, ins, M1)
    assert check_instance(info, ins, outs, M1, checker=InstanceChecker()).proved


def test_regression_reshape_of_dot_with_unit_dims() -> None:
    a, b = arg((2, 1, 3)), arg((3, 2, 1))
    dot = T.make_dot(a, b, ((), (), (2,), (0,)), (2, 1, 2, 1), "f32")
    env = {a.attrs[0]: full((2, 1, 3), 1), b.attrs[0]: full((3, 2, 1), 1)}
    assert evaluate_term(T.make_reshape(dot, (2, 1, 2)), env).shape == (2, 1, 2)


COLLECTIVE_BUGS = [
    ("permute-partial-across-groups", "stablehlo.collective_permute",
     tiled(T.make_arg(900_001, (2,), "f32"), partial=("tp",)),
     {"source_target_pairs": [[0, 0], [1, 3], [2, 2], [3, 1]], "channel_handle": 1}),
    ("max-over-replicated-axis-of-partial-sum", "stablehlo.all_reduce",
     tiled(T.make_arg(900_002, (2,), "f32"), partial=("tp",)),
     {"replica_groups": [[0, 2], [1, 3]], "use_global_device_ids": True, "channel_handle": 1, "reducer": "max"}),
    ("sum-over-replicated-axis-of-partial-max", "stablehlo.all_reduce",
     tiled(T.make_arg(900_003, (2,), "f32"), partial=("dp",), kind="max"),
     {"replica_groups": [[0, 1], [2, 3]], "use_global_device_ids": True, "channel_handle": 1, "reducer": "add"}),
]


@pytest.mark.parametrize("name,op,value,attrs", COLLECTIVE_BUGS,
                         ids=[c[0] for c in COLLECTIVE_BUGS])
def test_regression_partial_pieces_differ_across_replicas(name, op, value, attrs) -> None:
    """A partial value's local pieces are NOT replicated over the non-partial axes."""
    info = info_for(op, [value], [((2,), "f32")], M2, attrs)
    outs = run_rule(info, [value], M2)
    if all(isinstance(v, Opaque) for v in outs):
        return  # the rule refuses the instance
    result = check_instance(info, [value], outs, M2, checker=InstanceChecker())
    assert result.proved, result.describe()


def test_term_equality_fallback() -> None:
    x, y = arg((2, 3)), arg((2, 3))
    left = T.make_mul(T.make_add(x, y), T.make_add(x, y))          # (x + y)^2
    right = T.make_lin([(Fraction(1), T.make_mul(x, x)), (Fraction(2), T.make_mul(x, y)),
                        (Fraction(1), T.make_mul(y, y))], 0, (2, 3), "f32")
    assert left is not right
    assert check_term_equality(left, right).status == "proved"
    assert check_term_equality(left, T.make_mul(x, x)).status == "refuted"
    big = arg((512, 512))
    assert check_term_equality(big, T.scale(big, 2)).status == "skipped"
    q = T.make_div(T.make_mul(x, y), y)
    assert check_term_equality(q, x).status == "proved"  # for nonzero y


def test_large_gather_and_scatter_are_reduced() -> None:
    if "stablehlo.gather" not in RULES:
        pytest.skip("no gather rule")
    checker = InstanceChecker()
    embed = {"offset_dims": (2,), "collapsed_slice_dims": (0,), "start_index_map": (0,),
             "index_vector_dim": 2}
    table, ids = tiled(arg((1000, 64)), (), "tp"), tiled(arg((8, 16, 1), "i32"), "dp")
    info = info_for("stablehlo.gather", [table, ids], [((4, 16, 32), "f32")], M2,
                    {**embed, "slice_sizes": (1, 32)})
    outs = run_rule(info, [table, ids], M2)
    assert isinstance(outs[0], Rel), outs
    result = checker.check(info, [table, ids], outs, M2)
    assert result.status == "proved" and result.details["mode"] == "reduced", result.describe()
    rows = {"update_window_dims": (1,), "inserted_window_dims": (0,),
            "scatter_dims_to_operand_dims": (0,), "index_vector_dim": 1, "reducer": "add"}
    ins = [tiled(arg((1000, 64))), tiled(arg((64, 1), "i32"), "tp"), tiled(arg((64, 64)), "tp")]
    info = info_for("stablehlo.scatter", ins, [((1000, 64), "f32")], M4, rows)
    outs = run_rule(info, ins, M4)
    assert isinstance(outs[0], Rel), outs
    result = checker.check(info, ins, outs, M4)
    assert result.status == "proved" and result.details["mode"] == "reduced", result.describe()


def test_instance_cache_key_ignores_only_the_channel_number() -> None:
    """XLA numbers every collective's channel: the 2nd..Nth layer's all_reduce shares the
    first one's cache entry (nothing reads the number), while other groups do not."""
    def all_reduce(handle: int, groups) -> OpInfo:
        return OpInfo("stablehlo.all_reduce", {
            "channel_handle": f"#stablehlo.channel_handle<handle = {handle}, type = 0>",
            "replica_groups": groups, "use_global_device_ids": True, "reducer": "add"})

    assert all_reduce(1, [[0, 1]]).signature() == all_reduce(7, [[0, 1]]).signature()
    assert all_reduce(1, [[0, 1]]).signature() != all_reduce(1, [[0], [1]]).signature()


def test_concrete_partial_splits_are_exact_or_refused() -> None:
    """The counterexample search splits a partial sum into random local pieces: exact values
    split so that the pieces sum back exactly; a block holding a float (an infinity, or a
    random function's value at one) is refused, since rounding would make the pieces' sum
    differ from it and pass for a counterexample (a false "refuted")."""
    import numpy as np

    from entangle_mlir.semantics.element import sum_list

    source = Concrete(seed=3)
    block = source.tensor("x", (2, 3), "f32")
    pieces = source.split("sum", block, 4, "x", "f32")
    for idx in np.ndindex(block.shape):
        assert sum_list([p[idx] for p in pieces]) == block[idx]
    inexact = block.copy()
    inexact[0, 0] = float("-inf")
    with pytest.raises(Failure):
        source.split("sum", inexact, 4, "x", "f32")


def test_a_copy_is_checked_as_the_identity_at_a_reduced_shape() -> None:
    """XLA copies a shard_map body's operands (`mhlo.copy`, read as the identity): the
    instance is checked on leaves at a reduced shape like any rule's, so a vocab-sized table
    is no longer skipped as too large. A copy claimed to give another value is not proven:
    refuted at a small shape, not proven (skipped) at the table's."""
    checker = InstanceChecker()
    table = tiled(arg((128256, 64)), "tp")
    info = info_for("mhlo.copy", [table], [((64128, 64), "f32")], M1)
    result = checker.check(info, [table], [table], M1)
    assert result.status == "proved" and result.details["mode"] == "reduced", result.describe()
    doubled = tiled(T.scale(table.term, 2), "tp")
    assert checker.check(info, [table], [doubled], M1).status != "proved"
    small = tiled(arg((8, 4)), "tp")
    info = info_for("mhlo.copy", [small], [((4, 4), "f32")], M1)
    assert checker.check(info, [small], [tiled(T.scale(small.term, 2), "tp")],
                         M1).status == "refuted"
    other = tiled(arg((8, 4)), "tp")
    assert checker.check(info, [small], [other], M1).status == "refuted"
