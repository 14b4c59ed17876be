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
config.environment["PATH"] = os.pathsep.join([bin_dir, config.environment.get("PATH", os.environ.get("PATH", ""))])
# jax must never be needed by the tools; keep runs quiet and deterministic anyway.
for name in ("HOME", "TMPDIR", "XLA_FLAGS"):
    if name in os.environ:
        config.environment[name] = os.environ[name]


def tool(name):
    path = os.path.join(bin_dir, name)
    return path if os.path.exists(path) else name


config.substitutions.append(("entangle-opt", tool("entangle-opt")))
config.substitutions.append(("FileCheck", tool("filecheck")))
config.substitutions.append(("filecheck", tool("filecheck")))
# `entangle` last: it is a prefix of `entangle-opt`, so it must not be substituted first
# (lit applies substitutions in order; the word-boundary pattern keeps `entangle-opt` intact).
config.substitutions.append((r"\bentangle\b(?!-)", tool("entangle")))
