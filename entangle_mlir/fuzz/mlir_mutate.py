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

from ..mesh import Mesh

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
