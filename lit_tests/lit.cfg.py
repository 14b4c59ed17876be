# lit configuration for entangle's FileCheck tests.  Run from the repo root:  lit lit_tests -v
# pyright: reportUndefinedVariable=false
# ruff: noqa: F821  (`config` and `lit_config` are injected by lit)

import os
import sys

import lit.formats

config.name = "entangle"
config.test_format = lit.formats.ShTest()
config.suffixes = [".mlir"]
config.test_source_root = os.path.dirname(__file__)
# Inputs/ hold generated programs that RUN lines read; Output/ is lit's scratch space.
config.excludes = ["Inputs", "Output", "lit.cfg.py"]

# Tools come from the Python environment that runs lit (the venv with entangle installed).
bin_dir = os.path.dirname(sys.executable)
config.environment["PATH"] = os.pathsep.join(
    [bin_dir, config.environment.get("PATH", os.environ.get("PATH", ""))])
# lit starts tests with a clean environment; pass through what the tools may read.
for name in ("HOME", "TMPDIR", "PYTHONPATH"):
    if name in os.environ:
        config.environment[name] = os.environ[name]
# The tools import the entangle of the checkout these tests live in (a git worktree run with
# the shared venv would otherwise test the venv's installed copy).
config.environment["PYTHONPATH"] = os.pathsep.join(
    [os.path.dirname(os.path.dirname(os.path.abspath(__file__)))]
    + ([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else []))


def tool(name):
    path = os.path.join(bin_dir, name)
    return path if os.path.exists(path) else name


# Substitute whole command words only (not inside paths or flags such as --entangle-normalize):
# a tool name preceded by start/space/pipe and followed by a space or the end.
def word(name):
    return r"(?<![\w/.-])" + name + r"(?![\w.-])"


config.substitutions.append((word("entangle-opt"), tool("entangle-opt")))
config.substitutions.append((word("entangle"), tool("entangle")))
config.substitutions.append((word("filecheck"), tool("filecheck")))
config.substitutions.append((word("FileCheck"), tool("filecheck")))

# Features of the installed jaxlib (a test that needs one says `REQUIRES: NAME`).
from entangle_mlir.mlir.compat import has_stablehlo_future_type

if has_stablehlo_future_type():
    config.available_features.add("stablehlo-future")
