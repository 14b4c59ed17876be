"""`core/diagnostics.call_stack`: the user's call stack jax records in an op's location, which
the repair names a missing op's place by (`repair_sites._edge_loc`)."""

from __future__ import annotations

from entangle_mlir.core.diagnostics import Frame, SourceLoc, call_stack

BODY = ('loc("while/body/add"(callsite(callsite("accumulate"("p.py":169:11 to :22) at '
        'callsite("backward.<listcomp>"("p.py":371:17 to :41) at "backward"("p.py":371:16 to '
        ':74))) at callsite(callsite("train"("p.py":378:15 to :59) at "main"("m.py":36:15 to '
        '2:58)) at callsite("train"("p.py":378:15 to :59) at "main"("m.py":36:15 to :58))))))')


def _lines(frames: list[Frame]) -> list[tuple[str, str, int, int]]:
    return [(f.function, f.loc.file, f.loc.line, f.loc.col) for f in frames]


def test_a_loop_body_op_has_its_frames_innermost_first_each_once() -> None:
    assert _lines(call_stack(BODY)) == [
        ("accumulate", "p.py", 169, 11), ("backward.<listcomp>", "p.py", 371, 17),
        ("backward", "p.py", 371, 16), ("train", "p.py", 378, 15), ("main", "m.py", 36, 15)]


def test_plain_fused_unknown_and_garbled_locations() -> None:
    assert call_stack('loc("-":2:8)', "f.mlir") == [Frame("", SourceLoc("f.mlir", 2, 8))]
    assert _lines(call_stack('loc(fused<"x">["a.py":1:2, "b.py":3:4])')) == [("", "a.py", 1, 2)]
    assert _lines(call_stack('loc(callsite("a.py":1:2 at "b.py":3:4))')) == [
        ("", "a.py", 1, 2), ("", "b.py", 3, 4)]
    assert call_stack("loc(unknown)") == []
    assert call_stack('loc("dot_general")') == []
    assert call_stack('loc(callsite("a.py":1:2 at') == []
