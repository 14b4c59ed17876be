"""Every rule is a lemma proved by Z3 on small symbolic tensors (TASO-style).

For each key of `RULES`, hand-built OpInfos and input relations at 2-3 small shapes on 1-D and
2-D meshes: the rule's output relation must be proved by `check_instance` at the real (small)
shape. Must-fail lemmas build WRONG output relations by hand (not via rules) and Z3 must refute
them: "unknown" is a failure, as is a proved wrong relation.
"""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from fractions import Fraction

import numpy as np
import pytest

from entangle_mlir.analysis.instance.checker import InstanceChecker
from entangle_mlir.core import terms as T
from entangle_mlir.core.mesh import Mesh
from entangle_mlir.core.relations import (
    GLOBAL,
    DeviceScalar,
    Opaque,
    Permuted,
    Rel,
    Shifted,
    Value,
    Windowed,
)
from entangle_mlir.mlir.opinfo import OpInfo, TensorType
from entangle_mlir.rules import RULES
from entangle_mlir.rules.base import RuleContext

M1 = Mesh((("tp", 2),))
M2 = Mesh((("dp", 2), ("tp", 2)))
M3 = Mesh((("tp", 3),))

# ----- building blocks ------------------------------------------------------------------------

_next_arg = iter(range(10_000, 1_000_000))


def arg(shape: tuple[int, ...], dtype: str = "f32") -> T.Term:
    """A fresh reference argument."""
    return T.make_arg(next(_next_arg), tuple(shape), dtype)


def rel(term: T.Term, *tiling, partial: tuple[str, ...] = (), kind: str = "",
        poly: frozenset[int] = frozenset()) -> Rel:
    """A relation; `tiling` per dim as a tuple of axes or a single axis name (default none)."""
    tiles = [(t,) if isinstance(t, str) else tuple(t) for t in tiling]
    tiles += [()] * (len(term.shape) - len(tiles))
    if partial and not kind:
        kind = "sum"
    return Rel(term, tuple(tiles), tuple(partial), kind, poly)


def splat(value, shape: tuple[int, ...], dtype: str = "f32") -> Rel:
    """A splat constant at a local shape (every dim poly), as the constant rule builds it."""
    return Rel(T.make_splat(value, shape, dtype), ((),) * len(shape),
               poly=frozenset(range(len(shape))))


def local_type(value: Value, mesh: Mesh | None) -> TensorType:
    if isinstance(value, DeviceScalar):
        return TensorType(tuple(value.shape), "i32")
    if isinstance(value, Windowed):
        shape = list(local_type(value.rel, mesh).shape)
        shape[value.dim] = value.length
        shape = [n for d, n in enumerate(shape) if d not in value.summed]
        return TensorType(tuple(shape), value.rel.term.dtype)
    if isinstance(value, Permuted | Shifted):
        value = value.rel
    assert isinstance(value, Rel)
    if mesh is None or value.scope == GLOBAL:
        return TensorType(value.term.shape, value.term.dtype)
    shape = tuple(size if d in value.poly else size // mesh.group_size(axes)
                  for d, (size, axes) in enumerate(zip(value.term.shape, value.tiling)))
    return TensorType(shape, value.term.dtype)


def groups(mesh: Mesh, *axes: str) -> dict:
    return {"replica_groups": mesh.groups_for(tuple(axes)), "use_global_device_ids": True,
            "channel_handle": 1}


@dataclass
class Lemma:
    """One rule instance: op, attributes, input relations, local result types."""

    name: str
    op: str
    ins: list[Value]
    results: list[tuple[tuple[int, ...], str]] | None = None
    attrs: dict = field(default_factory=dict)
    mesh: Mesh | None = M1

    def info(self) -> OpInfo:
        operand_types = [local_type(v, self.mesh) for v in self.ins]
        results = self.results
        if results is None:
            results = [(operand_types[0].shape, operand_types[0].dtype)]
        return OpInfo(self.op, dict(self.attrs), operand_types,
                      [TensorType(tuple(s), d) for s, d in results])

    def context(self) -> RuleContext:
        rels = [v for v in self.ins if isinstance(v, Rel)]
        if self.mesh is None or any(r.scope == GLOBAL for r in rels):
            return RuleContext(mesh=self.mesh, manual_axes=())
        return RuleContext(mesh=self.mesh, manual_axes=self.mesh.names)


def _two_sided_mask_lemma() -> Lemma:
    """select on `2 <= i and i < 6` of an 8-row iota (XLA masks both ends of a padded split
    dim): the kept rows zero-padded (the and of two iota masks is their intersection)."""
    iota = T.make_iota((8, 2), 0, "i32")
    lo = T.make_elementwise("stablehlo.compare", (iota, T.make_splat(2, (8, 2), "i32")),
                            ("GE",), dtype="i1")
    hi = T.make_elementwise("stablehlo.compare", (iota, T.make_splat(6, (8, 2), "i32")),
                            ("LT",), dtype="i1")
    mask = T.make_elementwise("stablehlo.and", (lo, hi), dtype="i1")
    return Lemma("select-two-sided-iota-mask", "stablehlo.select",
                 [rel(mask, "tp"), rel(arg((8, 2)), "tp"), splat(0, (4, 2))])


def _checker() -> InstanceChecker:
    # Real (small) shapes only: the lemma is about these shapes, not a reduced one.
    return InstanceChecker(timeout_ms=20_000, reduce_above=10**9, max_elements=10**6)


def prove_lemma(lemma: Lemma) -> None:
    if lemma.op not in RULES:
        pytest.skip(f"no rule for {lemma.op}")
    info = lemma.info()
    ctx = lemma.context()
    outs = RULES[lemma.op](info, list(lemma.ins), ctx)
    assert outs and not any(isinstance(v, Opaque) for v in outs), (
        f"{lemma.name}: the rule claims nothing: {outs}")
    result = _checker().check(info, lemma.ins, outs, lemma.mesh, ctx)
    assert result.status == "proved", f"{lemma.name}: {result.describe()}"


# ----- elementwise ----------------------------------------------------------------------------

UNARY_FLOAT = ["stablehlo.negate", "stablehlo.abs", "stablehlo.exponential",
               "stablehlo.exponential_minus_one", "stablehlo.log", "stablehlo.log_plus_one",
               "stablehlo.tanh", "stablehlo.logistic", "stablehlo.rsqrt", "stablehlo.sqrt",
               "stablehlo.cbrt", "stablehlo.sine", "stablehlo.cosine", "stablehlo.tan",
               "stablehlo.sign", "stablehlo.floor", "stablehlo.ceil",
               "stablehlo.round_nearest_even", "stablehlo.round_nearest_afz", "chlo.square",
               "chlo.erf", "stablehlo.convert"]
BINARY_FLOAT = ["stablehlo.add", "stablehlo.subtract", "stablehlo.multiply", "stablehlo.divide",
                "stablehlo.maximum", "stablehlo.minimum", "stablehlo.power",
                "stablehlo.remainder", "stablehlo.atan2"]
LOGIC = ["stablehlo.and", "stablehlo.or", "stablehlo.xor"]


def _layouts(shape: tuple[int, ...]) -> list[tuple[Mesh | None, Callable[[T.Term], Rel]]]:
    """Several layouts for an operand of `shape` (global)."""
    out: list = []
    if len(shape) == 1:
        out.append((M1, lambda t: rel(t, "tp")))
        out.append((M2, lambda t: rel(t, ("dp", "tp"))))
    else:
        out.append((M1, lambda t: rel(t, (), "tp")))
        out.append((M2, lambda t: rel(t, "dp", "tp")))
        out.append((M3, lambda t: rel(t, "tp")))
    out.append((None, lambda t: Rel(t, ((),) * len(t.shape), scope=GLOBAL)))
    return out


def elementwise_lemmas() -> list[Lemma]:
    lemmas = []
    for shape in ((4,), (6, 4)):
        for k, (mesh, lay) in enumerate(_layouts(shape)):
            if mesh is M3 and shape[0] % 3:
                continue
            if mesh is M3 and shape == (6, 4):
                shape3 = (6, 2)
            else:
                shape3 = shape
            tag = f"{shape3}-{k}"
            for op in UNARY_FLOAT:
                lemmas.append(Lemma(f"{op}-{tag}", op, [lay(arg(shape3))], mesh=mesh))
            for op in BINARY_FLOAT:
                lemmas.append(Lemma(f"{op}-{tag}", op, [lay(arg(shape3)), lay(arg(shape3))],
                                    mesh=mesh))
            for op in LOGIC:
                lemmas.append(Lemma(f"{op}-{tag}", op, [lay(arg(shape3, "i1")),
                                                        lay(arg(shape3, "i1"))], mesh=mesh))
            lemmas.append(Lemma(f"not-{tag}", "stablehlo.not", [lay(arg(shape3, "i1"))],
                                mesh=mesh))
            for direction in ("LT", "EQ", "GE"):
                lemmas.append(Lemma(f"compare-{direction}-{tag}", "stablehlo.compare",
                                    [lay(arg(shape3)), lay(arg(shape3))],
                                    results=None, attrs={"comparison_direction": direction},
                                    mesh=mesh))
            lemmas.append(Lemma(f"select-{tag}", "stablehlo.select",
                                [lay(arg(shape3, "i1")), lay(arg(shape3)), lay(arg(shape3))],
                                mesh=mesh))
            lemmas.append(Lemma(f"clamp-{tag}", "stablehlo.clamp",
                                [lay(arg(shape3)), lay(arg(shape3)), lay(arg(shape3))],
                                mesh=mesh))
            lemmas.append(Lemma(f"is_finite-{tag}", "stablehlo.is_finite", [lay(arg(shape3))],
                                mesh=mesh))
    for lemma in lemmas:
        if lemma.op in ("stablehlo.compare", "stablehlo.is_finite"):
            lemma.results = [(lemma.info().operand_types[0].shape, "i1")]
        if lemma.op == "stablehlo.select":
            lemma.results = [(lemma.info().operand_types[1].shape, "f32")]
    return lemmas


def partial_lemmas() -> list[Lemma]:
    """Linear ops keep partial sums; max/min partials where order-preserving."""
    out = []
    for shape in ((4,), (2, 4)):
        x, y, b = arg(shape), arg(shape), arg(shape)
        px = rel(x, partial=("tp",))
        py = rel(y, partial=("tp",))
        rb = rel(b)
        out += [
            Lemma(f"add-partials-{shape}", "stablehlo.add", [px, py]),
            Lemma(f"sub-partials-{shape}", "stablehlo.subtract", [px, py]),
            Lemma(f"add-partial-replicated-{shape}", "stablehlo.add", [px, rb]),
            Lemma(f"sub-replicated-partial-{shape}", "stablehlo.subtract", [rb, px]),
            Lemma(f"mul-partial-replicated-{shape}", "stablehlo.multiply", [rb, px]),
            Lemma(f"div-partial-replicated-{shape}", "stablehlo.divide", [px, rb]),
            Lemma(f"negate-partial-{shape}", "stablehlo.negate", [px]),
            Lemma(f"convert-partial-{shape}", "stablehlo.convert", [px]),
            Lemma(f"select-partials-{shape}", "stablehlo.select",
                  [rel(arg(shape, "i1")), px, py]),
            Lemma(f"select-partial-zero-{shape}", "stablehlo.select",
                  [rel(arg(shape, "i1")), px, splat(0, shape)]),
            Lemma(f"add-partial-splat-{shape}", "stablehlo.add", [px, splat(1.5, shape)]),
            Lemma(f"mul-partial-splat-{shape}", "stablehlo.multiply", [px, splat(-3, shape)]),
            Lemma(f"add-partialmax-replicated-{shape}", "stablehlo.add",
                  [rel(x, partial=("tp",), kind="max"), rb]),
            Lemma(f"sub-partialmin-replicated-{shape}", "stablehlo.subtract",
                  [rel(x, partial=("tp",), kind="min"), rb]),
            Lemma(f"negate-partialmax-{shape}", "stablehlo.negate",
                  [rel(x, partial=("tp",), kind="max")]),
            Lemma(f"mul-partialmax-positive-{shape}", "stablehlo.multiply",
                  [rel(x, partial=("tp",), kind="max"), splat(Fraction(1, 2), shape)]),
            Lemma(f"add-partial-2d-{shape}", "stablehlo.add",
                  [rel(x, partial=("dp", "tp")), rel(b)], mesh=M2),
        ]
    # Partial max/min of booleans and integers: only the order's own operations keep them.
    for shape in ((4,), (2, 2)):
        any_, all_ = (rel(arg(shape, "i1"), partial=("tp",), kind=k) for k in ("max", "min"))
        flag = rel(arg(shape, "i1"))
        top = rel(arg(shape, "i32"), partial=("tp",), kind="max")
        out += [
            Lemma(f"not-partial-any-{shape}", "stablehlo.not", [any_]),
            Lemma(f"or-partial-any-flag-{shape}", "stablehlo.or", [any_, flag]),
            Lemma(f"and-partial-any-flag-{shape}", "stablehlo.and", [any_, flag]),
            Lemma(f"and-partial-alls-{shape}", "stablehlo.and",
                  [all_, rel(arg(shape, "i1"), partial=("tp",), kind="min")]),
            Lemma(f"convert-partial-any-i32-{shape}", "stablehlo.convert", [any_],
                  results=[(shape, "i32")]),
            Lemma(f"not-partial-int-max-{shape}", "stablehlo.not", [top]),
            Lemma(f"maximum-partial-int-min-{shape}", "stablehlo.maximum",
                  [rel(arg(shape, "i32"), partial=("tp",), kind="min"), rel(arg(shape, "i32"))]),
            Lemma(f"minimum-partial-int-maxes-{shape}", "stablehlo.minimum",
                  [top, rel(arg(shape, "i32"))]),
        ]
    # A partial sum over 'dp' combined with a value split over 'tp' (2-D mesh).
    x, b = arg((2, 4)), arg((2, 4))
    out.append(Lemma("add-partial-dp-tiled-tp", "stablehlo.add",
                     [rel(x, (), "tp", partial=("dp",)), rel(b, (), "tp")], mesh=M2))
    # Poly operands: a broadcast built at the local shape widened to the partner's global size.
    v = arg((2,))
    local_bcast = Rel(T.make_broadcast(v, (0,), (2, 2)), ((), ()), poly=frozenset({1}))
    out.append(Lemma("add-tiled-poly-broadcast", "stablehlo.add",
                     [rel(arg((2, 4)), (), "tp"), local_bcast]))
    out.append(Lemma("mul-tiled-splat", "stablehlo.multiply",
                     [rel(arg((4, 6)), "tp", ()), splat(2.5, (2, 6))]))
    # Device-dependent integer scalars (axis_index arithmetic), tabulated over devices.
    ids = DeviceScalar(tuple(range(4)), ())
    out.append(Lemma("scalar-remainder", "stablehlo.remainder", [ids, splat(2, (), "i32")],
                     results=[((), "i32")], mesh=M2))
    out.append(Lemma("scalar-divide", "stablehlo.divide", [ids, splat(2, (), "i32")],
                     results=[((), "i32")], mesh=M2))
    out.append(Lemma("scalar-multiply", "stablehlo.multiply", [ids, splat(3, (), "i32")],
                     results=[((), "i32")], mesh=M2))
    out.append(Lemma("scalar-compare", "stablehlo.compare", [ids, splat(1, (), "i32")],
                     results=[((), "i1")], attrs={"comparison_direction": "GT"}, mesh=M2))
    return out


_E8M23 = {"exponent_bits": 8, "mantissa_bits": 23}
_E8M7 = {"exponent_bits": 8, "mantissa_bits": 7}
_E5M10 = {"exponent_bits": 5, "mantissa_bits": 10}


def precision_lemmas() -> list[Lemma]:
    """reduce_precision: at a format holding every value of the dtype it is the identity (any
    layout, partial sums too); narrower, a rounding that keeps tilings and partial maxima."""
    out = []
    for mesh, shape, tiling in ((M1, (4, 2), ("tp",)), (M2, (4, 4), ("dp", "tp")),
                                (M3, (3, 2), ("tp",))):
        x = arg(shape)
        out += [
            Lemma(f"reduce_precision-e8m23-{shape}", "stablehlo.reduce_precision",
                  [rel(x, *tiling)], attrs=_E8M23, mesh=mesh),
            Lemma(f"reduce_precision-e8m7-{shape}", "stablehlo.reduce_precision",
                  [rel(x, *tiling)], attrs=_E8M7, mesh=mesh),
            Lemma(f"reduce_precision-e8m23-partial-{shape}", "stablehlo.reduce_precision",
                  [rel(x, partial=("tp",))], attrs=_E8M23, mesh=mesh),
            Lemma(f"reduce_precision-e5m10-partialmax-{shape}", "stablehlo.reduce_precision",
                  [rel(x, partial=("tp",), kind="max")], attrs=_E5M10, mesh=mesh),
        ]
    out.append(Lemma("reduce_precision-bf16-e8m23", "stablehlo.reduce_precision",
                     [rel(arg((4, 2), "bf16"), "tp")], attrs=_E8M23))
    out.append(Lemma("reduce_precision-bf16-e5m10-partialmin", "stablehlo.reduce_precision",
                     [rel(arg((2, 2), "bf16"), partial=("tp",), kind="min")], attrs=_E5M10))
    out.append(Lemma("convert-f32-bf16-partialmax", "stablehlo.convert",
                     [rel(arg((4, 2)), partial=("tp",), kind="max")],
                     results=[((4, 2), "bf16")]))
    out.append(Lemma("reduce_precision-global", "stablehlo.reduce_precision",
                     [Rel(arg((2, 3)), ((), ()), scope=GLOBAL)], attrs=_E5M10, mesh=None))
    return out


# ----- contraction and reduction --------------------------------------------------------------

def _dot_attrs(lb=(), rb=(), lc=(1,), rc=(0,)) -> dict:
    return {"lhs_batch": tuple(lb), "rhs_batch": tuple(rb), "lhs_contract": tuple(lc),
            "rhs_contract": tuple(rc)}


def dot_lemmas() -> list[Lemma]:
    out = []
    for m, k, n in ((2, 4, 2), (4, 2, 4), (2, 6, 3)):
        x, w = arg((m, k)), arg((k, n))
        # Megatron column-parallel: non-contracting split carries over.
        if n % 2 == 0:
            out.append(Lemma(f"dot-column-{m}x{k}x{n}", "stablehlo.dot_general",
                             [rel(x), rel(w, (), "tp")], results=[((m, n // 2), "f32")],
                             attrs=_dot_attrs()))
        # Row-parallel: both contracting dims split -> partial sum.
        out.append(Lemma(f"dot-row-{m}x{k}x{n}", "stablehlo.dot_general",
                         [rel(x, (), "tp"), rel(w, "tp")], results=[((m, n), "f32")],
                         attrs=_dot_attrs()))
        # A partial sum times a replicated matrix stays partial.
        out.append(Lemma(f"dot-partial-{m}x{k}x{n}", "stablehlo.dot_general",
                         [rel(x, partial=("tp",)), rel(w)], results=[((m, n), "f32")],
                         attrs=_dot_attrs()))
    # 2-D mesh: rows over dp, contraction over tp.
    x, w = arg((4, 4)), arg((4, 2))
    out.append(Lemma("dot-2d-dp-rows-tp-contract", "stablehlo.dot_general",
                     [rel(x, "dp", "tp"), rel(w, "tp")], results=[((2, 2), "f32")],
                     attrs=_dot_attrs(), mesh=M2))
    # Batch dims split over dp, contraction split over tp; rhs contracting dim first.
    a, b = arg((2, 3, 4)), arg((2, 4, 2))
    out.append(Lemma("dot-batched", "stablehlo.dot_general",
                     [rel(a, "dp", (), "tp"), rel(b, "dp", "tp")], results=[((1, 3, 2), "f32")],
                     attrs=_dot_attrs((0,), (0,), (2,), (1,)), mesh=M2))
    out.append(Lemma("dot-transposed-rhs", "stablehlo.dot_general",
                     [rel(arg((2, 4)), (), "tp"), rel(arg((3, 4)), (), "tp")],
                     results=[((2, 3), "f32")], attrs=_dot_attrs((), (), (1,), (1,))))
    return out


def _conv_attrs(spatial: int = 1, **window) -> dict:
    """jax's NC(H...) x OI(H...) -> NC(H...) dimension numbers, window attributes given."""
    space = tuple(range(2, 2 + spatial))
    return {"input_batch": 0, "input_feature": 1, "input_spatial": space,
            "kernel_input_feature": 1, "kernel_output_feature": 0, "kernel_spatial": space,
            "output_batch": 0, "output_feature": 1, "output_spatial": space,
            "feature_group_count": 1, "batch_group_count": 1, **window}


def conv_lemmas() -> list[Lemma]:
    """convolution as a dot_general: batch and output features keep their split, split input
    features (alike in the kernel) make a partial sum; windows, strides, padding and
    dilations over unsplit spatial dims; a one-element window is a dot."""
    out = []
    x, k = arg((4, 2, 5)), arg((2, 2, 2))
    out.append(Lemma("conv-batch-split", "stablehlo.convolution", [rel(x, "tp"), rel(k)],
                     results=[((2, 2, 4), "f32")], attrs=_conv_attrs()))
    out.append(Lemma("conv-features-split", "stablehlo.convolution",
                     [rel(x, (), "tp"), rel(k, (), "tp")], results=[((4, 2, 4), "f32")],
                     attrs=_conv_attrs()))
    out.append(Lemma("conv-out-features-split", "stablehlo.convolution",
                     [rel(x), rel(k, "tp")], results=[((4, 1, 4), "f32")],
                     attrs=_conv_attrs()))
    out.append(Lemma("conv-partial-input", "stablehlo.convolution",
                     [rel(x, partial=("tp",)), rel(k)], results=[((4, 2, 4), "f32")],
                     attrs=_conv_attrs()))
    window = {"window_strides": (2,), "padding": [[1, 2]], "lhs_dilation": (2,),
              "rhs_dilation": (2,), "window_reversal": (True,)}
    out.append(Lemma("conv-window-attrs", "stablehlo.convolution",
                     [rel(arg((2, 2, 3)), "tp"), rel(arg((2, 2, 2)))],
                     results=[((1, 2, 3), "f32")], attrs=_conv_attrs(**window)))
    out.append(Lemma("conv-2d-mesh", "stablehlo.convolution",
                     [rel(arg((2, 4, 3, 3)), "dp", "tp"), rel(arg((2, 4, 2, 2)), (), "tp")],
                     results=[((1, 2, 2, 2), "f32")], attrs=_conv_attrs(2), mesh=M2))
    out.append(Lemma("conv-pointwise-is-a-dot", "stablehlo.convolution",
                     [rel(arg((4, 6)), (), "tp"), rel(arg((3, 6)), (), "tp")],
                     results=[((4, 3), "f32")], attrs=_conv_attrs(0), mesh=M3))
    out.append(Lemma("conv-global", "stablehlo.convolution",
                     [Rel(arg((1, 2, 4)), ((), (), ()), scope=GLOBAL),
                      Rel(arg((3, 2, 2)), ((), (), ()), scope=GLOBAL)],
                     results=[((1, 3, 3), "f32")], attrs=_conv_attrs(), mesh=None))
    return out


def reduce_lemmas() -> list[Lemma]:
    out = []
    for shape in ((4, 2), (2, 6)):
        x = arg(shape)
        d0, d1 = shape
        for reducer, init in (("add", 0), ("max", -math.inf), ("min", math.inf)):
            out.append(Lemma(f"reduce-{reducer}-split-{shape}", "stablehlo.reduce",
                             [rel(x, (), "tp"), splat(init, ())], results=[((d0,), "f32")],
                             attrs={"dimensions": (1,), "reducer": reducer}))
            out.append(Lemma(f"reduce-{reducer}-keep-split-{shape}", "stablehlo.reduce",
                             [rel(x, (), "tp"), splat(init, ())],
                             results=[((d1 // 2,), "f32")],
                             attrs={"dimensions": (0,), "reducer": reducer}))
        out.append(Lemma(f"reduce-add-init-{shape}", "stablehlo.reduce",
                         [rel(x, "tp"), splat(1.5, ())], results=[((d0 // 2,), "f32")],
                         attrs={"dimensions": (1,), "reducer": "add"}))
        out.append(Lemma(f"reduce-add-partial-{shape}", "stablehlo.reduce",
                         [rel(x, partial=("tp",)), splat(0, ())], results=[((), "f32")],
                         attrs={"dimensions": (0, 1), "reducer": "add"}))
        out.append(Lemma(f"reduce-max-partialmax-{shape}", "stablehlo.reduce",
                         [rel(x, partial=("tp",), kind="max"), splat(-math.inf, ())],
                         results=[((d0,), "f32")], attrs={"dimensions": (1,), "reducer": "max"}))
    # any/all over split dims (booleans: or is a partial max, and a partial min) and integer
    # max/min from the integer type's least/greatest value.
    for mesh, shape, tiling in ((M1, (4, 2), ((), "tp")), (M2, (2, 4), ("dp", "tp")),
                                (M3, (2, 3), ((), "tp"))):
        local = tuple(n // mesh.group_size(t if isinstance(t, tuple) else (t,))
                      for n, t in zip(shape, tiling))
        b = arg(shape, "i1")
        for reducer, init in (("or", 0), ("and", 1), ("max", 0), ("min", 1)):
            out.append(Lemma(f"reduce-{reducer}-i1-split-{shape}-{len(mesh.names)}",
                             "stablehlo.reduce", [rel(b, *tiling), splat(init, (), "i1")],
                             results=[((local[0],), "i1")],
                             attrs={"dimensions": (1,), "reducer": reducer}, mesh=mesh))
        ints = arg(shape, "i32")
        for reducer, init in (("max", -(2**31)), ("min", 2**31 - 1)):
            out.append(Lemma(f"reduce-{reducer}-i32-split-{shape}-{len(mesh.names)}",
                             "stablehlo.reduce", [rel(ints, *tiling), splat(init, (), "i32")],
                             results=[((local[0],), "i32")],
                             attrs={"dimensions": (1,), "reducer": reducer}, mesh=mesh))
    out.append(Lemma("reduce-or-i1-of-partial-any", "stablehlo.reduce",
                     [rel(arg((2, 4), "i1"), partial=("tp",), kind="max"), splat(0, (), "i1")],
                     results=[((2,), "i1")], attrs={"dimensions": (1,), "reducer": "or"}))
    out.append(Lemma("reduce-or-i1-init-true", "stablehlo.reduce",
                     [rel(arg((4, 2), "i1"), "tp"), splat(1, (), "i1")],
                     results=[((2,), "i1")], attrs={"dimensions": (1,), "reducer": "or"}))
    out.append(Lemma("reduce-max-ui8-split", "stablehlo.reduce",
                     [rel(arg((2, 4), "ui8"), (), "tp"), splat(0, (), "ui8")],
                     results=[((2,), "ui8")], attrs={"dimensions": (1,), "reducer": "max"}))
    x = arg((4, 4))
    out.append(Lemma("reduce-add-2d", "stablehlo.reduce", [rel(x, "dp", "tp"), splat(0, ())],
                     results=[((2,), "f32")], attrs={"dimensions": (1,), "reducer": "add"},
                     mesh=M2))
    out += argmax_lemmas()
    # reduce_window (jnp.cumsum / cummax): windows along unsplit dims, split dims untouched.
    cumsum = {"window_dimensions": (1, 3), "padding": [[0, 0], [2, 0]]}
    for reducer, init in (("add", 0), ("max", -math.inf), ("min", math.inf)):
        out.append(Lemma(f"reduce_window-{reducer}-cum", "stablehlo.reduce_window",
                         [rel(arg((4, 3)), "tp"), splat(init, ())], results=[((2, 3), "f32")],
                         attrs={**cumsum, "reducer": reducer}))
    out.append(Lemma("reduce_window-add-partial", "stablehlo.reduce_window",
                     [rel(arg((2, 3)), partial=("tp",)), splat(0, ())],
                     results=[((2, 3), "f32")], attrs={**cumsum, "reducer": "add"}))
    out.append(Lemma("reduce_window-max-strided", "stablehlo.reduce_window",
                     [rel(arg((2, 6)), (), "tp"), splat(-math.inf, ())],
                     results=[((2, 2), "f32")],
                     attrs={"window_dimensions": (2, 1), "window_strides": (1, 1),
                            "padding": [[0, 1], [0, 0]], "reducer": "max"}, mesh=M3))
    out += product_lemmas()
    return out


CUMPROD = {"window_dimensions": (1, 3), "padding": [[0, 0], [2, 0]]}
"""jnp.cumprod along dim 1 of a (., 3) operand (reverse=True pads high instead)."""


def product_lemmas() -> list[Lemma]:
    """reduce_window and reduce with a mul reducer (jnp.cumprod, jnp.prod) over dims that are
    not split: forward and reverse, along either dim, floats and wrapping integers, an init
    that is not 1 for the reduce."""
    out = []
    for dtype in ("f32", "i32", "ui8"):
        out.append(Lemma(f"reduce_window-mul-cum-{dtype}", "stablehlo.reduce_window",
                         [rel(arg((4, 3), dtype), "tp"), splat(1, (), dtype)],
                         results=[((2, 3), dtype)], attrs={**CUMPROD, "reducer": "mul"}))
    out.append(Lemma("reduce_window-mul-cum-reverse", "stablehlo.reduce_window",
                     [rel(arg((4, 3)), "tp"), splat(1, ())], results=[((2, 3), "f32")],
                     attrs={"window_dimensions": (1, 3), "padding": [[0, 0], [0, 2]],
                            "reducer": "mul"}))
    out.append(Lemma("reduce_window-mul-cum-dim0", "stablehlo.reduce_window",
                     [rel(arg((3, 4)), (), "tp"), splat(1, ())], results=[((3, 2), "f32")],
                     attrs={"window_dimensions": (3, 1), "padding": [[2, 0], [0, 0]],
                            "reducer": "mul"}))
    out.append(Lemma("reduce_window-mul-cum-2d-mesh", "stablehlo.reduce_window",
                     [rel(arg((4, 4, 3)), "dp", "tp"), splat(1, ())],
                     results=[((2, 2, 3), "f32")],
                     attrs={"window_dimensions": (1, 1, 3), "padding": [[0, 0], [0, 0], [2, 0]],
                            "reducer": "mul"}, mesh=M2))
    for dtype, init in (("f32", 1), ("f32", 2), ("i32", 1), ("i32", 3)):
        out.append(Lemma(f"reduce-mul-{dtype}-init{init}", "stablehlo.reduce",
                         [rel(arg((4, 3), dtype), "tp"), splat(init, (), dtype)],
                         results=[((2,), dtype)], attrs={"dimensions": (1,), "reducer": "mul"}))
    return out


_NEG_INF, _POS_INF = -math.inf, math.inf


def _arg_lemma(name: str, kind: str, values: Rel, indices: Rel, init, dims, kept_local,
               mesh: Mesh | None = M1, index_dtype: str = "i32") -> Lemma:
    dtype = values.term.dtype
    init_index = splat(0, (), index_dtype)
    init_value = splat(init, (), dtype)
    if mesh is None:
        init_index = Rel(init_index.term, (), scope=GLOBAL)
        init_value = Rel(init_value.term, (), scope=GLOBAL)
    return Lemma(name, "stablehlo.reduce", [values, indices, init_value, init_index],
                 results=[(kept_local, dtype), (kept_local, index_dtype)],
                 attrs={"dimensions": tuple(dims), "reducer": kind}, mesh=mesh)


def argmax_lemmas() -> list[Lemma]:
    """argmax / argmin (jax's comparator) over unsplit dims: the other dims keep their split,
    values and indices alike (an iota at the local shape, or any index tensor)."""
    out = []
    x, iota = arg((4, 3)), T.make_iota((4, 3), 1, "i32")
    out.append(_arg_lemma("argmax-rows-tp", "argmax", rel(x, "tp"), rel(iota, "tp"), _NEG_INF,
                          (1,), (2,)))
    local_iota = Rel(T.make_iota((2, 3), 1, "i32"), ((), ()), poly=frozenset({0}))
    out.append(_arg_lemma("argmax-rows-tp-local-iota", "argmax", rel(x, "tp"), local_iota,
                          _NEG_INF, (1,), (2,)))
    out.append(_arg_lemma("argmin-rows-tp3", "argmin", rel(arg((3, 4)), "tp"),
                          rel(T.make_iota((3, 4), 1, "i32"), "tp"), _POS_INF, (1,), (1,),
                          mesh=M3))
    x3 = arg((4, 2, 3))
    out.append(_arg_lemma("argmax-2d-mesh", "argmax", rel(x3, "dp", "tp"),
                          rel(T.make_iota((4, 2, 3), 2, "i32"), "dp", "tp"), _NEG_INF, (2,),
                          (2, 1), mesh=M2))
    out.append(_arg_lemma("argmax-any-indices", "argmax", rel(arg((4, 3)), "tp"),
                          rel(arg((4, 3), "i32"), "tp"), _NEG_INF, (1,), (2,)))
    out.append(_arg_lemma("argmax-int-values", "argmax", rel(arg((2, 4), "i32"), (), ()),
                          rel(T.make_iota((2, 4), 1, "i32")), -(2**31), (1,), (2,)))
    out.append(_arg_lemma("argmin-keep-split-dim0", "argmin", rel(arg((4, 2)), "tp"),
                          rel(T.make_iota((4, 2), 1, "i32"), "tp"), 1.5, (1,), (2,)))
    out.append(_arg_lemma("argmax-global", "argmax", Rel(arg((2, 3)), ((), ()), scope=GLOBAL),
                          Rel(T.make_iota((2, 3), 1, "i32"), ((), ()), scope=GLOBAL), _NEG_INF,
                          (1,), (2,), mesh=None))
    return out


# ----- data movement --------------------------------------------------------------------------

def _microbatch_lemmas(mesh: Mesh) -> list[Lemma]:
    """A micro-batch's forward and backward (rules/kinds/window.py `window_rowwise`, `summed_move`):
    ops that treat the window's dim row by row keep the window; a matmul contracting it sums
    the window's rows; the moves, zero pads and replicated scalings of such a sum; sums over
    the same rows of different tensors add; complementary sums of a matmul meet the matmul
    over the whole batch."""
    x3 = rel(arg((16, 2, 3)), "tp")
    w3 = Windowed(x3, 0, 2, 2)
    x2, y2 = rel(arg((16, 3)), "tp"), rel(arg((16, 4)), "tp")
    summed = Windowed(rel(arg((16, 3, 4)), "tp"), 0, 2, 2, summed=(0,))
    dot = {"lhs_batch": (), "rhs_batch": (), "lhs_contract": (0,), "rhs_contract": (0,)}
    whole = T.make_dot(x2.term, y2.term, ((0,), (0,), (), ()), (16, 3, 4), "f32")
    batched = rel(whole, "tp")
    out = [
        Lemma("broadcast-window", "stablehlo.broadcast_in_dim", [w3],
              results=[((2, 2, 3, 5), "f32")], attrs={"broadcast_dimensions": (0, 1, 2)},
              mesh=mesh),
        Lemma("reshape-window", "stablehlo.reshape", [w3], results=[((2, 6), "f32")],
              mesh=mesh),
        Lemma("transpose-window", "stablehlo.transpose", [w3], results=[((3, 2, 2), "f32")],
              attrs={"permutation": (2, 0, 1)}, mesh=mesh),
        Lemma("slice-window-other-dim", "stablehlo.slice", [w3], results=[((2, 2, 2), "f32")],
              attrs={"start_indices": (0, 0, 1), "limit_indices": (2, 2, 3),
                     "strides": (1, 1, 1)}, mesh=mesh),
        Lemma("pad-window-other-dim", "stablehlo.pad", [w3, splat(0, (), "f32")],
              results=[((2, 2, 5), "f32")],
              attrs={"edge_padding_low": (0, 0, 2), "edge_padding_high": (0, 0, 0),
                     "interior_padding": (0, 0, 0)}, mesh=mesh),
        Lemma("concat-windows-other-dim", "stablehlo.concatenate",
              [w3, Windowed(rel(arg((16, 2, 1)), "tp"), 0, 2, 2)],
              results=[((2, 2, 4), "f32")], attrs={"dimension": 2}, mesh=mesh),
        Lemma("dot-window-free", "stablehlo.dot_general",
              [Windowed(x2, 0, 0, 2), rel(arg((3, 5)))], results=[((2, 5), "f32")],
              attrs={"lhs_batch": (), "rhs_batch": (), "lhs_contract": (1,),
                     "rhs_contract": (0,)}, mesh=mesh),
        Lemma("dot-windows-batch", "stablehlo.dot_general",
              [w3, Windowed(rel(arg((16, 3, 4)), "tp"), 0, 2, 2)],
              results=[((2, 2, 4), "f32")],
              attrs={"lhs_batch": (0,), "rhs_batch": (0,), "lhs_contract": (2,),
                     "rhs_contract": (1,)}, mesh=mesh),
        Lemma("dot-windows-contracted", "stablehlo.dot_general",
              [Windowed(x2, 0, 2, 2), Windowed(y2, 0, 2, 2)], results=[((3, 4), "f32")],
              attrs=dot, mesh=mesh),
        Lemma("transpose-window-sum", "stablehlo.transpose", [summed],
              results=[((4, 3), "f32")], attrs={"permutation": (1, 0)}, mesh=mesh),
        Lemma("reshape-window-sum", "stablehlo.reshape", [summed], results=[((1, 12), "f32")],
              mesh=mesh),
        Lemma("broadcast-window-sum", "stablehlo.broadcast_in_dim", [summed],
              results=[((3, 2, 4), "f32")], attrs={"broadcast_dimensions": (0, 2)},
              mesh=mesh),
        Lemma("pad-window-sum", "stablehlo.pad", [summed, splat(0, (), "f32")],
              results=[((5, 4), "f32")],
              attrs={"edge_padding_low": (1, 0), "edge_padding_high": (1, 0),
                     "interior_padding": (0, 0)}, mesh=mesh),
        Lemma("reduce-window-sum-further", "stablehlo.reduce", [summed, splat(0, (), "f32")],
              results=[((4,), "f32")], attrs={"dimensions": (0,), "reducer": "add"},
              mesh=mesh),
        Lemma("multiply-window-sum-by-value", "stablehlo.multiply",
              [summed, rel(arg((3, 4)))], mesh=mesh),
        Lemma("divide-window-sum-by-value", "stablehlo.divide",
              [Windowed(x2, 0, 0, 2, summed=(0, 1)), rel(arg(()))], results=[((), "f32")],
              mesh=mesh),
        Lemma("add-window-sums-same-rows", "stablehlo.add",
              [summed, Windowed(rel(arg((16, 3, 4)), "tp"), 0, 2, 2, summed=(0,))],
              mesh=mesh),
        Lemma("add-window-sum-zero", "stablehlo.add", [summed, splat(0, (3, 4), "f32")],
              mesh=mesh),
        Lemma("add-window-sums-of-a-matmul", "stablehlo.add",
              [Windowed(batched, 0, 0, 2, summed=(0,)), Windowed(batched, 0, 2, 2, summed=(0,))],
              results=[((3, 4), "f32")], mesh=mesh),
    ]
    return out


def movement_lemmas() -> list[Lemma]:
    out = []
    for shape in ((2, 3), (4,)):
        out.append(Lemma(f"constant-splat-{shape}", "stablehlo.constant", [],
                         results=[(shape, "f32")],
                         attrs={"value": np.full(shape, 0.25, np.float32), "splat": True}))
        value = np.arange(math.prod(shape), dtype=np.float32).reshape(shape) - 1.5
        out.append(Lemma(f"constant-dense-{shape}", "stablehlo.constant", [],
                         results=[(shape, "f32")], attrs={"value": value, "splat": False}))
        out.append(Lemma(f"iota-{shape}", "stablehlo.iota", [], results=[(shape, "i32")],
                         attrs={"iota_dimension": len(shape) - 1}))
    # broadcast_in_dim: split dims carry over, new dims are poly.
    for shape in ((4,), (4, 2)):
        x = arg(shape)
        rank = len(shape)
        out.append(Lemma(f"broadcast-new-dims-{shape}", "stablehlo.broadcast_in_dim",
                         [rel(x, "tp")], results=[((3, 2) + shape[1:], "f32")],
                         attrs={"broadcast_dimensions": tuple(range(1, rank + 1))}))
        out.append(Lemma(f"broadcast-partial-{shape}", "stablehlo.broadcast_in_dim",
                         [rel(x, partial=("tp",))], results=[(shape + (3,), "f32")],
                         attrs={"broadcast_dimensions": tuple(range(rank))}))
    out.append(Lemma("broadcast-widen-unit", "stablehlo.broadcast_in_dim",
                     [rel(arg((4, 1)), "tp")], results=[((2, 3), "f32")],
                     attrs={"broadcast_dimensions": (0, 1)}))
    out.append(Lemma("broadcast-transposing", "stablehlo.broadcast_in_dim",
                     [rel(arg((4, 2)), "tp")], results=[((2, 3, 2), "f32")],
                     attrs={"broadcast_dimensions": (2, 0)}))
    # reshape: the split dim is the major dim of its group.
    out.append(Lemma("reshape-split-major", "stablehlo.reshape", [rel(arg((4, 6)), "tp")],
                     results=[((2, 2, 3), "f32")]))
    out.append(Lemma("reshape-merge", "stablehlo.reshape", [rel(arg((4, 2, 3)), "tp")],
                     results=[((12,), "f32")]))
    out.append(Lemma("reshape-replicated", "stablehlo.reshape", [rel(arg((2, 6)))],
                     results=[((3, 4), "f32")]))
    out.append(Lemma("reshape-partial", "stablehlo.reshape",
                     [rel(arg((2, 4)), partial=("tp",))], results=[((8,), "f32")]))
    out.append(Lemma("reshape-2d", "stablehlo.reshape", [rel(arg((4, 4, 2)), "dp", "tp")],
                     results=[((2, 4), "f32")], mesh=M2))
    # reshape merging split dims: every dim before the last split one holds one element per
    # device, so the merged dim is split over their axes in order (major first).
    out.append(Lemma("reshape-merge-two-splits", "stablehlo.reshape",
                     [rel(arg((2, 4, 3)), "dp", "tp")], results=[((6,), "f32")], mesh=M2))
    out.append(Lemma("reshape-merge-two-splits-kept-major", "stablehlo.reshape",
                     [rel(arg((3, 2, 4)), (), "dp", "tp")], results=[((3, 2), "f32")],
                     mesh=M2))
    out.append(Lemma("reshape-merge-two-splits-then-split", "stablehlo.reshape",
                     [rel(arg((2, 4, 2)), "dp", "tp")], results=[((2, 2), "f32")], mesh=M2))
    # transpose
    out.append(Lemma("transpose-2d", "stablehlo.transpose", [rel(arg((4, 6)), "tp")],
                     results=[((6, 2), "f32")], attrs={"permutation": (1, 0)}))
    out.append(Lemma("transpose-3d", "stablehlo.transpose",
                     [rel(arg((2, 4, 2)), "dp", "tp")], results=[((2, 1, 2), "f32")],
                     attrs={"permutation": (2, 0, 1)}, mesh=M2))
    out.append(Lemma("transpose-partial", "stablehlo.transpose",
                     [rel(arg((2, 3)), partial=("tp",))], results=[((3, 2), "f32")],
                     attrs={"permutation": (1, 0)}))
    # reverse: unsplit dims only
    out.append(Lemma("reverse-unsplit", "stablehlo.reverse", [rel(arg((4, 3)), "tp")],
                     results=[((2, 3), "f32")], attrs={"dimensions": (1,)}))
    out.append(Lemma("reverse-partial", "stablehlo.reverse",
                     [rel(arg((2, 3)), partial=("tp",))], results=[((2, 3), "f32")],
                     attrs={"dimensions": (0, 1)}))
    # slice: unsplit dims only
    out.append(Lemma("slice-unsplit", "stablehlo.slice", [rel(arg((4, 5)), "tp")],
                     results=[((2, 2), "f32")],
                     attrs={"start_indices": (0, 1), "limit_indices": (2, 5),
                            "strides": (1, 2)}))
    out.append(Lemma("slice-partial", "stablehlo.slice", [rel(arg((4, 3)), partial=("tp",))],
                     results=[((2, 3), "f32")],
                     attrs={"start_indices": (1, 0), "limit_indices": (3, 3),
                            "strides": (1, 1)}))
    # Halo windows (rows of a split dim off each device's block): a slice makes one, a
    # permute moves it by a block, consecutive windows join (a whole block: a roll).
    x = rel(arg((8, 2)), "tp")
    out.append(Lemma("slice-window", "stablehlo.slice", [x], results=[((2, 2), "f32")],
                     attrs={"start_indices": (1, 0), "limit_indices": (3, 2),
                            "strides": (1, 1)}))
    out.append(Lemma("permute-window", "stablehlo.collective_permute",
                     [Windowed(x, 0, 3, 1)],
                     attrs={"source_target_pairs": [[0, 1], [1, 0]], "channel_handle": 1}))
    out.append(Lemma("concat-windows-roll", "stablehlo.concatenate",
                     [Windowed(x, 0, 7, 1), Windowed(x, 0, 0, 3)], results=[((4, 2), "f32")],
                     attrs={"dimension": 0}))
    out.append(Lemma("concat-window-and-block", "stablehlo.concatenate",
                     [Windowed(x, 0, 7, 1), x], results=[((5, 2), "f32")],
                     attrs={"dimension": 0}))
    # XLA's x[4:12] of 16 rows on 4 devices: halos from both neighbours (none at the ends, where
    # the devices hold zeros), then each device reads its rows at a device-dependent offset.
    y = rel(arg((16, 2)), "tp")
    M4 = Mesh((("tp", 4),))
    out.append(Lemma("permute-window-open-ends", "stablehlo.collective_permute",
                     [Windowed(y, 0, 2, 2)],
                     attrs={"source_target_pairs": [[0, 1], [1, 2], [2, 3]],
                            "channel_handle": 1}, mesh=M4))
    out.append(Lemma("dynamic-slice-window", "stablehlo.dynamic_slice",
                     [Windowed(y, 0, 14, 8, holes=((0, 0, 2), (3, 6, 8))),
                      DeviceScalar((6, 4, 2, 0), ()), splat(0, (), "i32")],
                     results=[((2, 2), "f32")], attrs={"slice_sizes": (2, 2)}, mesh=M4))
    # XLA's jnp.pad(x, 2) of 16 split rows on 4 devices (result 20 rows, 5 per device): a
    # halo row from each neighbour (zeros at the ends), a zero pad row on both sides, then
    # device b reads its 5 rows at offset b; the zeros it reads are exactly the rows outside x.
    out.append(Lemma("pad-window", "stablehlo.pad",
                     [Windowed(y, 0, 15, 6, holes=((0, 0, 1), (3, 5, 6))),
                      splat(0, (), "f32")],
                     results=[((8, 2), "f32")],
                     attrs={"edge_padding_low": (1, 0), "edge_padding_high": (1, 0),
                            "interior_padding": (0, 0)}, mesh=M4))
    padded_holes = ((0, 0, 2), (1, 0, 1), (2, 0, 1), (3, 0, 1), (0, 7, 8), (1, 7, 8),
                    (2, 7, 8), (3, 6, 8))
    out.append(Lemma("dynamic-slice-window-zero-extended", "stablehlo.dynamic_slice",
                     [Windowed(y, 0, 14, 8, holes=padded_holes),
                      DeviceScalar((0, 1, 2, 3), ()), splat(0, (), "i32")],
                     results=[((5, 2), "f32")], attrs={"slice_sizes": (5, 2)}, mesh=M4))
    # XLA's cumsum of 16 split columns on 4 devices: all_gather, zero pad by 15 (a window of
    # the replicated tensor), each device reads 19 columns at 4b (overlapping windows of x
    # split over tp, zeros before column 0), a 16-wide sum window leaves its 4 columns.
    z = rel(arg((2, 16)))
    out.append(Lemma("pad-replicated-window", "stablehlo.pad", [z, splat(0, (), "f32")],
                     results=[((2, 31), "f32")],
                     attrs={"edge_padding_low": (0, 15), "edge_padding_high": (0, 0),
                            "interior_padding": (0, 0)}, mesh=M4))
    padded = Windowed(z, 1, -15, 31, holes=tuple((d, 0, 15) for d in range(4)))
    out.append(Lemma("dynamic-slice-overlapping-windows", "stablehlo.dynamic_slice",
                     [padded, splat(0, (), "i32"), DeviceScalar((0, 4, 8, 12), ())],
                     results=[((2, 19), "f32")], attrs={"slice_sizes": (2, 19)}, mesh=M4))
    cum = rel(arg((2, 16)), (), "tp")
    overlapping = Windowed(cum, 1, -15, 19,
                           holes=((0, 0, 15), (1, 0, 11), (2, 0, 7), (3, 0, 3)))
    for reducer, init in (("add", 0), ("max", float("-inf"))):
        out.append(Lemma(f"reduce_window-{reducer}-overlapping-windows",
                         "stablehlo.reduce_window", [overlapping, splat(init, (), "f32")],
                         results=[((2, 4), "f32")],
                         attrs={"window_dimensions": (1, 16), "reducer": reducer}, mesh=M4))
    # Micro-batches of the local batch (x[:2], x[2:] of 4 rows per device): elementwise ops
    # on a window, a sum over the window's rows, and the sums of complementary windows: the
    # block's sum, a partial sum over the axis splitting the rows.
    mb = rel(arg((16, 2)), "tp")
    first, second = Windowed(mb, 0, 0, 2), Windowed(mb, 0, 2, 2)
    out.append(Lemma("tanh-window", "stablehlo.tanh", [first], mesh=M4))
    out.append(Lemma("multiply-window-constant", "stablehlo.multiply",
                     [second, splat(3, (2, 2), "f32")], mesh=M4))
    out.append(Lemma("reduce-window-sum", "stablehlo.reduce", [first, splat(0, (), "f32")],
                     results=[((), "f32")],
                     attrs={"dimensions": (0, 1), "reducer": "add"}, mesh=M4))
    out.append(Lemma("add-window-sums", "stablehlo.add",
                     [Windowed(mb, 0, 2, 2, summed=(0, 1)), Windowed(mb, 0, 0, 2, summed=(0, 1))],
                     results=[((), "f32")], mesh=M4))
    out.append(Lemma("add-window-sums-partly", "stablehlo.add",
                     [Windowed(mb, 0, 0, 1, summed=(0,)), Windowed(mb, 0, 1, 2, summed=(0,))],
                     results=[((2,), "f32")], mesh=M4))
    out.append(Lemma("reduce-window-other-dims", "stablehlo.reduce",
                     [Windowed(rel(arg((16, 2, 3)), "tp"), 0, 2, 2), splat(0, (), "f32")],
                     results=[((2, 2), "f32")],
                     attrs={"dimensions": (2,), "reducer": "add"}, mesh=M4))
    row_scale = rel(T.make_broadcast(arg((2,)), (1,), (2, 2)))
    out.append(Lemma("multiply-window-row-statistic", "stablehlo.multiply",
                     [row_scale, first], mesh=M4))
    out.append(Lemma("divide-window-sum", "stablehlo.divide",
                     [Windowed(mb, 0, 1, 2, summed=(0, 1)), splat(4, (), "f32")],
                     results=[((), "f32")], mesh=M4))
    out.extend(_microbatch_lemmas(M4))
    # Rows routed point to point (XLA's split of a fused qkv output): permutes that move
    # blocks by different amounts give a window with a start per device; a select on the
    # device id picks each device's rows; a dynamic_slice of such a window reads its block.
    out.append(Lemma("permute-window-routed", "stablehlo.collective_permute",
                     [Windowed(y, 0, 0, 2)],
                     attrs={"source_target_pairs": [[0, 1], [1, 3]], "channel_handle": 1},
                     mesh=M4))
    device_is_1 = Shifted(Rel(T.make_splat(0, (2, 2), "i1"), ((), ()), poly=frozenset({0, 1})),
                          (0, 1, 0, 0))
    out.append(Lemma("select-windows-per-device", "stablehlo.select",
                     [device_is_1, Windowed(y, 0, 10, 2, holes=((0, 0, 2), (2, 0, 2),
                                                                 (3, 0, 2))),
                      Windowed(y, 0, 8, 2, holes=((1, 0, 2), (2, 0, 2), (3, 0, 2)))],
                     mesh=M4))
    out.append(Lemma("dynamic-slice-routed-window", "stablehlo.dynamic_slice",
                     [Windowed(y, 0, 0, 4, starts=(0, 0, 2, 6)),
                      DeviceScalar((0, 2, 2, 0), ()), splat(0, (), "i32")],
                     results=[((2, 2), "f32")], attrs={"slice_sizes": (2, 2)}, mesh=M4))
    # concatenate along an unsplit dim
    out.append(_two_sided_mask_lemma())
    out.append(Lemma("concat-unsplit", "stablehlo.concatenate",
                     [rel(arg((4, 2)), "tp"), rel(arg((4, 1)), "tp")],
                     results=[((2, 3), "f32")], attrs={"dimension": 1}))
    out.append(Lemma("concat-partials", "stablehlo.concatenate",
                     [rel(arg((2,)), partial=("tp",)), rel(arg((3,)), partial=("tp",))],
                     results=[((5,), "f32")], attrs={"dimension": 0}))
    # pad unsplit dims
    out.append(Lemma("pad-unsplit", "stablehlo.pad",
                     [rel(arg((4, 3)), "tp"), splat(0.5, ())], results=[((2, 7), "f32")],
                     attrs={"edge_padding_low": (0, 1), "edge_padding_high": (0, 1),
                            "interior_padding": (0, 1)}))
    out.append(Lemma("pad-partial-zero", "stablehlo.pad",
                     [rel(arg((2, 2)), partial=("tp",)), splat(0, ())],
                     results=[((3, 2), "f32")],
                     attrs={"edge_padding_low": (1, 0), "edge_padding_high": (0, 0),
                            "interior_padding": (0, 0)}))
    return out


# ----- collectives and indexing ---------------------------------------------------------------

def collective_lemmas() -> list[Lemma]:
    out = []
    for shape in ((2,), (2, 3)):
        x = arg(shape)
        out.append(Lemma(f"all_reduce-partial-{shape}", "stablehlo.all_reduce",
                         [rel(x, partial=("tp",))], attrs={**groups(M1, "tp"), "reducer": "add"}))
        out.append(Lemma(f"all_reduce-replicated-{shape}", "stablehlo.all_reduce", [rel(x)],
                         attrs={**groups(M1, "tp"), "reducer": "add"}))
        out.append(Lemma(f"all_reduce-max-{shape}", "stablehlo.all_reduce",
                         [rel(x, partial=("tp",), kind="max")],
                         attrs={**groups(M1, "tp"), "reducer": "max"}))
        out.append(Lemma(f"all_reduce-min-{shape}", "stablehlo.all_reduce",
                         [rel(x, partial=("tp",), kind="min")],
                         attrs={**groups(M1, "tp"), "reducer": "min"}))
    x = arg((4, 2))
    out += [
        Lemma("all_reduce-2d-tp", "stablehlo.all_reduce", [rel(x, "dp", partial=("tp",))],
              attrs={**groups(M2, "tp"), "reducer": "add"}, mesh=M2),
        Lemma("all_reduce-2d-both", "stablehlo.all_reduce",
              [rel(arg((2, 2)), partial=("dp", "tp"))],
              attrs={**groups(M2, "dp", "tp"), "reducer": "add"}, mesh=M2),
        Lemma("all_reduce-2d-one-of-two", "stablehlo.all_reduce",
              [rel(arg((2, 2)), partial=("dp", "tp"))],
              attrs={**groups(M2, "dp"), "reducer": "add"}, mesh=M2),
        Lemma("all_reduce-2d-partial-and-replicated", "stablehlo.all_reduce",
              [rel(arg((2,)), partial=("tp",))],
              attrs={**groups(M2, "dp", "tp"), "reducer": "add"}, mesh=M2),
    ]
    # A broadcast built at the local shape (poly dim 1) reduced: still constant along dim 1.
    bcast = T.make_broadcast(arg((2,)), (0,), (2, 3))
    for name, partial, kind, reducer in (("replicated", (), "", "add"),
                                         ("partial", ("tp",), "sum", "add"),
                                         ("max", ("tp",), "max", "max")):
        out.append(Lemma(f"all_reduce-poly-{name}", "stablehlo.all_reduce",
                         [rel(bcast, partial=partial, kind=kind, poly=frozenset({1}))],
                         attrs={**groups(M1, "tp"), "reducer": reducer}))
    for shape, dim in (((4, 2), 0), ((2, 6), 1)):
        tiling = ["tp" if d == dim else () for d in range(2)]
        local = tuple(s // 2 if d == dim else s for d, s in enumerate(shape))
        out.append(Lemma(f"all_gather-{shape}-{dim}", "stablehlo.all_gather",
                         [rel(arg(shape), *tiling)], results=[(shape, "f32")],
                         attrs={**groups(M1, "tp"), "all_gather_dim": dim}))
        out.append(Lemma(f"reduce_scatter-{shape}-{dim}", "stablehlo.reduce_scatter",
                         [rel(arg(shape), partial=("tp",))], results=[(local, "f32")],
                         attrs={**groups(M1, "tp"), "scatter_dimension": dim,
                                "reducer": "add"}))
    out += [
        Lemma("all_gather-minor-of-two", "stablehlo.all_gather",
              [rel(arg((8, 2)), ("dp", "tp"))], results=[((4, 2), "f32")],
              attrs={**groups(M2, "tp"), "all_gather_dim": 0}, mesh=M2),
        Lemma("all_gather-two-axes", "stablehlo.all_gather",
              [rel(arg((8, 2)), ("dp", "tp"))], results=[((8, 2), "f32")],
              attrs={**groups(M2, "dp", "tp"), "all_gather_dim": 0}, mesh=M2),
        Lemma("reduce_scatter-2d", "stablehlo.reduce_scatter",
              [rel(arg((4, 2)), "dp", partial=("tp",))], results=[((1, 2), "f32")],
              attrs={**groups(M2, "tp"), "scatter_dimension": 0, "reducer": "add"}, mesh=M2),
        Lemma("reduce_scatter-replicated", "stablehlo.reduce_scatter",
              [rel(arg((4,)))], results=[((2,), "f32")],
              attrs={**groups(M1, "tp"), "scatter_dimension": 0, "reducer": "add"}),
    ]
    for shape in ((4, 2), (4, 6)):
        s0, s1 = shape
        out.append(Lemma(f"all_to_all-{shape}", "stablehlo.all_to_all",
                         [rel(arg(shape), "tp")], results=[((s0, s1 // 2), "f32")],
                         attrs={**groups(M1, "tp"), "split_dimension": 1,
                                "concat_dimension": 0, "split_count": 2}))
    # split_dimension == concat_dimension (XLA's reshard from one dim to another).
    out.append(Lemma("all_to_all-same-dim-unit", "stablehlo.all_to_all",
                     [rel(arg((4, 2, 1)), "tp")], results=[((2, 2, 1), "f32")],
                     attrs={**groups(M1, "tp"), "split_dimension": 1,
                            "concat_dimension": 1, "split_count": 2}))
    out.append(Lemma("all_to_all-same-dim-chunks", "stablehlo.all_to_all",
                     [rel(arg((4, 4)), "tp")], results=[((2, 4), "f32")],
                     attrs={**groups(M1, "tp"), "split_dimension": 1,
                            "concat_dimension": 1, "split_count": 2}))
    out.append(Lemma("all_to_all-same-dim-2d", "stablehlo.all_to_all",
                     [rel(arg((4, 2, 2)), ("dp", "tp"))], results=[((1, 2, 2), "f32")],
                     attrs={**groups(M2, "tp"), "split_dimension": 1,
                            "concat_dimension": 1, "split_count": 2}, mesh=M2))
    out.append(Lemma("all_to_all-2d", "stablehlo.all_to_all",
                     [rel(arg((2, 4, 4)), "dp", (), "tp")], results=[((1, 2, 4), "f32")],
                     attrs={**groups(M2, "tp"), "split_dimension": 1, "concat_dimension": 2,
                            "split_count": 2}, mesh=M2))
    # all_reduce over the axes that split a dim into one-row blocks: a keepdims reduction.
    for reducer in ("add", "max"):
        out.append(Lemma(f"all_reduce-unit-blocks-{reducer}", "stablehlo.all_reduce",
                         [rel(arg((2, 3)), "tp")], results=[((1, 3), "f32")],
                         attrs={**groups(M1, "tp"), "reducer": reducer}))
    out.append(Lemma("all_reduce-unit-blocks-2d", "stablehlo.all_reduce",
                     [rel(arg((2, 4)), "dp")], results=[((1, 4), "f32")],
                     attrs={**groups(M2, "dp", "tp"), "reducer": "add"}, mesh=M2))
    # collective_permute along an axis the value does not use.
    out.append(Lemma("collective_permute-replicated", "stablehlo.collective_permute",
                     [rel(arg((2, 3)))],
                     attrs={"source_target_pairs": [[0, 1], [1, 0]], "channel_handle": 1}))
    out.append(Lemma("collective_permute-2d", "stablehlo.collective_permute",
                     [rel(arg((4, 3)), "dp")],
                     attrs={"source_target_pairs": [[0, 1], [1, 0], [2, 3], [3, 2]],
                            "channel_handle": 1}, mesh=M2))
    # A cyclic shift of the blocks is a roll of the global tensor (also of a partial sum whose
    # groups move as a whole); any other order is a permuted value; a permute undoes one.
    ring3 = {"source_target_pairs": [[0, 1], [1, 2], [2, 0]], "channel_handle": 1}
    along_tp = {"source_target_pairs": [[0, 1], [1, 0], [2, 3], [3, 2]], "channel_handle": 1}
    swap = {"source_target_pairs": [[0, 2], [2, 0], [1, 1], [3, 3]], "channel_handle": 1}
    out.append(Lemma("collective_permute-roll", "stablehlo.collective_permute",
                     [rel(arg((6, 2)), "tp")], attrs=ring3, mesh=M3))
    out.append(Lemma("collective_permute-roll-2d", "stablehlo.collective_permute",
                     [rel(arg((4, 4)), "dp", "tp")], attrs=along_tp, mesh=M2))
    out.append(Lemma("collective_permute-roll-partial", "stablehlo.collective_permute",
                     [rel(arg((4, 2)), "tp", partial=("dp",))], attrs=along_tp, mesh=M2))
    out.append(Lemma("collective_permute-permuted", "stablehlo.collective_permute",
                     [rel(arg((8, 2)), ("dp", "tp"))], attrs=swap, mesh=M2))
    x = rel(arg((8, 2)), ("dp", "tp"))
    out.append(Lemma("collective_permute-undo", "stablehlo.collective_permute",
                     [Permuted(x, (2, 1, 0, 3))], attrs=swap, mesh=M2))
    return out


def index_lemmas() -> list[Lemma]:
    out = [
        Lemma("partition_id-1d", "stablehlo.partition_id", [], results=[((), "ui32")]),
        Lemma("partition_id-2d", "stablehlo.partition_id", [], results=[((), "ui32")],
              mesh=M2),
        Lemma("replica_id-2d", "stablehlo.replica_id", [], results=[((), "ui32")], mesh=M2),
    ]
    for mesh, axes in ((M1, ("tp",)), (M2, ("dp",)), (M2, ("tp",)), (M2, ("dp", "tp"))):
        count = mesh.group_size(axes)
        size = 2
        offsets = tuple(mesh.block_index(axes, d) * size for d in range(mesh.num_devices))
        x = arg((size * count, 3))
        out.append(Lemma(f"dynamic_slice-{mesh.describe()}-{'_'.join(axes)}",
                         "stablehlo.dynamic_slice",
                         [rel(x), DeviceScalar(offsets, ()), splat(0, (), "i32")],
                         results=[((size, 3), "f32")], attrs={"slice_sizes": (size, 3)},
                         mesh=mesh))
    # Offsets computed by the program (a loop counter): the same on every device.
    out.append(Lemma("dynamic_slice-computed-offset", "stablehlo.dynamic_slice",
                     [rel(arg((4, 6)), (), "tp"), rel(arg((), "i32")), splat(0, (), "i32")],
                     results=[((2, 3), "f32")], attrs={"slice_sizes": (2, 3)}))
    out.append(Lemma("dynamic_slice-computed-offset-2d", "stablehlo.dynamic_slice",
                     [rel(arg((3, 4)), (), ("dp", "tp")), rel(arg((), "i32")),
                      splat(0, (), "i32")],
                     results=[((1, 1), "f32")], attrs={"slice_sizes": (1, 1)}, mesh=M2))
    out.append(Lemma("dynamic_slice-constant-offset", "stablehlo.dynamic_slice",
                     [rel(arg((4, 6)), "tp"), splat(0, (), "i32"), splat(7, (), "i32")],
                     results=[((2, 2), "f32")], attrs={"slice_sizes": (2, 2)}))
    return out


_EMBED = {"offset_dims": (1,), "collapsed_slice_dims": (0,), "start_index_map": (0,),
          "index_vector_dim": 1}
_SCATTER_ROWS = {"update_window_dims": (1,), "inserted_window_dims": (0,),
                 "scatter_dims_to_operand_dims": (0,), "index_vector_dim": 1}


def indexed_lemmas() -> list[Lemma]:
    """gather / scatter / dynamic_update_slice (indices are symbolic integers)."""
    out = []
    for rows, width in ((5, 4), (3, 2)):
        table = arg((rows, width))
        ids = arg((4, 1), "i32")
        out += [
            Lemma(f"gather-hidden-split-{rows}", "stablehlo.gather",
                  [rel(table, (), "tp"), rel(ids)], results=[((4, width // 2), "f32")],
                  attrs={**_EMBED, "slice_sizes": (1, width // 2)}),
            Lemma(f"gather-ids-split-{rows}", "stablehlo.gather",
                  [rel(table), rel(ids, "tp")], results=[((2, width), "f32")],
                  attrs={**_EMBED, "slice_sizes": (1, width)}),
            Lemma(f"gather-partial-{rows}", "stablehlo.gather",
                  [rel(table, partial=("tp",)), rel(ids)], results=[((4, width), "f32")],
                  attrs={**_EMBED, "slice_sizes": (1, width)}),
        ]
    out.append(Lemma("gather-2d", "stablehlo.gather",
                     [rel(arg((3, 4)), (), "tp"), rel(arg((4, 1), "i32"), "dp")],
                     results=[((2, 2), "f32")], attrs={**_EMBED, "slice_sizes": (1, 2)},
                     mesh=M2))
    out.append(Lemma("gather-window", "stablehlo.gather",
                     [rel(arg((4, 6)), (), "tp"), rel(arg((2, 1), "i32"))],
                     results=[((2, 2, 3), "f32")],
                     attrs={"offset_dims": (1, 2), "collapsed_slice_dims": (),
                            "start_index_map": (0,), "index_vector_dim": 1,
                            "slice_sizes": (2, 3)}))
    for kind in ("add", "replace"):
        out.append(Lemma(f"scatter-{kind}-replicated", "stablehlo.scatter",
                         [rel(arg((4, 2))), rel(arg((3, 1), "i32")), rel(arg((3, 2)))],
                         results=[((4, 2), "f32")], attrs={**_SCATTER_ROWS, "reducer": kind}))
    out += [
        Lemma("scatter-add-updates-split", "stablehlo.scatter",
              [rel(arg((3, 2))), rel(arg((4, 1), "i32"), "tp"), rel(arg((4, 2)), "tp")],
              results=[((3, 2), "f32")], attrs={**_SCATTER_ROWS, "reducer": "add"}),
        Lemma("scatter-add-zero-operand", "stablehlo.scatter",
              [splat(0, (3, 2)), rel(arg((4, 1), "i32"), "tp"), rel(arg((4, 2)), "tp")],
              results=[((3, 2), "f32")], attrs={**_SCATTER_ROWS, "reducer": "add"}),
        Lemma("scatter-add-window-split", "stablehlo.scatter",
              [rel(arg((3, 4)), (), "tp"), rel(arg((2, 1), "i32")), rel(arg((2, 4)), (), "tp")],
              results=[((3, 2), "f32")], attrs={**_SCATTER_ROWS, "reducer": "add"}),
        Lemma("scatter-add-partials", "stablehlo.scatter",
              [rel(arg((3, 2)), partial=("tp",)), rel(arg((2, 1), "i32")),
               rel(arg((2, 2)), partial=("tp",))],
              results=[((3, 2), "f32")], attrs={**_SCATTER_ROWS, "reducer": "add"}),
        Lemma("dus-constant-offsets", "stablehlo.dynamic_update_slice",
              [rel(arg((4, 3))), rel(arg((2, 3))), splat(3, (), "i32"), splat(0, (), "i32")],
              results=[((4, 3), "f32")]),
        Lemma("dus-split-columns", "stablehlo.dynamic_update_slice",
              [rel(arg((4, 4)), (), "tp"), rel(arg((1, 4)), (), "tp"), splat(2, (), "i32"),
               splat(0, (), "i32")], results=[((4, 2), "f32")]),
        Lemma("dus-computed-offset", "stablehlo.dynamic_update_slice",
              [rel(arg((4, 4)), (), "tp"), rel(arg((2, 4)), (), "tp"), rel(arg((), "i32")),
               splat(0, (), "i32")], results=[((4, 2), "f32")]),
        Lemma("dus-placed-blocks", "stablehlo.dynamic_update_slice",
              [splat(0, (8, 3)), rel(arg((8, 3)), "tp"), DeviceScalar((0, 4), ()),
               splat(0, (), "i32")], results=[((8, 3), "f32")]),
        Lemma("dus-placed-blocks-2d", "stablehlo.dynamic_update_slice",
              [splat(0, (4, 3)), rel(arg((4, 3)), "tp"), DeviceScalar((0, 0, 2, 2), ()),
               splat(0, (), "i32")], results=[((4, 3), "f32")], mesh=Mesh((("tp", 2),
                                                                          ("dp", 2)))),
        Lemma("dus-partials", "stablehlo.dynamic_update_slice",
              [rel(arg((4, 3)), partial=("tp",)), rel(arg((2, 3)), partial=("tp",)),
               splat(1, (), "i32"), splat(0, (), "i32")], results=[((4, 3), "f32")]),
        Lemma("dus-partial-into-replicated", "stablehlo.dynamic_update_slice",
              [rel(arg((4, 3))), rel(arg((2, 3)), partial=("tp",)),
               splat(1, (), "i32"), splat(0, (), "i32")], results=[((4, 3), "f32")]),
    ]
    return out


def sorting_lemmas() -> list[Lemma]:
    """chlo.top_k: rows split over any axes select within their own rows (values and i32
    indices, ties to the lower index, on symbolic elements)."""
    out = []
    for mesh, shape, tiling, k in ((M1, (4, 5), ("tp",), 2), (M3, (3, 4), ("tp",), 1),
                                   (M2, (2, 2, 4), ("dp", "tp"), 3), (M1, (2, 3), (), 3)):
        x = arg(shape)
        local = tuple(s // mesh.group_size((a,)) if isinstance(a, str) else s
                      for s, a in zip(shape, tiling + ((),) * (len(shape) - len(tiling))))
        out_shape = local[:-1] + (k,)
        for op in ("chlo.top_k", "mhlo.topk"):
            out.append(Lemma(f"{op.split('.')[1]}-{'x'.join(map(str, shape))}-k{k}", op,
                             [rel(x, *tiling)],
                             results=[(out_shape, "f32"), (out_shape, "i32")],
                             attrs={"k": k}, mesh=mesh))
    # stablehlo.sort with jax's ascending comparator along an unsplit dim (argsort: the keys
    # and an iota moved with them).
    for mesh, shape, tiling, dim in ((M1, (4, 3), ("tp",), 1), (M3, (3, 4), ("tp",), 1),
                                     (M2, (2, 4, 3), ("dp", "tp"), 2), (M1, (3, 4), ((), "tp"), 0)):
        x = arg(shape)
        local = rel(x, *tiling).local_shape(mesh)
        attrs = {"dimension": dim, "is_stable": True, "comparator": "ascending"}
        out.append(Lemma(f"sort-{'x'.join(map(str, shape))}-dim{dim}", "stablehlo.sort",
                         [rel(x, *tiling)], results=[(local, "f32")], attrs=attrs, mesh=mesh))
        iota = T.make_iota(shape, dim, "i32")
        out.append(Lemma(f"argsort-{'x'.join(map(str, shape))}-dim{dim}", "stablehlo.sort",
                         [rel(x, *tiling), rel(iota, *tiling)],
                         results=[(local, "f32"), (local, "i32")], attrs=attrs, mesh=mesh))
    out += batching_lemmas()
    return out


_TAKE_ALONG = {"offset_dims": (), "collapsed_slice_dims": (1,), "operand_batching_dims": (0,),
               "start_indices_batching_dims": (0,), "start_index_map": (1,),
               "index_vector_dim": 2, "slice_sizes": (1, 1)}
"""`jnp.take_along_axis(logits, t[:, None, None], -1)`: one index per row of the operand."""
_TAKE_ALONG_GRAD = {"update_window_dims": (), "inserted_window_dims": (1,),
                    "input_batching_dims": (0,), "scatter_indices_batching_dims": (0,),
                    "scatter_dims_to_operand_dims": (1,), "index_vector_dim": 2}
"""Its gradient: scatter-add of the cotangent into each row at its index."""


def batching_lemmas() -> list[Lemma]:
    """gather / scatter with batching dims (take_along_axis, the target logit of a
    cross-entropy, and its gradient): the batching dim split alike in operand and indices."""
    out = []
    for mesh, axes, rows, width in ((M1, "tp", 4, 3), (M3, "tp", 3, 2), (M2, ("dp", "tp"), 4, 2)):
        n = mesh.group_size(axes if isinstance(axes, tuple) else (axes,))
        tag = f"{'-'.join(mesh.names)}-{rows}x{width}"
        logits, ids = arg((rows, width)), arg((rows, 1, 1), "i32")
        out += [
            Lemma(f"gather-batching-{tag}", "stablehlo.gather",
                  [rel(logits, axes), rel(ids, axes)], results=[((rows // n, 1), "f32")],
                  attrs=dict(_TAKE_ALONG), mesh=mesh),
            Lemma(f"scatter-batching-{tag}", "stablehlo.scatter",
                  [rel(arg((rows, width)), axes), rel(ids, axes), rel(arg((rows, 1)), axes)],
                  results=[((rows // n, width), "f32")],
                  attrs={**_TAKE_ALONG_GRAD, "reducer": "add"}, mesh=mesh),
            Lemma(f"scatter-batching-local-zeros-{tag}",
                  "stablehlo.scatter",
                  [splat(0, (rows // n, width)), rel(ids, axes), splat(1, (rows // n, 1))],
                  results=[((rows // n, width), "f32")],
                  attrs={**_TAKE_ALONG_GRAD, "reducer": "add"}, mesh=mesh),
        ]
    out.append(Lemma("gather-batching-partial", "stablehlo.gather",
                     [rel(arg((4, 3)), (), partial=("tp",)), rel(arg((4, 1, 1), "i32"))],
                     results=[((4, 1), "f32")], attrs=dict(_TAKE_ALONG)))
    return out


def case_lemmas() -> list[Lemma]:
    """case (lax.switch): the branches' results selected by a device-independent index keep
    the layout they agree on (tilings, partial sums); a constant index picks its branch, one
    out of range the last."""
    out = []
    index = rel(arg((), "i32"))
    for mesh, shape, tiling in ((M1, (4, 2), ("tp",)), (M2, (4, 4), ("dp", "tp")),
                                (M3, (3, 2), ("tp",))):
        local = rel(arg(shape), *tiling).local_shape(mesh)
        branches = [rel(arg(shape), *tiling) for _ in range(3)]
        out.append(Lemma(f"case-3-tiled-{shape}", "stablehlo.case", [index, *branches],
                         results=[(local, "f32")], attrs={"branches": 3}, mesh=mesh))
    sums = [rel(arg((2, 2)), partial=("tp",)) for _ in range(2)]
    out.append(Lemma("case-partial-sums", "stablehlo.case", [index, *sums],
                     results=[((2, 2), "f32")], attrs={"branches": 2}))
    pairs = [rel(arg((4,)), "tp"), rel(arg((2,), "i32")), rel(arg((4,)), "tp"),
             rel(arg((2,), "i32"))]
    out.append(Lemma("case-two-results", "stablehlo.case", [index, *pairs],
                     results=[((2,), "f32"), ((2,), "i32")], attrs={"branches": 2}))
    out.append(Lemma("case-splat-branch", "stablehlo.case",
                     [index, rel(arg((4, 2)), "tp"), splat(1.5, (2, 2))],
                     results=[((2, 2), "f32")], attrs={"branches": 2}))
    for k in (1, 7, -1):
        out.append(Lemma(f"case-constant-index-{k}", "stablehlo.case",
                         [splat(k, (), "i32"), rel(arg((4,)), "tp"), rel(arg((4,)), "tp"),
                          rel(arg((4,)), "tp")], results=[((2,), "f32")],
                         attrs={"branches": 3}))
    out.append(Lemma("case-global", "stablehlo.case",
                     [Rel(arg((), "i32"), (), scope=GLOBAL)] +
                     [Rel(arg((2, 3)), ((), ()), scope=GLOBAL) for _ in range(2)],
                     results=[((2, 3), "f32")], attrs={"branches": 2}, mesh=None))
    return out


ALL_LEMMAS = (elementwise_lemmas() + partial_lemmas() + precision_lemmas() + dot_lemmas()
              + conv_lemmas()
              + reduce_lemmas()
              + movement_lemmas() + collective_lemmas() + index_lemmas() + indexed_lemmas()
              + sorting_lemmas() + case_lemmas())


@pytest.mark.parametrize("lemma", ALL_LEMMAS, ids=[lemma.name for lemma in ALL_LEMMAS])
def test_rule_lemma(lemma: Lemma) -> None:
    prove_lemma(lemma)


def _mutable(lemma: Lemma) -> bool:
    return lemma.mesh is not None and lemma.op not in ("stablehlo.partition_id",
                                                        "stablehlo.replica_id")


MUTATED = [lemma for lemma in ALL_LEMMAS if _mutable(lemma)][::3]


def _doubled(value: Value) -> Value | None:
    """`value` with its numeric term doubled (also inside a window, shift, mask...), or None."""
    if isinstance(value, Rel):
        return value.with_term(T.scale(value.term, 2)) if value.term.dtype != "i1" else None
    inner = getattr(value, "rel", None)
    doubled = _doubled(inner) if isinstance(inner, Rel) else None
    return replace(value, rel=doubled) if doubled is not None else None


@pytest.mark.parametrize("lemma", MUTATED, ids=[lemma.name for lemma in MUTATED])
def test_mutated_lemma_is_refuted(lemma: Lemma) -> None:
    """The check is not vacuous: doubling a proved output's term must be refuted."""
    info = lemma.info()
    ctx = lemma.context()
    outs = RULES[lemma.op](info, list(lemma.ins), ctx)
    doubled = [_doubled(v) for v in outs]
    first = next((i for i, v in enumerate(doubled) if v is not None), None)
    if first is None:
        pytest.skip("no numeric output relation")
    wrong = [doubled[i] if i == first else v for i, v in enumerate(outs)]
    result = _checker().check(info, lemma.ins, wrong, lemma.mesh, ctx)
    assert result.status == "refuted", f"{lemma.name}: {result.describe()}"


def test_every_rule_has_a_lemma() -> None:
    covered = {lemma.op for lemma in ALL_LEMMAS}
    missing = sorted(set(RULES) - covered)
    assert not missing, f"rules without a lemma case: {missing}"


# ----- must-fail lemmas: wrong relations built by hand -----------------------------------------

def refute(op: str, ins: list[Value], outs: list[Value], results, attrs=None,
           mesh: Mesh = M1) -> None:
    lemma = Lemma("must-fail", op, ins, results=results, attrs=attrs or {}, mesh=mesh)
    info = lemma.info()
    result = _checker().check(info, ins, outs, mesh, lemma.context())
    assert result.status == "refuted", result.describe()


def test_refutes_tanh_of_partial_sum() -> None:
    x = arg((2, 2))
    wrong = rel(T.make_elementwise("stablehlo.tanh", (x,)), partial=("tp",))
    refute("stablehlo.tanh", [rel(x, partial=("tp",))], [wrong], [((2, 2), "f32")])


def test_refutes_merged_split_dims_in_the_wrong_axis_order() -> None:
    """(2 over dp, local 1) x (4 over tp) merged is split over (dp, tp), never (tp, dp)."""
    x = arg((2, 4, 3))
    merged = T.make_reshape(x, (24,))
    refute("stablehlo.reshape", [rel(x, "dp", "tp")], [rel(merged, ("tp", "dp"))],
           [((6,), "f32")], mesh=M2)


def test_refutes_merged_split_dims_with_a_wide_major_block() -> None:
    """A major split dim holding two elements per device interleaves the merged blocks: no
    (dp, tp) tiling of the merged dim, and the rule does not claim one."""
    x = arg((4, 4))
    merged = T.make_reshape(x, (16,))
    refute("stablehlo.reshape", [rel(x, "dp", "tp")], [rel(merged, ("dp", "tp"))],
           [((4,), "f32")], mesh=M2)
    lemma = Lemma("wide-major", "stablehlo.reshape", [rel(x, "dp", "tp")],
                  results=[((4,), "f32")], mesh=M2)
    (out,) = RULES[lemma.op](lemma.info(), list(lemma.ins), lemma.context())
    assert isinstance(out, Opaque), out


def test_refutes_psum_of_replicated_as_identity() -> None:
    x = arg((2, 3))
    refute("stablehlo.all_reduce", [rel(x)], [rel(x)], [((2, 3), "f32")],
           {**groups(M1, "tp"), "reducer": "add"})


def test_refutes_psum_of_a_local_broadcast_as_identity() -> None:
    """The psum over 'tp' of a broadcast built at the local shape is 2x it, poly or not."""
    bcast = rel(T.make_broadcast(arg((2,)), (0,), (2, 3)), poly=frozenset({1}))
    refute("stablehlo.all_reduce", [bcast], [bcast], [((2, 3), "f32")],
           {**groups(M1, "tp"), "reducer": "add"})


def test_refutes_bias_before_psum() -> None:
    x, b = arg((2, 2)), arg((2, 2))
    wrong = rel(T.make_add(x, b), partial=("tp",))
    refute("stablehlo.add", [rel(x, partial=("tp",)), rel(b)], [wrong], [((2, 2), "f32")])


def test_refutes_all_gather_of_the_wrong_dim() -> None:
    x = arg((4, 2))
    refute("stablehlo.all_gather", [rel(x, "tp")], [rel(x)], [((2, 4), "f32")],
           {**groups(M1, "tp"), "all_gather_dim": 1})


def test_refutes_reverse_of_a_split_dim_as_the_global_reverse() -> None:
    """Each device reverses its own block: not the global reverse (device d's block of it
    is device n-1-d's block reversed); nor is a reverse along the other dim."""
    x = arg((4, 3))
    reversed_rows = T.make_op("stablehlo.reverse", (x,), ((0,),), (4, 3), "f32", linear_in=0)
    refute("stablehlo.reverse", [rel(x, "tp")], [rel(reversed_rows, "tp")], [((2, 3), "f32")],
           {"dimensions": (0,)})
    refute("stablehlo.reverse", [rel(x, "tp")], [rel(reversed_rows, "tp")], [((2, 3), "f32")],
           {"dimensions": (1,)})


def test_refutes_partial_max_summed() -> None:
    x = arg((2, 2))
    refute("stablehlo.all_reduce", [rel(x, partial=("tp",), kind="max")], [rel(x)],
           [((2, 2), "f32")], {**groups(M1, "tp"), "reducer": "add"})


def test_refutes_dot_with_misaligned_contracting_splits() -> None:
    x, w = arg((2, 4)), arg((4, 2))
    wrong = rel(T.make_dot(x, w, ((), (), (1,), (0,)), (2, 2), "f32"), partial=("tp",))
    refute("stablehlo.dot_general", [rel(x, (), "tp"), rel(w, "dp")], [wrong],
           [((2, 2), "f32")], _dot_attrs(), mesh=M2)


def test_refutes_dot_with_one_contracting_side_split() -> None:
    # lhs is split on its contracting dim, but every device holds the SAME rows W[0:2] of the
    # rhs (replicated) instead of its own block: the partial-sum claim is wrong.
    x, w = arg((2, 4)), arg((4, 3))
    top = T.make_op("slice", (w,), ((0, 0), (2, 3), (1, 1)), (2, 3), "f32", linear_in=0)
    wrong = rel(T.make_dot(x, w, ((), (), (1,), (0,)), (2, 3), "f32"), partial=("tp",))
    refute("stablehlo.dot_general", [rel(x, (), "tp"), rel(top)], [wrong], [((2, 3), "f32")],
           _dot_attrs())


def test_refutes_reduce_scatter_claimed_on_the_wrong_dim() -> None:
    x = arg((2, 4))
    refute("stablehlo.reduce_scatter", [rel(x, partial=("tp",))], [rel(x, "tp")],
           [((2, 2), "f32")], {**groups(M1, "tp"), "scatter_dimension": 1, "reducer": "add"})


def test_refutes_wrong_dynamic_slice_offsets() -> None:
    x = arg((8, 2))
    offsets = DeviceScalar((0, 2, 2, 6), ())
    refute("stablehlo.dynamic_slice", [rel(x), offsets, splat(0, (), "i32")],
           [rel(x, ("dp", "tp"))], [((2, 2), "f32")], {"slice_sizes": (2, 2)}, mesh=M2)


def test_refutes_collective_permute_of_split_blocks() -> None:
    x = arg((4, 2))
    refute("stablehlo.collective_permute", [rel(x, "tp")], [rel(x, "tp")], [((2, 2), "f32")],
           {"source_target_pairs": [[0, 1], [1, 0]], "channel_handle": 1})


def test_refutes_roll_by_the_wrong_amount() -> None:
    x = arg((6, 2))
    refute("stablehlo.collective_permute", [rel(x, "tp")], [rel(T.make_roll(x, 0, 4), "tp")],
           [((2, 2), "f32")], {"source_target_pairs": [[0, 1], [1, 2], [2, 0]],
                               "channel_handle": 1}, mesh=M3)


def test_refutes_halo_windows_joined_as_the_own_block() -> None:
    x = rel(arg((8, 2)), "tp")
    refute("stablehlo.concatenate", [Windowed(x, 0, 7, 1), Windowed(x, 0, 0, 3)], [x],
           [((4, 2), "f32")], {"dimension": 0})


def test_refutes_halo_window_moved_the_wrong_way() -> None:
    x = rel(arg((12, 2)), "tp")
    refute("stablehlo.collective_permute", [Windowed(x, 0, 3, 1)], [Windowed(x, 0, -1, 1)],
           [((1, 2), "f32")], {"source_target_pairs": [[1, 0], [2, 1], [0, 2]],
                               "channel_handle": 1}, mesh=M3)


def test_refutes_reading_rows_a_device_never_received() -> None:
    y = rel(arg((16, 2)), "tp")
    window = Windowed(y, 0, 14, 8, holes=((0, 0, 2), (3, 6, 8)))
    claim = Rel(T.make_op("slice", (y.term,), ((2, 0), (10, 2), (1, 1)), (8, 2), "f32",
                          linear_in=0), (("tp",), ()))
    refute("stablehlo.dynamic_slice", [window, DeviceScalar((0, 4, 2, 0), ()),
                                       splat(0, (), "i32")],
           [claim], [((2, 2), "f32")], {"slice_sizes": (2, 2)}, mesh=Mesh((("tp", 4),)))


def test_two_sided_mask_is_a_pad_of_the_kept_rows() -> None:
    lemma = _two_sided_mask_lemma()
    (out,) = RULES[lemma.op](lemma.info(), list(lemma.ins), lemma.context())
    assert out.term.op == "pad" and out.term.attrs[:2] == ((2, 0), (2, 0)), T.pretty(out.term)


def test_refutes_reading_wrapped_rows_as_the_zeros_of_a_pad() -> None:
    """A cyclic halo (no zeros at the ends) read as if it were zero-padded: device 0's first
    rows are x's last rows, not the zeros of pad(x)."""
    y = rel(arg((16, 2)), "tp")
    every = tuple((d, 0, 1) for d in range(4)) + tuple((d, 7, 8) for d in range(4))
    window = Windowed(y, 0, 14, 8, holes=every)
    padded = T.make_op("pad", (y.term, T.make_splat(0, (), "f32")), ((2, 0), (2, 0), (0, 0)),
                       (20, 2), "f32", linear_in=0)
    refute("stablehlo.dynamic_slice", [window, DeviceScalar((0, 1, 2, 3), ()),
                                       splat(0, (), "i32")],
           [Rel(padded, (("tp",), ()))], [((5, 2), "f32")], {"slice_sizes": (5, 2)},
           mesh=Mesh((("tp", 4),)))


def test_zero_extended_read_needs_the_zeros() -> None:
    """The rule itself refuses that cyclic window: rows outside x must be zero rows."""
    from entangle_mlir.rules.kinds.window import zero_extended_read

    y = rel(arg((16, 2)), "tp")
    every = tuple((d, 0, 1) for d in range(4)) + tuple((d, 7, 8) for d in range(4))
    mesh = Mesh((("tp", 4),))
    wrapped = zero_extended_read(Windowed(y, 0, 14, 8, holes=every), [0, 1, 2, 3], 5, mesh)
    assert isinstance(wrapped, str) and "device 0 reads row 15" in wrapped, wrapped
    ends = every + ((0, 1, 2), (3, 6, 7))
    assert isinstance(zero_extended_read(Windowed(y, 0, 14, 8, holes=ends), [0, 1, 2, 3], 5,
                                         mesh), Rel)


def test_overlapping_windows_need_zeros_before_the_tensor() -> None:
    """A cumsum window whose leading rows wrap around (no zeros) is refused by the rule, and
    the block it would claim is refuted."""
    cum = rel(arg((2, 16)), (), "tp")
    mesh = Mesh((("tp", 4),))
    wrapped = Windowed(cum, 1, -15, 19, holes=((0, 0, 15), (1, 0, 11), (2, 0, 7)))
    lemma = Lemma("wrapped", "stablehlo.reduce_window", [wrapped, splat(0, (), "f32")],
                  results=[((2, 4), "f32")],
                  attrs={"window_dimensions": (1, 16), "reducer": "add"}, mesh=mesh)
    (out,) = RULES[lemma.op](lemma.info(), list(lemma.ins), lemma.context())
    assert isinstance(out, Opaque) and "device 3 reads row 13" in out.reason, out
    good = Windowed(cum, 1, -15, 19, holes=((0, 0, 15), (1, 0, 11), (2, 0, 7), (3, 0, 3)))
    (claim,) = RULES[lemma.op](lemma.info(), [good, splat(0, (), "f32")], lemma.context())
    refute(lemma.op, [wrapped, splat(0, (), "f32")], [claim], [((2, 4), "f32")],
           lemma.attrs, mesh=mesh)


def test_refutes_rows_routed_from_another_device() -> None:
    """A point-to-point permute (0 -> 1, 1 -> 3): device 3 holds device 1's rows, not device
    0's."""
    y = rel(arg((16, 2)), "tp")
    wrong = Windowed(y, 0, 0, 2, holes=((0, 0, 2), (2, 0, 2)), starts=(0, 0, 8, 0))
    refute("stablehlo.collective_permute", [Windowed(y, 0, 0, 2)], [wrong], [((2, 2), "f32")],
           {"source_target_pairs": [[0, 1], [1, 3]], "channel_handle": 1},
           mesh=Mesh((("tp", 4),)))


def test_refutes_a_window_sum_as_the_block_sum() -> None:
    """One micro-batch's sum is not the partial sum of the whole block."""
    mb = rel(arg((16, 2)), "tp")
    block_sum = Rel(T.make_op("reduce_sum", (mb.term,), ((0, 1),), (), "f32", linear_in=0),
                    (), ("tp",), "sum")
    refute("stablehlo.multiply", [Windowed(mb, 0, 0, 2, summed=(0, 1)), splat(1, (), "f32")],
           [block_sum], [((), "f32")], mesh=Mesh((("tp", 4),)))


def test_window_times_a_value_that_varies_along_its_rows_is_refused() -> None:
    """A replicated (2, 2) value is the same on every device, not the window's rows of
    anything: multiplying a window by it is not a window of a product."""
    mb = rel(arg((16, 2)), "tp")
    lemma = Lemma("varies", "stablehlo.multiply", [Windowed(mb, 0, 0, 2), rel(arg((2, 2)))],
                  mesh=Mesh((("tp", 4),)))
    (out,) = RULES[lemma.op](lemma.info(), list(lemma.ins), lemma.context())
    assert isinstance(out, Opaque), out


def test_window_sums_that_do_not_join_are_refused() -> None:
    """x[:1] and x[2:] of 4 local rows: a row is missing, the sums do not add up."""
    mb = rel(arg((16, 2)), "tp")
    lemma = Lemma("gap", "stablehlo.add", [Windowed(mb, 0, 0, 1, summed=(0, 1)),
                                           Windowed(mb, 0, 2, 2, summed=(0, 1))],
                  results=[((), "f32")], mesh=Mesh((("tp", 4),)))
    (out,) = RULES[lemma.op](lemma.info(), list(lemma.ins), lemma.context())
    assert isinstance(out, Opaque), out


def test_refutes_permuted_blocks_from_the_wrong_devices() -> None:
    x = rel(arg((8, 2)), ("dp", "tp"))
    refute("stablehlo.collective_permute", [x], [Permuted(x, (1, 0, 2, 3))], [((2, 2), "f32")],
           {"source_target_pairs": [[0, 2], [2, 0], [1, 1], [3, 3]], "channel_handle": 1},
           mesh=M2)


def test_refutes_top_k_of_split_candidates() -> None:
    """Each device's top 2 of its own half of the row is not the row's top 2."""
    from entangle_mlir.rules.sorting import make_top_k

    x = arg((2, 4))
    outs = [rel(make_top_k(x, 2, 0, "f32")), rel(make_top_k(x, 2, 1, "i32"))]
    refute("chlo.top_k", [rel(x, (), "tp")], outs, [((2, 2), "f32"), ((2, 2), "i32")],
           attrs={"k": 2})


def test_refutes_mhlo_topk_of_split_candidates() -> None:
    from entangle_mlir.rules.sorting import make_top_k

    x = arg((2, 4))
    outs = [rel(make_top_k(x, 2, 0, "f32")), rel(make_top_k(x, 2, 1, "i32"))]
    refute("mhlo.topk", [rel(x, (), "tp")], outs, [((2, 2), "f32"), ((2, 2), "i32")],
           attrs={"k": 2})


_SORT = {"dimension": 1, "is_stable": True, "comparator": "ascending"}


def test_refutes_sort_of_split_rows_as_the_row_sort() -> None:
    """Each device sorting its own block of a row is not the sorted row."""
    from entangle_mlir.rules.sorting import make_sort

    x = arg((2, 4))
    refute("stablehlo.sort", [rel(x, (), "tp")], [rel(make_sort((x,), 1, 0), (), "tp")],
           [((2, 2), "f32")], _SORT)


def test_refutes_argsort_moving_another_operand() -> None:
    """The indices follow the keys, not the keys of another tensor."""
    from entangle_mlir.rules.sorting import make_sort

    x, y = arg((4, 3)), arg((4, 3))
    iota = T.make_iota((4, 3), 1, "i32")
    refute("stablehlo.sort", [rel(x, "tp"), rel(iota, "tp")],
           [rel(make_sort((x, iota), 1, 0), "tp"), rel(make_sort((y, iota), 1, 1), "tp")],
           [((2, 3), "f32"), ((2, 3), "i32")], _SORT)


def test_refuses_sorts_the_rules_must_not_relate() -> None:
    for ins, attrs in (([rel(arg((2, 4)), (), "tp")], _SORT),
                       ([rel(arg((4, 3)), partial=("tp",))], _SORT),
                       ([rel(arg((4, 3)))], {**_SORT, "comparator": "other"}),
                       ([rel(arg((4, 3))), rel(arg((4, 3)))], {**_SORT, "is_stable": False}),
                       ([rel(arg((4, 3)))], {**_SORT, "is_stable": False})):
        lemma = Lemma("refused", "stablehlo.sort", ins,
                      results=[((4, 3), "f32")] * len(ins), attrs=attrs)
        outs = RULES["stablehlo.sort"](lemma.info(), ins, lemma.context())
        assert all(isinstance(v, Opaque) for v in outs), outs


def test_refuses_the_k_smallest() -> None:
    lemma = Lemma("refused", "mhlo.topk", [rel(arg((4, 4)), "tp")],
                  results=[((2, 2), "f32"), ((2, 2), "i32")], attrs={"k": 2, "largest": False})
    outs = RULES["mhlo.topk"](lemma.info(), lemma.ins, lemma.context())
    assert all(isinstance(v, Opaque) for v in outs), outs


def test_refutes_take_along_axis_with_only_the_indices_split() -> None:
    """Rows of the indices split over tp but a replicated operand: each device would pair its
    local index rows with the operand's first rows; claiming the split gather is refuted."""
    logits, ids = arg((4, 3)), arg((4, 1, 1), "i32")
    dims = {k: v for k, v in _TAKE_ALONG.items() if k != "slice_sizes"}
    out = rel(T.intern("stablehlo.gather", (logits, ids), tuple(sorted(
        {**dims, "slice_sizes": (1, 1)}.items())), (4, 1), "f32"), "tp")
    refute("stablehlo.gather", [rel(logits), rel(ids, "tp")], [out], [((2, 1), "f32")],
           attrs=dict(_TAKE_ALONG))


def test_refuses_take_along_axis_with_only_the_indices_split() -> None:
    lemma = Lemma("x", "stablehlo.gather", [rel(arg((4, 3))), rel(arg((4, 1, 1), "i32"), "tp")],
                  results=[((2, 1), "f32")], attrs=dict(_TAKE_ALONG))
    (value,) = RULES[lemma.op](lemma.info(), list(lemma.ins), lemma.context())
    assert isinstance(value, Opaque) and "pair rows of different tokens" in value.reason


def test_refutes_narrowing_reduce_precision_claimed_the_identity() -> None:
    """e8m7 on f32 rounds: claiming the operand's own term is refuted (the lemma set proves
    the rounding term instead)."""
    x = arg((4, 2))
    refute("stablehlo.reduce_precision", [rel(x, "tp")], [rel(x, "tp")], [((2, 2), "f32")],
           _E8M7)


def test_refutes_narrowing_reduce_precision_of_a_partial_sum() -> None:
    """Rounded pieces do not add up to the rounded sum."""
    x = arg((2, 2))
    rounded = T.make_elementwise("stablehlo.reduce_precision", (x,), (5, 10))
    refute("stablehlo.reduce_precision", [rel(x, partial=("tp",))],
           [rel(rounded, partial=("tp",))], [((2, 2), "f32")], _E5M10)


def test_refutes_reduce_precision_at_another_format() -> None:
    """e5m10 is not e8m7: two roundings, two functions."""
    x = arg((4,))
    other = T.make_elementwise("stablehlo.reduce_precision", (x,), (8, 7))
    refute("stablehlo.reduce_precision", [rel(x, "tp")], [rel(other, "tp")], [((2,), "f32")],
           _E5M10)


def test_refutes_any_of_split_dim_claimed_a_partial_all() -> None:
    """The or of each device's block combined with `and` is not the any of the row."""
    b = arg((2, 4), "i1")
    wrong = rel(T.intern("reduce_or", (b,), ((1,),), (2,), "i1"), partial=("tp",), kind="min")
    refute("stablehlo.reduce", [rel(b, (), "tp"), splat(0, (), "i1")], [wrong], [((2,), "i1")],
           {"dimensions": (1,), "reducer": "or"})


def test_refutes_all_reduce_and_of_a_partial_any() -> None:
    """pmin (and) of the devices' any is not the any."""
    b = arg((2,), "i1")
    any_ = T.intern("reduce_or", (arg((2, 4), "i1"),), ((1,),), (2,), "i1")
    refute("stablehlo.all_reduce", [rel(any_, partial=("tp",), kind="max")], [rel(any_)],
           [((2,), "i1")], {**groups(M1, "tp"), "reducer": "min"})
    del b


def test_refutes_negated_partial_integer_max_as_a_partial_min() -> None:
    """-max_d(a_d) is not min_d(-a_d) in int32: -INT_MIN wraps to INT_MIN."""
    x = arg((2,), "i32")
    wrong = rel(T.make_elementwise("stablehlo.negate", (x,)), partial=("tp",), kind="min")
    refute("stablehlo.negate", [rel(x, partial=("tp",), kind="max")], [wrong], [((2,), "i32")])


def test_refutes_or_of_two_partial_alls_as_a_partial_all() -> None:
    """(and over devices of a) or (and over devices of b) is not the and over devices of
    a_d or b_d."""
    a, b = arg((2,), "i1"), arg((2,), "i1")
    wrong = rel(T.make_elementwise("stablehlo.or", (a, b)), partial=("tp",), kind="min")
    refute("stablehlo.or", [rel(a, partial=("tp",), kind="min"),
                            rel(b, partial=("tp",), kind="min")], [wrong], [((2,), "i1")])


def test_refuses_ordered_partials_the_rules_must_not_keep() -> None:
    """The rules do not claim them in the first place: negate and add of a partial integer
    max (they wrap around), or of two partial alls."""
    x = arg((2,), "i32")
    top = rel(x, partial=("tp",), kind="max")
    for op, ins in (("stablehlo.negate", [top]), ("stablehlo.add", [top, rel(arg((2,), "i32"))]),
                    ("stablehlo.or", [rel(arg((2,), "i1"), partial=("tp",), kind="min"),
                                      rel(arg((2,), "i1"), partial=("tp",), kind="min")])):
        lemma = Lemma("refused", op, ins)
        outs = RULES[op](lemma.info(), ins, lemma.context())
        assert isinstance(outs[0], Opaque), (op, outs)


def test_refutes_argmax_of_split_blocks_as_the_row_argmax() -> None:
    """Each device's argmax of its block (global indices) is not the row's argmax."""
    from entangle_mlir.rules.reduction import make_arg_reduce

    x, iota = arg((2, 4)), T.make_iota((2, 4), 1, "i32")
    ninf, zero = T.make_splat(-math.inf, (), "f32"), T.make_splat(0, (), "i32")
    outs = [rel(make_arg_reduce("argmax", x, iota, ninf, zero, (1,), r)) for r in (0, 1)]
    refute("stablehlo.reduce", [rel(x, (), "tp"), rel(iota, (), "tp"), splat(-math.inf, ()),
                                splat(0, (), "i32")], outs, [((2,), "f32"), ((2,), "i32")],
           {"dimensions": (1,), "reducer": "argmax"})


def test_refutes_argmax_claimed_as_argmin() -> None:
    from entangle_mlir.rules.reduction import make_arg_reduce

    x, iota = arg((4, 3)), T.make_iota((4, 3), 1, "i32")
    ninf, zero = T.make_splat(-math.inf, (), "f32"), T.make_splat(0, (), "i32")
    outs = [rel(make_arg_reduce("argmin", x, iota, ninf, zero, (1,), r), "tp") for r in (0, 1)]
    refute("stablehlo.reduce", [rel(x, "tp"), rel(iota, "tp"), splat(-math.inf, ()),
                                splat(0, (), "i32")], outs, [((2,), "f32"), ((2,), "i32")],
           {"dimensions": (1,), "reducer": "argmax"})


def test_refutes_argmax_indices_from_another_index_tensor() -> None:
    """The indices picked are the index operand's, not an iota's."""
    from entangle_mlir.rules.reduction import make_arg_reduce

    x, ids = arg((4, 3)), arg((4, 3), "i32")
    iota = T.make_iota((4, 3), 1, "i32")
    ninf, zero = T.make_splat(-math.inf, (), "f32"), T.make_splat(0, (), "i32")
    outs = [rel(make_arg_reduce("argmax", x, iota, ninf, zero, (1,), r), "tp") for r in (0, 1)]
    refute("stablehlo.reduce", [rel(x, "tp"), rel(ids, "tp"), splat(-math.inf, ()),
                                splat(0, (), "i32")], outs, [((2,), "f32"), ((2,), "i32")],
           {"dimensions": (1,), "reducer": "argmax"})


def test_refuses_argmax_over_a_split_dim_and_of_a_partial() -> None:
    x, iota = arg((2, 4)), T.make_iota((2, 4), 1, "i32")
    for values, indices in ((rel(x, (), "tp"), rel(iota, (), "tp")),
                            (rel(x, partial=("tp",), kind="max"), rel(iota))):
        lemma = _arg_lemma("refused", "argmax", values, indices, _NEG_INF, (1,), (2,))
        outs = RULES[lemma.op](lemma.info(), lemma.ins, lemma.context())
        assert all(isinstance(v, Opaque) for v in outs), outs


def test_refutes_case_branches_in_the_wrong_order() -> None:
    from entangle_mlir.rules.control import select_chain

    i, a, b = arg((), "i32"), arg((4,)), arg((4,))
    refute("stablehlo.case", [rel(i), rel(a, "tp"), rel(b, "tp")],
           [rel(select_chain(i, [b, a]), "tp")], [((2,), "f32")], {"branches": 2})


def test_refutes_case_out_of_range_index_running_the_first_branch() -> None:
    """StableHLO runs the last branch for an index out of range, not the first."""
    i, a, b = arg((), "i32"), arg((4,)), arg((4,))
    hit = T.make_elementwise("stablehlo.compare", (i, T.make_splat(1, (), "i32")), ("EQ",),
                             dtype="i1")
    first_by_default = T.make_elementwise("stablehlo.select", (T.make_broadcast(hit, (), (4,)),
                                                               b, a))
    refute("stablehlo.case", [rel(i), rel(a, "tp"), rel(b, "tp")],
           [rel(first_by_default, "tp")], [((2,), "f32")], {"branches": 2})


def test_refutes_case_on_a_partial_index() -> None:
    """Each device runs the branch of its own piece of a partial max: not the select chain on
    the max."""
    from entangle_mlir.rules.control import select_chain

    i, a, b = arg((), "i32"), arg((4,)), arg((4,))
    refute("stablehlo.case", [rel(i, partial=("tp",), kind="max"), rel(a), rel(b)],
           [rel(select_chain(i, [a, b]))], [((4,), "f32")], {"branches": 2})


def test_refuses_case_on_an_index_that_differs_between_devices() -> None:
    i = arg((), "i32")
    for index in (rel(i, partial=("tp",), kind="max"), DeviceScalar((0, 1), ())):
        lemma = Lemma("refused", "stablehlo.case", [index, rel(arg((4,))), rel(arg((4,)))],
                      results=[((4,), "f32")], attrs={"branches": 2})
        outs = RULES["stablehlo.case"](lemma.info(), lemma.ins, lemma.context())
        assert isinstance(outs[0], Opaque), outs


def test_refutes_convolution_over_a_split_spatial_dim() -> None:
    """Each device's windows stop at its block edge: the output blocks are not the global
    convolution's."""
    from entangle_mlir.mlir.opinfo import OpInfo as Info
    from entangle_mlir.rules.contraction import conv_term

    x, k = arg((1, 2, 8)), arg((2, 2, 3))
    info = Info("stablehlo.convolution", _conv_attrs(), [], [TensorType((1, 2, 6), "f32")])
    term = conv_term(info, x, k, (1, 2, 6), "f32")
    refute("stablehlo.convolution", [rel(x, (), (), "tp"), rel(k)], [rel(term, (), (), "tp")],
           [((1, 2, 2), "f32")], _conv_attrs())


def test_refutes_convolution_with_only_the_input_features_split() -> None:
    """Every device reads the whole kernel: the pieces do not add up to the convolution."""
    from entangle_mlir.mlir.opinfo import OpInfo as Info
    from entangle_mlir.rules.contraction import conv_term

    x, k = arg((1, 4, 3)), arg((2, 4, 2))
    info = Info("stablehlo.convolution", _conv_attrs(), [], [TensorType((1, 2, 2), "f32")])
    term = conv_term(info, x, k, (1, 2, 2), "f32")
    top = T.make_op("slice", (k,), ((0, 0, 0), (2, 2, 2), (1, 1, 1)), (2, 2, 2), "f32",
                    linear_in=0)
    refute("stablehlo.convolution", [rel(x, (), "tp"), rel(top)],
           [rel(term, partial=("tp",))], [((1, 2, 2), "f32")], _conv_attrs())


def test_refuses_convolutions_the_rules_must_not_relate() -> None:
    for ins, attrs in (([rel(arg((1, 2, 8)), (), (), "tp"), rel(arg((2, 2, 3)))], _conv_attrs()),
                       ([rel(arg((1, 4, 3)), (), "tp"), rel(arg((2, 4, 2)))], _conv_attrs()),
                       ([rel(arg((1, 4, 3))), rel(arg((2, 2, 2)))],
                        _conv_attrs(feature_group_count=2))):
        lemma = Lemma("refused", "stablehlo.convolution", ins, results=[((1, 2, 2), "f32")],
                      attrs=attrs)
        outs = RULES[lemma.op](lemma.info(), ins, lemma.context())
        assert isinstance(outs[0], Opaque), outs


def test_refutes_max_of_split_dim_claimed_partial_sum() -> None:
    x = arg((2, 4))
    wrong = rel(T.intern("reduce_max", (x,), ((1,),), (2,), "f32"), partial=("tp",))
    refute("stablehlo.reduce", [rel(x, (), "tp"), splat(-math.inf, ())], [wrong],
           [((2,), "f32")], {"dimensions": (1,), "reducer": "max"})


# ----- random rule instances (seeded): whatever a rule claims must be proved ---------------------

_RANDOM_ELEMENTWISE = {"stablehlo.add": 2, "stablehlo.subtract": 2, "stablehlo.multiply": 2,
                       "stablehlo.divide": 2, "stablehlo.maximum": 2, "stablehlo.minimum": 2,
                       "stablehlo.negate": 1, "stablehlo.tanh": 1, "stablehlo.convert": 1,
                       "stablehlo.abs": 1, "stablehlo.select": 3, "stablehlo.clamp": 3,
                       "stablehlo.compare": 2}


def _random_rel(rng: random.Random, shape: tuple[int, ...], mesh: Mesh) -> Rel:
    """A random layout: each mesh axis splits a dim, is a partial axis, or replicates."""
    tiling: list[tuple[str, ...]] = [()] * len(shape)
    partial: list[str] = []
    for axis in rng.sample(mesh.names, len(mesh.names)):
        roll = rng.random()
        if roll < 0.4 and shape:
            d = rng.randrange(len(shape))
            if (shape[d] // mesh.group_size(tiling[d])) % mesh.size(axis) == 0:
                tiling[d] += (axis,)
        elif roll < 0.6:
            partial.append(axis)
    partial_axes = tuple(a for a in mesh.names if a in partial)
    kind = rng.choice(["sum", "sum", "max"]) if partial_axes else ""
    return Rel(arg(shape), tuple(tiling), partial_axes, kind)


def _like(rel_: Rel, dtype: str = "f32") -> Rel:
    return Rel(arg(rel_.term.shape, dtype), rel_.tiling, rel_.partial, rel_.kind)


def _random_lemma(rng: random.Random) -> Lemma | None:
    mesh = rng.choice([M1, M2])
    shape = tuple(rng.choice([2, 4]) for _ in range(rng.randint(1, 3)))
    x = _random_rel(rng, shape, mesh)
    local = local_type(x, mesh).shape
    family = rng.choice(["elementwise", "elementwise", "dot", "reduce", "broadcast", "reshape",
                         "transpose", "slice", "concatenate", "pad", "collective",
                         "collective"])
    if family == "elementwise":
        op = rng.choice(sorted(_RANDOM_ELEMENTWISE))
        ins: list[Value] = []
        for i in range(_RANDOM_ELEMENTWISE[op]):
            roll = rng.random()
            if op == "stablehlo.select" and i == 0:
                ins.append(Rel(arg(shape, "i1"), x.tiling))
            elif roll < 0.5:
                ins.append(_like(x))
            elif roll < 0.7:
                ins.append(Rel(arg(shape), x.tiling))
            elif roll < 0.85:
                ins.append(splat(rng.choice([0, 1, -2, 0.5]), local))
            else:
                ins.append(_random_rel(rng, shape, mesh))
        attrs = {"comparison_direction": rng.choice(["LT", "EQ"])} if op.endswith(
            "compare") else {}
        dtype = "i1" if op.endswith("compare") else "f32"
        return Lemma("random", op, ins, [(local_type(ins[-1], mesh).shape, dtype)], attrs,
                     mesh)
    if family == "dot":
        m, k, n = (rng.choice([2, 4]) for _ in range(3))
        lhs, rhs = _random_rel(rng, (m, k), mesh), _random_rel(rng, (k, n), mesh)
        lt, rt = local_type(lhs, mesh).shape, local_type(rhs, mesh).shape
        if lt[1] != rt[0]:
            return None
        return Lemma("random", "stablehlo.dot_general", [lhs, rhs], [((lt[0], rt[1]), "f32")],
                     _dot_attrs(), mesh)
    if family == "reduce":
        dims = tuple(sorted(rng.sample(range(len(shape)), rng.randint(1, len(shape)))))
        reducer = rng.choice(["add", "max", "min"])
        init = rng.choice([{"add": 0, "max": -math.inf, "min": math.inf}[reducer], 1])
        out = tuple(s for d, s in enumerate(local) if d not in dims)
        return Lemma("random", "stablehlo.reduce", [x, splat(init, ())], [(out, "f32")],
                     {"dimensions": dims, "reducer": reducer}, mesh)
    if family == "broadcast":
        rank = len(shape) + rng.randint(0, 2)
        dims = tuple(sorted(rng.sample(range(rank), len(shape))))
        out = [rng.choice([1, 2, 3]) for _ in range(rank)]
        for i, d in enumerate(dims):
            out[d] = local[i]
        return Lemma("random", "stablehlo.broadcast_in_dim", [x], [(tuple(out), "f32")],
                     {"broadcast_dimensions": dims}, mesh)
    if family == "reshape":
        size = math.prod(local)
        shapes = sorted(t for r in range(1, 4) for t in itertools.product([1, 2, 4, 8], repeat=r)
                        if math.prod(t) == size)
        return Lemma("random", "stablehlo.reshape", [x], [(rng.choice(shapes), "f32")], {}, mesh)
    if family == "transpose":
        perm = tuple(rng.sample(range(len(shape)), len(shape)))
        return Lemma("random", "stablehlo.transpose", [x], [(tuple(local[p] for p in perm),
                                                              "f32")],
                     {"permutation": perm}, mesh)
    if family == "slice":
        starts = tuple(rng.randrange(s) for s in local)
        limits = tuple(rng.randint(a + 1, s) for a, s in zip(starts, local))
        out = tuple(b - a for a, b in zip(starts, limits))
        return Lemma("random", "stablehlo.slice", [x], [(out, "f32")],
                     {"start_indices": starts, "limit_indices": limits,
                      "strides": (1,) * len(local)}, mesh)
    if family == "concatenate":
        dim = rng.randrange(len(shape))
        out = list(local)
        out[dim] *= 2
        return Lemma("random", "stablehlo.concatenate", [x, _like(x)], [(tuple(out), "f32")],
                     {"dimension": dim}, mesh)
    if family == "pad":
        low, high, inner = ([rng.randint(0, 1) for _ in local] for _ in range(3))
        out = tuple(s + a + b + max(s - 1, 0) * c for s, a, b, c in zip(local, low, high, inner))
        return Lemma("random", "stablehlo.pad", [x, splat(rng.choice([0, 1]), ())],
                     [(out, "f32")], {"edge_padding_low": tuple(low),
                                      "edge_padding_high": tuple(high),
                                      "interior_padding": tuple(inner)}, mesh)
    axes = tuple(a for a in mesh.names if rng.random() < 0.6) or (mesh.names[0],)
    if rng.random() < 0.3:
        axes = axes[::-1]
    count = mesh.group_size(axes)
    op = rng.choice(["all_reduce", "all_gather", "reduce_scatter", "all_to_all",
                     "collective_permute"])
    dim, other = rng.randrange(len(shape)), rng.randrange(len(shape))
    out = list(local)
    if op == "all_reduce":
        attrs = {**groups(mesh, *axes), "reducer": rng.choice(["add", "max"])}
    elif op == "all_gather":
        out[dim] *= count
        attrs = {**groups(mesh, *axes), "all_gather_dim": dim}
    elif op == "reduce_scatter":
        if local[dim] % count:
            return None
        out[dim] //= count
        attrs = {**groups(mesh, *axes), "scatter_dimension": dim, "reducer": "add"}
    elif op == "all_to_all":
        if local[dim] % count:
            return None
        out[dim] //= count
        out[other] *= count
        attrs = {**groups(mesh, *axes), "split_dimension": dim, "concat_dimension": other,
                 "split_count": count}
    else:
        targets = rng.sample(range(mesh.num_devices), mesh.num_devices)
        attrs = {"source_target_pairs": [[i, t] for i, t in enumerate(targets)],
                 "channel_handle": 1}
    return Lemma("random", f"stablehlo.{op}", [x], [(tuple(out), "f32")], attrs, mesh)


def _random_indexed_lemma(rng: random.Random) -> Lemma | None:
    """Random layouts for gather / scatter / dynamic_update_slice."""
    mesh = rng.choice([M1, M2])
    family = rng.choice(["gather", "scatter", "dus"])
    rows, width, count = rng.choice([3, 4]), rng.choice([2, 4]), rng.choice([2, 4])

    def ids() -> Rel:
        layout = _random_rel(rng, (count, 1), mesh)
        return Rel(arg((count, 1), "i32"), layout.tiling, layout.partial, layout.kind)

    if family == "gather":
        table, index = _random_rel(rng, (rows, width), mesh), ids()
        local = local_type(table, mesh).shape
        window = rng.choice([local[1], 1])
        return Lemma("random", "stablehlo.gather", [table, index],
                     [((local_type(index, mesh).shape[0], window), "f32")],
                     {**_EMBED, "slice_sizes": (1, window)}, mesh)
    if family == "scatter":
        operand = (_random_rel(rng, (rows, width), mesh) if rng.random() < 0.8
                   else splat(0, (rows, width)))
        index, updates = ids(), _random_rel(rng, (count, width), mesh)
        if rng.random() < 0.5:
            updates = Rel(updates.term, (index.tiling[0], updates.tiling[1]), updates.partial,
                          updates.kind)
        return Lemma("random", "stablehlo.scatter", [operand, index, updates],
                     [(local_type(operand, mesh).shape, "f32")],
                     {**_SCATTER_ROWS, "reducer": rng.choice(["add", "add", "replace"])}, mesh)
    rows = rng.choice([4, 8])
    operand = (_random_rel(rng, (rows, width), mesh) if rng.random() < 0.7
               else splat(0, (rows, width)))
    update = _random_rel(rng, (rng.choice([1, 2, 4, rows]), width), mesh)
    lo, lu = local_type(operand, mesh).shape, local_type(update, mesh).shape
    if lu[0] > lo[0] or lu[1] > lo[1]:
        return None
    roll = rng.random()
    if roll < 0.4:
        start: Value = splat(rng.randint(-1, 5), (), "i32")
    elif roll < 0.7:
        start = rel(arg((), "i32"))
    else:
        start = DeviceScalar(tuple(rng.choice([0, lu[0], 2 * lu[0]])
                                   for _ in range(mesh.num_devices)), ())
    return Lemma("random", "stablehlo.dynamic_update_slice",
                 [operand, update, start, splat(0, (), "i32")], [(lo, "f32")], {}, mesh)


@pytest.mark.parametrize("seed", range(6))
def test_random_rule_instances(seed: int) -> None:
    """Seeded random layouts and attributes: every relation a rule claims is proved (an opaque
    answer is allowed; a division by the constant zero is out of scope)."""
    rng = random.Random(seed)
    claimed = 0
    for k in range(100):
        lemma = _random_lemma(rng) if k % 4 else _random_indexed_lemma(rng)
        if lemma is None or lemma.op not in RULES:
            continue
        info, ctx = lemma.info(), lemma.context()
        outs = RULES[lemma.op](info, list(lemma.ins), ctx)
        if all(isinstance(v, Opaque) for v in outs):
            continue
        claimed += 1
        result = _checker().check(info, lemma.ins, outs, lemma.mesh, ctx)
        if result.status == "unknown" and "division by zero" in result.reason:
            continue
        assert result.status == "proved", (
            f"{result.describe()}\n  {info.name} {info.attrs} on {lemma.mesh.describe()}\n"
            + "\n".join(f"  in  {v.describe()}" for v in lemma.ins)
            + "\n" + "\n".join(f"  out {v.describe()}" for v in outs))
    assert claimed > 40


# ----- canonical forms: common scalar factors ---------------------------------------------------

def _values(*terms: T.Term) -> dict:
    rng = np.random.default_rng(7)
    env = {}
    for t in terms:
        for leaf in (t, *t.args):
            if leaf.op == "arg":
                env[leaf.attrs[0]] = np.array(
                    [Fraction(int(v), 7) for v in rng.integers(-20, 20, leaf.shape).ravel()],
                    dtype=object).reshape(leaf.shape)
    return env


def test_proportional_sums_meet_under_products_and_linear_ops() -> None:
    """A local mean's 1/N_local times a pmean's 1/n equals the reference's 1/N whichever side
    of a product, pad, broadcast or mask the scalar was applied on (dp_mean_coefficients)."""
    from entangle_mlir.semantics.evaluate import evaluate_term

    a, b, x = arg((2, 3)), arg((2, 3)), arg((2, 3))
    local = T.make_lin([(Fraction(1, 8), a), (Fraction(-1, 8), b)], Fraction(1, 8), (2, 3), "f32")
    ref = T.make_lin([(Fraction(1, 32), a), (Fraction(-1, 32), b)], Fraction(1, 32), (2, 3),
                     "f32")
    assert T.scale(T.make_mul(local, x), Fraction(1, 4)) is T.make_mul(ref, x)
    assert T.scale(T.make_div(x, local), 4) is T.make_div(x, ref)
    pad = lambda t: T.make_op("pad", (t, T.make_splat(0, (), "f32")), ((1, 0), (0, 0), (0, 0)),
                              (3, 3), "f32", linear_in=0)
    assert T.scale(pad(local), Fraction(1, 4)) is pad(ref)
    bcast = lambda t: T.make_broadcast(t, (1, 2), (4, 2, 3))
    assert T.scale(bcast(local), Fraction(1, 4)) is bcast(ref)
    mask = T.make_elementwise("stablehlo.compare", (a, b), ("LT",), dtype="i1")
    select = lambda t: T.make_elementwise(
        "stablehlo.select", (mask, t, T.make_splat(0, (2, 3), "f32")))
    assert T.scale(select(local), Fraction(1, 4)) is select(ref)
    quotient = T.make_div(T.make_splat(Fraction(1, 32), (2, 3), "f32"), x)
    assert quotient is T.scale(T.make_div(T.make_splat(1, (2, 3), "f32"), x), Fraction(1, 32))
    # ... and the factored forms still compute the same numbers.
    env = _values(a, b, x)
    want = (env[a.attrs[0]] - env[b.attrs[0]] + 1) * Fraction(1, 32)
    got = evaluate_term(select(ref), env)
    expected = np.where(env[a.attrs[0]] < env[b.attrs[0]], want, 0)
    assert (got == expected).all()
    got = evaluate_term(T.make_mul(ref, x), env)
    assert (got == want * env[x.attrs[0]]).all()


def test_integer_division_keeps_its_numerator() -> None:
    """Integer division truncates: no scalar is pulled out of its numerator."""
    i = arg((3,), "i32")
    doubled = T.make_lin([(Fraction(2), i)], Fraction(2), (3,), "i32")
    quotient = T.make_div(doubled, arg((3,), "i32"))
    assert quotient.op == "div" and quotient.args[0] is doubled


# ----- micro-batches: must-fail and refusals -------------------------------------------------

def test_refutes_a_matmul_sum_over_the_other_micro_batch() -> None:
    """x[2:4]^T y[2:4] of every block is not the sum over rows [0, 2)."""
    tp4 = Mesh((("tp", 4),))
    x2, y2 = rel(arg((16, 3)), "tp"), rel(arg((16, 4)), "tp")
    attrs = {"lhs_batch": (), "rhs_batch": (), "lhs_contract": (0,), "rhs_contract": (0,)}
    ins = [Windowed(x2, 0, 2, 2), Windowed(y2, 0, 2, 2)]
    lemma = Lemma("rows", "stablehlo.dot_general", ins, results=[((3, 4), "f32")], attrs=attrs,
                  mesh=tp4)
    (out,) = RULES[lemma.op](lemma.info(), ins, lemma.context())
    assert isinstance(out, Windowed) and out.summed == (0,), out
    refute("stablehlo.dot_general", ins, [replace(out, offset=0)], [((3, 4), "f32")], attrs,
           mesh=tp4)


def test_refutes_a_moved_window_sum_claimed_unmoved() -> None:
    """A transposed micro-batch sum is the sum of the transposed tensor, not of the tensor."""
    tp4 = Mesh((("tp", 4),))
    summed = Windowed(rel(arg((16, 3, 3)), "tp"), 0, 2, 2, summed=(0,))
    refute("stablehlo.transpose", [summed], [summed], [((3, 3), "f32")],
           {"permutation": (1, 0)}, mesh=tp4)


def test_refutes_reduced_window_claims() -> None:
    """The shape-reduced instance check of a micro-batch window (instance.reduce._reduced_window)
    still refutes a wrong claim: tanh of rows [4b, 4b+4) of blocks of 8 is not rows
    [4b+4, 4b+8)."""
    tp4 = Mesh((("tp", 4),))
    x = rel(arg((32, 6)), "tp")
    window = Windowed(x, 0, 4, 4)
    lemma = Lemma("reduced", "stablehlo.tanh", [window], mesh=tp4)
    (out,) = RULES[lemma.op](lemma.info(), [window], lemma.context())
    checker = InstanceChecker(timeout_ms=20_000)
    proved = checker.check(lemma.info(), [window], [out], tp4, lemma.context())
    assert proved.status == "proved" and "reduced" in proved.details.get("mode", ""), proved
    wrong = checker.check(lemma.info(), [window], [replace(out, offset=0)], tp4,
                          lemma.context())
    assert wrong.status == "refuted", wrong.describe()


def test_window_rows_against_a_replicated_batch_are_refused() -> None:
    """A batched matmul of a micro-batch with a replicated tensor of the same batch size pairs
    the window's rows with other rows: no window."""
    tp4 = Mesh((("tp", 4),))
    ins = [Windowed(rel(arg((16, 2, 3)), "tp"), 0, 0, 2), rel(arg((2, 3, 4)))]
    lemma = Lemma("batch", "stablehlo.dot_general", ins, results=[((2, 2, 4), "f32")],
                  attrs={"lhs_batch": (0,), "rhs_batch": (0,), "lhs_contract": (2,),
                         "rhs_contract": (1,)}, mesh=tp4)
    (out,) = RULES[lemma.op](lemma.info(), ins, lemma.context())
    assert isinstance(out, Opaque), out


def test_per_micro_batch_mean_is_a_scale_error() -> None:
    """sum(loss * mask) / sum(mask) per micro-batch: reported as a wrong scale (k = N/(m N_i));
    the relation it would need (the micro-batch sum over the whole batch's total) is refuted."""
    tp4 = Mesh((("tp", 4),))
    loss, mask = rel(arg((16, 1)), "tp"), rel(arg((16, 1)), "tp")
    sums, totals = (Windowed(v, 0, 0, 2, summed=(0, 1)) for v in (loss, mask))
    lemma = Lemma("mean", "stablehlo.divide", [sums, totals], results=[((), "f32")], mesh=tp4)
    (out,) = RULES[lemma.op](lemma.info(), [sums, totals], lemma.context())
    assert isinstance(out, Opaque) and out.category == "scale", out
    assert "k = N/(8*N_i)" in out.reason and "same number of valid tokens" in out.reason
    total = T.make_op("reduce_sum", (mask.term,), ((0, 1),), (), "f32", linear_in=0)
    whole_mean = T.make_div(loss.term, T.make_broadcast(total, (), (16, 1)))
    refute("stablehlo.divide", [sums, totals],
           [replace(sums, rel=replace(loss, term=whole_mean))], [((), "f32")], mesh=tp4)


def _sum(term: T.Term, dims: tuple[int, ...]) -> T.Term:
    shape = tuple(n for d, n in enumerate(term.shape) if d not in dims)
    return T.make_op("reduce_sum", (term,), (dims,), shape, term.dtype, linear_in=0)


def test_sum_out_forms_are_the_sums() -> None:
    """Every form `sum_out` gives a completed micro-batch sum is the sum (Z3, all values)."""
    from entangle_mlir.analysis.instance.term_equality import check_term_equality
    from entangle_mlir.rules.kinds.window import sum_out

    x, y = arg((4, 3)), arg((4, 2))
    c = arg((3,))
    cases = {
        "matmul-batch-to-contract": (T.make_dot(x, y, ((0,), (0,), (), ()), (4, 3, 2), "f32"),
                                     (0,)),
        "transpose": (T.intern("transpose", (x,), ((1, 0),), (3, 4), "f32"), (1,)),
        "constant-factor": (T.make_mul(x, T.make_broadcast(c, (1,), (4, 3))), (0,)),
        "constant-divisor": (T.make_div(x, T.make_broadcast(c, (1,), (4, 3))), (0,)),
        "zero-pad": (T.make_op("pad", (x, T.make_splat(0, (), "f32")),
                               ((0, 1), (0, 2), (0, 0)), (4, 6), "f32", linear_in=0), (0,)),
        "reshape": (T.intern("reshape", (x,), (), (2, 2, 3), "f32"), (0, 1)),
        "broadcast": (T.intern("broadcast", (x,), ((0, 2),), (4, 5, 3), "f32"), (0,)),
        "linear": (T.make_add(x, T.make_mul(x, x)), (0,)),
    }
    for name, (term, dims) in cases.items():
        canonical = sum_out(term, dims, "f32")
        result = check_term_equality(_sum(term, dims), canonical, name=name)
        assert result.status == "proved", f"{name}: {result.describe()}"


def test_refutes_pulling_a_factor_that_varies_along_the_sum() -> None:
    """A factor that varies along the summed dim does not come out of the sum (sum_out only
    pulls broadcasts of the other dims)."""
    from entangle_mlir.analysis.instance.term_equality import check_term_equality
    from entangle_mlir.rules.kinds.window import sum_out

    x, v = arg((4, 3)), arg((4,))
    varies = T.make_mul(x, T.make_broadcast(v, (0,), (4, 3)))
    assert sum_out(varies, (0,), "f32") is _sum(varies, (0,))
    pulled = T.make_mul(_sum(x, (0,)), T.make_broadcast(_sum(v, (0,)), (), (3,)))
    assert check_term_equality(_sum(varies, (0,)), pulled).status == "refuted"


def test_sum_out_keeps_a_sum_the_reference_computes() -> None:
    """A completed micro-batch sum the reference computes as it stands (a bias gradient over
    the whole batch's tokens) is kept, not pushed into the terms it sums."""
    from entangle_mlir.rules.kinds.window import sum_out

    x, y = arg((4, 3)), arg((4, 2))
    dot = T.make_dot(x, y, ((0,), (0,), (), ()), (4, 3, 2), "f32")
    plain = _sum(dot, (0,))
    assert sum_out(dot, (0,), "f32") is not plain
    assert sum_out(dot, (0,), "f32", frozenset({plain.serial})) is plain


# ----- products (jnp.cumprod, jnp.prod) --------------------------------------------------------

def _cumprod_term(x: T.Term, padding, window=(1, 3)) -> T.Term:
    attrs = (window, (1, 1), (1, 1), (1, 1), tuple(p[0] for p in padding),
             tuple(p[1] for p in padding))
    return T.intern("reduce_window_mul", (x,), attrs, x.shape, x.dtype)


@pytest.mark.parametrize("dtype", ["f32", "i32"])
def test_refutes_an_exclusive_cumprod_as_the_inclusive_one(dtype: str) -> None:
    """The window of jnp.cumprod (3 wide, 2 before) is not the one that stops before its own
    element (2 wide, 1 before), nor the reverse one (2 after), nor a window off by one (1
    before, 1 after). (A 4-wide window with 3 before is jnp.cumprod again: its extra element
    is always padding, the identity; Z3 proves that one.)"""
    x = arg((4, 3), dtype)
    attrs = {**CUMPROD, "reducer": "mul"}
    for wrong in (_cumprod_term(x, [[0, 0], [1, 0]], (1, 2)),
                  _cumprod_term(x, [[0, 0], [0, 2]]),
                  _cumprod_term(x, [[0, 0], [1, 1]])):
        refute("stablehlo.reduce_window", [rel(x, "tp"), splat(1, (), dtype)],
               [rel(wrong, "tp")], [((2, 3), dtype)], attrs)


def test_refutes_a_cumsum_as_the_cumprod() -> None:
    """A product window is not the sum window of the same shape."""
    x = arg((4, 3))
    attrs = (CUMPROD["window_dimensions"], (1, 1), (1, 1), (1, 1), (0, 2), (0, 0))
    cumsum = T.make_op("reduce_window_sum", (x,), attrs, x.shape, "f32", linear_in=0)
    refute("stablehlo.reduce_window", [rel(x, "tp"), splat(1, ())], [rel(cumsum, "tp")],
           [((2, 3), "f32")], {**CUMPROD, "reducer": "mul"})


def test_refutes_a_product_without_its_init() -> None:
    """reduce (mul) from 3 is three times the product, not the product."""
    x = arg((4, 3), "i32")
    prod = T.intern("reduce_mul", (x,), ((1,),), (4,), "i32")
    refute("stablehlo.reduce", [rel(x, "tp"), splat(3, (), "i32")], [rel(prod, "tp")],
           [((2,), "i32")], {"dimensions": (1,), "reducer": "mul"})


@pytest.mark.parametrize("op,attrs,ins,results", [
    ("stablehlo.reduce_window", {**CUMPROD, "reducer": "mul"},
     lambda x: [rel(x, (), "tp"), splat(1, ())], [((4, 3), "f32")]),
    ("stablehlo.reduce_window", {**CUMPROD, "reducer": "mul"},
     lambda x: [rel(x, partial=("tp",)), splat(1, ())], [((4, 6), "f32")]),
    ("stablehlo.reduce_window", {**CUMPROD, "reducer": "mul"},
     lambda x: [rel(x, "tp"), splat(2, ())], [((2, 6), "f32")]),
    ("stablehlo.reduce", {"dimensions": (1,), "reducer": "mul"},
     lambda x: [rel(x, (), "tp"), splat(1, ())], [((4,), "f32")]),
    ("stablehlo.reduce", {"dimensions": (1,), "reducer": "mul"},
     lambda x: [rel(x, partial=("tp",)), splat(1, ())], [((4,), "f32")]),
])
def test_products_the_layout_tier_cannot_relate_are_refused(op, attrs, ins, results) -> None:
    """A product window or reduction along a split dim (each device multiplies its own
    block), of a partial sum (a product of sums is not the sum of products) or from an init
    that is not 1 in a window (padding is filled with it) is opaque, never related."""
    lemma = Lemma("refused", op, ins(arg((4, 6))), results=results, attrs=attrs)
    outs = RULES[op](lemma.info(), list(lemma.ins), lemma.context())
    assert all(isinstance(v, Opaque) for v in outs), outs
