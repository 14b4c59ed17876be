"""CI's time relies on xdist's test groups (`--dist loadgroup`, README's test command): every
test of one corpus example (`tests.shared.per_example`), and every test using a module-scoped
fixture of its module (tests/conftest.py), on one worker, so what is cached per process is
computed once. pytest 9.2 made xdist 3.8 drop the groups without a word (pytest-xdist#1386):
this shows they hold with the installed pair."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

TESTS = '''
import pytest

from tests.shared import per_example


class Ex:
    def __init__(self, name):
        self.name = name


@pytest.fixture(scope="module")
def lowered():
    return 1


@pytest.mark.parametrize("ex", per_example([Ex("a"), Ex("b")]))
@pytest.mark.parametrize("k", range(4))
def test_example(ex, k):
    pass


@pytest.mark.parametrize("k", range(6))
def test_fixture_user(lowered, k):
    pass
'''


def test_groups_run_on_one_worker(tmp_path) -> None:
    module = tmp_path / "test_groups_probe.py"
    module.write_text(TESTS)
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-n", "2", "--dist", "loadgroup", "-v",
         "-p", "no:cacheprovider",
         "--rootdir", str(ROOT), "-c", str(ROOT / "pyproject.toml"),
         "--confcutdir", str(ROOT / "tests"), "-p", "tests.conftest", str(module)],
        check=False, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    workers: dict[str, set[str]] = {}
    for worker, test, params in re.findall(r"\[(gw\d)\].*PASSED \S*::(\w+)\[([^\]]*)\]",
                                           run.stdout):
        group = "fixture" if test == "test_fixture_user" else params.split("-")[-1]
        workers.setdefault(group, set()).add(worker)
    assert set(workers) == {"a", "b", "fixture"}, run.stdout
    assert all(len(w) == 1 for w in workers.values()), workers
