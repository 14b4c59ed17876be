"""XLA's dumps that are not the program to check are bad input (exit 2), one line naming what
the file is and the dump (and XLA flag) to pass instead; never a bug report, never "unsupported".

The dumps are XLA's own (tests/mlir/xla_dumps/generate.py) of one jitted layer; the after-
spmd-partitioning dump of the same compile is proven.
"""

from __future__ import annotations

import os

import pytest

DUMPS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "xla_dumps")
REF = os.path.join(DUMPS, "ref.mlir")
PASS_RE = "--xla_dump_hlo_pass_re=spmd-partitioning"
RIGHT_DUMP = ("after_spmd-partitioning", PASS_RE)


def _one_error(run, *needles: str) -> str:
    text = run.text
    assert run.code == 2, text
    assert "Traceback" not in text and "unsupported" not in text
    lines = [line for line in text.splitlines() if line.strip()]
    assert len(lines) == 1 and "error: " in lines[0], text
    for needle in needles:
        assert needle in lines[0], f"{needle!r} not in {lines[0]!r}"
    return lines[0]


@pytest.mark.parametrize("dump, needles", [
    ("before_optimizations.txt", ("before SPMD partitioning", "custom_call @xla.sdy.")),
    ("before_spmd-partitioning.txt", ("before SPMD partitioning", "global shape")),
    ("gspmd.before_spmd-partitioning.txt", ("before SPMD partitioning", "global shape")),
    ("after_optimizations.txt", ("after optimizations", "fusions")),
    ("async_collectives.txt", ("after optimizations", "all-reduce-start")),
    ("after_spmd-partitioning.txt", ("no sharding for result #0",
                                     "--xla_keep_shardings_after_spmd=true", "hlo.pb")),
    ("buffer-assignment.txt", ("XLA's buffer assignment report", "not a program")),
    ("jit_lowering.mlir", ("nothing sharded to check",)),
])
def test_wrong_dump_is_bad_input(entangle, dump, needles) -> None:
    _one_error(entangle("check", REF, os.path.join(DUMPS, dump)), *needles, *RIGHT_DUMP)


@pytest.mark.parametrize("dump", ["after_spmd-partitioning.hlo.pb",
                                  "after_spmd-partitioning.keep_shardings.txt"])
def test_right_dump_is_proven(entangle, dump) -> None:
    run = entangle("check", REF, os.path.join(DUMPS, dump))
    assert run.code == 0 and "verified" in run.out, run.text


def _text(name: str) -> str:
    with open(os.path.join(DUMPS, name)) as handle:
        return handle.read()


def test_parameter_without_sharding(entangle, write) -> None:
    """One parameter's sharding dropped: its layout is unknown, bad input naming the dump."""
    text = _text("after_spmd-partitioning.keep_shardings.txt")
    cut = text.replace(", sharding={devices=[4,1,2]<=[2,4]T(1,0) last_tile_dim_replicate}", "", 1)
    assert cut != text
    _one_error(entangle("check", REF, write("cut.txt", cut)), "no sharding for argument #1",
               *RIGHT_DUMP)


def test_collectives_without_any_sharding(entangle, write) -> None:
    """Every sharding dropped: local shapes and an all-reduce, no layout: bad input saying so,
    not a shape mismatch."""
    import re

    text = re.sub(r", sharding=\{[^}]*\}", "", _text("after_spmd-partitioning.keep_shardings.txt"))
    assert "sharding=" not in text
    _one_error(entangle("check", REF, write("bare.txt", text)),
               "stablehlo.all_reduce", "records no sharding on its parameters", *RIGHT_DUMP)


def test_library_call_is_after_optimizations(entangle, write) -> None:
    """GPU optimizations rewrite dots to cuBLAS calls: the module after optimizations."""
    text = _text("after_spmd-partitioning.keep_shardings.txt").replace(
        "dot(%param, %param.1), lhs_contracting_dims={1}, rhs_contracting_dims={0}",
        'custom-call(%param, %param.1), custom_call_target="__cublas$gemm"')
    assert "__cublas$gemm" in text
    _one_error(entangle("check", REF, write("gemm.txt", text)), "after optimizations",
               "@__cublas$gemm", *RIGHT_DUMP)


@pytest.mark.parametrize("content, kind", [
    ("; ModuleID = '__compute_module'\nsource_filename = \"x\"\n", "LLVM IR"),
    (b"\x7fELF\x02\x01\x01\x00" + bytes(64), "object file"),
    ("xla_cpu_enable_fast_min_max: false\nxla_dump_to: \"/tmp/d\"\n", "debug options"),
    ("HloLiveRange (max 5):\n  InstructionSequence:\n", "live range report"),
    ("Memory Space: default (color=0)\nTotal bytes: 1612 (1.6KiB)\n", "memory usage report"),
])
def test_other_dump_files(entangle, write, content, kind) -> None:
    _one_error(entangle("check", REF, write("dumped", content)), f"XLA's {kind}", *RIGHT_DUMP)


@pytest.mark.parametrize("dump, kind", [("before_optimizations.txt", "before SPMD partitioning"),
                                        ("after_optimizations.txt", "after optimizations")])
def test_wrong_dump_as_reference(entangle, dump, kind) -> None:
    """A dump given as the reference: bad input naming the unsharded lowering, not a bug
    report about the reference (the sharding custom_calls read as a partial sum: exit 1)."""
    run = entangle("check", os.path.join(DUMPS, dump),
                   os.path.join(DUMPS, "after_spmd-partitioning.hlo.pb"))
    _one_error(run, "the reference is", kind, "entangle_mlir.jax.reference_text")


def test_stack_frame_index_folded_into_metadata() -> None:
    """A dump with newer XLA's stack-frame index reads on a parser without it (jaxlib 0.8):
    folded into each op's metadata, the ops keep their source lines."""
    from entangle_mlir.mlir.compat import hlo_text_without_stack_frames
    from entangle_mlir.mlir.xla import load_hlo

    with open(os.path.join(DUMPS, "before_optimizations.txt")) as file:
        text = file.read()
    folded = hlo_text_without_stack_frames(text)
    assert folded is not None and "StackFrames" not in folded and "stack_frame_id" not in folded
    asm = load_hlo(folded).operation.get_asm(enable_debug_info=True)
    assert 'loc("<string>":9:0)' in asm
    assert hlo_text_without_stack_frames(folded) is None
