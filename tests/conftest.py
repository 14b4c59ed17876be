"""Shared fixtures: run the CLIs in-process, write MLIR into temp files.

pytest applies this file to every folder under tests/. What tests import (paths, small MLIR
programs, helpers) is in tests/shared.py. Nothing here imports jax: the CLI tests must stay fast
and prove the checker works without it.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from tests.shared import REF_ADD, SHARDED_ADD


@dataclass
class Run:
    """Exit code and captured output of one in-process CLI run."""

    code: int
    out: str
    err: str

    @property
    def text(self) -> str:
        return self.out + self.err


def _run(main, argv: list[str], capsys) -> Run:
    capsys.readouterr()
    try:
        code = main([str(a) for a in argv])
    except SystemExit as exc:  # argparse errors
        code = exc.code if isinstance(exc.code, int) else 2
    captured = capsys.readouterr()
    return Run(code, captured.out, captured.err)


@pytest.fixture(autouse=True)
def fresh_terms():
    """Every test builds its terms from scratch and forgets the memos of the tests before it
    (`memos.start_over`), as `check_program` does for each check: a normal form can depend on
    the order terms were first built, so a test must not see what the tests before it in the
    same worker built (nor keep their terms alive)."""
    from entangle_mlir.core.memos import start_over

    start_over()


@pytest.fixture
def entangle(capsys):
    """`entangle(*argv)` runs `entangle_mlir.cli.main` and returns a `Run`."""
    from entangle_mlir.cli import main

    return lambda *argv: _run(main, list(argv), capsys)


@pytest.fixture
def entangle_opt(capsys):
    """`entangle_opt(*argv)` runs `entangle_mlir.opt.main` and returns a `Run`."""
    from entangle_mlir.opt import main

    return lambda *argv: _run(main, list(argv), capsys)


@pytest.fixture
def write(tmp_path):
    """`write(name, text_or_bytes)` -> path (str) of a new file under tmp_path."""

    def _write(name: str, content: str | bytes) -> str:
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content)
        return str(path)

    return _write


@pytest.fixture
def trivial_pair(write):
    """(ref path, sharded path) of a correct x + y pair."""
    return write("ref.mlir", REF_ADD), write("sharded.mlir", SHARDED_ADD)


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups off the marks
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Under `-n` with `--dist loadgroup` (README's test command): a test using a module-scoped
    fixture of its own module joins that module's xdist group, so the fixture (a lowering, a
    200-program fuzz sample) is computed on one worker, not on each that draws one of its
    tests. Tests already in a group (`tests.shared.per_example`) keep theirs."""
    for item in items:
        if item.get_closest_marker("xdist_group"):
            continue
        module = item.nodeid.split("::")[0]
        info = getattr(item, "_fixtureinfo", None)
        defs = info.name2fixturedefs.values() if info else ()
        if any(d and d[-1].scope == "module" and d[-1].baseid == module for d in defs):
            item.add_marker(pytest.mark.xdist_group(module))
