"""Loading MLIR with every dialect jax emits, through the bindings shipped inside jaxlib.

Importing this module does not import jax.
"""

from __future__ import annotations

import ctypes
import functools
import re
from collections.abc import Callable

import numpy as np
from jaxlib.mlir import ir
from jaxlib.mlir._mlir_libs import _chlo, _jax_mlir_ext, _mlirHlo, _sdy, _stablehlo

from entangle_mlir.core.diagnostics import InputError, SourceLoc


@functools.cache
def context() -> ir.Context:
    """One shared context with func, stablehlo, sdy, chlo and mhlo registered.

    The dialects are registered through jaxlib's native modules: the bindings import a
    dialect's Python op classes (`jaxlib.mlir.dialects.mhlo`, 10 ms) when they first meet one
    of its ops, so a program without mhlo or chlo ops does not pay for them."""
    ctx = ir.Context()
    registry = ir.DialectRegistry()
    _jax_mlir_ext.register_dialects(registry)
    ctx.append_dialect_registry(registry)
    ctx.load_all_available_dialects()
    _stablehlo.register_dialect(ctx)
    _sdy.register_dialect(ctx)
    _chlo.register_dialect(ctx)
    _mlirHlo.register_mhlo_dialect(ctx)
    ctx.allow_unregistered_dialects = False
    return ctx


_ERROR_POS = re.compile(r'error: "([^"]*)":(\d+):(\d+): (.*)')


def parse_module(source: str | bytes, filename: str = "-") -> ir.Module:
    """Parse MLIR text or bytecode; a parse failure becomes one `InputError` at its position,
    and so does text nested deeper than `MAX_NESTING` (MLIR's parser recurses once per
    level and overflows the C stack, a segmentation fault, near 5000 levels)."""
    if isinstance(source, str) and not source.strip():
        raise InputError("empty input: no MLIR module", file=filename)
    if isinstance(source, str) or not source.startswith(b"ML\xefR"):
        _check_nesting(source.encode("utf-8", "surrogateescape") if isinstance(source, str)
                       else source, filename)
    try:
        with context():
            return ir.Module.parse(source)
    except ir.MLIRError as err:
        raise _parse_error(str(err), filename, source) from None
    except (ValueError, RuntimeError) as err:
        raise InputError(f"cannot parse MLIR: {err}", file=filename) from None


MAX_NESTING = 1000
"""Deepest nesting of brackets (`{}`, `()`, `[]`, `<>`: regions, operand lists, attributes,
types) accepted in MLIR text. Real programs nest a few dozen levels; the analysis's own
recursion stops well before this (`input nests too deeply`), and MLIR's recursive parser
crashes near 5000."""

_KEPT = frozenset(b'{}()[]<>"')
_DROPPED = bytes(c for c in range(256) if c not in _KEPT)
_STEP = np.zeros(256, np.int8)
_STEP[list(b"{([<")] = 1
_STEP[list(b"})]>")] = -1
_STRINGS_AND_COMMENTS = re.compile(rb'"[^"\\\n]*(?:\\.[^"\\\n]*)*"|//[^\n]*')


def _check_nesting(raw: bytes, filename: str) -> None:
    """Refuse text nested deeper than `MAX_NESTING` (outside strings and comments; `->` is
    not a bracket), naming where. Vectorised: about 5 ms per MB."""
    text = raw
    if b"\\" in text or b"//" in text:
        text = _STRINGS_AND_COMMENTS.sub(b"", text)  # escapes or comments: lex them exactly
    kept = np.frombuffer(text.replace(b"->", b"").translate(None, _DROPPED), np.uint8)
    step = _STEP[kept]
    if np.count_nonzero(step > 0) <= MAX_NESTING:
        return
    quotes = kept == ord('"')
    if quotes.any():  # a string runs from an odd-numbered quote to the next one
        step[(np.cumsum(quotes, dtype=np.int64) & 1).astype(bool)] = 0
    depth = np.cumsum(step, dtype=np.int64)
    if depth.max() <= MAX_NESTING:
        return
    raise InputError(f"nested more than {MAX_NESTING} levels deep (regions, brackets or "
                     f"types): entangle reads programs nested at most {MAX_NESTING} deep",
                     _deep_position(raw, filename), file=filename)


def _deep_position(raw: bytes, filename: str) -> SourceLoc | None:
    """Where the nesting first goes past `MAX_NESTING` (the error path: a plain scan)."""
    depth = 0
    for match in re.finditer(rb'"[^"\\\n]*(?:\\.[^"\\\n]*)*"|//[^\n]*|->|[{}()\[\]<>]',
                             raw):
        token = match.group()
        if len(token) == 1:
            depth += int(_STEP[token[0]])
            if depth > MAX_NESTING:
                row = raw.count(b"\n", 0, match.start()) + 1
                col = match.start() - (raw.rfind(b"\n", 0, match.start()) + 1) + 1
                return SourceLoc(filename, row, col)
    return None


def _parse_error(text: str, filename: str, source: str | bytes = "") -> InputError:
    for line in text.splitlines():
        match = _ERROR_POS.search(line)
        if match:
            file = filename if match.group(1) in ("-", "") else match.group(1)
            row, col = int(match.group(2)), int(match.group(3))
            message = match.group(4)
            if "unregistered dialect" in message:
                name = _op_name_at(source, row, col)
                message = (f"unknown op {name}: its dialect is not one entangle reads "
                           "(func, stablehlo, chlo, mhlo, sdy, arith, ...)" if name else
                           "an op of an unknown dialect")
            loc = SourceLoc(file, row, col) if row > 0 else None
            return InputError(f"cannot parse MLIR: {message}", loc, file=filename)
    detail = " ".join(line.strip() for line in text.splitlines()[1:] if line.strip())
    return InputError(f"cannot parse MLIR: {detail or text}", file=filename)


def _op_name_at(source: str | bytes, row: int, col: int) -> str:
    """The op name written at a position of the source text (for parse errors)."""
    if not isinstance(source, str) or row < 1:
        return ""
    lines = source.splitlines()
    if row > len(lines):
        return ""
    line = lines[row - 1]
    match = (re.search(r'"([A-Za-z_][\w$]*\.[\w.$]+)"', line)
             or re.search(r'(?:=|^)\s*([A-Za-z_][\w$]*\.[\w.$]+)', line))
    return match.group(1) if match else ""


def ops_in_order(module: ir.Module) -> list[tuple[str, ir.Operation]]:
    """Every op of `module` with its name, in `walk` order: one walk that the normalizing
    rewrites filter in turn, as long as none of them changes the module."""
    found: list[tuple[str, ir.Operation]] = []

    def collect(op):
        found.append((op.name, op))
        return ir.WalkResult.ADVANCE

    module.operation.walk(collect)
    return found


def while_loops(module: ir.Module) -> list[ir.Operation]:
    """Every `stablehlo.while` of `module`, in `walk` order (inner loops before the loops
    holding them)."""
    return [op for name, op in ops_in_order(module) if name == "stablehlo.while"]


def op_key(op: ir.Operation) -> int:
    """An op's identity while it is alive: its address, the same for every handle of it and
    through every edit. (`hash(op)` is not: it changes with the op's operands and
    attributes.) Taken before an op may be erased, so that an erased op is recognised
    without touching it."""
    return _capsule_pointer(getattr(op, "operation", op)._CAPIPtr, _OPERATION_CAPSULE)


_capsule_pointer = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.py_object, ctypes.c_char_p)(
    ("PyCapsule_GetPointer", ctypes.pythonapi))
_OPERATION_CAPSULE = b"jaxlib.mlir.ir.Operation._CAPIPtr"
"""The name of the capsule holding an `ir.Operation`'s address (`Operation._CAPIPtr`)."""


def producer(value) -> ir.Operation | None:
    """The op that defines `value` (None for a block argument)."""
    owner = value.owner
    if isinstance(owner, ir.Block):
        return None
    return owner.operation if hasattr(owner, "operation") else owner


def _unused(op: ir.Operation) -> bool:
    return not any(True for r in op.results for _ in r.uses)


def erase_dead(root: ir.Operation, erasable: Callable[[str], bool],
               erased: set[int] | None = None,
               survivors: dict[int, ir.Operation] | None = None) -> int:
    """Erase `root` if nothing uses its results, then in turn every producer of an erased op's
    operands left without uses whose name is `erasable`; the number of ops erased.

    Memory-safe (the rewrites used to crash here): an op reached twice, as the producer of
    two operands or of two erased ops (a diamond such as `m + log(sum(exp(x - m)))`), is
    recognised by the key it had while alive and never touched once erased. `erased`
    (updated) holds the keys of every op erased, those nested in an erased op's regions
    included, so a caller holding a list of handles can skip the ones gone. A key never names
    a live op by accident: every op pending was alive together with every op erased here
    (nothing is created meanwhile), so their addresses differ. `survivors` (updated): the
    producers of erased ops' operands left alive, by key (they lost uses)."""
    gone = erased if erased is not None else set()
    pending = [(op_key(root), root)]
    root_key = pending[0][0]
    count = 0
    while pending:
        key, op = pending.pop()
        if key in gone:
            continue
        if not erasable(op.name) or not _unused(op):
            if survivors is not None and key != root_key:
                survivors[key] = op
            continue
        producers = [p for p in map(producer, op.operands) if p is not None]
        pending += [(op_key(p), p) for p in producers]
        if op.regions:
            op.walk(lambda inner: (gone.add(op_key(inner)), ir.WalkResult.ADVANCE)[1])
        gone.add(key)
        op.erase()
        count += 1
    return count
