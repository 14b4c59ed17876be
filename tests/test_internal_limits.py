"""The checker's own limits and defects are "not proven" (inconclusive, exit 3) with the
reason named, never bad input (exit 2) nor a traceback: a RecursionError raised while
checking a parsed program is the checker's recursion limit (the parser refuses text nesting
deeper than `mlir.ir.MAX_NESTING`), and any other exception is a defect."""

from __future__ import annotations

import functools
from pathlib import Path

import pytest

from entangle_mlir import cli, driver

DEMO = Path(driver.__file__).parent / "demo"
PAIR = [str(DEMO / "megatron_mlp_tp4.ref.mlir"), str(DEMO / "megatron_mlp_tp4.sharded.mlir")]


@pytest.mark.parametrize("error, reason", [
    (RecursionError("maximum recursion depth exceeded"), "nest too deeply"),
    (KeyError("x"), "internal error of the checker (KeyError"),
], ids=["recursion", "defect"])
def test_checker_limits_are_not_proven(monkeypatch, capsys, error, reason) -> None:
    def failing(*args, **kwargs):
        raise error

    monkeypatch.setattr(driver, "_check_program", failing)
    assert cli.main(["check", *PAIR, "--no-confirm"]) == 3
    out, err = capsys.readouterr()
    assert reason in out and "could not decide" in out
    assert "Traceback" not in out + err and "nests too deeply to analyse" not in err


def test_the_same_pair_checks_without_the_fault(capsys) -> None:
    """The pair above is proven when nothing fails: the exit codes above are the faults'."""
    assert cli.main(["check", *PAIR, "--no-confirm"]) == 0


@functools.cache
def _deep_through_c(levels: int) -> int:
    """`levels` nested calls, each through C functions (the cache's wrapper, `sorted`'s key):
    three frames and two C-level calls a level."""
    return 0 if levels == 0 else sorted([levels], key=lambda n: _deep_through_c(n - 1))[0]  # noqa: FURB192


def test_the_general_tier_has_room_for_its_recursion_limit(monkeypatch) -> None:
    """1700 levels (under `RECURSION_LIMIT`) through C overflow the main thread's
    8 MiB stack (a segfault, as measured with `IN_THREAD` off); the tier's own thread holds
    them, and past the limit the tier stops with a RecursionError, reported as its limit."""
    from entangle_mlir.analysis.general import tier

    _deep_through_c.cache_clear()
    depth = {"levels": 1700}
    monkeypatch.setattr(tier, "general_tier",
                        lambda *a, **k: tier.GeneralResult(_deep_through_c(depth["levels"]) == 1700))
    assert tier.run_general_tier(None).proven
    depth["levels"] = 4000
    _deep_through_c.cache_clear()
    stopped = tier.run_general_tier(None)
    assert not stopped.proven and stopped.internal and "too deeply" in stopped.reason


def test_a_callers_time_limit_stops_the_tier_too(monkeypatch) -> None:
    """A caller's alarm (fuzz's timed checks) raises while the tier runs on its thread: the
    tier is stopped by the same exception before it reaches the caller, so no tier keeps
    running beside the caller's next check (it shared caches with it: the next tests of a
    worker failed)."""
    import signal
    import threading
    import time

    from entangle_mlir.analysis.general import tier

    class Alarm(Exception):
        pass

    stopped = threading.Event()

    def endless(*args, **kwargs):
        try:
            while True:
                time.sleep(0.01)
        finally:
            stopped.set()

    def ring(*args):
        raise Alarm

    monkeypatch.setattr(tier, "general_tier", endless)
    before = signal.signal(signal.SIGALRM, ring)
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.3)
        result = tier.run_general_tier(None)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, before)
    assert stopped.is_set()
    assert not result.proven and result.internal and "Alarm" in result.reason
    assert not any(t.name == "entangle-general-tier" for t in threading.enumerate())


def test_the_tier_thread_sees_the_callers_context() -> None:
    """The general tier's thread runs in a copy of the caller's context: the inputs' names
    (`terms.ARG_NAMES`) the caller set are the ones its notes print (a new thread starts with
    every context variable at its default: loop notes said `%arg4` for jax's `xs`)."""
    from types import MappingProxyType

    from entangle_mlir.analysis.general import tier
    from entangle_mlir.core.terms import ARG_NAMES

    token = ARG_NAMES.set(MappingProxyType({4: "xs"}))
    try:
        assert tier._on_deep_stack(lambda: dict(ARG_NAMES.get())) == {4: "xs"}
    finally:
        ARG_NAMES.reset(token)
