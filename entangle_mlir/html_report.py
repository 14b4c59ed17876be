"""`entangle check --html`: one self-contained page (inline CSS and JS, nothing fetched) with
the reference and the sharded program side by side, each op coloured by its relation, the
diverging op next to its diagnostic, and every input and output as a device grid of its
sharding (drawn as `jax.debug.visualize_array_sharding` draws it).

Two steps: `page_data` gathers what the page shows (plain dataclasses; testable without a
browser), `render` turns that into HTML, escaping every piece of program text.
"""

from __future__ import annotations

import ast
import html
import io
from dataclasses import dataclass, field, replace

from jaxlib.mlir import ir

from entangle_mlir.analysis.infer import Walk, partition_spec_text
from entangle_mlir.core.mesh import Mesh
from entangle_mlir.core.reasons import INCONCLUSIVE
from entangle_mlir.core.relations import Opaque, Rel
from entangle_mlir.core.report import INCONCLUSIVE_WORDS, Report
from entangle_mlir.mlir.ir import context
from entangle_mlir.mlir.opinfo import op_location
from entangle_mlir.mlir.program import Program

TILED, PARTIAL, REPLICATED, GLOBAL, OTHER, UNRELATED, NONE = (
    "tiled", "partial", "replicated", "global", "other", "unrelated", "none")
KINDS = {
    TILED: "tiled: each device holds a block",
    PARTIAL: "partial sum: each device holds a summand",
    REPLICATED: "replicated: every device holds the whole value",
    GLOBAL: "whole value outside shard_map (sharded side) / the reference's own",
    OTHER: "related otherwise (shifted, windowed, per-device blocks, ...)",
    UNRELATED: "not related to the reference",
    NONE: "no relation (terminator, or not walked: a repeated layer reused)",
}
"""The colours of the page, by relation kind, with the legend's words."""

LINE_CHARS = 220
"""An op's printed text is cut after this many characters (large constants, long attributes)."""


@dataclass(frozen=True)
class OpLine:
    """One op of a program as the page lists it."""

    anchor: str
    depth: int
    text: str
    loc: str
    kind: str
    relation: str
    """The relation of each result (`OpRecord.relation_text`), '' without a record."""
    diagnostics: tuple[int, ...] = ()
    """The diagnostics (indices into `Page.diagnostics`) that point at this op."""
    counterpart: bool = False
    """The reference op the first diverging op should correspond to."""


@dataclass(frozen=True)
class DiagnosticView:
    """A diagnostic as the page shows it: its own line, notes, and the op it points at."""

    text: str
    notes: tuple[str, ...]
    anchor: str
    """The `OpLine.anchor` of the op it points at, '' when it names none on the page."""


@dataclass(frozen=True)
class DeviceGrid:
    """A value's sharding as a grid of boxes, each labelled by the devices holding that block:
    rows are the blocks of every dim but the last (row-major), columns the last dim's."""

    label: str
    shape: tuple[int, ...]
    spec: str
    boxes: tuple[tuple[tuple[int, ...], ...], ...]
    """Rows of boxes; each box the device ids holding that block."""


@dataclass
class Page:
    """Everything the page shows."""

    verdict: str
    outcome: str
    headline: str
    mesh: str
    diagnostics: list[DiagnosticView] = field(default_factory=list)
    reference: list[OpLine] = field(default_factory=list)
    sharded: list[OpLine] = field(default_factory=list)
    reference_file: str = ""
    sharded_file: str = ""
    inputs: list[DeviceGrid] = field(default_factory=list)
    outputs: list[DeviceGrid] = field(default_factory=list)
    results: list[tuple[str, str, str, bool]] = field(default_factory=list)
    """Per output: label, ρ, PartitionSpec, proven."""
    notes: list[str] = field(default_factory=list)
    evidence: list[str] = field(default_factory=list)
    assumptions: list[str] = field(default_factory=list)
    rule_checks: list[str] = field(default_factory=list)


# ----- the data step ---------------------------------------------------------------------------

def value_kind(value) -> str:
    """The colour of one value's relation to the reference."""
    if value is None:
        return NONE
    if isinstance(value, Opaque):
        return UNRELATED
    if not isinstance(value, Rel):
        return OTHER
    if value.is_global:
        return GLOBAL
    if value.partial:
        return PARTIAL
    return TILED if value.tiled_axes else REPLICATED


def record_kind(record) -> str:
    """An op's colour: its most telling result (unrelated before partial before tiled...)."""
    if record is None or not record.outputs:
        return NONE
    kinds = {value_kind(v) for v in record.outputs}
    for kind in (UNRELATED, PARTIAL, TILED, OTHER, REPLICATED, GLOBAL):
        if kind in kinds:
            return kind
    return NONE


def page_data(report: Report, walks: dict[str, Walk], program: Program) -> Page:
    """What the page of `report` shows; `walks` are the check's walks ("reference",
    "sharded"), `program` the walked (normalized) pair."""
    ref_walk, sharded_walk = walks.get("reference"), walks.get("sharded")
    with context():
        sharded_records = _records_by_op(sharded_walk)
        ref_records = _records_by_op(ref_walk)
        held = _sharded_kinds(sharded_walk)
        sharded = list(_lines(program.sharded_func, program.sharded_file, "s",
                              lambda op: (r := sharded_records.get(op), record_kind(r))))
        reference = list(_lines(program.ref_func, program.ref_file, "r",
                                lambda op: (r := ref_records.get(op), _ref_kind(r, held))))
        anchors = {op: line.anchor for op, line in sharded + reference}
        ref_anchors = {op: line.anchor for op, line in reference}
        views, pointed, counterparts = [], {}, set()
        for index, diagnostic in enumerate(report.diagnostics):
            focus = report.foci.get((diagnostic.message, str(diagnostic.loc)))
            record = getattr(focus, "sharded", None)
            anchor = anchors.get(getattr(getattr(record, "info", None), "op", None), "")
            if not anchor and diagnostic.loc is not None:
                anchor = next((line.anchor for _, line in sharded if line.loc == str(
                    diagnostic.loc)), "")
            twin = getattr(getattr(focus, "reference", None), "info", None)
            if index == 0 and twin is not None and twin.op in ref_anchors:
                counterparts.add(ref_anchors[twin.op])
            if anchor:
                pointed.setdefault(anchor, []).append(index)
            lines = diagnostic.render().split("\n")
            views.append(DiagnosticView(lines[0], tuple(lines[1:]), anchor))
        inputs = _input_grids(program, sharded_walk)
        outputs = _output_grids(report, ref_walk, sharded_walk)

    def finish(lines: list[tuple[object, OpLine]]) -> list[OpLine]:
        return [replace(line, diagnostics=tuple(pointed.get(line.anchor, ())),
                        counterpart=line.anchor in counterparts) for _, line in lines]

    if report.proven:
        headline = ("verified: the sharded program refines the reference"
                    f"{' on mesh ' + report.mesh if report.mesh else ''}")
    else:
        reason = report.diagnostics[0].message if report.diagnostics else "unknown reason"
        headline = f"not proven: {reason}"
    notes = list(report.notes)
    if report.outcome == INCONCLUSIVE:
        notes.append(f"inconclusive: {INCONCLUSIVE_WORDS}")
    return Page(
        verdict=report.verdict, outcome=report.outcome, headline=headline, mesh=report.mesh,
        diagnostics=views, reference=finish(reference), sharded=finish(sharded),
        reference_file=program.ref_file, sharded_file=program.sharded_file,
        inputs=inputs, outputs=outputs,
        results=[(o.label, o.rho, o.partition_spec, o.proven) for o in report.outputs],
        notes=notes, evidence=_evidence(report), assumptions=list(report.assumptions),
        rule_checks=([report.mode] if report.mode else []) + report.render_unchecked())


def _records_by_op(walk: Walk | None) -> dict:
    """Each walked op's record (a loop body's op: its last record)."""
    found = {}
    for record in walk.records if walk is not None else ():
        if record.info.op is not None:
            found[record.info.op] = record
    return found


def _sharded_kinds(walk: Walk | None) -> dict[int, str]:
    """How the sharded program holds each reference term it computes, by term serial."""
    held: dict[int, str] = {}
    for record in walk.records if walk is not None else ():
        for value in record.outputs:
            if isinstance(value, Rel):
                held.setdefault(value.term.serial, value_kind(value))
    return held


def _ref_kind(record, held: dict[int, str]) -> str:
    """A reference op's colour: how the sharded program holds its value (global where the
    sharded program never computes it on its own)."""
    if record is None or not record.outputs:
        return NONE
    for value in record.outputs:
        if isinstance(value, Rel) and value.term.serial in held:
            return held[value.term.serial]
    return GLOBAL if any(isinstance(v, Rel) for v in record.outputs) else record_kind(record)


def _lines(func, file: str, prefix: str, classify):
    """The ops of `func` (each with its `OpLine`), nested regions indented, in the order they
    print."""
    state = ir.AsmState(func)
    count = 0

    def block_lines(block, depth):
        nonlocal count
        for op in block.operations:
            op = op.operation
            record, kind = classify(op)
            loc = op_location(op, file)
            yield op, OpLine(f"{prefix}{count}", depth, _op_text(op, state),
                             str(loc) if loc else "", kind,
                             record.relation_text() if record is not None else "")
            count += 1
            for region in op.regions:
                for inner in region.blocks:
                    yield from block_lines(inner, depth + 1)

    yield from block_lines(func.regions[0].blocks[0], 0)


def _op_text(op, state) -> str:
    """The op's first printed line, with its SSA names as the whole function prints them."""
    buffer = io.StringIO()
    try:
        op.print(state=state, file=buffer)
        text = buffer.getvalue()
    except TypeError:  # bindings without AsmState printing
        text = op.get_asm(large_elements_limit=16)
    first = text.split("\n", 1)[0].rstrip()
    if first.endswith("{"):
        first = first[:-1].rstrip()
    return first if len(first) <= LINE_CHARS else first[:LINE_CHARS] + " …"


def grid_boxes(shape: tuple[int, ...], tiling, mesh: Mesh | None
               ) -> tuple[tuple[tuple[int, ...], ...], ...]:
    """The device grid of a value of `shape` laid out by `tiling` (the mesh axes splitting
    each dim): rows are the blocks of every dim but the last, columns the last dim's; each
    box lists the devices holding that block."""
    if mesh is None:
        return (((0,),),)
    counts = [mesh.group_size(axes) for axes in tiling] or [1]
    if len(counts) == 1:
        counts = [1] + counts
        tiling = [()] + list(tiling or [()])
    rows = 1
    for count in counts[:-1]:
        rows *= count
    columns = counts[-1]
    boxes: list[list[list[int]]] = [[[] for _ in range(columns)] for _ in range(rows)]
    for device in range(mesh.num_devices):
        row = 0
        for count, axes in zip(counts[:-1], tiling[:-1]):
            row = row * count + mesh.block_index(tuple(axes), device)
        boxes[row][mesh.block_index(tuple(tiling[-1]), device)].append(device)
    return tuple(tuple(tuple(box) for box in row) for row in boxes)


def spec_tiling(spec: str, rank: int) -> tuple[tuple[str, ...], ...] | None:
    """The tiling a PartitionSpec text names (`P('dp', None)`, `P(('dp', 'tp'),)`), padded
    with unsplit dims to `rank`; None when it is not one."""
    if not (spec.startswith("P(") and spec.endswith(")")):
        return None
    try:
        parts = ast.literal_eval(f"[{spec[2:-1]}]")
    except (ValueError, SyntaxError):
        return None
    tiling = []
    for part in parts:
        if part is None:
            tiling.append(())
        elif isinstance(part, str):
            tiling.append((part,))
        elif isinstance(part, tuple) and all(isinstance(a, str) for a in part):
            tiling.append(part)
        else:
            return None
    return tuple(tiling) + ((),) * (rank - len(tiling))


def _input_grids(program: Program, walk: Walk | None) -> list[DeviceGrid]:
    """Each sharded input's layout: where it enters shard_map (or, partitioned per device, as
    its parameter sharding reads)."""
    if walk is None:
        return []
    block = program.sharded_func.regions[0].blocks[0]
    entered = {}
    for op in block.operations:
        op = op.operation
        if op.name == "sdy.manual_computation":
            for operand, arg in zip(op.operands, op.regions[0].blocks[0].arguments):
                entered.setdefault(operand, walk.values.get(arg))
    grids = []
    for i, arg in enumerate(block.arguments):
        value = walk.values.get(arg)
        inner = value if isinstance(value, Rel) and not value.is_global else entered.get(arg)
        shape = tuple(value.term.shape) if isinstance(value, Rel) else ()
        if isinstance(inner, Rel):
            tiling = inner.tiling
            spec = partition_spec_text(tiling) if tiling else "P()"
        else:
            tiling, spec = ((),) * len(shape), "whole value (outside shard_map)"
        grids.append(DeviceGrid(f"input #{i}", shape, spec,
                                grid_boxes(shape, tiling, walk.mesh)))
    return grids


def _output_grids(report: Report, ref: Walk | None, walk: Walk | None) -> list[DeviceGrid]:
    """Each output's declared layout (its PartitionSpec), at the reference's global shape."""
    grids = []
    for out in report.outputs:
        want = ref.outputs[out.index] if ref is not None and out.index < len(ref.outputs) \
            else None
        shape = tuple(want.term.shape) if isinstance(want, Rel) else ()
        tiling = spec_tiling(out.partition_spec, len(shape))
        spec = out.partition_spec or "whole value (outside shard_map)"
        grids.append(DeviceGrid(out.label, shape, spec, grid_boxes(
            shape, tiling if tiling is not None else ((),) * len(shape),
            walk.mesh if walk is not None else None)))
    return grids


def _evidence(report: Report) -> list[str]:
    lines = []
    confirmation = report.evidence.get("confirmation") or {}
    if confirmation.get("summary") and not confirmation.get("confirmed"):
        lines.append(confirmation["summary"])
    for summary in ((report.evidence.get("at_op") or {}).get("summary"),
                    report.evidence.get("summary")):
        if summary:
            lines.append(summary)
    return lines


# ----- the rendering step ----------------------------------------------------------------------

_COLOURS = {TILED: "#cfe8ff", PARTIAL: "#ffe3b3", REPLICATED: "#d9f2d9", GLOBAL: "#ececf4",
            OTHER: "#ead9f7", UNRELATED: "#ffc9c9", NONE: "#ffffff"}
_BOX_COLOURS = ("#8dd3c7", "#ffffb3", "#bebada", "#fb8072", "#80b1d3", "#fdb462", "#b3de69",
                "#fccde5", "#d9d9d9", "#bc80bd", "#ccebc5", "#ffed6f")

_CSS = """
body { font: 14px/1.4 system-ui, sans-serif; margin: 1em 2em; color: #222; }
h1 { font-size: 1.3em; } h2 { font-size: 1.1em; margin-top: 1.2em; }
.verdict { padding: .6em 1em; border-radius: 6px; font-weight: 600; }
.verdict.proven { background: #d9f2d9; } .verdict.bug { background: #ffc9c9; }
.verdict.inconclusive { background: #fff1b3; }
.diag { font-family: monospace; margin: .3em 0; } .diag a { color: #a00; }
.diag .note, .msg .note { color: #555; margin-left: 2em; white-space: pre-wrap; }
.programs { display: grid; grid-template-columns: 1fr 1fr; gap: 1em; }
.program { overflow-x: auto; border: 1px solid #ccc; border-radius: 6px; padding: .4em; }
.program h2 { margin: .2em 0 .4em; }
.op { font: 12px/1.5 monospace; white-space: pre; padding: 0 .3em; border-left: 4px solid
      transparent; cursor: pointer; }
.op .loc { color: #666; display: inline-block; min-width: 16em; padding-right: .6em; }
.op .rel { display: none; color: #444; white-space: pre-wrap; margin-left: 17em; }
.op.open .rel { display: block; }
.diverging { border-left-color: #c00; outline: 2px solid #c00; }
.counterpart { border-left-color: #06c; outline: 2px dashed #06c; }
.op:target { outline: 3px solid #000; }
.msg { font: 12px/1.4 system-ui, sans-serif; white-space: pre-wrap; background: #fff4f4;
       border: 1px solid #c00; border-radius: 4px; padding: .3em .6em; margin: .2em 0 .4em 1em; }
.legend span { display: inline-block; padding: 0 .5em; margin: 0 .3em .3em 0;
               border: 1px solid #bbb; border-radius: 3px; font-size: 12px; }
.grids { display: flex; flex-wrap: wrap; gap: 1.2em; }
.grid { font-size: 12px; } .grid table { border-collapse: collapse; }
.grid td { border: 1px solid #333; min-width: 3.5em; height: 2.2em; text-align: center;
           font-family: monospace; }
ul { margin: .3em 0; }
"""

_JS = """
document.querySelectorAll('.op').forEach(function (op) {
  op.addEventListener('click', function () { op.classList.toggle('open'); });
});
"""


def _e(text: str) -> str:
    return html.escape(str(text), quote=True)


def render(page: Page) -> str:
    """The page as one self-contained HTML document."""
    kind_class = {True: "proven"}.get(page.verdict == "proven", page.outcome)
    parts = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
             f"<title>entangle: {_e(page.headline)}</title>",
             "<style>", _CSS,
             "".join(f".k-{kind} {{ background: {colour}; }}\n"
                     for kind, colour in _COLOURS.items()),
             "</style></head><body>",
             "<h1>entangle check</h1>",
             f'<div class="verdict {_e(kind_class)}" id="verdict">{_e(page.headline)}</div>']
    if page.diagnostics:
        parts.append('<div id="diagnostics">')
        for view in page.diagnostics:
            text = (f'<a href="#{_e(view.anchor)}">{_e(view.text)}</a>' if view.anchor
                    else _e(view.text))
            parts.append(f'<div class="diag">{text}')
            parts.extend(f'<div class="note">{_e(note)}</div>' for note in view.notes)
            parts.append("</div>")
        parts.append("</div>")
    parts.append("<h2>Outputs</h2><ul id=\"outputs\">")
    for label, rho, spec, proven in page.results:
        mark = "" if proven else " <b>(not proven)</b>"
        spec_text = f" [{_e(spec)}]" if spec else ""
        parts.append(f"<li><code>{_e(label)}</code> = ρ: {_e(rho)}{spec_text}{mark}</li>")
    parts.append("</ul>")
    for title, items, ident in (("Notes", page.notes, "notes"),
                                ("Evidence", page.evidence, "evidence"),
                                ("Assumptions", page.assumptions if page.verdict == "proven"
                                 else [], "assumptions"),
                                ("Rule checks", page.rule_checks, "rule-checks")):
        if items:
            parts.append(f'<h2>{title}</h2><ul id="{ident}">')
            parts.extend(f"<li>{_e(item)}</li>" for item in items)
            parts.append("</ul>")
    parts.append("<h2>Shardings</h2>")
    if page.mesh:
        parts.append(f"<p>mesh {_e(page.mesh)}</p>")
    parts.append('<div class="grids" id="grids">')
    parts.extend(_grid(g) for g in page.inputs + page.outputs)
    parts.append("</div>")
    parts.append('<h2>Programs</h2><div class="legend">'
                 + "".join(f'<span class="k-{kind}">{_e(words)}</span>'
                           for kind, words in KINDS.items())
                 + '<span class="diverging">diverging op</span>'
                 + '<span class="counterpart">its reference counterpart</span></div>'
                 "<p>Reference ops are coloured by how the sharded program holds the same "
                 "value. Click an op for its relation.</p>")
    parts.append('<div class="programs">')
    for title, file, lines, ident in (("reference", page.reference_file, page.reference,
                                       "reference"),
                                      ("sharded", page.sharded_file, page.sharded, "sharded")):
        parts.append(f'<div class="program" id="{ident}"><h2>{title}: '
                     f"<code>{_e(file)}</code></h2>")
        parts.extend(_op_line(line, page) for line in lines)
        parts.append("</div>")
    parts.append("</div>")
    parts.append(f"<script>{_JS}</script></body></html>")
    return "\n".join(parts)


def _op_line(line: OpLine, page: Page) -> str:
    classes = ["op", f"k-{line.kind}"]
    if line.diagnostics:
        classes.append("diverging")
    if line.counterpart:
        classes.append("counterpart")
    relation = line.relation or KINDS[NONE]
    head = (f'<div class="{" ".join(classes)}" id="{_e(line.anchor)}" '
            f'data-kind="{_e(line.kind)}">'
            f'<span class="loc">{_e(line.loc)}</span>{"  " * line.depth}{_e(line.text)}'
            f'<span class="rel">{_e(relation)}</span></div>')
    out = [head]
    for index in line.diagnostics:
        view = page.diagnostics[index]
        out.append(f'<div class="msg">{_e(view.text)}')
        out.extend(f'<div class="note">{_e(note)}</div>' for note in view.notes)
        if index == 0:
            out.extend(f'<div class="note">evidence: {_e(item)}</div>'
                       for item in page.evidence)
        out.append("</div>")
    return "".join(out)


def _grid(grid: DeviceGrid) -> str:
    colours: dict[tuple[int, ...], str] = {}
    rows = []
    for row in grid.boxes:
        cells = []
        for box in row:
            colour = colours.setdefault(box, _BOX_COLOURS[len(colours) % len(_BOX_COLOURS)])
            label = ",".join(map(str, box))
            cells.append(f'<td style="background:{colour}">{_e(label)}</td>')
        rows.append(f"<tr>{''.join(cells)}</tr>")
    shape = "x".join(map(str, grid.shape)) or "scalar"
    return (f'<div class="grid"><div><b>{_e(grid.label)}</b> {_e(shape)}</div>'
            f"<div><code>{_e(grid.spec)}</code></div><table>{''.join(rows)}</table></div>")


def to_html(report: Report, walks: dict[str, Walk], program: Program) -> str:
    """The page of a check (`Report.to_html` calls this through the driver's callback)."""
    return render(page_data(report, walks, program))
