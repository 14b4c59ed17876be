"""Everything that differs between the supported jaxlib versions, one small function each.

entangle supports the jax/jaxlib range of pyproject.toml (`.ci/run` tests the newest and the
oldest). Every place where the bindings of two supported versions differ goes through a
function here, whose docstring names the versions; the rest of the package is written against
the newest. Importing this module does not import jax (only jaxlib).
"""

from __future__ import annotations

import re

import jaxlib
from jaxlib.mlir import ir
from jaxlib.mlir._mlir_libs import _jax_mlir_ext

from entangle_mlir.mlir.ir import context


def _version_tuple(text: str) -> tuple[int, ...]:
    """`"0.10.2"` -> (0, 10, 2); a suffix such as `.dev20261201` is dropped."""
    return tuple(int(part) for part in re.findall(r"\d+", text)[:3])


JAXLIB_VERSION = _version_tuple(jaxlib.__version__)
"""The installed jaxlib, as a tuple of ints."""


def inlined_func_call(callee: ir.Operation, args: list[ir.Value],
                      before: ir.Operation) -> list[ir.Value]:
    """Inline the body of the func.func `callee` applied to `args` just before the op `before`;
    the values it returns.

    jaxlib >= 0.10.1 inlines at the current insertion point; 0.10.0 and older take the block
    to inline into and append at its end, so there the new ops are moved before `before`."""
    with ir.InsertionPoint(before), before.location:
        if JAXLIB_VERSION >= (0, 10, 1):
            return list(_jax_mlir_ext.inlined_func_call(callee, args))
        block = before.block
        old = len(block.operations)
        results = list(_jax_mlir_ext.inlined_func_call(callee, args, block))
    for op in list(block.operations)[old:]:
        op.move_before(before)
    return results


def hlo_bindings():
    """The jaxlib module holding XLA's HLO classes (`HloSharding`, `OpSharding`, `HloModule`,
    `hlo_module_from_text`): `jaxlib._hlo` from jaxlib 0.10.2, `jaxlib._jax` in 0.10.1 and
    older."""
    if JAXLIB_VERSION >= (0, 10, 2):
        from jaxlib import _hlo  # lazy: XLA's HLO bindings; only HLO input and evidence use them
        return _hlo
    from jaxlib import _jax  # lazy: XLA's HLO bindings; only HLO input and evidence use them
    return _jax


def plain_replica_groups_options() -> dict[str, bool]:
    """XLA compile options that keep the partitioner's replica groups plain dense lists.

    From jaxlib 0.10.1, XLA may print them as mesh axes ("replica groups v3") unless
    `xla_enable_rgv3_materialization` is off; 0.10.0 and older print them plain and reject
    the option they do not know."""
    if JAXLIB_VERSION >= (0, 10, 1):
        return {"xla_enable_rgv3_materialization": False}
    return {}


def has_shardy_global_to_local() -> bool:
    """Whether Shardy's `sdy-convert-global-to-local` pass is registered: from jaxlib 0.10.0
    (0.9 and older stop at global shapes, so `xla.shardy_partition` cannot make a per-device
    program there)."""
    return JAXLIB_VERSION >= (0, 10, 0)


def block_argument(value: ir.Value) -> ir.BlockArgument | None:
    """`value` as an `ir.BlockArgument` (which has `arg_number`), or None when an op defines it.

    From jaxlib 0.10.0 the bindings hand out block arguments as `ir.BlockArgument` already;
    0.9 and older as plain `ir.Value`, cast here (the cast works on every version)."""
    if not isinstance(value.owner, ir.Block):
        return None
    return value if isinstance(value, ir.BlockArgument) else ir.BlockArgument(value)


_STACK_FRAME_SECTIONS = ("FileNames", "FunctionNames", "FileLocations", "StackFrames")


def hlo_text_without_stack_frames(text: str) -> str | None:
    """HLO text with its stack-frame index (the `FileNames` ... `StackFrames` sections newer
    XLA prints after the `HloModule` line) folded back into each op's metadata as
    `source_file`/`source_line`, or None when the text has no such index.

    jaxlib 0.8's HLO parser rejects those sections ("expects '{' at the beginning of
    instruction list"), so dumps written by a newer XLA are read there through this."""
    lines = text.splitlines()
    tables: dict[str, dict[int, str]] = {}
    kept: list[str] = []
    section = None
    for line in lines:
        if line.strip() in _STACK_FRAME_SECTIONS:
            section = tables.setdefault(line.strip(), {})
            continue
        if section is not None:
            entry = re.match(r"\s*(\d+)\s+(.*)$", line)
            if entry:
                section[int(entry.group(1))] = entry.group(2)
                continue
            section = None
        kept.append(line)
    if not tables:
        return None
    files = {k: v.strip('"') for k, v in tables.get("FileNames", {}).items()}

    def field(entry: str, name: str) -> int | None:
        found = re.search(rf"\b{name}=(\d+)", entry)
        return int(found.group(1)) if found else None

    def source(match: re.Match) -> str:
        frame = tables.get("StackFrames", {}).get(int(match.group(1)), "")
        location = tables.get("FileLocations", {}).get(field(frame, "file_location_id") or 0, "")
        file_id, line_number = field(location, "file_name_id"), field(location, "line")
        if file_id not in files or line_number is None:
            return ""
        return f'source_file="{files[file_id]}" source_line={line_number}'

    return re.sub(r"\bstack_frame_id=(\d+)", source, "\n".join(kept))


def has_stablehlo_future_type() -> bool:
    """Whether the bundled StableHLO dialect knows `!stablehlo.future` (the type of
    `stablehlo.async_start`, XLA's asynchronous collectives as jaxlib converts them): not in
    jaxlib 0.8, whose parser rejects MLIR text holding it ("unknown stablehlo type: future")."""
    with context():
        try:
            ir.Type.parse("!stablehlo.future<tensor<f32>>")
        except ir.MLIRError:
            return False
    return True
