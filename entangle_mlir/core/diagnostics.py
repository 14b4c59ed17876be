"""Diagnostics in MLIR's format, source locations, and the bad-input error.

Every user-facing message goes through `Diagnostic.render()` so that the CLI, `entangle-opt
--verify-diagnostics` and the JSON report agree on the text.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

_FILE_LOC = re.compile(r'"([^"]*)":(\d+):(\d+)')
_NAME_LOC = re.compile(r'loc\("([^"]*)"\(')


@dataclass(frozen=True)
class SourceLoc:
    """A `file:line:col` position, plus the jax op name (e.g. `dot_general`) when recorded."""

    file: str
    line: int
    col: int
    op_name: str = ""

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.col}"


def parse_location(text: str, default_file: str = "-") -> SourceLoc | None:
    """The first file position inside an MLIR location's text (the user's frame for jax ops).

    jax prints `loc("dot_general"("body"("model.py":10:20 to :26)))`; parsing a string gives
    `loc("-":2:8)`, where `-` is replaced by `default_file`.
    """
    match = _FILE_LOC.search(text)
    if match is None:
        return None
    file = match.group(1)
    if file in ("-", ""):
        file = default_file
    name = _NAME_LOC.search(text)
    return SourceLoc(file, int(match.group(2)), int(match.group(3)), name.group(1) if name else "")


@dataclass(frozen=True)
class Frame:
    """One frame of the call stack an op's location records: the function jax names
    (`gpipe_train.<locals>.backward`; '' where none is named) and the position in it."""

    function: str
    loc: SourceLoc


_TOKEN = re.compile(r'"(?:[^"\\]|\\.)*"|[A-Za-z_][\w.]*|\d+|\S')


def call_stack(text: str, default_file: str = "-") -> list[Frame]:
    """The frames an MLIR location's text records, innermost first, each once (jax repeats a
    loop body's outer frames); [] where it records none or is not understood.

    jax prints `loc("add"(callsite("accumulate"("m.py":9:11 to :22) at "train"("m.py":30:16
    to :74))))`: a name around a file position is a frame of that function, `callsite(A at
    B)` is A's frames then B's, another name (the op's) is looked through, and of a `fused`
    location its first part counts."""
    tokens = _TOKEN.findall(text)
    frames: list[Frame] = []
    try:
        _, position = _parse_location(tokens, 0, default_file, frames)
    except (IndexError, ValueError, RecursionError):
        return []
    if position is not None:
        frames.append(Frame("", position))
    seen: set[Frame] = set()
    return [f for f in frames if not (f in seen or seen.add(f))]


def _parse_location(tokens: list[str], at: int, default_file: str,
                    frames: list[Frame]) -> tuple[int, SourceLoc | None]:
    """Parse one location from `tokens[at]`, appending its frames; (the index after it, its
    position where it is a bare file position)."""
    token = tokens[at]
    if token in ("loc", "callsite"):
        at = _expect(tokens, at + 1, "(")
        at, position = _parse_location(tokens, at, default_file, frames)
        if token == "callsite":
            if position is not None:
                frames.append(Frame("", position))
            at, position = _parse_location(tokens, _expect(tokens, at, "at"), default_file,
                                           frames)
            if position is not None:
                frames.append(Frame("", position))
            position = None
        return _expect(tokens, at, ")"), position
    if token == "unknown":
        return at + 1, None
    if token == "fused":
        at += 1
        if tokens[at] == "<":
            while tokens[at] != ">":
                at += 1
            at += 1
        at = _expect(tokens, at, "[")
        first = True
        while tokens[at] != "]":
            if not first:
                at = _expect(tokens, at, ",")
            at, position = _parse_location(tokens, at, default_file, frames if first else [])
            if first and position is not None:
                frames.append(Frame("", position))
            first = False
        return at + 1, None
    if not token.startswith('"'):
        raise ValueError(token)
    name = token[1:-1]
    at += 1
    if tokens[at] == ":":
        line, col = int(tokens[at + 1]), int(tokens[at + 3])
        at += 4
        if tokens[at] == "to":
            at += 1
            if tokens[at] != ":":
                at += 1
            at += 2
        return at, SourceLoc(default_file if name in ("-", "") else name, line, col)
    if tokens[at] == "(":
        inner: list[Frame] = []
        at, position = _parse_location(tokens, at + 1, default_file, inner)
        if position is not None:
            inner.append(Frame(name, position))
        frames.extend(inner)
        return _expect(tokens, at, ")"), None
    return at, None


def _expect(tokens: list[str], at: int, token: str) -> int:
    if tokens[at] != token:
        raise ValueError(f"expected {token!r}, found {tokens[at]!r}")
    return at + 1


@dataclass(frozen=True)
class Diagnostic:
    """One message at a location: severity is `error`, `warning`, `note` or `remark`."""

    severity: str
    message: str
    loc: SourceLoc | None = None
    notes: tuple[Diagnostic, ...] = field(default=())
    category: str = ""

    def render(self) -> str:
        where = f"{self.loc}: " if self.loc else ""
        lines = [f"{where}{self.severity}: {self.message}"]
        lines += [note.render() for note in self.notes]
        return "\n".join(lines)

    def to_json(self) -> dict:
        loc = None
        if self.loc:
            loc = {"file": self.loc.file, "line": self.loc.line, "col": self.loc.col,
                   "op_name": self.loc.op_name}
        out = {"severity": self.severity, "message": self.message, "location": loc,
               "notes": [n.to_json() for n in self.notes]}
        if self.category:
            out["reason"] = self.category
        return out


class InputError(Exception):
    """Input that cannot be used at all (exit code 2): one message, with a location if known."""

    def __init__(self, message: str, loc: SourceLoc | None = None, file: str | None = None):
        super().__init__(message)
        self.message = message
        self.loc = loc
        self.file = file

    def render(self) -> str:
        where = f"{self.loc}: " if self.loc else (f"{self.file}: " if self.file else "")
        return f"{where}error: {self.message}"
