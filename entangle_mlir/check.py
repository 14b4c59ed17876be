"""`check`: the whole pipeline on a reference/sharded pair, returning a `Report`."""

from __future__ import annotations

import time

from .diagnostics import InputError
from .infer import Walker
from .ir import context, load_file, parse_module
from .program import (Program, check_signatures, from_combined, from_two_modules, has_refines,
                      inline_calls)
from .refine import compare
from .report import Report


def check_program(program: Program, *, verify_rules: bool = True) -> Report:
    """Normalize, walk both functions, compare; optionally Z3-check every rule instance."""
    start = time.perf_counter()
    with context():
        inline_calls(program.ref_module, program.ref_file)
        if program.sharded_module is not program.ref_module:
            inline_calls(program.sharded_module, program.sharded_file)
        check_signatures(program)
        ref_walk = Walker(program.ref_func, program.ref_module, program.ref_file).run()
        sharded_walk = Walker(program.sharded_func, program.sharded_module,
                              program.sharded_file).run()
        report = compare(ref_walk, sharded_walk)
    report.stats["ops"] = len(sharded_walk.records)
    report.stats["reference_ops"] = len(ref_walk.records)
    if verify_rules:
        from .verify import verify_walk

        verify_walk(sharded_walk, report)
    else:
        report.mode = "skipped (--no-verify-rules): rule instances were not checked by Z3"
    report.stats["seconds"] = round(time.perf_counter() - start, 4)
    return report


def check_texts(ref_text: str, sharded_text: str, *, ref_file: str = "reference.mlir",
                sharded_file: str = "sharded.mlir", verify_rules: bool = True) -> Report:
    ref = parse_module(ref_text, ref_file)
    sharded = parse_module(sharded_text, sharded_file)
    return check_program(from_two_modules(ref, sharded, ref_file, sharded_file),
                         verify_rules=verify_rules)


def check_files(ref_path: str, sharded_path: str, *, verify_rules: bool = True) -> Report:
    ref = load_file(ref_path)
    sharded = load_file(sharded_path)
    return check_program(from_two_modules(ref, sharded, ref_path, sharded_path),
                         verify_rules=verify_rules)


def check_combined_file(path: str, *, verify_rules: bool = True) -> Report:
    module = load_file(path)
    if not has_refines(module):
        raise InputError("no function carries `entangle.refines = @reference`", file=path)
    return check_program(from_combined(module, path), verify_rules=verify_rules)
