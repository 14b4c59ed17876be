"""The console script's exit (`cli.entry` -> `cli.exit_now`): the process ends without the
interpreter's teardown, with main's exit code and all of its output (stdout to a pipe is
block-buffered: an exit that skipped the flush would lose the report)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from entangle_mlir.cli import main
from tests.shared import EXAMPLES_MLIR, REPO


def _env() -> dict:
    """This environment with stdout buffered as a pipe's is by default."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    return {**env, "PYTHONPATH": str(REPO)}


def _console(*args: str) -> subprocess.CompletedProcess:
    """`entangle ARGS` as the console script runs it (`python -m entangle_mlir.cli` calls
    `entry` as the script does), stdout and stderr to pipes."""
    return subprocess.run([sys.executable, "-m", "entangle_mlir.cli", *args],
                          capture_output=True, text=True, check=False, timeout=300,
                          env=_env(), cwd=REPO)


def _pair(name: str) -> tuple[str, str]:
    return (str(EXAMPLES_MLIR / f"{name}.ref.mlir"), str(EXAMPLES_MLIR / f"{name}.sharded.mlir"))


@pytest.mark.parametrize("name,code", [("megatron_mlp_tp4", 0),
                                       ("megatron_mlp_missing_psum_tp4", 1)])
def test_console_exit_code_and_whole_report(name, code, capsys) -> None:
    """The subprocess prints exactly what `main` prints in process, and exits with its code."""
    ref, shd = _pair(name)
    options = ("--no-verify-rules", "--no-confirm")
    assert main(["check", ref, shd, *options]) == code
    expected = capsys.readouterr().out
    done = _console("check", ref, shd, *options)
    assert done.returncode == code, done.stderr
    assert done.stdout == expected
    assert expected.strip()


def test_console_json_is_whole() -> None:
    ref, shd = _pair("megatron_mlp_missing_psum_tp4")
    done = _console("check", ref, shd, "--no-verify-rules", "--no-confirm", "--json")
    assert done.returncode == 1, done.stderr
    assert json.loads(done.stdout)["exit_code"] == 1


def test_console_bad_input_exit_code(tmp_path) -> None:
    missing = str(tmp_path / "missing.mlir")
    done = _console("check", missing, missing)
    assert done.returncode == 2
    assert "missing.mlir" in done.stderr


def _run_exit(body: str) -> subprocess.CompletedProcess:
    code = "import atexit, threading, time\nfrom entangle_mlir.cli import exit_now\n" + body
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=False, timeout=60, env=_env(), cwd=REPO)


def test_exit_now_skips_teardown_runs_handlers() -> None:
    """Exit handlers run and buffered output is written; objects are not freed one by one
    (a global's __del__ never runs)."""
    done = _run_exit("class Held:\n"
                     "    def __del__(self):\n"
                     "        print('freed')\n"
                     "held = Held()\n"
                     "atexit.register(lambda: print('handler ran'))\n"
                     "print('report', end='')\n"
                     "exit_now(4)\n")
    assert done.returncode == 4, done.stderr
    assert done.stdout == "reporthandler ran\n"


def test_exit_now_waits_for_a_running_thread() -> None:
    """While another thread runs, the ordinary exit (which waits for it and frees objects)."""
    done = _run_exit("class Held:\n"
                     "    def __del__(self):\n"
                     "        print('freed')\n"
                     "held = Held()\n"
                     "threading.Thread(target=lambda: (time.sleep(0.3), print('thread done'))"
                     ").start()\n"
                     "exit_now(3)\n")
    assert done.returncode == 3, done.stderr
    assert "thread done" in done.stdout and "freed" in done.stdout
