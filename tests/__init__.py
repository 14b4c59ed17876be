"""The test suite, laid out like the package it tests.

core/, mlir/, semantics/, normalize/, rules/, analysis/ test the subpackages of the same name;
the top level tests the top-level modules (driver, cli, opt, jax, evidence, progress), the docs,
the lit suite's coverage and the package's import contracts (test_architecture.py); examples/
checks and grounds the example corpora, fuzz/ runs the fuzzers of fuzz/ with fixed seeds, and
speed/ pins the exact shortcuts behind the benchmark's times.

Every folder is a package, so a test module is `tests.<folder>.<name>` and helpers are imported
the same way from anywhere: `from tests.shared import ...`, `from tests.judging import ...`.
Fixtures are in conftest.py, which pytest applies to every folder.
"""
