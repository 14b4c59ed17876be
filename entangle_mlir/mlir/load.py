"""Reading a program file: MLIR text or bytecode, or an XLA HLO dump (text or proto), which
jaxlib converts to StableHLO.

Above `ir` and `xla`, the one place that knows both formats.
"""

from __future__ import annotations

import os
import stat

from jaxlib.mlir import ir

from entangle_mlir.core.diagnostics import InputError
from entangle_mlir.mlir import xla
from entangle_mlir.mlir.ir import parse_module
from entangle_mlir.mlir.per_device import PARTITIONED_DUMP

MAX_INPUT_BYTES = 512 * 1024 * 1024
MAX_SPECIAL_BYTES = 64 * 1024 * 1024


def load_file(path: str) -> ir.Module:
    """Read and parse a file, reporting unreadable, binary-garbage or oversized input cleanly."""
    return load_data(read_file(path), path)


def read_file(path: str) -> bytes:
    """A program file's bytes (`load_data` parses them), or an `InputError` saying why not: a
    directory, a pipe, too large, unreadable."""
    if os.path.isdir(path):
        raise InputError("is a directory, not an MLIR file", file=path)
    try:
        mode = os.stat(path).st_mode
        if stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode):
            raise InputError("is a pipe or socket, not an MLIR file", file=path)
        size = os.path.getsize(path)
        if size > MAX_INPUT_BYTES:
            raise InputError(f"file is too large ({size} bytes)", file=path)
        with open(path, "rb") as handle:
            data = handle.read(MAX_SPECIAL_BYTES + 1 if not stat.S_ISREG(mode) else -1)
        if not stat.S_ISREG(mode) and len(data) > MAX_SPECIAL_BYTES:
            raise InputError("not a regular file, and it does not end within "
                             f"{MAX_SPECIAL_BYTES} bytes", file=path)
    except OSError as err:
        raise InputError(f"cannot read file: {err.strerror}", file=path) from None
    return data


def load_data(data: bytes, path: str) -> ir.Module:
    """Parse a program file's bytes (MLIR text or bytecode, an XLA HLO dump); `path` names it
    in diagnostics (`check-many` sends a file's bytes to where it is checked)."""
    if data.startswith(b"ML\xefR"):
        return parse_module(data, path)
    report = xla.dump_report_kind(data)
    if report is not None:
        raise InputError(f"is XLA's {report} (a file --xla_dump_to writes beside the HLO "
                         "modules), not a program; pass the module XLA partitioned: run with "
                         + PARTITIONED_DUMP, file=path)
    # XLA HLO dumps: a serialized HloProto / HloModuleProto (`.hlo.pb`, `.pb`) or HLO text
    # (`HloModule ...`), converted to StableHLO by jaxlib.
    if xla.is_hlo_proto_path(path) or xla.is_hlo_text(data):
        return xla.load_hlo(data, path)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        if xla.looks_like_hlo_proto(data):
            return xla.load_hlo(data, path)
        raise InputError(f"not UTF-8 text (byte {err.start}), not MLIR bytecode and not an "
                         "XLA HLO proto", file=path) from None
    return parse_module(text, path)
