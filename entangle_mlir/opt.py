"""entangle-opt: run entangle's passes on an MLIR file, like mlir-opt.

    entangle-opt FILE --pass-pipeline='builtin.module(entangle-normalize,...)'
    entangle-opt FILE --entangle-infer-relations          (shorthand flags, in pipeline order)
    --split-input-file     treat `// -----` separated chunks as independent inputs
    --verify-diagnostics   check `// expected-error @+1 {{...}}` annotations against the
                           diagnostics produced (all expected found, nothing unexpected);
                           `expected-error-re {{text {{regex}} text}}` as in mlir-opt
    --mlir-print-debuginfo print the locations of the output's ops
"""

from __future__ import annotations

import argparse
import re
import sys
from dataclasses import dataclass

from entangle_mlir import VersionFlag
from entangle_mlir.core.diagnostics import Diagnostic, InputError
from entangle_mlir.mlir.ir import context, parse_module
from entangle_mlir.passes import PASSES
from entangle_mlir.passes.pipeline import PassState, parse_pipeline, run_pipeline

SPLIT_MARKER = re.compile(r"^// -----\s*$", re.MULTILINE)
EXPECTED = re.compile(
    r"//\s*expected-(error|warning|note|remark)(-re)?\s*(?:@([+-]\d+|above|below))?\s*"
    r"\{\{(.*)\}\}")


@dataclass
class Expected:
    severity: str
    line: int
    text: str
    pattern: re.Pattern | None = None
    """Of an `expected-<severity>-re`: the text with its `{{...}}` parts as regexes."""
    matched: bool = False

    def matches(self, message: str) -> bool:
        """Whether `message` holds the expected text (as a search, like mlir-opt)."""
        if self.pattern is not None:
            return self.pattern.search(message) is not None
        return self.text in message


def _regex(text: str) -> re.Pattern:
    """mlir-opt's `-re` text: literal but for the regexes between `{{` and `}}`."""
    parts = re.split(r"\{\{(.*?)\}\}", text)
    return re.compile("".join(part if i % 2 else re.escape(part)
                              for i, part in enumerate(parts)))


class _PassFlag(argparse.Action):
    """A shorthand pass flag: the passes run in the order their flags are given."""

    def __call__(self, parser, namespace, values, option_string=None):
        namespace.flags = [*(namespace.flags or []), self.dest]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="entangle-opt", description=__doc__.splitlines()[0])
    parser.add_argument("input", help="input .mlir file ('-' for stdin)")
    parser.add_argument("--pass-pipeline", default="", help="builtin.module(pass1,pass2{opt=v})")
    parser.add_argument("--split-input-file", action="store_true")
    parser.add_argument("--verify-diagnostics", action="store_true")
    parser.add_argument("--mlir-print-debuginfo", action="store_true",
                        help="print the locations of the output's ops")
    parser.add_argument("-o", dest="output", default="-", help="output file")
    parser.add_argument("--version", action=VersionFlag)
    for name, cls in PASSES.items():
        parser.add_argument(f"--{name}", dest=name, nargs=0, action=_PassFlag, help=cls.summary)
    parser.set_defaults(flags=[])
    args = parser.parse_args(argv)
    if args.flags and args.pass_pipeline:
        parser.error("give the passes either as --pass-pipeline or as flags, not both")
    pipeline = args.pass_pipeline or ",".join(args.flags)
    try:
        parse_pipeline(pipeline, PASSES)
        text = _read(args.input)
    except InputError as err:
        print(err.render(), file=sys.stderr)
        return 2
    chunks = _split(text) if args.split_input_file else [(text, 0)]
    outputs, status = [], 0
    for chunk, offset in chunks:
        printed, code = _run_chunk(chunk, offset, args, pipeline)
        outputs.append(printed)
        status = max(status, code)
    rendered = "\n// -----\n".join(o for o in outputs if o is not None)
    if args.output == "-":
        sys.stdout.write(rendered)
    else:
        with open(args.output, "w") as handle:
            handle.write(rendered)
    return status


def _read(path: str) -> str:
    if path == "-":
        return sys.stdin.read()
    try:
        with open(path, "rb") as handle:
            data = handle.read()
    except OSError as err:
        raise InputError(f"cannot read file: {err.strerror}", file=path) from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise InputError(f"not UTF-8 text (byte {err.start})", file=path) from None


def _split(text: str) -> list[tuple[str, int]]:
    chunks, start, line = [], 0, 0
    for match in SPLIT_MARKER.finditer(text):
        chunks.append((text[start:match.start()], line))
        line += text[start:match.end()].count("\n")
        start = match.end()
    chunks.append((text[start:], line))
    return chunks


def _run_chunk(chunk: str, offset: int, args, pipeline: str) -> tuple[str | None, int]:
    file = args.input
    produced: list[Diagnostic] = []
    printed = None
    code = 0
    try:
        module = parse_module(chunk, file)
        state = PassState(module, file)
        with context():
            run_pipeline(parse_pipeline(pipeline, PASSES), state)
            printed = module.operation.get_asm(enable_debug_info=args.mlir_print_debuginfo)
            if args.mlir_print_debuginfo:
                printed = _file_locations(printed, file, offset)
        produced = _shift(state.diagnostics, file, offset)
        code = 1 if any(d.severity == "error" for d in produced) else 0
    except InputError as err:
        loc = err.loc
        if loc is not None and loc.file == file:
            loc = type(loc)(loc.file, loc.line + offset, loc.col, loc.op_name)
        produced = [Diagnostic("error", err.message, loc)]
        code = 2
    if args.verify_diagnostics:
        return printed, _verify(chunk, offset, file, produced)
    for diag in produced:
        print(diag.render(), file=sys.stderr)
    return printed, code


_PARSED_LOC = re.compile(r'loc\("-":(\d+):(\d+)\)')


def _file_locations(printed: str, file: str, offset: int) -> str:
    """Locations as the file has them: the parser names the text it read "-" and counts the
    lines of a `--split-input-file` chunk from the chunk's start."""
    name = file.replace("\\", "\\\\").replace('"', '\\"')
    return _PARSED_LOC.sub(lambda m: f'loc("{name}":{int(m.group(1)) + offset}:{m.group(2)})',
                           printed)


def _shift(diags: list[Diagnostic], file: str, offset: int) -> list[Diagnostic]:
    """Chunk-relative lines to file lines; notes become diagnostics of their own."""
    flat = []
    for diag in diags:
        for one in (diag, *diag.notes):
            loc = one.loc
            if loc is not None and loc.file == file:
                loc = type(loc)(loc.file, loc.line + offset, loc.col, loc.op_name)
            flat.append(Diagnostic(one.severity, one.message, loc))
    return flat


def _expectations(chunk: str, offset: int) -> list[Expected]:
    found = []
    lines = chunk.split("\n")
    for number, line in enumerate(lines, start=1):
        for match in EXPECTED.finditer(line):
            severity, is_regex, where, text = match.groups()
            target = number
            if where == "above":
                target = number - 1
            elif where == "below":
                target = number + 1
            elif where:
                target = number + int(where)
            pattern = _regex(text) if is_regex else None
            found.append(Expected(severity, target + offset, text, pattern))
    return found


def _verify(chunk: str, offset: int, file: str, produced: list[Diagnostic]) -> int:
    expected = _expectations(chunk, offset)
    failed = False
    for diag in produced:
        match = next((e for e in expected if not e.matched and e.severity == diag.severity
                      and diag.loc is not None and diag.loc.file == file
                      and e.line == diag.loc.line and e.matches(diag.message)), None)
        if match is None:
            failed = True
            print(f"{diag.loc or file}: error: unexpected {diag.severity}: {diag.message}",
                  file=sys.stderr)
        else:
            match.matched = True
    for e in expected:
        if not e.matched:
            failed = True
            print(f"{file}:{e.line}: error: expected {e.severity} \"{e.text}\" was not produced",
                  file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
