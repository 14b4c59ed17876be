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
