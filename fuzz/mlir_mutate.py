"""Systematic mutations of a sharded StableHLO program's text (no jax needed).

`mutants(text)` lists `(description, mutated_text)` for every mutation site of a shard_map
lowering: each collective dropped / duplicated / regrouped (other mesh axes, other device order
inside a group) / given another dim or reducer; each collective_permute's pairs swapped, dropped
or reversed; each binary/unary elementwise op replaced by another and non-commutative operands
swapped; each constant changed; each reduce given another reducer; each comparison flipped;
each dynamic_slice's offsets swapped; partition_id replaced by 0; each static slice shifted.

A mutant may not verify (a dim change that breaks the types): running it tells (`invalid`).
"""

from __future__ import annotations

import re
from collections.abc import Iterator

from entangle_mlir.core.mesh import Mesh

BINOPS = {
    "add": ("subtract", "multiply", "maximum"),
    "subtract": ("add",),
    "multiply": ("add", "divide"),
    "divide": ("multiply",),
    "maximum": ("minimum", "add"),
    "minimum": ("maximum",),
}
UNARY = {
    "tanh": ("logistic",), "exponential": ("tanh",), "logistic": ("tanh",),
    "negate": ("abs",), "abs": ("negate",), "rsqrt": ("sqrt",), "sqrt": ("rsqrt",),
    "sine": ("cosine",), "log": ("exponential",),
}
COMPARE = {"GT": "LT", "LT": "GT", "GE": "GT", "LE": "LT", "EQ": "NE", "NE": "EQ"}
REDUCERS = {"add": ("maximum",), "maximum": ("minimum", "add"), "minimum": ("maximum",)}

_RESULT = re.compile(r"^(\s*)(%[\w#]+)(:\d+)? = ")
_BIN = re.compile(r"= stablehlo\.(add|subtract|multiply|divide|maximum|minimum) (%[\w#]+), "
                  r"(%[\w#]+)")
_UN = re.compile(r"= stablehlo\.(" + "|".join(UNARY) + r") (%[\w#]+)")
_CONST = re.compile(r"stablehlo\.constant dense<([^>\[\]]+)> : tensor<(\w+)>")
_GROUPS = re.compile(r"replica_groups = dense<(\[\[[\d, \[\]]*\]\])> : tensor<(\d+)x(\d+)xi64>")
_PAIRS = re.compile(r"source_target_pairs = dense<(\[\[[\d, \[\]]*\]\])> : tensor<(\d+)x2xi64>")
_MESH = re.compile(r"sdy\.mesh @\w+ = <\[([^\]]*)\]>")
_DS = re.compile(r"stablehlo\.dynamic_slice (%[\w#]+), ((?:%[\w#]+, )+)sizes")
_REDUCE = re.compile(r"applies stablehlo\.(add|maximum|minimum) across")
_CMP = re.compile(r"stablehlo\.compare  ?(GT|LT|GE|LE|EQ|NE),")
_SLICE = re.compile(r"stablehlo\.slice (%[\w#]+) \[([\d:, ]+)\]")
_TENSOR = re.compile(r"tensor<([\dx]*)x?(\w+)>")


def parse_mesh(text: str) -> Mesh | None:
    m = _MESH.search(text)
    if not m:
        return None
    axes = tuple((name, int(size)) for name, size in re.findall(r'"(\w+)"=(\d+)', m.group(1)))
    return Mesh(axes) if axes else None


def _groups_text(groups: list[list[int]]) -> str:
    body = ", ".join("[" + ", ".join(map(str, g)) + "]" for g in groups)
    return f"dense<[{body}]> : tensor<{len(groups)}x{len(groups[0])}xi64>"


def _parse_list(text: str) -> list[list[int]]:
    import json

    return json.loads(text)


def _op_span(lines: list[str], i: int) -> int:
    """Index of the last line of the op starting at line i (ops with regions span lines)."""
    if not lines[i].rstrip().endswith("({"):
        return i
    depth = 0
    for j in range(i, len(lines)):
        depth += lines[j].count("({") - lines[j].count("})")
        if depth <= 0:
            return j
    return i


def _rename_uses(lines: list[str], start: int, old: str, new: str) -> list[str]:
    pat = re.compile(re.escape(old) + r"(?![\w#])")
    return lines[:start] + [pat.sub(new, ln) for ln in lines[start:]]


def _first_operand(line: str) -> str | None:
    m = re.search(r'= "?stablehlo\.\w+"?\(?(%[\w#]+)', line)
    return m.group(1) if m else None


def _drop(lines: list[str], i: int) -> list[str] | None:
    """Remove the op at line i and use its first operand instead of its result."""
    m = _RESULT.match(lines[i])
    operand = _first_operand(lines[i])
    if not m or not operand or m.group(3):
        return None
    end = _op_span(lines, i)
    result = m.group(2)
    rest = lines[:i] + lines[end + 1:]
    return _rename_uses(rest, i, result, operand)


def _duplicate(lines: list[str], i: int) -> list[str] | None:
    """Apply the op at line i twice (its result fed to a copy of itself)."""
    m = _RESULT.match(lines[i])
    operand = _first_operand(lines[i])
    if not m or not operand or m.group(3):
        return None
    end = _op_span(lines, i)
    result = m.group(2)
    dup = "%dup_" + result[1:]
    copy = lines[i:end + 1]
    copy[0] = copy[0].replace(f"{result} = ", f"{dup} = ", 1).replace(operand, result, 1)
    after = _rename_uses(lines[end + 1:], 0, result, dup)
    return lines[:end + 1] + copy + after


def _shape(tensor_text: str) -> tuple[list[int], str] | None:
    m = re.fullmatch(r"tensor<((?:\d+x)*)(\w+)>", tensor_text.strip())
    if not m:
        return None
    dims = [int(d) for d in m.group(1).split("x") if d]
    return dims, m.group(2)


def _tensor(dims: list[int], dtype: str) -> str:
    return "tensor<" + "".join(f"{d}x" for d in dims) + dtype + ">"


def _retype_result(line: str, fn) -> str | None:
    """Rewrite `(operand types) -> result type` of a collective with fn(operand dims)."""
    found = list(re.finditer(r": \((tensor<[^>]*>)\) -> (tensor<[^>]*>)", line))
    if not found:
        return None
    m = found[-1]
    parsed = _shape(m.group(1))
    if not parsed:
        return None
    dims, dtype = parsed
    new = fn(list(dims))
    if new is None:
        return None
    return line[:m.start(2)] + _tensor(new, dtype) + line[m.end(2):]


def _int_attr(line: str, name: str) -> int | None:
    m = re.search(name + r" = (\d+)", line)
    return int(m.group(1)) if m else None


def _set_attr(line: str, name: str, value: int) -> str:
    return re.sub(name + r" = \d+", f"{name} = {value}", line, count=1)


def _group_variants(mesh: Mesh | None, groups: list[list[int]]):
    """Other replica groups: other mesh axes (any order) and other device orders."""
    seen = {repr(groups)}
    if mesh is not None:
        import itertools

        for k in range(1, len(mesh.names) + 1):
            for axes in itertools.permutations(mesh.names, k):
                g = mesh.groups_for(axes)
                if repr(g) not in seen:
                    seen.add(repr(g))
                    yield f"groups of {axes}", g
    if len(groups[0]) > 1:
        swapped = [[g[1], g[0]] + g[2:] for g in groups]
        if repr(swapped) not in seen:
            seen.add(repr(swapped))
            yield "device order swapped", swapped
    if len(groups[0]) > 2:
        rotated = [g[1:] + g[:1] for g in groups]
        if repr(rotated) not in seen:
            yield "device order rotated", rotated


def _sub_once(line: str, start: int, end: int, new: str) -> str:
    return line[:start] + new + line[end:]


def _float_variants(value: str, dtype: str) -> list[str]:
    try:
        v = float(value) if dtype.startswith(("f", "bf")) else int(value)
    except ValueError:
        return []
    if dtype.startswith(("f", "bf")):
        out = [v * 2, v + 1.0, -v if v != 0 else 1.0]
        return [f"{x:.6e}" for x in out if x != v]
    if dtype in ("i1",):
        return []
    out = [v + 1, v * 2 if v != 0 else 2, 0 if v != 0 else 1]
    return [str(x) for x in out if x != v]


def mutants(text: str) -> Iterator[tuple[str, str]]:
    """Every single-site mutant of a sharded program's text."""
    lines = text.split("\n")
    mesh = parse_mesh(text)

    def emit(desc: str, i: int, new_lines: list[str] | None):
        if new_lines is not None:
            return (f"line {i + 1}: {desc}", "\n".join(new_lines))
        return None

    for i, line in enumerate(lines):
        out: list[tuple[str, str] | None] = []
        stripped = line.strip()
        if stripped.startswith(("func.func", "module", "sdy.mesh", "return", "sdy.return")) or \
                "sdy.manual_computation" in line:
            continue
        # collectives
        cm = re.search(r'"stablehlo\.(all_reduce|all_gather|reduce_scatter|all_to_all|'
                       r'collective_permute|collective_broadcast)"', line)
        if cm:
            end = _op_span(lines, i)
            op = "\n".join(lines[i:end + 1])

            def put(text, i=i, end=end):
                return lines[:i] + text.split("\n") + lines[end + 1:]

            kind = cm.group(1)
            out.append(emit(f"drop {kind}", i, _drop(lines, i)))
            if kind == "all_reduce":
                out.append(emit(f"duplicate {kind}", i, _duplicate(lines, i)))
            gm = _GROUPS.search(op)
            if gm:
                groups = _parse_list(gm.group(1))
                for what, g in _group_variants(mesh, groups):
                    new_op = op[:gm.start()] + "replica_groups = " + _groups_text(g) + \
                        op[gm.end():]
                    if kind in ("all_gather", "reduce_scatter", "all_to_all") and \
                            len(g[0]) != len(groups[0]):
                        n_old, n_new = len(groups[0]), len(g[0])
                        dim = {"all_gather": "all_gather_dim",
                               "reduce_scatter": "scatter_dimension"}.get(kind)
                        if kind == "all_to_all":
                            new_op = re.sub(r"split_count = \d+", f"split_count = {n_new}",
                                            new_op)
                            sd = _int_attr(op, "split_dimension")
                            cd = _int_attr(op, "concat_dimension")

                            def fix(d, sd=sd, cd=cd, n_old=n_old, n_new=n_new):
                                d = list(d)
                                if d[sd] % n_new:
                                    return None
                                d[sd] //= n_new
                                d[cd] *= n_new
                                return d
                        else:
                            k = _int_attr(op, dim)

                            def fix(d, k=k, kind=kind, n_new=n_new):
                                d = list(d)
                                if kind == "all_gather":
                                    d[k] *= n_new
                                elif d[k] % n_new:
                                    return None
                                else:
                                    d[k] //= n_new
                                return d
                        retyped = _retype_result(new_op, fix)
                        if retyped is None:
                            continue
                        new_op = retyped
                    out.append(emit(f"{kind} {what}", i, put(new_op)))
            if kind in ("all_gather", "reduce_scatter"):
                name = "all_gather_dim" if kind == "all_gather" else "scatter_dimension"
                k = _int_attr(op, name)
                n = len(_parse_list(gm.group(1))[0]) if gm else 1
                m = re.search(r": \((tensor<[^>]*>)\)", op)
                rank = len(_shape(m.group(1))[0]) if m and _shape(m.group(1)) else 0
                for d in range(rank):
                    if d == k:
                        continue

                    def fix(dims, d=d, kind=kind, n=n):
                        dims = list(dims)
                        if kind == "all_gather":
                            dims[d] *= n
                        elif dims[d] % n:
                            return None
                        else:
                            dims[d] //= n
                        return dims
                    retyped = _retype_result(_set_attr(op, name, d), fix)
                    if retyped is not None:
                        new_op = retyped
                        out.append(emit(f"{kind} dim {d} instead of {k}", i, put(new_op)))
            if kind == "all_to_all":
                sd, cd = _int_attr(op, "split_dimension"), _int_attr(op, "concat_dimension")
                n = _int_attr(op, "split_count") or 1
                m = re.search(r": \((tensor<[^>]*>)\)", op)
                rank = len(_shape(m.group(1))[0]) if m and _shape(m.group(1)) else 0
                for nsd, ncd, what in ([(cd, sd, "split/concat swapped")]
                                       + [(d, cd, f"split dim {d}") for d in range(rank)
                                          if d not in (sd, cd)]
                                       + [(sd, d, f"concat dim {d}") for d in range(rank)
                                          if d not in (sd, cd)]):
                    def fix(dims, nsd=nsd, ncd=ncd, n=n):
                        dims = list(dims)
                        if dims[nsd] % n:
                            return None
                        dims[nsd] //= n
                        dims[ncd] *= n
                        return dims
                    changed = _set_attr(_set_attr(op, "split_dimension", nsd),
                                        "concat_dimension", ncd)
                    retyped = _retype_result(changed, fix)
                    if retyped is not None:
                        new_op = retyped
                        out.append(emit(f"all_to_all {what}", i, put(new_op)))
            pm = _PAIRS.search(op)
            if pm:
                pairs = _parse_list(pm.group(1))
                variants = []
                if len(pairs) > 1:
                    sw = [list(p) for p in pairs]
                    sw[0][1], sw[1][1] = sw[1][1], sw[0][1]
                    variants.append(("targets of two pairs swapped", sw))
                    variants.append(("last pair dropped", pairs[:-1]))
                variants.append(("pairs reversed", [[b, a] for a, b in pairs]))
                for what, v in variants:
                    if sorted(map(tuple, v)) == sorted(map(tuple, pairs)):
                        continue
                    body = ", ".join(f"[{a}, {b}]" for a, b in v)
                    new_op = op[:pm.start()] + f"source_target_pairs = dense<[{body}]> : " \
                        f"tensor<{len(v)}x2xi64>" + op[pm.end():]
                    out.append(emit(f"collective_permute {what}", i, put(new_op)))
        # elementwise binary ops (also the reducer inside an all_reduce / reduce_scatter)
        bm = _BIN.search(line)
        if bm:
            op, a, b = bm.groups()
            for other in BINOPS[op]:
                new = list(lines)
                new[i] = line.replace(f"stablehlo.{op} ", f"stablehlo.{other} ", 1)
                out.append(emit(f"{op} -> {other}", i, new))
            if op in ("subtract", "divide") and a != b:
                new = list(lines)
                new[i] = _sub_once(line, bm.start(2), bm.end(3), f"{b}, {a}")
                out.append(emit(f"{op} operands swapped", i, new))
        um = _UN.search(line)
        if um:
            for other in UNARY[um.group(1)]:
                new = list(lines)
                new[i] = line.replace(f"stablehlo.{um.group(1)} ", f"stablehlo.{other} ", 1)
                out.append(emit(f"{um.group(1)} -> {other}", i, new))
        km = _CONST.search(line)
        if km:
            for v in _float_variants(km.group(1), km.group(2)):
                new = list(lines)
                new[i] = _sub_once(line, km.start(1), km.end(1), v)
                out.append(emit(f"constant {km.group(1)} -> {v}", i, new))
        rm = _REDUCE.search(line)
        if rm:
            for other in REDUCERS[rm.group(1)]:
                new = list(lines)
                new[i] = _sub_once(line, rm.start(1), rm.end(1), other)
                out.append(emit(f"reduce {rm.group(1)} -> {other}", i, new))
        cpm = _CMP.search(line)
        if cpm:
            new = list(lines)
            new[i] = _sub_once(line, cpm.start(1), cpm.end(1), COMPARE[cpm.group(1)])
            out.append(emit(f"compare {cpm.group(1)} -> {COMPARE[cpm.group(1)]}", i, new))
        dm = _DS.search(line)
        if dm:
            offsets = [o.strip() for o in dm.group(2).split(",") if o.strip()]
            for j in range(len(offsets) - 1):
                if offsets[j] != offsets[j + 1]:
                    sw = list(offsets)
                    sw[j], sw[j + 1] = sw[j + 1], sw[j]
                    new = list(lines)
                    new[i] = _sub_once(line, dm.start(2), dm.end(2),
                                       "".join(o + ", " for o in sw))
                    out.append(emit(f"dynamic_slice offsets {j},{j + 1} swapped", i, new))
        if "stablehlo.partition_id" in line:
            new = list(lines)
            new[i] = re.sub(r"stablehlo\.partition_id : tensor<(\w+)>",
                            r"stablehlo.constant dense<0> : tensor<\1>", line)
            out.append(emit("partition_id -> 0", i, new))
        sm = _SLICE.search(line)
        if sm:
            ranges = [r.strip() for r in sm.group(2).split(",")]
            m = re.search(r": \((tensor<[^>]*>)\)", line)
            in_shape = _shape(m.group(1))[0] if m and _shape(m.group(1)) else None
            for j, r in enumerate(ranges):
                parts = r.split(":")
                if len(parts) != 2 or in_shape is None:
                    continue
                lo, hi = int(parts[0]), int(parts[1])
                for delta in (1, -1):
                    if 0 <= lo + delta and hi + delta <= in_shape[j] and hi > lo:
                        rs = list(ranges)
                        rs[j] = f"{lo + delta}:{hi + delta}"
                        new = list(lines)
                        new[i] = _sub_once(line, sm.start(2), sm.end(2), ", ".join(rs))
                        out.append(emit(f"slice dim {j} shifted by {delta}", i, new))
        for item in out:
            if item is not None:
                yield item


# ----- value-semantics mutants (the semantic attacker) ------------------------------------------
#
# `value_mutants(text)` attacks what the values ARE, not where they live: element types narrowed
# by convert round trips, constants moved by one ulp or a small relative amount, integer widths,
# compare types and directions, what a reducer region returns, the reducer's op, and the precision
# a collective is computed in. Each mutant is a `ValueMutant` (kind, description, lazy text), so a
# runner can sample a few of each kind from a large program without building every text.

VALUE_KINDS = ("dtype", "int_width", "constant", "compare_type", "compare_dir", "region_return",
               "reducer", "precision", "reduce_precision", "op_variant")

FLOAT_TYPES = ("f32", "f16", "bf16", "f64")
INT_TYPES = ("i8", "i16", "i32", "i64", "ui8", "ui16", "ui32", "ui64")
# round trips of an intermediate's element type: (from, via, what it should do to the numbers)
ROUND_TRIPS = {
    "f32": (("bf16", "narrow"), ("f16", "narrow"), ("f64", "widen"), ("i32", "truncate")),
    "i32": (("i8", "narrow"), ("i16", "narrow"), ("f32", "narrow"), ("ui32", "reinterpret"),
            ("i64", "widen")),
    "i64": (("i32", "narrow"),),
}
# reducer ops inside regions and what they become
REDUCER_SWAPS = {
    "add": ("maximum", "minimum", "multiply"),
    "maximum": ("add", "minimum", "multiply"),
    "minimum": ("maximum", "add"),
    "multiply": ("add", "maximum"),
    "and": ("or",), "or": ("and", "xor"), "xor": ("or",),
}
# ops replaced by a sibling that agrees on many inputs (rounding, shifts, +-1 variants)
OP_VARIANTS = {
    "floor": ("ceil", "round_nearest_even"), "ceil": ("floor",),
    "round_nearest_even": ("round_nearest_afz",), "round_nearest_afz": ("round_nearest_even",),
    "shift_right_arithmetic": ("shift_right_logical",),
    "shift_right_logical": ("shift_right_arithmetic",),
    "exponential": ("exponential_minus_one",), "exponential_minus_one": ("exponential",),
    "log": ("log_plus_one",), "log_plus_one": ("log",),
    "remainder": ("divide",), "sign": ("negate",), "not": ("negate",),
}
# reduce_precision formats equal to a narrower float type (exponent bits, mantissa bits)
REDUCE_PRECISION = {"bf16": (8, 7), "f16": (5, 10)}
COMPARE_TYPES = {"FLOAT": ("TOTALORDER",), "TOTALORDER": ("FLOAT",),
                 "SIGNED": ("UNSIGNED",), "UNSIGNED": ("SIGNED",)}
DIRECTIONS = ("EQ", "NE", "GE", "GT", "LE", "LT")
REGION_OPS = ("all_reduce", "reduce_scatter", "reduce", "reduce_window", "scatter",
              "select_and_scatter")
PRECISION_COLLECTIVES = ("all_reduce", "reduce_scatter", "all_gather", "all_to_all",
                         "collective_permute")

_RTYPE = re.compile(r"(tensor<[^<>]*>)(?: loc\(.*\))?\s*$")
_ANY_CONST = re.compile(r"stablehlo\.constant dense<([^<>]+)> : tensor<((?:\d+x)*)(\w+)>")
_CMP_FULL = re.compile(r"stablehlo\.compare  ?(GT|LT|GE|LE|EQ|NE), (%[\w#]+), (%[\w#]+), "
                       r" ?(FLOAT|TOTALORDER|SIGNED|UNSIGNED)")
_COMPACT_REDUCE = re.compile(
    r"^(\s*)(%[\w#]+) = stablehlo\.reduce\((%[\w#]+) init: (%[\w#]+)\) applies "
    r"stablehlo\.(\w+) across dimensions = (\[[\d, ]*\]) : \((tensor<[^>]*>), "
    r"(tensor<(\w+)>)\) -> (tensor<[^>]*>)(.*)$")
_REGION_OP = re.compile(r'"stablehlo\.(' + "|".join(REGION_OPS) + r')"')
_COLLECTIVE1 = re.compile(r'^(\s*)(%[\w#]+) = "stablehlo\.(' + "|".join(PRECISION_COLLECTIVES)
                          + r')"\((%[\w#]+)\)')


class ValueMutant:
    """One value mutation: `kind` (one of VALUE_KINDS), `desc`, and `text()` (built on demand)."""

    def __init__(self, kind: str, desc: str, build, expect: str = ""):
        self.kind, self.desc, self._build, self.expect = kind, desc, build, expect

    def text(self) -> str | None:
        return self._build()

    def __repr__(self) -> str:
        return f"ValueMutant({self.kind}: {self.desc})"


def _span(lines: list[str], i: int) -> int:
    """Last line of the op starting at line i: braces balanced (regions in either syntax)."""
    depth = 0
    for j in range(i, len(lines)):
        depth += lines[j].count("{") - lines[j].count("}")
        if depth <= 0:
            return j
    return i


def _scope_end(lines: list[str], i: int) -> int:
    """Index of the line closing the block that holds line i (uses of a value end there)."""
    depth = 0
    for j in range(i + 1, len(lines)):
        depth += lines[j].count("{") - lines[j].count("}")
        if depth < 0:
            return j
    return len(lines)


def _rename_in(lines: list[str], start: int, stop: int, old: str, new: str) -> list[str]:
    pat = re.compile(re.escape(old) + r"(?![\w#])")
    return lines[:start] + [pat.sub(new, ln) for ln in lines[start:stop]] + lines[stop:]


def _elem(tensor: str) -> str | None:
    p = _shape(tensor)
    return p[1] if p else None


def _with_elem(tensor: str, dtype: str) -> str:
    dims, _ = _shape(tensor)
    return _tensor(dims, dtype)


def _indent(line: str) -> str:
    return line[:len(line) - len(line.lstrip())]


def _result_type(lines: list[str], i: int, end: int) -> str | None:
    """The single result type of the op spanning lines i..end (`-> T` or `: T` at its end)."""
    last = re.sub(r" loc\(.*\)\s*$", "", lines[end]).rstrip()
    m = re.search(r"-> (tensor<[^<>]*>)$", last) or re.search(r": (tensor<[^<>]*>)$", last)
    return m.group(1) if m else None


def _round_trip(lines, i, name, ty, via, tag):
    """Insert `name -> via -> back` after the op at line i and use the round-tripped value."""
    end = _span(lines, i)
    stop = _scope_end(lines, end)
    a, b = f"%vm{tag}_a", f"%vm{tag}_b"
    ind = _indent(lines[i])
    low = _with_elem(ty, via)
    ins = [f"{ind}{a} = stablehlo.convert {name} : ({ty}) -> {low}",
           f"{ind}{b} = stablehlo.convert {a} : ({low}) -> {ty}"]
    rest = _rename_in(lines, end + 1, stop, name, b)
    return rest[:end + 1] + ins + rest[end + 1:]


def _bits_hex(value, dtype: str) -> str:
    import ml_dtypes
    import numpy as np

    np_type = {"f32": np.float32, "f16": np.float16, "f64": np.float64,
               "bf16": ml_dtypes.bfloat16}[dtype]
    uint = {"f32": np.uint32, "f16": np.uint16, "f64": np.uint64, "bf16": np.uint16}[dtype]
    width = {"f32": 8, "f16": 4, "f64": 16, "bf16": 4}[dtype]
    bits = int(np.array(value, dtype=np_type).view(uint))
    return f"0x{bits:0{width}X}"


def _float_value(text: str, dtype: str):
    """The constant's value as a numpy scalar of its dtype (decimal or hex bits), or None."""
    import ml_dtypes
    import numpy as np

    np_type = {"f32": np.float32, "f16": np.float16, "f64": np.float64,
               "bf16": ml_dtypes.bfloat16}.get(dtype)
    if np_type is None:
        return None
    text = text.strip()
    if text.startswith("0x"):
        uint = {"f32": np.uint32, "f16": np.uint16, "f64": np.uint64, "bf16": np.uint16}[dtype]
        return np.array(int(text, 16), dtype=uint).view(np_type)[()]
    try:
        return np_type(float(text))
    except ValueError:
        return None


def _float_constant_variants(value, dtype: str) -> list[tuple[str, str]]:
    """(description, hex bits) of a float constant moved by 1 ulp up/down and by 2^-20, 2^-10."""
    import numpy as np

    if not np.isfinite(float(value)) and not np.isinf(float(value)):
        return []
    t = type(value)
    out, seen = [], {_bits_hex(value, dtype)}
    cands = []
    if np.isfinite(float(value)):
        cands += [("+1ulp", np.nextafter(value, t(np.inf)) if dtype != "bf16" else None),
                  ("-1ulp", np.nextafter(value, t(-np.inf)) if dtype != "bf16" else None)]
        if dtype == "bf16":
            import ml_dtypes

            bits = int(np.array(value, dtype=ml_dtypes.bfloat16).view(np.uint16))
            sign = -1 if bits & 0x8000 else 1
            for what, d in (("+1ulp", sign), ("-1ulp", -sign)):
                nb = bits + d if bits & 0x7FFF or d > 0 else bits | 0x8001
                cands = [c for c in cands if c[0] != what]
                cands.append((what, np.array(nb & 0xFFFF, dtype=np.uint16).view(
                    ml_dtypes.bfloat16)[()]))
        if float(value) == 0:
            cands.append(("sign of zero flipped", -value))
        for k in (20, 10):
            for sgn in (1, -1):
                cands.append((f"*(1{'+' if sgn > 0 else '-'}2^-{k})",
                              t(float(value) * (1 + sgn * 2.0 ** -k))))
    else:   # +-inf (a max/min init): the largest finite value of the same sign
        cands.append(("-> largest finite", np.nextafter(value, t(0))))
    for what, v in cands:
        if v is None or not np.isfinite(float(v)) and np.isfinite(float(value)):
            continue
        h = _bits_hex(v, dtype)
        if h not in seen:
            seen.add(h)
            out.append((what, h))
    return out


_INT_BITS = {"i8": 8, "i16": 16, "i32": 32, "i64": 64, "ui8": 8, "ui16": 16, "ui32": 32,
             "ui64": 64}


def _int_constant_variants(value: int, dtype: str) -> list[tuple[str, int]]:
    bits = _INT_BITS.get(dtype)
    if bits is None:
        return []
    signed = not dtype.startswith("u")
    lo, hi = (-(1 << (bits - 1)), (1 << (bits - 1)) - 1) if signed else (0, (1 << bits) - 1)
    cands = [("+1", value + 1), ("-1", value - 1)]
    if bits >= 32:
        cands += [("+2^30", value + (1 << 30)), ("-> 2^31-1", (1 << 31) - 1),
                  ("-> -2^31", -(1 << 31) if signed else 1 << 31)]
    out, seen = [], {value}
    for what, v in cands:
        if lo <= v <= hi and v not in seen:
            seen.add(v)
            out.append((what, v))
    return out


def _constant_sites(lines, i):
    line = lines[i]
    m = _ANY_CONST.search(line)
    if not m:
        return
    body, dtype = m.group(1).strip(), m.group(3)
    if body.startswith('"'):
        return

    def put(new_body, m=m, line=line):
        new = list(lines)
        new[i] = line[:m.start(1)] + new_body + line[m.end(1):]
        return new

    if body.startswith("["):      # a 1-D table (offsets, masks): its first and last entries
        if "[" in body[1:]:
            return
        items = [s.strip() for s in body[1:-1].split(",")]
        for k in sorted({0, len(items) - 1}):
            for what, new_item in _scalar_variants(items[k], dtype)[:2]:
                new_items = list(items)
                new_items[k] = new_item
                yield (f"constant table[{k}] {items[k]} {what} ({dtype})",
                       lambda ni=new_items: put("[" + ", ".join(ni) + "]"))
        return
    for what, new_body in _scalar_variants(body, dtype):
        yield f"constant {body} {what} -> {new_body} ({dtype})", lambda nb=new_body: put(nb)


def _scalar_variants(text: str, dtype: str) -> list[tuple[str, str]]:
    if dtype in FLOAT_TYPES:
        v = _float_value(text, dtype)
        if v is None:
            return []
        return _float_constant_variants(v, dtype)
    if dtype == "i1":
        return [("flipped", "false" if text == "true" else "true")] if text in (
            "true", "false") else []
    try:
        value = int(text, 16) if text.startswith("0x") else int(text)
    except ValueError:
        return []
    return [(what, str(v)) for what, v in _int_constant_variants(value, dtype)]


def _region_lines(lines, i, end):
    """(block-args line index, return line index) of the single region of the op at i..end."""
    head = next((j for j in range(i, end + 1) if "^bb0(" in lines[j] or
                 re.search(r"\breducer\(", lines[j])), None)
    ret = next((j for j in range(end, i, -1) if "stablehlo.return" in lines[j]), None)
    if head is None or ret is None:
        return None
    return head, ret


def _expand_compact_reduce(line: str, tag: str) -> list[str] | None:
    """A compact `stablehlo.reduce ... applies stablehlo.OP` written with its region spelled
    out, so the region's body and return can be mutated."""
    m = _COMPACT_REDUCE.match(line)
    if not m:
        return None
    ind, res, x, init, op, dims, xt, it, _, rt, rest = m.groups()
    a, b, r = f"%vm{tag}_x", f"%vm{tag}_y", f"%vm{tag}_r"
    return [(f"{ind}{res} = stablehlo.reduce({x} init: {init}) across dimensions = {dims} : "
             f"({xt}, {it}) -> {rt}"),
            f"{ind} reducer({a}: {it}, {b}: {it})  {{",
            f"{ind}  {r} = stablehlo.{op} {a}, {b} : {it}",
            f"{ind}  stablehlo.return {r} : {it}",
            f"{ind}}}{rest}"]


def _zero_constant(ty: str) -> str:
    e = _elem(ty)
    if e in FLOAT_TYPES:
        return "0.000000e+00"
    if e == "i1":
        return "false"
    return "0"


def _region_sites(lines, i, tag):
    """Region-return and reducer-body mutants of a reducer op at line i."""
    line = lines[i]
    compact = _expand_compact_reduce(line, tag)
    if compact is not None:
        base = lines[:i] + compact + lines[i + 1:]
        kind = _COMPACT_REDUCE.match(line).group(5)
        end = i + len(compact) - 1
        name = "reduce"
    else:
        rm = _REGION_OP.search(line)
        if not rm or not line.rstrip().endswith("({"):
            return
        base, end, name = lines, _span(lines, i), rm.group(1)
        kind = None
    reg = _region_lines(base, i, end)
    if reg is None:
        return
    head, ret = reg
    args = re.findall(r"(%[\w#]+): (tensor<[^>]*>)", base[head])
    rm_ = re.search(r"stablehlo\.return ([^:]+) : (.*?)(?: loc\(.*\))?$", base[ret])
    if not args or not rm_:
        return
    values = [v.strip() for v in rm_.group(1).split(",")]
    types = [t.strip() for t in rm_.group(2).split(", ")]
    n = len(values)
    if len(args) != 2 * n:
        return
    ind = _indent(base[ret])

    def with_return(new_values, extra=(), base=base, ret=ret, types=types):
        new = list(base)
        new[ret:ret + 1] = list(extra) + [
            f"{ind}stablehlo.return {', '.join(new_values)} : {', '.join(types)}"]
        return new

    # which block args are the accumulators: the compact/`reducer(...)` form lists (acc, x)
    # pairs per operand; the ^bb0 form lists every accumulator first.
    if "^bb0(" in base[head]:
        first, second = [a for a, _ in args[:n]], [a for a, _ in args[n:]]
    else:
        flat = [a for a, _ in args]
        first, second = flat[0::2], flat[1::2]
    yield ("region_return", f"{name} region returns its first argument(s) {first}",
           lambda: with_return(first))
    yield ("region_return", f"{name} region returns its second argument(s) {second}",
           lambda: with_return(second))
    consts = [f"{ind}%vm{tag}_c{k} = stablehlo.constant dense<{_zero_constant(t)}> : {t}"
              for k, t in enumerate(types)]
    yield ("region_return", f"{name} region returns a constant 0",
           lambda: with_return([f"%vm{tag}_c{k}" for k in range(n)], consts))
    for j in range(head + 1, ret):
        bm = re.search(r"= stablehlo\.(add|maximum|minimum|multiply|and|or|xor) ", base[j])
        if not bm:
            continue
        for other in REDUCER_SWAPS[bm.group(1)]:
            def swap(j=j, bm=bm, other=other):
                new = list(base)
                new[j] = base[j][:bm.start(1)] + other + base[j][bm.end(1):]
                return new
            yield ("reducer", f"{name} reducer {bm.group(1)} -> {other}", swap)
    del kind


def _precision_sites(lines, i, tag):
    """A single-operand collective computed in bf16/f16 via converts around it."""
    m = _COLLECTIVE1.match(lines[i])
    if not m:
        return
    ind, res, op, operand = m.groups()
    end = _span(lines, i)
    span = lines[i:end + 1]
    whole = "\n".join(span)
    tm = re.search(r"(?:\)|}>) : \((tensor<[^>]*>)\) -> (tensor<[^>]*>)", whole)
    if not tm or _elem(tm.group(1)) != "f32":
        return
    in_t, out_t = tm.group(1), tm.group(2)
    for low in ("bf16", "f16"):
        def build(low=low):
            a, r = f"%vm{tag}_{low}_in", f"%vm{tag}_{low}_out"
            body = whole.replace("f32>", f"{low}>")
            body = body.replace(f"{res} = ", f"{r} = ", 1).replace(f"({operand})", f"({a})", 1)
            pre = f"{ind}{a} = stablehlo.convert {operand} : ({in_t}) -> {_with_elem(in_t, low)}"
            post = f"{ind}{res} = stablehlo.convert {r} : ({_with_elem(out_t, low)}) -> {out_t}"
            return lines[:i] + [pre] + body.split("\n") + [post] + lines[end + 1:]
        yield ("precision", f"{op} computed in {low}", build)


def _reinterpreted_compare(lines, i, km, other: str):
    """An integer compare done as `other` (SIGNED/UNSIGNED): XLA wants the compare type of the
    element type, so both operands are converted (modular, bits kept) to the integer type of the other signedness."""
    line = lines[i]
    tm = re.search(r": \((tensor<[^>]*>), (tensor<[^>]*>)\) -> (tensor<[^>]*>)", line)
    if not tm or _elem(tm.group(1)) not in _INT_BITS:
        return None
    e = _elem(tm.group(1))
    flipped = e[1:] if e.startswith("u") else "u" + e
    ta, tb = tm.group(1), tm.group(2)
    ua, ub = _with_elem(ta, flipped), _with_elem(tb, flipped)
    ind = _indent(line)
    a, b = f"%vm{i}_ua", f"%vm{i}_ub"

    def build():
        new = (line[:km.start(1)] + km.group(1) + ", " + a + ", " + b + ",  " + other
               + line[km.end(4):tm.start()] + f": ({ua}, {ub}) -> {tm.group(3)}"
               + line[tm.end():])
        return lines[:i] + [
            f"{ind}{a} = stablehlo.convert {km.group(2)} : ({ta}) -> {ua}",
            f"{ind}{b} = stablehlo.convert {km.group(3)} : ({tb}) -> {ub}",
            new] + lines[i + 1:]
    return build


def _sites_at(lines: list[str], i: int):
    """(kind, description, build, expect) of every value mutation of the op at line i."""
    line = lines[i]
    stripped = line.strip()
    if stripped.startswith(("func.func", "module", "sdy.mesh", "return", "sdy.return",
                            "stablehlo.return", "^bb", "}")) or not stripped:
        return
    tag = str(i)
    rm = _RESULT.match(line)
    # element types of an intermediate (and integer widths)
    if rm and not rm.group(3) and "sdy.manual_computation" not in line:
        name = rm.group(2)
        ty = _result_type(lines, i, _span(lines, i))
        e = _elem(ty) if ty else None
        for via, what in ROUND_TRIPS.get(e, ()):
            kind = "dtype" if e in FLOAT_TYPES else "int_width"
            yield (kind, f"{name} ({e}) round trip through {via}",
                   lambda ty=ty, via=via: _round_trip(lines, i, name, ty, via, tag), what)
    if rm and not rm.group(3) and "sdy.manual_computation" not in line:
        name = rm.group(2)
        ty = _result_type(lines, i, _span(lines, i))
        if ty and _elem(ty) == "f32":
            for fmt, (e_bits, m_bits) in REDUCE_PRECISION.items():
                def reduce_precision(ty=ty, e_bits=e_bits, m_bits=m_bits, name=name):
                    end = _span(lines, i)
                    stop = _scope_end(lines, end)
                    r = f"%vm{tag}_rp"
                    ins = f"{_indent(line)}{r} = stablehlo.reduce_precision {name}, format = " \
                          f"e{e_bits}m{m_bits} : {ty}"
                    rest = _rename_in(lines, end + 1, stop, name, r)
                    return rest[:end + 1] + [ins] + rest[end + 1:]
                yield ("reduce_precision", f"{name} reduce_precision to {fmt} (e{e_bits}m{m_bits})",
                       reduce_precision, "narrow")
    om = re.search(r"= stablehlo\.(\w+) ", line)
    if om and om.group(1) in OP_VARIANTS:
        for other in OP_VARIANTS[om.group(1)]:
            def variant(other=other, om=om):
                return lines[:i] + [line[:om.start(1)] + other + line[om.end(1):]] + \
                    lines[i + 1:]
            yield "op_variant", f"{om.group(1)} -> {other}", variant, ""
    # a collective's operand narrowed just before it, and the collective computed narrow
    cm = _COLLECTIVE1.match(line)
    if cm:
        operand = cm.group(4)
        whole = "\n".join(lines[i:_span(lines, i) + 1])
        tm = re.search(r"(?:\)|}>) : \((tensor<[^>]*>)\) -> ", whole)
        if tm and _elem(tm.group(1)) == "f32":
            t = tm.group(1)
            for via in ("bf16", "f16"):
                def before(via=via):
                    a, b = f"%vm{tag}_{via}_a", f"%vm{tag}_{via}_b"
                    ind = _indent(line)
                    low = _with_elem(t, via)
                    return lines[:i] + [
                        f"{ind}{a} = stablehlo.convert {operand} : ({t}) -> {low}",
                        f"{ind}{b} = stablehlo.convert {a} : ({low}) -> {t}",
                        line.replace(f"({operand})", f"({b})", 1)] + lines[i + 1:]
                yield ("dtype", f"{cm.group(3)} operand round trip through {via}", before,
                       "narrow")
        for kind, desc, build in _precision_sites(lines, i, tag):
            yield kind, desc, build, "narrow"
    for desc, build in _constant_sites(lines, i):
        yield "constant", desc, build, ""
    km = _CMP_FULL.search(line)
    if km:
        d, ct = km.group(1), km.group(4)

        def put(group, other):
            return lines[:i] + [line[:km.start(group)] + other + line[km.end(group):]] + \
                lines[i + 1:]
        for other in COMPARE_TYPES[ct]:
            if ct in ("SIGNED", "UNSIGNED"):
                build = _reinterpreted_compare(lines, i, km, other)
                if build is not None:
                    desc = f"compare {d} type {ct} -> {other} (operands converted)"
                    yield "compare_type", desc, build, ""
                continue
            yield ("compare_type", f"compare {d} type {ct} -> {other}",
                   lambda other=other: put(4, other), "")
        for other in DIRECTIONS:
            if other != d:
                yield ("compare_dir", f"compare {d} -> {other} ({ct})",
                       lambda other=other: put(1, other), "")
    for kind, desc, build in _region_sites(lines, i, tag):
        yield kind, desc, build, ""


def value_sites(text: str, kinds=None) -> list[ValueMutant]:
    """Every value mutation site of a program's text (lazy: texts are built by `.text()`)."""
    lines = text.split("\n")
    want = set(kinds or VALUE_KINDS)
    out: list[ValueMutant] = []
    for i in range(len(lines)):
        for kind, desc, build, expect in _sites_at(lines, i):
            if kind in want:
                def make(build=build):
                    new = build()
                    return None if new is None else "\n".join(new)
                out.append(ValueMutant(kind, f"line {i + 1}: {desc}", make, expect))
    return out


def value_mutants(text: str, kinds=None) -> Iterator[tuple[str, str, str]]:
    """(kind, description, mutated text) of every value mutant of a program's text."""
    for m in value_sites(text, kinds):
        t = m.text()
        if t is not None:
            yield m.kind, m.desc, t
