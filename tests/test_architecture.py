"""The package's import contracts (issue 17), read from the source with an `ast` walk.

1. Layers, lowest first: core < mlir < semantics < normalize < rules (rules/kinds included) <
   analysis < passes < the top-level modules (driver, cli, opt, jax, evidence, confirm, repair,
   repair_sites, progress and the package's __init__). A module imports only from its own layer
   or lower ones.
2. No import circles among the package's modules, counting every import: one inside a function
   is still a dependency, only a later one.
3. Only jax.py and evidence.py import jax (jaxlib, which holds the MLIR bindings, may be imported
   anywhere).
4. rules/ never imports the passes, the command line (cli, driver, opt), the solver
   (analysis.solver) or z3.
5. Every import inside a function says why it waits: a trailing `# lazy: <reason>`.
6. One installed top-level package: pyproject's packages.find includes only entangle_mlir*,
   every folder of it holding Python has an __init__.py (or packages.find would leave it out),
   and fuzz/, benchmarks/, examples/ are not inside it.

An import names the deepest module of the package it reaches (`from entangle_mlir.core import
terms` is entangle_mlir.core.terms; `from entangle_mlir.rules import RULES` is
entangle_mlir.rules); the packages above it, whose __init__ Python runs first, are not counted
as edges (as import linters count). Each checker is a plain function over a source tree that
returns the offending lines; the tests at the bottom run them on small synthetic trees, so each
is seen to fail where it must.
"""

from __future__ import annotations

import ast
import fnmatch
import functools
import io
import re
import tokenize
import tomllib
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from tests.shared import REPO

PACKAGE = "entangle_mlir"
LAYERS = ("core", "mlir", "semantics", "normalize", "rules", "analysis", "passes", "top")
TOP_MODULES = ("driver", "cli", "opt", "jax", "evidence", "confirm", "progress", "pytest_plugin",
               "html_report", "many", "repair", "repair_sites")
JAX_IMPORTERS = (f"{PACKAGE}.jax", f"{PACKAGE}.evidence")
RULES_MUST_NOT_IMPORT = (f"{PACKAGE}.passes", f"{PACKAGE}.cli", f"{PACKAGE}.driver",
                         f"{PACKAGE}.opt", f"{PACKAGE}.analysis.solver", "z3")
NOT_INSTALLED = ("fuzz", "benchmarks", "examples")
LAZY = re.compile(r"#\s*lazy:\s*(\S.*)")


@dataclass(frozen=True)
class Import:
    """One name an import statement brings in, resolved to the module it loads."""

    module: str             # the importing module, dotted
    path: str               # its file, relative to the tree's root
    line: int
    target: str             # the deepest module of the tree it names, or the module named
    in_function: bool
    lazy_reason: str        # the text after `# lazy:` on the statement's lines ("" if none)

    @property
    def where(self) -> str:
        return f"{self.path}:{self.line}"


def modules(root: Path) -> dict[str, Path]:
    """Dotted name -> file of every module of the package under `root` (a package is its
    __init__.py)."""
    found = {}
    for path in sorted((root / PACKAGE).rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


class _ImportStatements(ast.NodeVisitor):
    """Every import statement of a module, with whether it sits inside a function."""

    def __init__(self) -> None:
        self.found: list[tuple[ast.Import | ast.ImportFrom, bool]] = []
        self._depth = 0

    def _function(self, node: ast.AST) -> None:
        self._depth += 1
        self.generic_visit(node)
        self._depth -= 1

    visit_FunctionDef = visit_AsyncFunctionDef = _function

    def visit_Import(self, node: ast.Import | ast.ImportFrom) -> None:
        self.found.append((node, self._depth > 0))

    visit_ImportFrom = visit_Import


def _named(node: ast.Import | ast.ImportFrom, module: str, is_package: bool,
           known: dict[str, Path]) -> list[str]:
    """The modules one statement names: `from pkg import name` is pkg.name when that is a
    module, else pkg; within the tree, the deepest module of the dotted name."""
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    else:
        if node.level:
            base = module.split(".") if is_package else module.split(".")[:-1]
            base = base[:len(base) - node.level + 1]
            stem = ".".join(base + ([node.module] if node.module else []))
        else:
            stem = node.module or ""
        names = [f"{stem}.{a.name}" if f"{stem}.{a.name}" in known else stem for a in node.names]
    resolved = []
    for name in names:
        if name.split(".")[0] == PACKAGE:
            while name not in known and "." in name:
                name = name.rsplit(".", 1)[0]
        resolved.append(name)
    return resolved


def _lazy_reasons(source: str) -> dict[int, str]:
    """Line -> the reason of a `# lazy: <reason>` comment on it."""
    reasons = {}
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT and (match := LAZY.fullmatch(token.string.strip())):
            reasons[token.start[0]] = match.group(1).strip()
    return reasons


@functools.cache
def imports(root: Path) -> tuple[Import, ...]:
    """Every import of every module of the package under `root`."""
    known = modules(root)
    found = []
    for module, path in known.items():
        source = path.read_text()
        reasons = _lazy_reasons(source)
        collector = _ImportStatements()
        collector.visit(ast.parse(source, str(path)))
        for node, in_function in collector.found:
            lines = range(node.lineno, (node.end_lineno or node.lineno) + 1)
            reason = next((reasons[n] for n in lines if n in reasons), "")
            for target in _named(node, module, path.name == "__init__.py", known):
                found.append(Import(module, str(path.relative_to(root)), node.lineno, target,
                                    in_function, reason))
    return tuple(found)


def _once(lines: Iterable[str]) -> list[str]:
    """`lines` without repeats (a statement importing two names of one module), in order."""
    return list(dict.fromkeys(lines))


def _within(name: str, prefixes: Iterable[str]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def layer(module: str) -> str | None:
    """The layer of one of the package's modules, None if the table has none for it."""
    parts = module.split(".")
    if parts == [PACKAGE] or (len(parts) == 2 and parts[1] in TOP_MODULES):
        return "top"
    return parts[1] if len(parts) > 1 and parts[1] in LAYERS[:-1] else None


# ----- the checkers: each returns one line per offence ----------------------------------------

def layer_violations(root: Path) -> list[str]:
    """Contract 1: imports of a higher layer, and modules the layer table does not place."""
    out = []
    for module, path in modules(root).items():
        if layer(module) is None:
            out.append(f"{path.relative_to(root)}: {module} is in no layer of {LAYERS}")
    for imp in imports(root):
        if not _within(imp.target, [PACKAGE]) or layer(imp.module) is None:
            continue
        own, theirs = layer(imp.module), layer(imp.target)
        if theirs is None or LAYERS.index(theirs) > LAYERS.index(own):
            out.append(f"{imp.where}: {imp.module} ({own}) imports {imp.target} ({theirs})")
    return _once(out)


def import_graph(root: Path) -> dict[str, dict[str, Import]]:
    """module -> {module of the package it imports -> the first import of it}, every import
    counted (module level and inside functions)."""
    graph: dict[str, dict[str, Import]] = {module: {} for module in modules(root)}
    for imp in imports(root):
        if imp.target in graph and imp.target != imp.module:
            graph[imp.module].setdefault(imp.target, imp)
    return graph


def cycles(graph: dict[str, dict[str, Import]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


def _one_circle(graph: dict[str, dict[str, Import]], members: list[str]) -> list[Import]:
    """A shortest circle through the first member, within the component: its imports in order."""
    start, inside = members[0], set(members)
    paths: dict[str, list[Import]] = {start: []}
    queue = [start]
    for v in queue:
        for w, imp in sorted(graph[v].items()):
            if w == start:
                return paths[v] + [imp]
            if w in inside and w not in paths:
                paths[w] = paths[v] + [imp]
                queue.append(w)
    raise AssertionError(f"no circle through {start} in {members}")


def cycle_violations(root: Path) -> list[str]:
    """Contract 2: each import circle, with one circle through it spelled out line by line."""
    graph = import_graph(root)
    out = []
    for members in cycles(graph):
        steps = " -> ".join(f"{imp.target} ({imp.where})" for imp in _one_circle(graph, members))
        out.append(f"circle of {len(members)}: {', '.join(members)}\n    {members[0]} -> {steps}")
    return out


def jax_violations(root: Path) -> list[str]:
    """Contract 3: imports of jax outside jax.py and evidence.py."""
    return _once(f"{imp.where}: {imp.module} imports {imp.target}" for imp in imports(root)
                 if _within(imp.target, ["jax"]) and imp.module not in JAX_IMPORTERS)


def rules_violations(root: Path) -> list[str]:
    """Contract 4: rules/ importing the passes, the command line, the solver or z3."""
    return _once(f"{imp.where}: {imp.module} imports {imp.target}" for imp in imports(root)
                 if _within(imp.module, [f"{PACKAGE}.rules"])
                 and _within(imp.target, RULES_MUST_NOT_IMPORT))


def lazy_violations(root: Path) -> list[str]:
    """Contract 5: imports inside a function without a `# lazy: <reason>` comment."""
    return _once(f"{imp.where}: {imp.module} imports {imp.target} inside a function without "
                 "`# lazy: <reason>`"
                 for imp in imports(root) if imp.in_function and not imp.lazy_reason)


def packaging_violations(root: Path) -> list[str]:
    """Contract 6: what pyproject installs is the one package, whole, and nothing beside it."""
    setuptools = tomllib.loads((root / "pyproject.toml").read_text()).get("tool", {}).get(
        "setuptools", {})
    packages = setuptools.get("packages", {})
    if not isinstance(packages, dict) or "find" not in packages:
        return ["pyproject.toml: packages are not found by [tool.setuptools.packages.find]"]
    include = packages["find"].get("include", [])
    out = [] if include else ["pyproject.toml: packages.find includes every top-level folder"]
    out += [f"pyproject.toml: packages.find includes {pattern!r}, not only {PACKAGE}*"
            for pattern in include if not pattern.startswith(PACKAGE)]
    for folder in sorted(p for p in root.iterdir() if (p / "__init__.py").exists()):
        if folder.name != PACKAGE and any(fnmatch.fnmatchcase(folder.name, p) for p in include):
            out.append(f"pyproject.toml: packages.find installs {folder.name}/ too")
    out += [f"{PACKAGE}/{name}/ is inside the installed package"
            for name in NOT_INSTALLED if (root / PACKAGE / name).exists()]
    for folder in sorted({path.parent for path in (root / PACKAGE).rglob("*.py")}):
        if not (folder / "__init__.py").exists():
            out.append(f"{folder.relative_to(root)}/ holds Python but no __init__.py: "
                       "packages.find leaves it out of the install")
    return out


def _report(violations: list[str]) -> str:
    return f"{len(violations)} offence(s):\n" + "\n".join(violations)


# ----- the contracts, on the package ------------------------------------------------------------

def test_modules_import_only_their_own_layer_or_lower() -> None:
    violations = layer_violations(REPO)
    assert not violations, _report(violations)


def test_no_import_circles() -> None:
    violations = cycle_violations(REPO)
    assert not violations, _report(violations)


def test_only_jax_and_evidence_import_jax() -> None:
    violations = jax_violations(REPO)
    assert not violations, _report(violations)


def test_rules_never_import_passes_command_line_solver_or_z3() -> None:
    violations = rules_violations(REPO)
    assert not violations, _report(violations)


def test_imports_inside_functions_say_why_they_wait() -> None:
    violations = lazy_violations(REPO)
    assert not violations, _report(violations)


def test_one_installed_top_level_package() -> None:
    violations = packaging_violations(REPO)
    assert not violations, _report(violations)


def test_the_walk_sees_the_package() -> None:
    """The checkers read the real tree: its layers' modules and their imports."""
    found = modules(REPO)
    assert {layer(m) for m in found} >= set(LAYERS), sorted(found)
    targets = {imp.target for imp in imports(REPO)}
    assert {f"{PACKAGE}.core.terms", f"{PACKAGE}.rules", "jaxlib.mlir"} <= targets


# ----- the checkers, on synthetic trees: each must catch what it is for ------------------------

def _tree(root: Path, files: dict[str, str | None]) -> Path:
    """A source tree under `root`; every folder of the package gets an empty __init__.py unless
    `files` says otherwise (None: no file)."""
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if text is not None:
            path.write_text(text)
    for folder in {(root / name).parent for name in files}:
        while folder != root and not (folder / "__init__.py").exists() \
                and f"{folder.relative_to(root)}/__init__.py" not in files:
            (folder / "__init__.py").write_text("")
            folder = folder.parent
    return root


def test_cycle_finder_finds_two_modules_importing_each_other(tmp_path: Path) -> None:
    root = _tree(tmp_path, {
        "entangle_mlir/core/a.py": "from entangle_mlir.core import b\n",
        "entangle_mlir/core/b.py": "def f():\n    from entangle_mlir.core.a import g  # lazy: x\n",
        "entangle_mlir/core/c.py": "import entangle_mlir.core.a\n",
    })
    assert cycles(import_graph(root)) == [["entangle_mlir.core.a", "entangle_mlir.core.b"]]
    (offence,) = cycle_violations(root)
    assert "entangle_mlir/core/a.py:1" in offence and "entangle_mlir/core/b.py:2" in offence


def test_cycle_finder_finds_a_longer_circle_through_relative_imports(tmp_path: Path) -> None:
    root = _tree(tmp_path, {
        "entangle_mlir/rules/__init__.py": "from .base import Rule\n",
        "entangle_mlir/rules/base.py": "from .kinds import window\n",
        "entangle_mlir/rules/kinds/window.py": "from entangle_mlir.rules import RULES\n",
    })
    assert cycles(import_graph(root)) == [
        ["entangle_mlir.rules", "entangle_mlir.rules.base", "entangle_mlir.rules.kinds.window"]]


def test_cycle_finder_passes_a_tree_without_circles(tmp_path: Path) -> None:
    root = _tree(tmp_path, {
        "entangle_mlir/core/a.py": "import os\n",
        "entangle_mlir/core/b.py": "from entangle_mlir.core import a\n",
        "entangle_mlir/mlir/c.py": "from entangle_mlir.core.b import f\nimport entangle_mlir.core.a\n",
    })
    assert cycles(import_graph(root)) == [] and cycle_violations(root) == []


def test_layer_checker_flags_an_import_upward(tmp_path: Path) -> None:
    root = _tree(tmp_path, {
        "entangle_mlir/core/terms.py": "def f():\n    from entangle_mlir.rules import base  # lazy: x\n",
        "entangle_mlir/rules/base.py": "from entangle_mlir.core import terms\n",
        "entangle_mlir/rules/kinds/window.py": "from entangle_mlir.rules.base import Rule\n",
        "entangle_mlir/analysis/infer.py": "from entangle_mlir import driver\n",
        "entangle_mlir/driver.py": "from entangle_mlir.passes import pipeline\n",
        "entangle_mlir/passes/pipeline.py": "from entangle_mlir.analysis import infer\n",
        "entangle_mlir/misc/thing.py": "",
    })
    assert layer_violations(root) == [
        "entangle_mlir/misc/__init__.py: entangle_mlir.misc is in no layer of " + str(LAYERS),
        "entangle_mlir/misc/thing.py: entangle_mlir.misc.thing is in no layer of " + str(LAYERS),
        ("entangle_mlir/analysis/infer.py:1: entangle_mlir.analysis.infer (analysis) imports "
         "entangle_mlir.driver (top)"),
        ("entangle_mlir/core/terms.py:2: entangle_mlir.core.terms (core) imports "
         "entangle_mlir.rules.base (rules)"),
    ]


def test_jax_checker_allows_jaxlib_and_the_two_front_ends(tmp_path: Path) -> None:
    root = _tree(tmp_path, {
        "entangle_mlir/core/x.py": "from jaxlib.mlir import ir\nimport jax.numpy as jnp\n",
        "entangle_mlir/jax.py": "import jax\n",
        "entangle_mlir/evidence.py": "def run():\n    from jax import numpy  # lazy: x\n",
        "entangle_mlir/cli.py": "import jaxlib\nimport jaxtyping\n",
    })
    assert jax_violations(root) == [
        "entangle_mlir/core/x.py:2: entangle_mlir.core.x imports jax.numpy"]


def test_rules_checker_flags_passes_command_line_solver_and_z3(tmp_path: Path) -> None:
    root = _tree(tmp_path, {
        "entangle_mlir/rules/base.py": ("import z3\n"
                                        "from entangle_mlir.analysis import solver\n"
                                        "from entangle_mlir.analysis.instance import checker\n"
                                        "from entangle_mlir import cli\n"),
        "entangle_mlir/rules/kinds/window.py": "from entangle_mlir.passes.pipeline import run\n",
        "entangle_mlir/analysis/solver.py": "import z3\n",
        "entangle_mlir/analysis/instance/checker.py": "",
        "entangle_mlir/passes/pipeline.py": "",
        "entangle_mlir/cli.py": "",
    })
    assert [v.split(": ", 1)[1] for v in rules_violations(root)] == [
        "entangle_mlir.rules.base imports z3",
        "entangle_mlir.rules.base imports entangle_mlir.analysis.solver",
        "entangle_mlir.rules.base imports entangle_mlir.cli",
        "entangle_mlir.rules.kinds.window imports entangle_mlir.passes.pipeline",
    ]


def test_lazy_checker_wants_a_reason_on_every_import_inside_a_function(tmp_path: Path) -> None:
    root = _tree(tmp_path, {"entangle_mlir/core/a.py": '''\
import os
if os.name:
    import sys


def with_reason():
    import json  # lazy: only a rarely used path writes JSON


def multi_line_with_reason():
    from collections import (  # lazy: a reason on the first line counts
        OrderedDict,
        deque,
    )


def empty_reason():
    import json  # lazy:


class C:
    def method(self):
        import json  # another comment


def outer():
    def inner():
        from os import path
'''})
    assert [v.split(" inside")[0] for v in lazy_violations(root)] == [
        "entangle_mlir/core/a.py:18: entangle_mlir.core.a imports json",
        "entangle_mlir/core/a.py:23: entangle_mlir.core.a imports json",
        "entangle_mlir/core/a.py:28: entangle_mlir.core.a imports os",
    ]


def test_packaging_checker(tmp_path: Path) -> None:
    good = '[tool.setuptools.packages.find]\ninclude = ["entangle_mlir*"]\n'
    root = _tree(tmp_path / "good", {"pyproject.toml": good, "entangle_mlir/core/a.py": "",
                                     "fuzz/gen.py": "", "examples/catalog.py": ""})
    assert packaging_violations(root) == []

    bad = '[tool.setuptools.packages.find]\ninclude = ["entangle_mlir*", "f*"]\n'
    root = _tree(tmp_path / "bad", {"pyproject.toml": bad, "entangle_mlir/core/a.py": "",
                                    "entangle_mlir/examples/catalog.py": "",
                                    "entangle_mlir/loose/__init__.py": None,
                                    "entangle_mlir/loose/b.py": "", "fuzz/gen.py": ""})
    assert packaging_violations(root) == [
        "pyproject.toml: packages.find includes 'f*', not only entangle_mlir*",
        "pyproject.toml: packages.find installs fuzz/ too",
        "entangle_mlir/examples/ is inside the installed package",
        ("entangle_mlir/loose/ holds Python but no __init__.py: packages.find leaves it out "
         "of the install"),
    ]
    (tmp_path / "none").mkdir()
    (tmp_path / "none" / "pyproject.toml").write_text('[tool.setuptools]\npackages = ["x"]\n')
    assert packaging_violations(tmp_path / "none") == [
        "pyproject.toml: packages are not found by [tool.setuptools.packages.find]"]


def test_no_module_defines_a_name_twice() -> None:
    """A second top-level `def`/`class` of one name silently replaces the first for every
    caller (two branches each adding a helper of one name, merged): each name once."""
    twice = []
    for path in sorted((REPO / PACKAGE).rglob("*.py")) + sorted((REPO / "tests").rglob("*.py")):
        tree = ast.parse(path.read_text())
        seen: set[str] = set()
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                if node.name in seen:
                    twice.append(f"{path.relative_to(REPO)}:{node.lineno} {node.name}")
                seen.add(node.name)
    assert not twice, twice
