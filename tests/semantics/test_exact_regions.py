"""Issue 16, classes 1, 3 and 8: regions read whole, `compare_type` in the term, collective
attributes read as StableHLO defines them.

Every wrong program here is grounded: the sharded module (a jax lowering, edited textually where
jax cannot express the attack) is compiled and run on 8 simulated CPU devices against its
reference on chosen inputs, the numbers are shown to differ, and the check must not prove it.
Its correct twin (the unedited lowering) is shown to match and must stay proven, every rule
instance checked by Z3.
"""

from __future__ import annotations

import os

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                           + " --xla_force_host_platform_device_count=8").strip()

import re
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from entangle_mlir.driver import check_texts
from examples.real import catalog
from examples.real.catalog import Example, custom
from examples.real.programs import ArgDef


def _run_sharded_text(ex: Example, text: str, inputs: list[np.ndarray]) -> list[np.ndarray]:
    """Compile `text` (an edit of the example's sharded lowering, same signature) with the
    lowering's own options and run it on `inputs` placed as the example's in_specs."""
    from jax._src.interpreters import mlir as jmlir
    from jax._src.lib.mlir import ir

    lowered = catalog.sharded_fn(ex).lower(*catalog._avals(ex, True))
    comp = lowered._lowering
    saved = comp._hlo
    try:
        with jmlir.make_ir_context():
            comp._hlo = ir.Module.parse(text)
        comp._executable = None
        compiled = lowered.compile()
    finally:
        comp._hlo = saved
        comp._executable = None
    mesh = catalog.make_mesh(ex)
    placed = [jax.device_put(x, NamedSharding(mesh, a.spec)) for x, a in zip(inputs, ex.args)]
    return [np.asarray(o) for o in jax.tree.leaves(compiled(*placed))]


def _run_reference(ex: Example, inputs: list[np.ndarray]) -> list[np.ndarray]:
    return [np.asarray(o) for o in jax.tree.leaves(jax.jit(ex.reference)(*inputs))]


def _same(a: list[np.ndarray], b: list[np.ndarray]) -> bool:
    """Bit-for-bit equal up to float reassociation (1e-5), signs of zeros included."""
    for x, y in zip(a, b, strict=True):
        if x.shape != y.shape or x.dtype != y.dtype:
            return False
        if np.issubdtype(x.dtype, np.floating):
            if not np.allclose(x, y, atol=1e-5, rtol=1e-5) or np.any(
                    np.signbit(x[x == 0]) != np.signbit(y[x == 0])):
                return False
        elif not np.array_equal(x, y):
            return False
    return True


def judge(ex: Example, inputs: list[np.ndarray], edit: Callable[[str], str] | None = None,
          *, correct: bool, reason: str = "") -> str:
    """Ground `ex`'s sharded lowering (edited by `edit`) against its reference on `inputs`:
    it must compute the reference's numbers exactly when `correct`; then the check must prove
    it exactly then (every rule instance by Z3), else name `reason`. Returns the report."""
    ref_text, text = catalog.lower_pair(ex)
    if edit is not None:
        edited = edit(text)
        assert edited != text, "the edit changed nothing"
        text = edited
    same = _same(_run_reference(ex, inputs), _run_sharded_text(ex, text, inputs))
    assert same == correct, f"{ex.name}: grounded {'equal' if same else 'different'}"
    report = check_texts(ref_text, text, verify_rules=correct)
    rendered = report.render_text()
    assert report.proven == correct, rendered
    if correct:
        assert " 0 refuted, 0 inconclusive" in report.mode, report.mode
    else:
        assert reason in rendered, rendered
    return rendered


def _mesh4() -> tuple:
    return (("tp", 4),)


# ----- class 1: regions read whole ---------------------------------------------------------------

_ALL_REDUCE_ADD = re.compile(
    r"(%\d+) = stablehlo\.add (%arg\d+), (%arg\d+) : tensor<(\w+)>(.*)\n(\s*)stablehlo\.return \1 "
    r": tensor<\w+>")


def _psum_region(replacement: str) -> Callable[[str], str]:
    """Replace the all_reduce's region body (`%r = add %a, %b; return %r`) by `replacement`,
    formatted with a, b (the block arguments), t (the element type) and r."""
    def edit(text: str) -> str:
        def sub(m: re.Match) -> str:
            r, a, b, t, _loc, indent = m.groups()
            return replacement.format(a=a, b=b, t=t, r=r).replace("\n", "\n" + indent)
        return _ALL_REDUCE_ADD.sub(sub, text, count=1)
    return edit


_ADD = "{r} = stablehlo.add {a}, {b} : tensor<{t}>\n"


def _row_sum() -> Example:
    return custom("rowsum", _mesh4(), lambda x: jnp.sum(x, axis=1),
                  lambda x: lax.psum(jnp.sum(x, axis=1), "tp"),
                  [ArgDef("x", (8, 16), "float32", "data", P(None, "tp"))], P(), "row sums")


def _data(shape, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def test_psum_region_correct_twin_is_proven() -> None:
    judge(_row_sum(), [_data((8, 16))], correct=True)
    judge(_row_sum(), [_data((8, 16))], _psum_region("%sw = stablehlo.add {b}, {a} : tensor<{t}>\n"
                                                     "stablehlo.return %sw : tensor<{t}>"),
          correct=True)


def _refused_by_xla(ex: Example, edit: Callable[[str], str], reason: str) -> None:
    """XLA refuses to run an all_reduce whose region is not a plain reduction ("Unsupported
    reduction computation" on CPU): grounded as a program XLA cannot run, and not proven."""
    ref_text, text = catalog.lower_pair(ex)
    edited = edit(text)
    assert edited != text
    with pytest.raises(Exception, match="Unsupported reduction computation"):
        _run_sharded_text(ex, edited, [_data((8, 16))])
    report = check_texts(ref_text, edited, verify_rules=False)
    assert not report.proven and reason in report.render_text(), report.render_text()


@pytest.mark.parametrize("returned, why", [
    (_ADD + "stablehlo.return {a} : tensor<{t}>", "returns its argument %arg0 (the accumulator)"),
    (_ADD + "stablehlo.return {b} : tensor<{t}>", "returns its argument %arg1 (the new element)"),
    ("%dbl = stablehlo.add {a}, {a} : tensor<{t}>\nstablehlo.return %dbl : tensor<{t}>",
     "returns stablehlo.add(%arg0, %arg0)"),
    ("%zero = stablehlo.constant dense<0.0> : tensor<{t}>\nstablehlo.return %zero : tensor<{t}>",
     "computes stablehlo.constant"),
], ids=["accumulator", "other-argument", "add-a-a", "constant"])
def test_psum_region_not_a_sum_is_not_proven(returned: str, why: str) -> None:
    """The region computes add but returns something else: read whole, it is no sum."""
    _refused_by_xla(_row_sum(), _psum_region(returned), why)


_COMPACT_REDUCE = re.compile(
    r"stablehlo\.reduce\((%\w+) init: (%\w+)\) applies stablehlo\.(\w+) across dimensions = "
    r"\[([\d, ]*)\] : \((tensor<[^>]*>), (tensor<(\w+)>)\) -> (tensor<[^>]*>)")


def _reduce_region(body: str) -> Callable[[str], str]:
    """Rewrite the first compact `stablehlo.reduce ... applies OP` into its generic form with
    the region `body` (formatted with op, t and the block arguments %ra, %rb)."""
    def edit(text: str) -> str:
        def sub(m: re.Match) -> str:
            x, init, op, dims, xt, it, t, rt = m.groups()
            region = body.format(op=op, t=t)
            return (f'"stablehlo.reduce"({x}, {init}) <{{dimensions = array<i64: {dims}>}}> ({{\n'
                    f"      ^bb0(%ra: tensor<{t}>, %rb: tensor<{t}>):\n        {region}\n"
                    f"      }}) : ({xt}, {it}) -> {rt}")
        return _COMPACT_REDUCE.sub(sub, text, count=1)
    return edit


_EXACT_REDUCE = ("%rr = stablehlo.{op} %rb, %ra : tensor<{t}>\n"
                 "        stablehlo.return %rr : tensor<{t}>")


def test_reduce_region_in_generic_form_is_proven() -> None:
    """The same reduction written out (operands swapped: add is commutative) stays proven."""
    judge(_row_sum(), [_data((8, 16))], _reduce_region(_EXACT_REDUCE), correct=True)


@pytest.mark.parametrize("body, why", [
    ("%rr = stablehlo.{op} %ra, %rb : tensor<{t}>\n        stablehlo.return %ra : tensor<{t}>",
     "returns its argument %arg0 (the accumulator)"),
    ("stablehlo.return %ra : tensor<{t}>", "returns its argument %arg0 (the accumulator)"),
    ("%rr = stablehlo.{op} %rb, %rb : tensor<{t}>\n        stablehlo.return %rr : tensor<{t}>",
     "stablehlo.add(%arg1, %arg1)"),
    ("%rr = stablehlo.subtract %ra, %rb : tensor<{t}>\n        stablehlo.return %rr : tensor<{t}>",
     "computes stablehlo.subtract"),
], ids=["add-returns-accumulator", "accumulator", "add-b-b", "subtract"])
def test_local_reduce_region_not_a_sum_is_not_proven(body: str, why: str) -> None:
    judge(_row_sum(), [_data((8, 16))], _reduce_region(body), correct=False, reason=why)


def _pool() -> Example:
    def pool(x):
        return lax.reduce_window(x, 0.0, lax.add, (1, 2), (1, 2), "VALID")
    return custom("sumpool", _mesh4(), pool, pool,
                  [ArgDef("x", (8, 16), "float32", "data", P("tp", None))], P("tp", None),
                  "sum pooling of row blocks")


_WINDOW_ADD = re.compile(r"(\^bb0\((%\w+): tensor<f32>.*?, (%\w+): tensor<f32>.*:\n"
                         r"\s*(%\w+) = stablehlo\.add \2, \3 : tensor<f32>.*\n"
                         r"(\s*)stablehlo\.return )\4")


def test_reduce_window_region() -> None:
    """Sum pooling with its region's return edited to the accumulator (the pad value)."""
    ex = _pool()
    x = [_data((8, 16), 1)]
    text = catalog.lower_pair(ex)[1]
    assert "stablehlo.reduce_window" in text and _WINDOW_ADD.search(text), text
    judge(ex, x, correct=True)
    judge(ex, x, lambda t: _WINDOW_ADD.sub(lambda m: m.group(1) + m.group(2), t, count=1),
          correct=False, reason="returns its argument %arg0 (the accumulator)")


def _scatter_set() -> Example:
    ids = np.array([5, 1], dtype=np.int32)

    def put(x, u):
        return x.at[ids].set(u)
    return custom("put_rows", _mesh4(), put, put,
                  [ArgDef("x", (8, 16), "float32", "data", P(None, "tp")),
                   ArgDef("u", (2, 16), "float32", "data", P(None, "tp"))], P(None, "tp"),
                  "row writes into column blocks")


_SCATTER_SET = re.compile(r"(\^bb0\((%\w+): tensor<f32>.*?, (%\w+): tensor<f32>.*:\n"
                          r"\s*stablehlo\.return )\3")


def test_scatter_region() -> None:
    """A scatter whose region returns the operand's element (keep) instead of the update."""
    ex = _scatter_set()
    xs = [_data((8, 16), 2), _data((2, 16), 3)]
    text = catalog.lower_pair(ex)[1]
    assert "stablehlo.scatter" in text and _SCATTER_SET.search(text), text
    judge(ex, xs, correct=True)
    judge(ex, xs, lambda t: _SCATTER_SET.sub(lambda m: m.group(1) + m.group(2), t, count=1),
          correct=False, reason="returns its argument %arg0 (the accumulator)")


def test_one_region_classifier() -> None:
    """Every reading of a region goes through `opinfo.region_kind`: the rules, the semantics and
    the rewrites share it (the two scatter_kinds that disagreed are one)."""
    from entangle_mlir.mlir import opinfo
    from entangle_mlir.rules import gather_scatter
    from entangle_mlir.semantics import ops

    assert ops.scatter_kind is opinfo.scatter_kind
    assert gather_scatter.scatter_kind is opinfo.scatter_kind


# ----- class 3: compare_type is part of the term -------------------------------------------------

def _sign_test() -> Example:
    def f(x):
        return jnp.where(x >= 0.0, 1.0, 2.0)
    return custom("nonneg", _mesh4(), f, f,
                  [ArgDef("x", (8, 16), "float32", "data", P(None, "tp"))], P(None, "tp"),
                  "the branch a sign test takes")


def _signed_zeros() -> np.ndarray:
    x = _data((8, 16), 4)
    x[::2, ::3] = -0.0
    x[1::2, ::3] = 0.0
    return x


def _to_totalorder(text: str) -> str:
    return re.sub(r"(stablehlo\.compare\s+GE, [^:]*?), FLOAT :", r"\1, TOTALORDER :", text,
                  count=1)


def test_compare_float_twin_is_proven() -> None:
    judge(_sign_test(), [_signed_zeros()], correct=True)


def test_compare_totalorder_against_float_is_not_proven() -> None:
    """The sharded sign test compares in TOTALORDER, the reference in FLOAT: `-0 >= 0` is
    false in TOTALORDER, so every -0 input takes the other branch."""
    report = judge(_sign_test(), [_signed_zeros()], _to_totalorder, correct=False,
                   reason="not proven")
    assert "compare[TOTALORDER](x, 0)" in report, report


def test_compare_type_of_the_term_and_z3() -> None:
    """The term of a TOTALORDER compare carries its compare type (a FLOAT one, the element
    type's default, does not), and the Z3 semantics cannot equate them: at two zeros the
    TOTALORDER result is unknown, and Python floats are ordered by IEEE totalOrder."""
    import z3

    from entangle_mlir.semantics.element import compare

    a, b = z3.Real("a"), z3.Real("b")
    solver = z3.Solver()
    solver.add(compare(a, b, "GE", total=True) != compare(a, b, "GE"))
    assert solver.check() == z3.sat
    solver = z3.Solver()
    solver.add(a != b, compare(a, b, "GE", total=True) != compare(a, b, "GE"))
    assert solver.check() == z3.unsat
    assert compare(-0.0, 0.0, "LT", total=True) and not compare(-0.0, 0.0, "LT")
    assert compare(-1.0, -0.0, "LT", total=True) and compare(-2.0, -1.0, "LT", total=True)


def test_compare_type_that_xla_rejects_is_bad_input(entangle, write) -> None:
    """UNSIGNED on signed i32 operands (the nearest wrong program to a signed test): XLA's
    verifier refuses it, so entangle exits 2 with one message at the compare."""
    def f(x):
        return jnp.where(x < 0, 1, 2)
    ex = custom("neg", _mesh4(), f, f, [ArgDef("x", (8, 16), "int32", "tokens", P(None, "tp"),
                                                high=5)], P(None, "tp"), "an int sign test")
    ref_text, text = catalog.lower_pair(ex)
    bad = re.sub(r"(stablehlo\.compare\s+LT, [^:]*?), SIGNED :", r"\1, UNSIGNED :", text, count=1)
    assert bad != text
    with pytest.raises(Exception, match="Expected comparison type SIGNED"):
        _run_sharded_text(ex, bad, [np.full((8, 16), -1, np.int32)])
    run = entangle("check", write("ref.mlir", ref_text), write("bad.mlir", bad),
                   "--no-verify-rules")
    assert run.code == 2 and "Traceback" not in run.text, run.text
    assert "compare_type UNSIGNED on i32 operands: XLA requires SIGNED" in run.text, run.text
    assert "test_exact_regions.py:" in run.text  # the op's location: the user's line


def test_while_on_a_float_condition_without_compare_type() -> None:
    """A ring loop whose condition compares floats, its compare_type left out (the default,
    FLOAT): a clean verdict, never a traceback, and never proven unless grounded equal."""
    perm = [(i, (i + 1) % 4) for i in range(4)]

    def body(x):
        def step(c):
            return c[0] + 1.0, lax.ppermute(c[1], "tp", perm)
        return lax.while_loop(lambda c: c[0] < 4.0, step, (0.0, x))[1]
    ex = custom("float_ring", _mesh4(), lambda x: x, body,
                [ArgDef("x", (8, 16), "float32", "data", P(None, "tp"))], P(None, "tp"),
                "four ring steps counted in floats")
    ref_text, text = catalog.lower_pair(ex)
    plain = re.sub(r"(stablehlo\.compare\s+LT, [^:]*?), FLOAT :", r"\1 :", text)
    assert plain != text
    x = _data((8, 16), 5)
    same = _same(_run_reference(ex, [x]), _run_sharded_text(ex, plain, [x]))
    assert same
    report = check_texts(ref_text, plain, verify_rules=False)
    assert report.proven in (True, False) and report.render_text()


# ----- class 8: collective attributes as StableHLO defines them ----------------------------------

_PSUM_ATTRS = ("channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, "
               "replica_groups = dense<[[0, 1, 2, 3]]> : tensor<1x4xi64>, use_global_device_ids")
_CHANNEL = "channel_handle = #stablehlo.channel_handle<handle = {h}, type = 1>, "
_ONE_GROUP = "replica_groups = dense<[[0]]> : tensor<1x1xi64>"
_NO_GROUPS = "replica_groups = dense<> : tensor<0x0xi64>"


def _psum_attrs(attrs: str) -> Callable[[str], str]:
    return lambda text: text.replace(_PSUM_ATTRS, attrs)


@pytest.mark.parametrize("attrs", [
    _CHANNEL.format(h=1) + _ONE_GROUP,
    _CHANNEL.format(h=1) + _NO_GROUPS,
], ids=["replica-group-0-times-every-partition", "no-groups-with-channel"])
def test_cross_replica_and_partition_is_the_psum(attrs: str) -> None:
    """A channel without use_global_device_ids: the groups are replica ids, each times every
    partition; with one replica `[[0]]` (or no groups) is the sum over all partitions."""
    judge(_row_sum(), [_data((8, 16))], _psum_attrs(attrs), correct=True)


@pytest.mark.parametrize("attrs", [
    _ONE_GROUP,
    _NO_GROUPS,
    _CHANNEL.format(h=0) + _ONE_GROUP,
], ids=["no-channel", "no-channel-no-groups", "channel-handle-0"])
def test_cross_replica_in_a_partitioned_program_is_a_no_op(attrs: str) -> None:
    """No channel (or handle 0): cross_replica groups over the one replica, each group one
    process: the all_reduce leaves every partition its own partial sum."""
    judge(_row_sum(), [_data((8, 16))], _psum_attrs(attrs), correct=False, reason="not proven")


@pytest.mark.parametrize("attrs, message, xla", [
    (_CHANNEL.format(h=1) + "replica_groups = dense<[[0, 1, 2, 3]]> : tensor<1x4xi64>",
     "replica id 1 in replica groups [[0, 1, 2, 3]] is outside the 1 replicas",
     "replica_id < replica_count"),
    (_CHANNEL.format(h=1) + "replica_groups = dense<[[0, 1, 2]]> : tensor<1x3xi64>, "
     "use_global_device_ids", "leave out flattened device ids [3]", "flattened IDs"),
    (_CHANNEL.format(h=0) + "replica_groups = dense<[[0, 1, 2, 3]]> : tensor<1x4xi64>",
     "replica id 1 in replica groups", "replica_id < replica_count"),
], ids=["replica-ids-out-of-range", "groups-leave-a-device-out", "handle-0-device-ids"])
def test_groups_xla_rejects_are_bad_input(entangle, write, attrs: str, message: str,
                                          xla: str) -> None:
    ex = _row_sum()
    ref_text, text = catalog.lower_pair(ex)
    bad = _psum_attrs(attrs)(text)
    with pytest.raises(Exception, match=xla):
        _run_sharded_text(ex, bad, [_data((8, 16))])
    run = entangle("check", write("ref.mlir", ref_text), write("bad.mlir", bad),
                   "--no-verify-rules")
    assert run.code == 2 and "Traceback" not in run.text, run.text
    lines = [line for line in run.text.splitlines() if line.strip()]
    assert len(lines) == 1 and "test_exact_regions.py:" in lines[0] and message in lines[0], run.text


def _roll() -> Example:
    return custom("roll_blocks", _mesh4(), lambda x: jnp.roll(x, 4, axis=1),
                  lambda x: lax.ppermute(x, "tp", [(i, (i + 1) % 4) for i in range(4)]),
                  [ArgDef("x", (8, 16), "float32", "data", P(None, "tp"))], P(None, "tp"),
                  "roll by one block")


@pytest.mark.parametrize("edit, message", [
    (lambda t: t.replace("[3, 0]]", "[3, 7]]"),
     ("partition id 7 in source_target_pairs [[0, 1], [1, 2], [2, 3], [3, 7]] is outside the "
     "4 partitions")),
    (lambda t: re.sub(r"channel_handle = #stablehlo\.channel_handle<handle = \d+, type = \d+>, ",
                      "", t), "replica id 1 in source_target_pairs"),
], ids=["target-outside-the-mesh", "no-channel-pairs-are-replica-ids"])
def test_collective_permute_xla_rejects_is_bad_input(entangle, write, edit, message) -> None:
    """Both abort XLA's CPU runtime (std::out_of_range, so they are not run here); entangle
    said "verified" for the second and "internal error ... KeyError" for the first."""
    ex = _roll()
    ref_text, text = catalog.lower_pair(ex)
    judge(ex, [_data((8, 16), 6)], correct=True)
    run = entangle("check", write("ref.mlir", ref_text), write("bad.mlir", edit(text)),
                   "--no-verify-rules")
    assert run.code == 2 and "Traceback" not in run.text, run.text
    lines = [line for line in run.text.splitlines() if line.strip()]
    assert len(lines) == 1 and "test_exact_regions.py:" in lines[0] and message in lines[0], run.text
