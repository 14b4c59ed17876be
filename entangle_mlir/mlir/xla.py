"""XLA HLO (text or proto) -> StableHLO module, through jaxlib only (never imports jax).

XLA's `--xla_dump_to` writes the after-spmd-partitioning program as HLO text (`*.txt`) or, with
`--xla_dump_hlo_as_proto`, as a serialized `xla.HloProto` (`*.hlo.pb`) whose field 1 is the
`HloModuleProto`. Both are converted with jaxlib's `hlo_to_stablehlo`, which returns MLIR
bytecode: per-device parameters keep their `mhlo.sharding`, the module keeps
`mhlo.num_partitions`, `mhlo.spmd_parameters_shardings` and `mhlo.spmd_output_sharding`.

The protos are read with a tiny varint reader (no protobuf dependency): only enough to peel the
wrappers (`HloSnapshot` -> `HloProto` -> `HloModuleProto`).
"""

from __future__ import annotations

import contextlib
import subprocess
import sys

from entangle_mlir.core.diagnostics import InputError
from entangle_mlir.mlir.compat import (
    JAXLIB_VERSION,
    has_shardy_global_to_local,
    hlo_bindings,
    hlo_text_without_stack_frames,
)
from entangle_mlir.mlir.ir import context, parse_module
from entangle_mlir.mlir.program import functions, inline_calls, public_main

HLO_TEXT_PREFIX = b"HloModule"


_NOT_PROGRAMS = ((b"BufferAssignment:", "buffer assignment report"),
                 (b"HloLiveRange", "live range report"),
                 (b"Memory Space:", "memory usage report"),
                 (b"Total bytes used:", "buffer assignment values report"),
                 (b"; ModuleID", "LLVM IR of the compiled program"),
                 (b"\x7fELF", "object file of the compiled program"))
"""How the other files `--xla_dump_to` writes begin: reports and compiler output, no program."""


def dump_report_kind(data: bytes) -> str | None:
    """What an XLA dump file that holds no HLO program is (a buffer assignment report, LLVM
    IR, ...), read from how it begins; None for anything else."""
    head = data[:64].lstrip(b"\n")
    for prefix, kind in _NOT_PROGRAMS:
        if head.startswith(prefix):
            return kind
    if data.startswith(b"xla_") and b"xla_dump_to:" in data:
        return "debug options"
    return None


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(buf):
            raise ValueError("truncated varint")
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return result, pos
        if shift > 70:
            raise ValueError("varint too long")


def proto_fields(buf: bytes) -> list[tuple[int, int, object]]:
    """Top-level (field number, wire type, value) of a serialized protobuf message.

    Length-delimited values are `bytes`, varints `int`, fixed-width ones raw `bytes`. Raises
    ValueError when `buf` is not a well-formed message.
    """
    fields = []
    pos = 0
    while pos < len(buf):
        tag, pos = _varint(buf, pos)
        number, wire = tag >> 3, tag & 7
        if number == 0:
            raise ValueError("field number 0")
        if wire == 0:
            value, pos = _varint(buf, pos)
        elif wire == 1:
            value, pos = buf[pos:pos + 8], pos + 8
        elif wire == 2:
            length, pos = _varint(buf, pos)
            value, pos = buf[pos:pos + length], pos + length
        elif wire == 5:
            value, pos = buf[pos:pos + 4], pos + 4
        else:
            raise ValueError(f"unsupported wire type {wire}")
        if pos > len(buf):
            raise ValueError("truncated field")
        fields.append((number, wire, value))
    return fields


def _looks_like_module(buf: bytes) -> bool:
    """An HloModuleProto: string name (1), computations (3) and an entry computation (2 or 6)."""
    try:
        fields = proto_fields(buf)
    except ValueError:
        return False
    numbers = {n for n, w, _ in fields if w == 2}
    if 3 not in numbers:
        return False
    name = next((v for n, w, v in fields if n == 1 and w == 2), b"")
    try:
        name.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return 2 in numbers or any(n == 6 for n, _, _ in fields)


def module_proto(data: bytes) -> bytes:
    """The HloModuleProto inside an HloModuleProto, HloProto or HloSnapshot serialization."""
    current = data
    for _ in range(3):
        try:
            fields = proto_fields(current)
        except ValueError:
            break
        first = next((v for n, w, v in fields if n == 1 and w == 2), None)
        # A wrapper's field 1 is a message (HloProto.hlo_module, HloSnapshot.hlo); a module's
        # field 1 is its name. Prefer unwrapping when field 1 itself is a module (or wrapper).
        if first is not None and (_looks_like_module(first) or _is_wrapper(first)):
            current = first
            continue
        break
    if not _looks_like_module(current):
        raise InputError("not an XLA HLO proto (HloProto / HloModuleProto / HloSnapshot)")
    return current


def _is_wrapper(buf: bytes) -> bool:
    try:
        fields = proto_fields(buf)
    except ValueError:
        return False
    first = next((v for n, w, v in fields if n == 1 and w == 2), None)
    return first is not None and _looks_like_module(first)


def looks_like_hlo_proto(data: bytes) -> bool:
    """True when `data` parses as an HloModuleProto or a wrapper of one."""
    try:
        module_proto(data)
    except InputError:
        return False
    return True


def text_to_module_proto(text: str) -> bytes:
    """The serialized HloModuleProto of HLO text, by XLA's own parser. A dump whose
    stack-frame index the installed parser does not know is read with that index folded
    into the ops' metadata (`compat.hlo_text_without_stack_frames`); the error reported is
    the one about the text as given."""
    parse = hlo_bindings().hlo_module_from_text
    try:
        return parse(text).as_serialized_hlo_module_proto()
    except Exception as err:  # noqa: BLE001 - XLA's parser raises its own error types
        first_error = err
    folded = hlo_text_without_stack_frames(text)
    if folded is not None:
        with contextlib.suppress(Exception):
            return parse(folded).as_serialized_hlo_module_proto()
    detail = " ".join(line.strip() for line in str(first_error).strip().splitlines()[:2])
    raise InputError(f"cannot parse HLO text: {detail or type(first_error).__name__}")


def module_proto_to_stablehlo(proto: bytes) -> bytes:
    """MLIR bytecode of the StableHLO module XLA's own converter makes of an HloModuleProto."""
    from jaxlib import _jax  # lazy: XLA's HLO bindings; only HLO input needs them

    try:
        return bytes(_jax.mlir.hlo_to_stablehlo(proto))
    except Exception as err:  # noqa: BLE001
        message = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise InputError(f"cannot convert HLO to StableHLO: {message}") from None


def is_hlo_text(data: bytes) -> bool:
    return data.lstrip().startswith(HLO_TEXT_PREFIX)


def is_hlo_proto_path(path: str) -> bool:
    return path.endswith((".hlo.pb", ".pb"))


def hlo_to_stablehlo(data: bytes | str) -> bytes:
    """HLO text or a serialized HLO proto -> StableHLO MLIR bytecode."""
    if isinstance(data, str):
        return module_proto_to_stablehlo(text_to_module_proto(data))
    if is_hlo_text(data):
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as err:
            raise InputError(f"HLO text is not UTF-8 (byte {err.start})") from None
        return module_proto_to_stablehlo(text_to_module_proto(text))
    return module_proto_to_stablehlo(module_proto(data))


def load_hlo(data: bytes | str, filename: str = "-"):
    """Parse HLO text/proto into an `ir.Module` (StableHLO) in entangle's context."""
    try:
        bytecode = hlo_to_stablehlo(data)
    except InputError as err:
        if err.file is None:
            err.file = filename
        raise
    return parse_module(bytecode, filename)


# ----- Shardy's own partitioning pipeline ---------------------------------------------------------

SHARDY_PIPELINE = ("builtin.module(sdy-propagation-pipeline,"
                   "func.func(sdy-insert-explicit-reshards{enable-full-version=true}),"
                   "func.func(sdy-reshard-to-collectives),sdy-convert-global-to-local)")
"""Shardy's MLIR partitioning as jaxlib 0.10 registers it: propagate shardings, insert explicit
reshards (`enable-full-version` also makes reductions over split dims explicit: without it the
reduction's all_reduce is missing, see tests/test_partitioned.py), lower them to stablehlo
collectives, convert to local shapes. The result keeps `sdy.sharding` on parameters and results;
`entangle check` reads it like XLA's partitioner output (per_device.adopt_shardy_local)."""

_RUN_PIPELINE = """
import sys
from jaxlib.mlir import ir, passmanager
from jaxlib.mlir.dialects import mhlo, stablehlo
from entangle_mlir.mlir.ir import context
stablehlo.register_stablehlo_passes()
mhlo.register_mhlo_passes()
with context():
    module = ir.Module.parse(sys.stdin.read())
    passmanager.PassManager.parse(sys.argv[1]).run(module.operation)
    sys.stdout.write(module.operation.get_asm(enable_debug_info=True))
"""


def shardy_partition(global_text: str, pipeline: str = SHARDY_PIPELINE,
                     timeout_s: float = 300) -> str:
    """Shardy's per-device program for a global-view module with `sdy.sharding`s (what
    `jax.jit(f, ...).lower(...).as_text()` gives on a mesh of Auto axes). The passes run in a
    subprocess: some abort the whole process on input they do not expect (InputError then).
    jaxlib before 0.10 lacks sdy-convert-global-to-local: an InputError saying so."""
    if "sdy-convert-global-to-local" in pipeline and not has_shardy_global_to_local():
        raise InputError("Shardy's pipeline cannot run: sdy-convert-global-to-local is not in "
                         f"jaxlib {'.'.join(map(str, JAXLIB_VERSION))} (it is from jaxlib 0.10)")
    try:
        run = subprocess.run([sys.executable, "-c", _RUN_PIPELINE, pipeline],
                             input=_without_calls(global_text), check=False,
                             capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        raise InputError(f"Shardy's pipeline did not finish in {timeout_s:g} s") from None
    if run.returncode != 0:
        raise InputError("Shardy's pipeline failed:\n" + _pipeline_error(run.stderr))
    return run.stdout


def _without_calls(text: str) -> str:
    """The module with every `func.call` inlined and the functions no longer called removed:
    Shardy's propagation gives a call's results local shapes its callee's signature does not
    have (`jax.nn.silu` lowers to a call), which its verifier then refuses."""
    if "call @" not in text and "func.call" not in text:
        return text
    module = parse_module(text)
    if not inline_calls(module, "<shardy input>"):
        return text
    with context():
        main = public_main(module, "<shardy input>")
        for func in functions(module):
            if func != main and "sym_visibility" in func.attributes:
                func.erase()
        return module.operation.get_asm(enable_debug_info=True)


def _pipeline_error(stderr: str) -> str:
    """The pipeline's MLIR diagnostics, whole (the error and each note), without the Python
    traceback of the subprocess that ran it."""
    lines = [line for line in stderr.splitlines() if line.strip()]
    start = next((i for i, line in enumerate(lines) if "MLIRError" in line or "error:" in line),
                 None)
    if start is None:
        return "\n".join(lines[-20:]) or "no output"
    shown = lines[start:]
    if "MLIRError: " in shown[0]:
        shown[0] = shown[0].split("MLIRError: ", 1)[1]
    return "\n".join(line.rstrip() for line in shown)

