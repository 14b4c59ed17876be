"""Passes over a module and the state they share; the pipeline parser.

A pass is a small class with a `name` and its options as dataclass fields (like xDSL's
ModulePass). `entangle-opt` and `entangle check` both run passes through `run_pipeline`.
"""

from __future__ import annotations

import dataclasses
import re
import time
from dataclasses import dataclass, field
from typing import ClassVar

from jaxlib.mlir import ir

from entangle_mlir.core.diagnostics import Diagnostic, InputError
from entangle_mlir.core.report import Report
from entangle_mlir.mlir.program import Program
from entangle_mlir.normalize.finite import Finiteness


@dataclass
class PassState:
    """What passes hand to each other: the module, the program pair, walks and the report."""

    module: ir.Module
    file: str
    program: Program | None = None
    walks: dict = field(default_factory=dict)
    report: Report | None = None
    diagnostics: list[Diagnostic] = field(default_factory=list)
    rule_checks: str = ""
    layers_reused: dict = field(default_factory=dict)
    """Layers each walk summarized instead of walking (`analysis/layer_reuse.py`), by walk
    name."""
    started: float = field(default_factory=time.perf_counter)
    notes: list[str] = field(default_factory=list)
    """Notes for the report from the passes before the walk (the ring loops entangle-normalize
    folded by their invariant)."""
    finiteness: Finiteness | None = None
    """How entangle-normalize judged finiteness, and what that decided: the rewrites refused
    only for a possible overflow, or that relied on `--assume-no-overflow`."""


@dataclass
class ModulePass:
    """Base class: subclasses set `name` and implement `apply`."""

    name: ClassVar[str] = ""
    summary: ClassVar[str] = ""

    def apply(self, state: PassState) -> None:
        raise NotImplementedError


_PASS_SPEC = re.compile(r"\s*([\w.-]+)\s*(?:\{([^}]*)\})?\s*")


def parse_pipeline(text: str, registry: dict[str, type[ModulePass]]) -> list[ModulePass]:
    """`builtin.module(a, b{opt=value})` or a bare comma-separated list of pass names."""
    text = text.strip()
    match = re.fullmatch(r"builtin\.module\((.*)\)", text, re.DOTALL)
    if match:
        text = match.group(1)
    passes: list[ModulePass] = []
    for spec in _split_top(text):
        if not spec.strip():
            continue
        m = _PASS_SPEC.fullmatch(spec)
        if not m:
            raise InputError(f"cannot parse pass pipeline element '{spec.strip()}'")
        name, options = m.group(1), m.group(2) or ""
        if name not in registry:
            known = ", ".join(sorted(registry))
            raise InputError(f"unknown pass '{name}' (known passes: {known})")
        passes.append(_instantiate(registry[name], options))
    return passes


def _split_top(text: str) -> list[str]:
    parts, depth, current = [], 0, ""
    for char in text:
        if char in "{(":
            depth += 1
        elif char in "})":
            depth -= 1
        if char == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += char
    parts.append(current)
    return parts


def _instantiate(cls: type[ModulePass], options: str) -> ModulePass:
    """The pass with its options read by their fields' types: a bool is `true`/`false` (or
    `1`/`0`; the name alone is true), an int a non-negative integer (every int option counts
    devices, seconds or steps); anything else, an unknown or a repeated option is refused."""
    fields = {f.name: f for f in dataclasses.fields(cls)}
    values: dict[str, object] = {}
    for item in options.split():
        key, has_value, raw = item.partition("=")
        key = key.replace("-", "_")
        if key not in fields:
            known = ", ".join(sorted(fields)) or "none"
            raise InputError(f"pass '{cls.name}' has no option '{key}' (its options: {known})")
        if key in values:
            raise InputError(f"option '{key}' of pass '{cls.name}' is given twice")
        values[key] = _option_value(cls.name, key, fields[key].default, raw, bool(has_value))
    return cls(**values)


def _option_value(pass_name: str, key: str, default: object, raw: str, has_value: bool):
    """One option's value, typed like its default."""
    where = f"option '{key}' of pass '{pass_name}'"
    if isinstance(default, bool):
        if not has_value:
            return True
        words = {"true": True, "1": True, "false": False, "0": False}
        if raw.lower() not in words:
            raise InputError(f"{where} is true or false, not '{raw}'")
        return words[raw.lower()]
    if isinstance(default, int):
        if not re.fullmatch(r"\d+", raw):
            raise InputError(f"{where} is a non-negative integer, not '{raw}'")
        return int(raw)
    if not has_value:
        raise InputError(f"{where} needs a value ({key}=...)")
    return raw


def run_pipeline(passes: list[ModulePass], state: PassState) -> PassState:
    for pass_ in passes:
        pass_.apply(state)
    return state
