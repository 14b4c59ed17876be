"""A neutral description of one op: name, plain-Python attributes, types and location.

Rules, the Z3 instance checks and the lemma tests all consume `OpInfo`, so a rule can be
exercised without MLIR objects. Attribute names follow the StableHLO spec with these
normalisations:

* `dot_general`: `lhs_batch`, `rhs_batch`, `lhs_contract`, `rhs_contract` (tuples of ints);
  the deprecated `stablehlo.dot` is described as a dot_general.
* `reduce`, `reduce_window`, `all_reduce`, `reduce_scatter`, `scatter`: `reducer` is `"add"`,
  `"max"`, `"min"`, `"mul"`, `"and"`, `"or"`, `"replace"` (scatter) or `"other"`, the region
  read whole (`region_kind`); for `other`, `region_problem` says what the region does.
* `compare`: `comparison_direction` is `"EQ"`, `"NE"`, `"LT"`, ...; `compare_type` is
  `"FLOAT"`, `"TOTALORDER"`, `"SIGNED"` or `"UNSIGNED"`, the element type's default when absent.
* `constant`: `value` is a numpy array, `splat` is True for a splat constant.
* collectives: `replica_groups` / `source_target_pairs` are lists of lists of ints.
* dense i64 arrays become tuples, integer attributes ints.

Importing this module does not load the MLIR bindings: the functions that read MLIR objects
import them when first called.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np

from entangle_mlir.core.diagnostics import SourceLoc, parse_location


@dataclass(frozen=True)
class TensorType:
    shape: tuple[int, ...]
    dtype: str

    @property
    def is_float(self) -> bool:
        return self.dtype.startswith(("f", "bf"))

    @property
    def is_int(self) -> bool:
        return self.dtype.startswith(("i", "ui", "si")) and self.dtype != "i1"


@dataclass
class OpInfo:
    name: str
    attrs: dict = field(default_factory=dict)
    operand_types: list[TensorType] = field(default_factory=list)
    result_types: list[TensorType] = field(default_factory=list)
    loc: SourceLoc | None = None
    op: object = None

    def signature(self) -> tuple:
        """Hashable key of the attributes (for caching rule-instance checks). A collective's
        channel number is left out when positive (XLA numbers every collective; only whether it
        is positive changes the meaning, `groups.py`), so the 2nd..Nth layer's all_reduce is a cache hit as it is in shard_map form."""
        items = []
        for key in sorted(self.attrs):
            value = self.attrs[key]
            if key == "channel_handle" and isinstance(value, str):
                value = _CHANNEL_NUMBER.sub("handle = *", value)
            if isinstance(value, np.ndarray):
                value = (value.shape, value.tobytes())
            elif isinstance(value, list):
                value = tuple(tuple(v) if isinstance(v, list) else v for v in value)
            items.append((key, value))
        return (self.name, tuple(items))


_CHANNEL_NUMBER = re.compile(r"handle = [1-9]\d*")
"""A positive channel number (0 means no channel: another grouping, `groups.py`)."""

_REDUCERS = {"stablehlo.add": "add", "stablehlo.maximum": "max", "stablehlo.minimum": "min",
             "stablehlo.multiply": "mul", "stablehlo.and": "and", "stablehlo.or": "or"}


def tensor_type(t) -> TensorType:
    """The `TensorType` of an MLIR type (memoized by the uniqued type)."""
    found = _TENSOR_TYPES.get(t)
    if found is None:
        found = _TENSOR_TYPES[t] = _tensor_type(t)
    return found


_TENSOR_TYPES: dict = {}


def _tensor_type(t) -> TensorType:
    from jaxlib.mlir import ir  # lazy: rules use OpInfo without the bindings

    if isinstance(t, ir.RankedTensorType):
        if not t.has_static_shape:
            raise ValueError(f"dynamic shape {t}")
        return TensorType(tuple(t.shape), str(t.element_type))
    return TensorType((), str(t))


def reducer_kind(op) -> str:
    """The reduction an op's region computes (`add`, `max`, ..., `replace` for a scatter that
    writes its update), else `other` (`region_kind` says why)."""
    return region_kind(op)[0]


def region_kind(op) -> tuple[str, str]:
    """(kind, why) of the computation region of a reduce, reduce_window, all_reduce,
    reduce_scatter or scatter, read whole and exactly.

    The kind is `add`, `max`, `min`, `mul` (`and`, `or` on i1) when the region's block is
    exactly `%r = op(%arg0, %arg1)` (either order; every op of the table is commutative)
    followed by `return %r`; `replace` for a scatter whose region returns its update
    (`%arg1`). Every block argument, the inner op and the returned value must be rank-0
    tensors of the element type of the op's operands and results (no promotion). Anything
    else is `other`, with `why` naming what the region does instead: a region returning its
    accumulator, a constant, `add(%arg0, %arg0)`, extra ops, a variadic reducer (argmax) all
    compute something else than a plain reduction."""
    name = op.name
    short = name.split(".")[-1]
    operands = list(op.operands)
    if name in ("stablehlo.reduce", "stablehlo.reduce_window"):
        inputs = len(operands) // 2
        element_types = {_element(v.type) for v in operands}
        pairs = 2 * inputs
    elif name == "stablehlo.scatter":
        inputs = (len(operands) - 1) // 2
        element_types = {_element(v.type) for i, v in enumerate(operands) if i != inputs}
        pairs = 2 * inputs
    else:  # all_reduce and reduce_scatter apply one binary region to every operand
        inputs = 1
        element_types = {_element(v.type) for v in operands}
        pairs = 2
    element_types |= {_element(t) for t in op.results.types}
    if not len(op.regions) or len(op.regions[0].blocks) != 1:
        return "other", f"{short} without a one-block computation region"
    if inputs == 2 and name == "stablehlo.reduce":
        return arg_reduction_kind(op)
    if inputs != 1:
        return "other", (f"{short} with {inputs} inputs (a variadic reducer such as argmax): "
                         "its region is not read as a plain reduction")
    block = op.regions[0].blocks[0]
    args = list(block.arguments)
    body = [o.operation for o in block.operations]
    if len(args) != pairs:
        return "other", f"{short}'s region takes {len(args)} arguments, not {pairs}"
    if len(element_types) != 1:
        return "other", (f"{short} mixes element types {sorted(element_types)} (its region "
                         "computes in another type than its operands)")
    (element,) = element_types
    scalar = f"tensor<{element}>"
    for i, arg in enumerate(args):
        if str(arg.type) != scalar:
            return "other", (f"{short}'s region argument {i} is {arg.type}, not {scalar}: "
                             "it computes in another type than its operands")
    if not body or body[-1].name not in ("stablehlo.return", "func.return") or len(
            body[-1].operands) != 1:
        return "other", f"{short}'s region does not return one value"
    returned = body[-1].operands[0]
    if str(returned.type) != scalar:
        return "other", f"{short}'s region returns a {returned.type}, not {scalar}"
    position = next((i for i, a in enumerate(args) if a == returned), None)
    if position is not None:
        if name == "stablehlo.scatter" and position == 1 and len(body) == 1:
            return "replace", ""
        role = "the accumulator" if position == 0 else "the new element"
        return "other", (f"{short}'s region returns its argument %arg{position} ({role}) "
                         "instead of combining both arguments")
    if len(body) != 2:
        return "other", (f"{short}'s region holds {len(body) - 1} ops before its return, "
                         "not one reduction op")
    inner = body[0]
    kind = _REDUCERS.get(inner.name)
    if kind is None:
        return "other", f"{short}'s region computes {inner.name}, not a known reduction"
    if kind in ("and", "or") and element != "i1" or kind in ("add", "mul") and element == "i1":
        return "other", f"{short}'s region computes {inner.name} on {element}"
    if len(inner.results) != 1 or inner.results[0] != returned:
        return "other", f"{short}'s region does not return the result of {inner.name}"
    ins = list(inner.operands)
    if not (len(ins) == 2 and (ins[0] == args[0] and ins[1] == args[1]
                               or ins[0] == args[1] and ins[1] == args[0])):
        names = ", ".join(_value_name(v, args) for v in ins)
        return "other", (f"{short}'s region returns {inner.name}({names}), not "
                         f"{inner.name}(%arg0, %arg1)")
    return kind, ""


def arg_reduction_kind(op) -> tuple[str, str]:
    """(kind, why) of a reduce over (values, indices): `argmax` or `argmin` when its region is
    exactly jax's comparator (`lax.argmax` / `argmin`), read whole up to the order of its ops
    and of commutative operands; else `other`, with what the region does instead.

    With block arguments (v, i) the accumulator and (w, j) the new pair, jax's argmax region
    is `p = v > w or v != v` (NaN wins), returns `select(p, v, w)` and
    `select(p or (v == w and i < j), i, j)`: the larger value, on ties the first index. A
    region that keeps the last index on ties (`i > j`), compares with `>=`, returns the values
    crossed, or orders compares in another compare type computes another function."""
    block = op.regions[0].blocks[0]
    args = list(block.arguments)
    body = [o.operation for o in block.operations]
    operands = list(op.operands)
    if len(args) != 4 or not body or len(body[-1].operands) != 2 or len(op.results) != 2:
        return "other", "reduce over two inputs whose region is not a (value, index) selection"
    value_type, index_type = (_element(v.type) for v in operands[:2])
    if [_element(a.type) for a in args] != [value_type, index_type] * 2 or any(
            str(a.type) != f"tensor<{_element(a.type)}>" for a in args):
        return "other", "reduce over two inputs whose region computes in other types"
    if not index_type.startswith(("i", "si", "ui")) or index_type == "i1":
        return "other", f"reduce over two inputs whose second input is {index_type}, not indices"
    got = tuple(_expression(v, args) for v in body[-1].operands)
    for kind, direction in (("argmax", "GT"), ("argmin", "LT")):
        if got == _arg_template(direction, value_type, index_type):
            return kind, ""
    return "other", ("reduce over (values, indices) whose region is not jax's argmax/argmin "
                     "comparator (the larger/smaller value, on ties the first index)")


def sort_comparator(op) -> tuple[str, str]:
    """(kind, why) of a sort's comparator region, read whole: `ascending` when it is jax's
    (`lax.sort`, `jnp.sort`, `argsort`: the first operand's elements compared with `<`, on
    floats after mapping -0 to +0 and every NaN to one NaN, with TOTALORDER -- an order on
    numbers where -0 and +0 are equal and NaNs come last; on integers a plain `<`), reading
    only the first operand's pair (the others move with it); else `other`, with why."""
    block = op.regions[0].blocks[0]
    args = list(block.arguments)
    body = [o.operation for o in block.operations]
    if len(args) != 2 * len(op.operands) or not body or len(body[-1].operands) != 1:
        return "other", "sort whose comparator is not a predicate on pairs of elements"
    key = _element(op.operands[0].type)
    got = _expression(body[-1].operands[0], args)
    a, b = ("arg", 0), ("arg", 1)
    if key.startswith(("i", "si", "ui")) and key != "i1":
        template = _compare_expression("LT", default_compare_type(key), a, b)
    elif key in ("f32", "f16", "bf16", "f64"):
        template = _compare_expression("LT", "TOTALORDER", _canonical_float(a, key),
                                       _canonical_float(b, key))
    else:
        return "other", f"sort of {key} keys"
    if got != template:
        return "other", ("sort whose comparator is not jax's ascending order on the first "
                         "operand")
    return "ascending", ""


_FLOAT_CONSTANTS = {"f32": ("0.000000e+00", "0x7FC00000"), "f64": ("0.000000e+00",
                                                                  "0x7FF8000000000000"),
                    "f16": ("0.000000e+00", "0x7E00"), "bf16": ("0.000000e+00", "0x7FC0")}


def _canonical_float(x: tuple, dtype: str) -> tuple:
    """jax's comparator input: `select(x != x, NaN, select(x == 0, 0, x))`."""
    zero, nan = (("const", f"dense<{c}> : tensor<{dtype}>") for c in _FLOAT_CONSTANTS[dtype])
    unsigned = ("select", _compare_expression("EQ", "FLOAT", x, zero), zero, x)
    return ("select", _compare_expression("NE", "FLOAT", x, x), nan, unsigned)


def _arg_template(direction: str, value_type: str, index_type: str) -> tuple:
    """The `_expression`s jax's argmax (`GT`) / argmin (`LT`) region returns."""
    v, i, w, j = (("arg", k) for k in range(4))
    vt, it = default_compare_type(value_type), default_compare_type(index_type)
    first = _compare_expression(direction, vt, v, w)
    picked = _commutative("stablehlo.or", [first, _compare_expression("NE", vt, v, v)])
    tie = _commutative("stablehlo.and", [_compare_expression("EQ", vt, v, w),
                                         _compare_expression("LT", it, i, j)])
    return (("select", picked, v, w),
            ("select", _commutative("stablehlo.or", [picked, tie]), i, j))


def _compare_expression(direction: str, ctype: str, a: tuple, b: tuple) -> tuple:
    """A compare with its operands in a canonical order (the direction flipped to match)."""
    flipped = {"LT": "GT", "LE": "GE", "GT": "LT", "GE": "LE", "EQ": "EQ", "NE": "NE"}
    if repr(b) < repr(a):
        a, b, direction = b, a, flipped[direction]
    return ("compare", direction, ctype, a, b)


def _commutative(name: str, operands: list[tuple]) -> tuple:
    return (name, *sorted(operands, key=repr))


def _expression(value, args: list, depth: int = 0) -> tuple:
    """A region value as a canonical nested tuple: block arguments by position, compares,
    and / or (operands sorted) and select; anything else names itself and stops the match."""
    for k, a in enumerate(args):
        if a == value:
            return ("arg", k)
    owner = value.owner
    op = getattr(owner, "operation", owner)
    name = getattr(op, "name", "?")
    if depth > 8:
        return ("too deep",)
    ins = [_expression(v, args, depth + 1) for v in op.operands] if hasattr(op, "operands") \
        else []
    if name == "stablehlo.compare" and len(ins) == 2:
        direction = _DIRECTION.search(str(op.attributes["comparison_direction"])).group(1)
        return _compare_expression(direction, compare_type(op), ins[0], ins[1])
    if name in ("stablehlo.or", "stablehlo.and") and len(ins) == 2:
        return _commutative(name, ins)
    if name == "stablehlo.select" and len(ins) == 3:
        return ("select", *ins)
    if name == "stablehlo.constant":
        return ("const", str(op.attributes["value"]))
    return ("op", name, *ins)


def _element(t) -> str:
    return tensor_type(t).dtype


def _value_name(value, args: list) -> str:
    for i, a in enumerate(args):
        if a == value:
            return f"%arg{i}"
    return "a computed value"


def scatter_kind(info: OpInfo) -> str:
    """A scatter's update computation: `replace`, a reducer (`add`, ...) or `other`, from its
    normalized attributes (`reducer`; `update` in hand-built OpInfos), else its region."""
    kind = info.attrs.get("reducer") or info.attrs.get("update")
    if kind:
        return str(kind)
    op = info.op
    if op is None or not len(op.regions):
        return "other"
    return region_kind(op)[0]


def region_problem(info: OpInfo) -> str:
    """What an op's computation region does instead of a supported reduction (for the
    diagnostic of a reducer classified `other`)."""
    return info.attrs.get("region_problem") or (
        f"{info.name.split('.')[-1]} with a '{info.attrs.get('reducer', 'other')}' reducer")


def _convert_attr(attr):
    """The plain-Python value of an attribute (dispatched on its class, which decides every
    test below: the bindings' classes use the standard isinstance). Immutable values are
    remembered by attribute (`_CONVERTED`)."""
    found = _CONVERTED.get(attr)
    if found is not None:
        return found
    convert = _CONVERTERS.get(type(attr))
    if convert is None:
        convert = _CONVERTERS[type(attr)] = _converter(type(attr))
    value = convert(attr)
    if convert is not _int_list:
        _CONVERTED[attr] = value
    return value


_CONVERTED: dict = {}
"""Converted attribute values by attribute. MLIR attributes are uniqued and immutable, and a
key holds its context alive, so an entry never goes stale; a deep model repeats the same
dimension lists, constants and dimension numbers in every layer. Only immutable values (tuples,
scalars, strings; read-only arrays for constants) are kept."""


def _converter(cls):
    from jaxlib.mlir import ir  # lazy: rules use OpInfo without the bindings

    if issubclass(cls, (ir.DenseI64ArrayAttr, ir.DenseI32ArrayAttr, ir.DenseBoolArrayAttr)):
        return tuple
    if issubclass(cls, ir.BoolAttr):
        return _value_of
    if issubclass(cls, ir.IntegerAttr):
        return _value_of
    if issubclass(cls, ir.DenseIntElementsAttr):
        return _int_list
    if issubclass(cls, ir.UnitAttr):
        return _true
    if issubclass(cls, ir.StringAttr):
        return _value_of
    return str


_CONVERTERS: dict[type, object] = {}
"""Attribute class -> its conversion (`_converter`)."""


def _value_of(attr):
    return attr.value


def _int_list(attr):
    return np.array(attr).tolist()


def _true(attr):
    return True


_DIRECTION = re.compile(r"comparison_direction\s+(\w+)")
_CMP_TYPE = re.compile(r"comparison_type\s+(\w+)")


def default_compare_type(dtype: str) -> str:
    """The `compare_type` StableHLO requires for an element type (spec C3: SIGNED for signed
    integers, UNSIGNED for unsigned ones and booleans, FLOAT, or TOTALORDER, for floats)."""
    if dtype == "i1" or dtype.startswith("ui"):
        return "UNSIGNED"
    if dtype.startswith(("i", "si")):
        return "SIGNED"
    return "FLOAT"


def allowed_compare_types(dtype: str) -> tuple[str, ...]:
    """The compare types XLA accepts for an element type (its HLO verifier rejects others)."""
    default = default_compare_type(dtype)
    return ("FLOAT", "TOTALORDER") if default == "FLOAT" else (default,)


ARRAY_COMPARISONS = {"EQ": np.equal, "NE": np.not_equal, "LT": np.less, "LE": np.less_equal,
                     "GT": np.greater, "GE": np.greater_equal}
"""A `stablehlo.compare` direction as numpy's function of whole arrays (element by element:
of Python integers, their own comparisons)."""


def compare_type(op) -> str:
    """A `stablehlo.compare`'s compare type: the attribute, or the default of its operands'
    element type when absent (what XLA uses then). It is part of what the op computes:
    TOTALORDER orders -0 before +0 (and NaNs), FLOAT does not."""
    if "compare_type" in op.attributes:
        match = _CMP_TYPE.search(str(op.attributes["compare_type"]))
        if match:
            return match.group(1)
    return default_compare_type(tensor_type(op.operands[0].type).dtype)


def compare_is_default(info: OpInfo) -> bool:
    """A compare whose compare type is its element type's default (FLOAT, SIGNED, ...)."""
    dtype = info.operand_types[0].dtype if info.operand_types else "f32"
    return info.attrs.get("compare_type", default_compare_type(dtype)) == \
        default_compare_type(dtype)


def constant_value(attr):
    """(numpy array, is_splat) of a constant's `value` attribute."""

    dense = attr
    shape = tuple(dense.type.shape)
    if dense.is_splat:
        splat = dense.get_splat_value()
        return np.full(shape, _scalar_attr(splat)), True
    try:
        return np.array(dense), False
    except Exception:  # noqa: BLE001 - exotic element types (bf16, complex) compare by text
        return np.array([str(attr)]), False


def _scalar_attr(attr):
    from jaxlib.mlir import ir  # lazy: rules use OpInfo without the bindings

    if isinstance(attr, ir.FloatAttr):
        return attr.value
    if isinstance(attr, ir.BoolAttr):
        return int(attr.value)
    if isinstance(attr, ir.IntegerAttr):
        return attr.value
    text = str(attr).split(":")[0].strip()
    return {"true": 1, "false": 0}.get(text, float(text) if text else 0)


_READ_APART = frozenset({"value", "dot_dimension_numbers", "comparison_direction",
                         "compare_type"})
"""Attributes `describe` reads in their own way (or not at all)."""


def describe(op, default_file: str = "-") -> OpInfo:
    """The `OpInfo` of an `ir.Operation`."""
    name = op.name
    attrs: dict = {}
    attributes = op.attributes
    for key, attr in _items(attributes):
        if key not in _READ_APART:
            attrs[key] = _convert_attr(attr)
    if name == "stablehlo.constant":
        attrs["value"], attrs["splat"] = _constant_of(attributes["value"])
    elif name == "stablehlo.dot_general":
        attrs.update(_dot_dimensions(attributes["dot_dimension_numbers"]))
    elif name == "stablehlo.dot":
        lhs_rank = len(tensor_type(op.operands[0].type).shape)
        name = "stablehlo.dot_general"
        attrs.update(lhs_batch=(), rhs_batch=(), lhs_contract=(lhs_rank - 1,), rhs_contract=(0,))
    elif name == "stablehlo.compare":
        text = str(attributes["comparison_direction"])
        attrs["comparison_direction"] = _DIRECTION.search(text).group(1)
        attrs["compare_type"] = compare_type(op)
    elif name == "stablehlo.sort":
        attrs["comparator"], why = sort_comparator(op)
        if why:
            attrs["region_problem"] = why
    elif name == "stablehlo.convolution":
        attrs.update(_conv_dimensions(attributes["dimension_numbers"]))
        del attrs["dimension_numbers"]
    elif name in _REDUCING:
        attrs["reducer"], why = region_kind(op)
        if why:
            attrs["region_problem"] = why
    types = _TENSOR_TYPES
    operand_types = []
    for value in op.operands:
        t = value.type
        found = types.get(t)
        operand_types.append(found if found is not None else tensor_type(t))
    result_types = []
    for t in op.results.types:
        found = types.get(t)
        result_types.append(found if found is not None else tensor_type(t))
    return OpInfo(name, attrs, operand_types, result_types, op_location(op, default_file),
                  op)


def _constant_of(attr) -> tuple:
    """`constant_value`, remembered by attribute (`_CONVERTED`) as a read-only array."""
    key = ("constant", attr)
    found = _CONVERTED.get(key)
    if found is None:
        value, splat = constant_value(attr)
        value.flags.writeable = False
        found = _CONVERTED[key] = (value, splat)
    return found


def _dot_dimensions(attr) -> dict:
    """A dot_general's dimension numbers as `lhs_batch`, ... tuples (remembered by attribute)."""
    key = ("dot", attr)
    found = _CONVERTED.get(key)
    if found is None:
        from jaxlib.mlir.dialects import stablehlo  # lazy: no bindings at import (rules)

        dims = stablehlo.DotDimensionNumbers(attr)
        found = _CONVERTED[key] = {"lhs_batch": tuple(dims.lhs_batching_dimensions),
                                   "rhs_batch": tuple(dims.rhs_batching_dimensions),
                                   "lhs_contract": tuple(dims.lhs_contracting_dimensions),
                                   "rhs_contract": tuple(dims.rhs_contracting_dimensions)}
    return found


def _conv_dimensions(attr) -> dict:
    """A convolution's dimension numbers as `input_batch`, ... (remembered by attribute)."""
    key = ("conv", attr)
    found = _CONVERTED.get(key)
    if found is None:
        from jaxlib.mlir.dialects import stablehlo  # lazy: no bindings at import (rules)

        dims = stablehlo.ConvDimensionNumbers(attr)
        found = _CONVERTED[key] = {
            "input_batch": dims.input_batch_dimension,
            "input_feature": dims.input_feature_dimension,
            "input_spatial": tuple(dims.input_spatial_dimensions),
            "kernel_input_feature": dims.kernel_input_feature_dimension,
            "kernel_output_feature": dims.kernel_output_feature_dimension,
            "kernel_spatial": tuple(dims.kernel_spatial_dimensions),
            "output_batch": dims.output_batch_dimension,
            "output_feature": dims.output_feature_dimension,
            "output_spatial": tuple(dims.output_spatial_dimensions)}
    return found


CONV_DIMENSIONS = ("input_batch", "input_feature", "input_spatial", "kernel_input_feature",
                   "kernel_output_feature", "kernel_spatial", "output_batch", "output_feature",
                   "output_spatial")
"""A convolution's dimension numbers as `describe` names them."""


def conv_attrs(info: OpInfo) -> dict:
    """A convolution's attributes complete: the dimension numbers, and the window attributes
    with StableHLO's defaults filled in (strides and dilations 1, no padding, no reversal,
    one feature and batch group)."""
    a = info.attrs
    n = len(a["input_spatial"])
    out = {key: a[key] for key in CONV_DIMENSIONS}
    out["window_strides"] = tuple(a.get("window_strides") or (1,) * n)
    out["padding"] = tuple(tuple(int(v) for v in p) for p in (a.get("padding") or [[0, 0]] * n))
    out["lhs_dilation"] = tuple(a.get("lhs_dilation") or (1,) * n)
    out["rhs_dilation"] = tuple(a.get("rhs_dilation") or (1,) * n)
    out["window_reversal"] = tuple(bool(r) for r in (a.get("window_reversal") or (False,) * n))
    out["feature_group_count"] = int(a.get("feature_group_count", 1))
    out["batch_group_count"] = int(a.get("batch_group_count", 1))
    return out


_REDUCING = frozenset({"stablehlo.reduce", "stablehlo.all_reduce", "stablehlo.reduce_scatter",
                       "stablehlo.reduce_window", "stablehlo.scatter"})


def _items(attributes):
    """(name, attribute) pairs of an op's attributes."""
    items = getattr(attributes, "items", None)
    if items is not None:
        return items()
    return [(named if type(named) is str else named.name,
             attributes[named if type(named) is str else named.name]) for named in attributes]


def op_location(op, default_file: str = "-") -> SourceLoc | None:
    """The user's source position of an op, if its location records one (memoized: printing
    a location is most of the cost of describing an op, and layers repeat locations)."""
    key = (op.location.attr, default_file)
    found = _LOCATIONS.get(key, _MISSING)
    if found is _MISSING:
        found = _LOCATIONS[key] = parse_location(str(op.location), default_file)
    return found


_LOCATIONS: dict[tuple, SourceLoc | None] = {}
_MISSING = object()
