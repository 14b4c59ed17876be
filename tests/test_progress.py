"""The progress display: on a terminal a run shows what it is doing on stderr (and clears the
line when done); in a pipe, as in CI, stderr stays silent."""

from __future__ import annotations

import os
import pty
import subprocess
import sys

from tests.shared import EXAMPLES_MLIR

EXAMPLE = EXAMPLES_MLIR / "gpt2_block_dp2_tp4"
COMMAND = [sys.executable, "-m", "entangle_mlir.cli", "check", f"{EXAMPLE}.ref.mlir",
           f"{EXAMPLE}.sharded.mlir"]


def _environment() -> dict[str, str]:
    return {**os.environ, "ENTANGLE_PROGRESS_DELAY": "0"}


def _run_with_terminal_stderr() -> tuple[int, str, str]:
    """Run the check with stderr on a pseudo-terminal; (exit code, stdout, terminal text)."""
    master, slave = pty.openpty()
    try:
        proc = subprocess.Popen(COMMAND, stdout=subprocess.PIPE, stderr=slave,
                                stdin=subprocess.DEVNULL, env=_environment())
        os.close(slave)
        chunks = []
        while True:
            try:
                chunk = os.read(master, 4096)
            except OSError:  # the terminal's other end closed
                break
            if not chunk:
                break
            chunks.append(chunk)
        out = proc.stdout.read().decode()
        proc.stdout.close()
        code = proc.wait(timeout=120)
    finally:
        os.close(master)
    return code, out, b"".join(chunks).decode(errors="replace")


def test_progress_is_shown_on_a_terminal_and_cleared() -> None:
    code, out, terminal = _run_with_terminal_stderr()
    assert code == 0, out + terminal
    assert "verified" in out
    assert "walking gpt2_block_dp2_tp4.sharded.mlir, ops:" in terminal, terminal
    assert "checking reference rule instances with Z3:" in terminal, terminal
    assert "checking sharded rule instances with Z3:" in terminal, terminal
    last = terminal.rsplit("\r", 2)
    assert last[-1] == "" and last[-2].strip() == "", repr(terminal[-200:])


def test_no_progress_in_a_pipe() -> None:
    done = subprocess.run(COMMAND, check=False, capture_output=True, text=True,
                          env=_environment(), timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "verified" in done.stdout
    assert done.stderr == ""
