"""The docs are runnable and fresh.

* The tutorials' code runs: every ```python block of `docs/tutorial-shard-map.md` and
  `docs/tutorial-xla.md`, in document order, as one script in a fresh directory with 8 simulated
  CPU devices (`XLA_FLAGS=--xla_force_host_platform_device_count=8`). A block opened with
  ```python file=NAME is written to NAME instead of being run (the user's model.py, a test file);
  a ```sh block runs there, one command per line, and each must exit 0 or 1 (proven / not
  proven; 2 is bad input). `<!-- script: NAME -->` names the script (default tutorial.py), since
  jax records it in the locations of what it lowers.
* README.md's ```python blocks run, each as its own script from the repository's root, and its
  `$ entangle check ...` transcript's command prints what the README shows.
* Nothing is set for them that a reader would not set: the venv's `bin` is on PATH (the
  tutorials say to activate it), XLA_FLAGS is not (a snippet needing devices sets it).
* `docs/diagnostics.md` and `docs/op-coverage.md` are what `docs/generate.py` writes.

Run a tutorial by hand (to refresh the output shown in it):
    python tests/test_docs.py docs/tutorial-shard-map.md [DIR]
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"
TUTORIALS = ("tutorial-shard-map.md", "tutorial-xla.md")
FENCE = re.compile(r"^```([\w-]*)([^\n]*)\n(.*?)^```\s*$", re.MULTILINE | re.DOTALL)
SH_PRELUDE = '''
import subprocess as _subprocess


def _sh(command):
    print(f"$ {command}", flush=True)
    done = _subprocess.run(command, shell=True)
    assert done.returncode in (0, 1, 3), f"`{command}` exited with {done.returncode}"

'''


def blocks(markdown: str) -> list[tuple[str, str, str]]:
    """(language, attributes, body) of every fenced code block, in order."""
    return [(m.group(1), m.group(2).strip(), m.group(3)) for m in FENCE.finditer(markdown)]


def tutorial_script(markdown: str) -> tuple[str, str]:
    """(script name, script text) running the tutorial's code in document order."""
    match = re.search(r"<!--\s*script:\s*(\S+)\s*-->", markdown)
    name = match.group(1) if match else "tutorial.py"
    parts = [SH_PRELUDE]
    for language, attributes, body in blocks(markdown):
        target = re.search(r"\bfile=(\S+)", attributes)
        if language == "python" and target:
            parts.append(f"open({target.group(1)!r}, 'w').write({body!r})\n")
        elif language == "python":
            parts.append(body)
        elif language == "sh":
            for command in body.replace("\\\n", " ").splitlines():
                if command.strip() and not command.lstrip().startswith("#"):
                    parts.append(f"_sh({command.strip()!r})\n")
    return name, "\n".join(parts)


def run_tutorial(path: Path, directory: Path, timeout: float = 900) -> subprocess.CompletedProcess:
    name, script = tutorial_script(path.read_text())
    (directory / name).write_text(script)
    return subprocess.run([sys.executable, name], cwd=directory, env=reader_env(), text=True,
                          capture_output=True, timeout=timeout, check=False)


def reader_env() -> dict[str, str]:
    """The environment of a reader who activated the venv (its `bin` first on PATH) and set
    nothing else: no XLA_FLAGS (a snippet that needs simulated devices sets them itself)."""
    bin_dir = os.path.dirname(sys.executable)
    env = {**os.environ, "PATH": bin_dir + os.pathsep + os.environ.get("PATH", "")}
    for name in ("XLA_FLAGS", "ENTANGLE_DUMP_SMT", "PYTHONPATH"):
        env.pop(name, None)
    return env


@pytest.mark.parametrize("name", TUTORIALS)
def test_tutorial_runs(name: str, tmp_path: Path) -> None:
    path = DOCS / name
    kinds = [language for language, _, _ in blocks(path.read_text())]
    assert kinds.count("python") >= 3, f"{name}: expected runnable python blocks"
    done = run_tutorial(path, tmp_path)
    assert done.returncode == 0, (f"{name} failed:\n--- stdout\n{done.stdout[-4000:]}\n"
                                  f"--- stderr\n{done.stderr[-4000:]}")


README_PYTHON = [body for language, attributes, body in blocks((REPO / "README.md").read_text())
                 if language == "python" and "file=" not in attributes]
"""The README's runnable python blocks (a ```python file=NAME block is a file a reader writes
in their own repository, shown, not run here; the plugin's is run by tests/test_pytest_plugin.py
in its own words)."""


@pytest.mark.parametrize("index", range(len(README_PYTHON)))
def test_readme_python_snippet_runs(index: int) -> None:
    """As pasted into `python` started in the repository's root (so `examples` imports)."""
    done = subprocess.run([sys.executable, "-"], input=README_PYTHON[index], cwd=REPO,
                          env=reader_env(), text=True, capture_output=True, timeout=900,
                          check=False)
    assert done.returncode == 0, (f"README python block {index} failed:\n{README_PYTHON[index]}"
                                  f"\n--- stdout\n{done.stdout[-3000:]}\n--- stderr\n"
                                  f"{done.stderr[-3000:]}")


def test_readme_transcript_is_what_the_command_prints() -> None:
    """The README's `$ entangle check ...` example: its command, run from the repository's
    root, prints the lines shown (numbers of the confirmation and evidence runs aside)."""
    text = (REPO / "README.md").read_text()
    shown = [body for language, _, body in blocks(text) if body.startswith("$ entangle ")]
    assert shown, "README shows no `$ entangle` transcript"
    for body in shown:
        command, *expected = body.rstrip("\n").split("\n")
        done = subprocess.run(command[2:], shell=True, cwd=REPO, env=reader_env(), text=True,
                              capture_output=True, timeout=900, check=False)
        assert done.returncode in (0, 1, 3), done.stderr
        printed = done.stdout.rstrip("\n").split("\n")
        stable = [line for line in expected if not line.startswith(("note: confirmed",
                                                                    "evidence:"))]
        assert stable == [line for line in printed if not line.startswith(
            ("note: confirmed", "evidence:"))], done.stdout


def test_tutorials_cover_the_issue() -> None:
    """A proof, a caught bug with its diagnostic, --explain, --json and assert_refines."""
    for name in TUTORIALS:
        text = (DOCS / name).read_text()
        for needle in ("verified: the sharded program refines the reference", "error: ",
                       "--explain", "--json", "assert_", "not proven"):
            assert needle in text, f"{name} does not show {needle!r}"


def test_generated_docs_are_fresh() -> None:
    done = subprocess.run([sys.executable, str(DOCS / "generate.py"), "--check"], text=True,
                          capture_output=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-3000:] + done.stdout[-3000:]


def test_docs_link_to_existing_files() -> None:
    for path in DOCS.glob("*.md"):
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", path.read_text()):
            if "://" in target:
                continue
            assert (path.parent / target).exists(), f"{path.name}: broken link {target}"


if __name__ == "__main__":
    tutorial = Path(sys.argv[1]).resolve()
    where = Path(sys.argv[2]) if len(sys.argv) > 2 else Path(tempfile.mkdtemp(prefix="tutorial-"))
    where.mkdir(parents=True, exist_ok=True)
    result = run_tutorial(tutorial, where)
    print(result.stdout, end="")
    print(result.stderr, end="", file=sys.stderr)
    print(f"[ran in {where}: exit code {result.returncode}]", file=sys.stderr)
    sys.exit(result.returncode)
