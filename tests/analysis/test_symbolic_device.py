"""Device masks checked with a symbolic device index (`analysis/instance/symbolic_device.py`).

A vocab-parallel mask's instance is one Z3 query for every device of a class: the device's
coordinates along the mask's axes are z3 integers in their box. The lemmas below run the
rules of the embedding's chain (both spellings: jax's `where(outside, 0, ids - start)` and
XLA's `clip(ids - start, 0, n - 1)`) on 1-, 2- and 3-axis meshes (XLA's tp 8 is d0 x d1 x d2)
and check that the symbolic query proves them and refutes the nearest wrong claims: a mask
offset one block off, `<` where `<=` belongs, each device testing another device's block, an
offset right on device 0 only. The pieces the symbolic claim is built of are lemmas too: the
clamped difference and the shifted value at a symbolic start equal the concrete ones at every
device (and not at a neighbour's). The whole program is grounded: the XLA-form embedding on
8 simulated devices, correct and with each mistake, numbers compared with the reference.
"""

from __future__ import annotations

import os

if "--xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                               + " --xla_force_host_platform_device_count=8").strip()

import numpy as np
import pytest
import z3

from entangle_mlir.analysis.instance.local_values import _clamped_difference
from entangle_mlir.analysis.instance.symbolic_device import SymbolicDevice, symbolic_axes
from entangle_mlir.core import terms as T
from entangle_mlir.core.mesh import Mesh
from entangle_mlir.core.relations import BlockIndex, InBlock, Masked, Rel, Shifted
from entangle_mlir.semantics.element import int_limits, wrap_shift
from tests.rules.test_device_blocks import rel, run, zeros
from tests.rules.test_lemmas import _EMBED, _checker, arg

TP2 = Mesh((("tp", 2),))
TP3 = Mesh((("tp", 3),))
DP_TP = Mesh((("dp", 2), ("tp", 2)))
XLA8 = Mesh((("d0", 2), ("d1", 2), ("d2", 2)))
MESHES = [TP2, TP3, DP_TP, XLA8]
IDS = ["tp2", "tp3", "dp2xtp2", "d0xd1xd2"]
LENGTH = 2


def mask_axes(mesh: Mesh) -> tuple[str, ...]:
    return ("tp",) if "tp" in mesh.names else mesh.names


def starts(mesh: Mesh, block=None, length: int = LENGTH) -> tuple[int, ...]:
    """Each device's start: `block(b, n)` (default b) times `length`, b its block index
    along the mask's axes out of n."""
    axes = mask_axes(mesh)
    n = mesh.group_size(axes)
    pick = block or (lambda b, n: b)
    return tuple(pick(mesh.block_index(axes, d), n) * length for d in range(mesh.num_devices))


def tokens(mesh: Mesh, n: int = 4) -> tuple[Rel, tuple[int, ...]]:
    """Token ids (split over dp where there is one) and their local shape."""
    if "dp" in mesh.names:
        return rel(arg((n,), "i32"), "dp"), (n // mesh.size("dp"),)
    return rel(arg((n,), "i32")), (n,)


def check(op: str, ins: list, mesh: Mesh, result, attrs=None, dtype="f32", claim=None):
    """The rule's output (or `claim`) and Z3's verdict on it."""
    outs, info, ctx = run(op, ins, mesh, result, attrs, dtype)
    verdict = _checker().check(info, ins, [claim] if claim is not None else outs, mesh, ctx)
    return outs[0], verdict


def symbolic(verdict) -> bool:
    return verdict.details.get("devices", "").startswith("symbolic along")


def proved_symbolically(op: str, ins: list, mesh: Mesh, result, attrs=None, dtype="f32"):
    out, verdict = check(op, ins, mesh, result, attrs, dtype)
    assert verdict.status == "proved" and symbolic(verdict), verdict.describe()
    return out


def refuted_symbolically(op: str, ins: list, claim, mesh: Mesh, result, attrs=None,
                         dtype="f32") -> None:
    _, verdict = check(op, ins, mesh, result, attrs, dtype, claim)
    assert verdict.status == "refuted" and symbolic(verdict), verdict.describe()


def xla_chain(mesh: Mesh, local_start=None):
    """XLA's spelling of the embedding's mask and index, each instance proved symbolically:
    `local = ids - start; (local >= 0) & (local < n); min(max(local, 0), n - 1)`."""
    ids, shape = tokens(mesh)
    local = Shifted(ids, tuple(-s for s in local_start or starts(mesh)))
    ge = proved_symbolically("stablehlo.compare", [local, zeros(shape, "i32")], mesh, shape,
                             {"comparison_direction": "GE"}, "i1")
    lt = proved_symbolically("stablehlo.compare", [local, zeros(shape, "i32", LENGTH)], mesh,
                             shape, {"comparison_direction": "LT"}, "i1")
    inside = proved_symbolically("stablehlo.and", [ge, lt], mesh, shape, dtype="i1")
    low = proved_symbolically("stablehlo.maximum", [zeros(shape, "i32"), local], mesh, shape,
                              dtype="i32")
    index = proved_symbolically("stablehlo.minimum", [zeros(shape, "i32", LENGTH - 1), low],
                                mesh, shape, dtype="i32")
    return ids, local, ge, lt, inside, index, shape


# ----- proved: one query for every device -----------------------------------------------------

@pytest.mark.parametrize("mesh", MESHES, ids=IDS)
def test_xla_spelling_is_proved_for_every_device_at_once(mesh: Mesh) -> None:
    *_, inside, index, shape = xla_chain(mesh)
    assert isinstance(inside, InBlock) and inside.inside and inside.axes == mask_axes(mesh)
    assert isinstance(index, BlockIndex) and index.clamp == (0, LENGTH - 1)
    # jax's bounds checks on the clipped index are constants, proved for every device
    for direction, bound, value in (("GE", 0, 1), ("LE", LENGTH - 1, 1), ("LT", 0, 0)):
        test = proved_symbolically("stablehlo.compare", [index, zeros(shape, "i32", bound)],
                                   mesh, shape, {"comparison_direction": direction}, "i1")
        assert T.splat_value(test.term) == value


@pytest.mark.parametrize("mesh", MESHES, ids=IDS)
def test_jax_spelling_is_proved_for_every_device_at_once(mesh: Mesh) -> None:
    ids, shape = tokens(mesh)
    start = Shifted(zeros(shape, "i32"), starts(mesh))
    end = Shifted(zeros(shape, "i32"), tuple(s + LENGTH for s in starts(mesh)))
    below = proved_symbolically("stablehlo.compare", [ids, start], mesh, shape,
                                {"comparison_direction": "LT"}, "i1")
    above = proved_symbolically("stablehlo.compare", [ids, end], mesh, shape,
                                {"comparison_direction": "GE"}, "i1")
    outside = proved_symbolically("stablehlo.or", [below, above], mesh, shape, dtype="i1")
    assert isinstance(outside, InBlock) and outside.outside
    local = Shifted(ids, tuple(-s for s in starts(mesh)))
    index = proved_symbolically("stablehlo.select", [outside, zeros(shape, "i32"), local],
                                mesh, shape, dtype="i32")
    assert isinstance(index, BlockIndex) and index.clamp is None
    cotangent = rel(arg(ids.term.shape + (3,)), *ids.tiling)
    wide = proved_symbolically("stablehlo.broadcast_in_dim", [outside], mesh, shape + (3,),
                               {"broadcast_dimensions": (0,)}, "i1")
    masked = proved_symbolically("stablehlo.select", [wide, zeros(shape + (3,)), cotangent],
                                 mesh, shape + (3,))
    assert isinstance(masked, Masked) and masked.zero


@pytest.mark.parametrize("mesh", [TP2, XLA8], ids=["tp2", "d0xd1xd2"])
def test_a_table_split_over_the_mask_axes_keeps_the_per_device_check(mesh: Mesh) -> None:
    """The lookup reads the device's block of the vocab-split table, and the masked rows'
    sum is partial over the mask's axes: neither is the same on every device of a class,
    so both are checked device by device (and proved)."""
    _, _, _, _, inside, index, shape = xla_chain(mesh)
    column = proved_symbolically("stablehlo.broadcast_in_dim", [index], mesh, shape + (1,),
                                 {"broadcast_dimensions": (0,)}, "i32")
    vocab = LENGTH * mesh.group_size(mask_axes(mesh))
    table = rel(arg((vocab, 2)), mask_axes(mesh))
    found, verdict = check("stablehlo.gather", [table, column], mesh, shape + (2,),
                           {**_EMBED, "slice_sizes": (1, 2)})
    assert verdict.status == "proved" and not symbolic(verdict), verdict.describe()
    wide = proved_symbolically("stablehlo.broadcast_in_dim", [inside], mesh, shape + (2,),
                               {"broadcast_dimensions": (0,)}, "i1")
    summed, verdict = check("stablehlo.select", [wide, found, zeros(shape + (2,))], mesh,
                            shape + (2,))
    assert isinstance(summed, Rel) and summed.partial == mask_axes(mesh)
    assert verdict.status == "proved" and not symbolic(verdict), verdict.describe()


# ----- refuted: the nearest wrong claims ------------------------------------------------------

@pytest.mark.parametrize("mesh", MESHES, ids=IDS)
def test_mask_offset_one_block_off_is_refuted(mesh: Mesh) -> None:
    _, _, ge, _, _, _, shape = xla_chain(mesh)
    next_block = Shifted(ge.rel, tuple(-s - LENGTH for s in starts(mesh)))
    refuted_symbolically("stablehlo.compare", [next_block, zeros(shape, "i32")], ge, mesh, shape,
                         {"comparison_direction": "GE"}, "i1")


@pytest.mark.parametrize("mesh", MESHES, ids=IDS)
def test_less_than_where_less_or_equal_belongs_is_refuted(mesh: Mesh) -> None:
    """`local < n - 1` claimed as the block's upper bound `local <= n - 1`."""
    _, local, _, lt, _, _, shape = xla_chain(mesh)
    refuted_symbolically("stablehlo.compare", [local, zeros(shape, "i32", LENGTH - 1)], lt,
                         mesh, shape, {"comparison_direction": "LT"}, "i1")


@pytest.mark.parametrize("mesh", MESHES, ids=IDS)
def test_testing_another_devices_block_is_refuted(mesh: Mesh) -> None:
    """Each device tests the block of its mirror device (block n - 1 - b): affine in the
    coordinates, so still one symbolic query, which finds the device it fails on."""
    _, _, ge, _, _, _, shape = xla_chain(mesh)
    mirror = Shifted(ge.rel, tuple(-s for s in starts(mesh, lambda b, n: n - 1 - b)))
    refuted_symbolically("stablehlo.compare", [mirror, zeros(shape, "i32")], ge, mesh, shape,
                         {"comparison_direction": "GE"}, "i1")


@pytest.mark.parametrize("mesh", MESHES, ids=IDS)
def test_an_offset_right_on_device_zero_only_is_refuted(mesh: Mesh) -> None:
    """Starts b * (n + 1): device 0's claim holds, every other device's fails; the symbolic
    query is over the whole box, not the device it was built at."""
    _, _, ge, _, _, _, shape = xla_chain(mesh)
    wide = Shifted(ge.rel, tuple(-s for s in starts(mesh, length=LENGTH + 1)))
    refuted_symbolically("stablehlo.compare", [wide, zeros(shape, "i32")], ge, mesh, shape,
                         {"comparison_direction": "GE"}, "i1")


def test_a_table_not_affine_in_the_coordinates_is_checked_per_device() -> None:
    """tp 3, each device testing its cyclic neighbour's block (starts 2, 4, 0): no affine
    form, so the per-device check runs, and refutes it."""
    mesh = TP3
    _, _, ge, _, _, _, shape = xla_chain(mesh)
    neighbour = Shifted(ge.rel, tuple(-s for s in starts(mesh, lambda b, n: (b + 1) % n)))
    ins = [neighbour, zeros(shape, "i32")]
    _, info, _ = run("stablehlo.compare", ins, mesh, shape, {"comparison_direction": "GE"}, "i1")
    assert symbolic_axes(info, ins, [ge], mesh) == ()
    _, verdict = check("stablehlo.compare", ins, mesh, shape, {"comparison_direction": "GE"},
                       "i1", ge)
    assert verdict.status == "refuted" and not symbolic(verdict), verdict.describe()


# ----- the pieces: a symbolic start is every device's concrete one ----------------------------

def _same_for_all(lhs, rhs, v: z3.ArithRef, dtype: str) -> bool:
    """lhs == rhs for every value v of `dtype`."""
    lo, hi = int_limits(dtype)
    solver = z3.Solver()
    solver.add(v >= lo, v <= hi, lhs != rhs)
    answer = solver.check()
    assert answer != z3.unknown
    return answer == z3.unsat


def _num(x) -> z3.ArithRef:
    return x if isinstance(x, z3.ExprRef) else z3.IntVal(int(x))


@pytest.mark.parametrize("length,blocks", [(3, 2), (3, 4), (50, 3), (100, 2)])
@pytest.mark.parametrize("bounds", [(0, None), (None, "n-1"), (0, "n-1"), (-2, "n+1")],
                         ids=["lo", "hi", "block", "wide"])
def test_clamped_difference_at_a_symbolic_start(length: int, blocks: int, bounds) -> None:
    """`clamp(x - start, lo, hi)` in i8 (the difference wraps around) with start = k *
    length, k symbolic in [0, blocks): at k = b it is the concrete value at start b *
    length, for every x; at start (b + 1) * length it is not."""
    dtype = "i8"
    lo, hi = (None if e is None else length - 1 if e == "n-1" else length + 1 if e == "n+1"
              else e for e in bounds)
    v, k = z3.Int("x"), z3.Int("k")
    last = (blocks - 1) * length
    symbolic_value = _num(_clamped_difference(v, k * length, dtype, (lo, hi), length, last))
    for b in range(blocks):
        at_b = z3.substitute(symbolic_value, (k, z3.IntVal(b)))
        same = _num(_clamped_difference(v, b * length, dtype, (lo, hi), length, last))
        assert _same_for_all(at_b, same, v, dtype)
        other = _num(_clamped_difference(v, (b + 1) * length, dtype, (lo, hi), length, last))
        assert not _same_for_all(at_b, other, v, dtype)


@pytest.mark.parametrize("mesh", [TP3, DP_TP, XLA8], ids=["tp3", "dp2xtp2", "d0xd1xd2"])
@pytest.mark.parametrize("step", [-100, 60])
def test_shifted_value_at_symbolic_coordinates(mesh: Mesh, step: int) -> None:
    """An i8 value plus an affine per-device offset (wrapping around), at symbolic
    coordinates, is at each device's coordinates that device's `wrap_shift`, and not its
    neighbour's."""
    axes = mask_axes(mesh)
    offsets = tuple(7 + step * mesh.block_index(axes, d) for d in range(mesh.num_devices))
    value = Shifted(rel(arg((1,), "i8")), offsets)
    coords = {a: z3.Int(f"c.{a}") for a in axes}
    v = z3.Int("x")
    for rep in (d for d in range(mesh.num_devices) if not any(mesh.coords(d)[a] for a in axes)):
        where = SymbolicDevice(mesh, rep, coords)
        shifted = _num(where.shifted(np.array([v], dtype=object), value)[0])
        for d in range(mesh.num_devices):
            if any(mesh.coords(d)[a] != mesh.coords(rep)[a] for a in mesh.names if a not in axes):
                continue
            at_d = z3.substitute(shifted, *[(c, z3.IntVal(mesh.coords(d)[a]))
                                            for a, c in coords.items()])
            assert _same_for_all(at_d, _num(wrap_shift(v, offsets[d], "i8")), v, "i8")
            other = offsets[(d + 1) % mesh.num_devices]
            if other != offsets[d]:
                assert not _same_for_all(at_d, _num(wrap_shift(v, other, "i8")), v, "i8")


# ----- grounded: the XLA-form embedding on 8 simulated devices --------------------------------

def _lookup(kind: str, tp: int):
    """Megatron's lookup as the shard_map body, correct or with one mistake."""
    import jax.numpy as jnp
    from jax import lax

    def body(ids, w):
        n = w.shape[0]
        block = lax.axis_index("tp") + (1 if kind == "next_block" else 0)
        local = ids - block * n
        upper = (local < n - 1) if kind == "lt_for_le" else (local <= n - 1)
        mask = (local >= 0) & upper
        if kind == "other_device":
            w = lax.ppermute(w, "tp", [(i, (i + 1) % tp) for i in range(tp)])
        rows = jnp.take(w, jnp.clip(local, 0, n - 1), axis=0)
        return lax.psum(jnp.where(mask[..., None], rows, 0.0), "tp")
    return body


@pytest.mark.parametrize("kind", ["correct", "next_block", "lt_for_le", "other_device"])
def test_xla_form_embedding_verdict_matches_execution(kind: str) -> None:
    """jit(tanh(lookup(ids, w)) * 2) with w split over 8 devices, the lookup a shard_map
    library function (XLA's mesh d0 x d1 x d2): the correct one computes the reference's
    numbers and is proven, its mask instances by the symbolic device; each twin computes
    other numbers and is not proven."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    from entangle_mlir.analysis.instance.checker import DEFAULT_CHECKER
    from entangle_mlir.driver import check_texts
    from entangle_mlir.jax import lower_partitioned

    tp, n_ids = 8, 16
    vocab = LENGTH * tp
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:tp]), ("tp",))
    lookup = jax.shard_map(_lookup(kind, tp), mesh=mesh, in_specs=(P(), P("tp", None)),
                           out_specs=P())

    def reference(w, ids):
        return jnp.tanh(jnp.take(w, ids, axis=0)) * 2.0

    def sharded(w, ids):
        return jnp.tanh(lookup(ids, w)) * 2.0

    avals = [jax.ShapeDtypeStruct((vocab, 4), jnp.float32,
                                  sharding=NamedSharding(mesh, P("tp", None))),
             jax.ShapeDtypeStruct((n_ids,), jnp.int32, sharding=NamedSharding(mesh, P()))]
    w = np.random.default_rng(0).standard_normal((vocab, 4)).astype(np.float32)
    ids = np.arange(n_ids, dtype=np.int32)  # every block's first and last row
    got = jax.jit(sharded)(*(jax.device_put(x, a.sharding) for x, a in zip((w, ids), avals)))
    same = bool(np.allclose(got, reference(w, ids), atol=1e-6))
    assert same is (kind == "correct")
    _, per_device = lower_partitioned(sharded, *avals)
    ref_text = jax.jit(reference).lower(*(jax.ShapeDtypeStruct(a.shape, a.dtype)
                                          for a in avals)).as_text()
    DEFAULT_CHECKER.clear()
    report = check_texts(ref_text, per_device)
    assert report.proven is same, report.render_text()
    if same:
        masks = [r for r in DEFAULT_CHECKER.cache.values()
                 if "device mask" in r.details.get("mode", "")]
        assert any(symbolic(r) for r in masks), [r.details for r in masks]
        assert all(r.status == "proved" for r in masks)


# ----- the fallback ---------------------------------------------------------------------------

@pytest.mark.parametrize("failure", ["raises", "inconclusive"])
def test_a_symbolic_query_that_fails_falls_back_to_each_device(failure: str,
                                                               monkeypatch) -> None:
    """Where the symbolic claim cannot be built, or Z3 cannot decide it, each device's claim
    is checked as before: the verdict is the per-device one (proved here; a wrong claim
    refuted)."""
    from entangle_mlir.analysis.instance import claims as claims_module
    from entangle_mlir.analysis.instance import solve
    from entangle_mlir.analysis.solver import ProofResult

    mesh = DP_TP
    *_, local, ge, _, _, _, shape = xla_chain(mesh)
    if failure == "raises":
        def broken(*args, **kwargs):
            raise TypeError("no symbolic form")
        monkeypatch.setattr(claims_module, "symbolic_claims", broken)
    else:
        prove = solve._prove

        def undecided(*args):
            if args[-1]:  # the symbolic device's axes
                return ProofResult("unknown", None, 0.0, "instance", "Z3 timed out")
            return prove(*args)
        monkeypatch.setattr(solve, "_prove", undecided)
    ins = [local, zeros(shape, "i32")]
    _, verdict = check("stablehlo.compare", ins, mesh, shape, {"comparison_direction": "GE"},
                       "i1", ge)
    assert verdict.status == "proved" and not symbolic(verdict), verdict.describe()
    next_block = Shifted(ge.rel, tuple(-s - LENGTH for s in starts(mesh)))
    _, verdict = check("stablehlo.compare", [next_block, zeros(shape, "i32")], mesh, shape,
                       {"comparison_direction": "GE"}, "i1", ge)
    assert verdict.status == "refuted" and not symbolic(verdict), verdict.describe()


# ----- per-device tables alone: a partition id's arithmetic on a large mesh ------------------

XLA512 = Mesh(tuple((f"d{i}", 2) for i in range(9)))
"""XLA's per-device form of dp 64 x tp 8: nine axes of two devices."""


def table_check(op: str, table: tuple[int, ...], by: int, mesh: Mesh, claim=None):
    """`op(pid-like table, by)` in ui32: the rule's output (or `claim`) and Z3's verdict."""
    from entangle_mlir.core.relations import DeviceScalar
    from entangle_mlir.mlir.opinfo import OpInfo, TensorType
    from entangle_mlir.rules import RULES
    from entangle_mlir.rules.base import RuleContext

    info = OpInfo(op, {}, [TensorType((), "ui32")] * 2, [TensorType((), "ui32")])
    ctx = RuleContext(mesh=mesh, manual_axes=mesh.names)
    ins = [DeviceScalar(table), zeros((), "ui32", by)]
    outs = RULES[op](info, ins, ctx)
    verdict = _checker().check(info, ins, [claim] if claim is not None else outs, mesh, ctx)
    return outs[0], verdict


@pytest.mark.parametrize("op,by", [("stablehlo.remainder", 8), ("stablehlo.divide", 8),
                                   ("stablehlo.divide", 1)])
def test_partition_id_arithmetic_is_one_query_on_512_devices(op: str, by: int) -> None:
    pid = tuple(range(XLA512.num_devices))
    out, verdict = table_check(op, pid, by, XLA512)
    want = [p % by if op == "stablehlo.remainder" else p // by for p in pid]
    assert list(out.values) == want
    assert verdict.status == "proved" and symbolic(verdict), verdict.describe()


def test_partition_id_arithmetic_on_few_devices_keeps_the_per_device_check() -> None:
    pid = tuple(range(XLA8.num_devices))
    _, verdict = table_check("stablehlo.remainder", pid, 4, XLA8)
    assert verdict.status == "proved" and not symbolic(verdict), verdict.describe()


def test_a_wrong_remainder_table_is_refuted() -> None:
    """`pid % 8` claimed as `pid % 16` (affine in the coordinates: one symbolic query finds a
    device it fails on) and as `pid % 8` but one device off (not affine: device by device)."""
    from entangle_mlir.core.relations import DeviceScalar

    pid = tuple(range(XLA512.num_devices))
    wide = DeviceScalar(tuple(p % 16 for p in pid))
    _, verdict = table_check("stablehlo.remainder", pid, 8, XLA512, wide)
    assert verdict.status == "refuted" and symbolic(verdict), verdict.describe()
    off = DeviceScalar(tuple((p % 8) + (p == 300) for p in pid))
    _, verdict = table_check("stablehlo.remainder", pid, 8, XLA512, off)
    assert verdict.status == "refuted" and not symbolic(verdict), verdict.describe()
