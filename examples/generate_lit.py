"""Write the MLIR inputs of the example lit tests (lit_tests/bugs, lit_tests/examples).

Usage: ``python -m examples.generate_lit`` (rewrite the inputs) or
``python -m examples.generate_lit --check`` (exit 1 if a committed input is stale).

Every example at tp=4 (the seven buggy ones and the correct ones) is lowered with
``examples.catalog.lower_pair``. Locations are made independent of where the repo lives and of
how this script is run: the repo root is stripped from file names (``examples/models.py``), and
the frames of this script and of the Python runtime (runpy, pytest) are not recorded, so the
user frames are the models and the shard_map call in the catalogue.
"""

from __future__ import annotations

import argparse
import difflib
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BUGS_DIR = REPO / "lit_tests" / "bugs" / "Inputs"
EXAMPLES_DIR = REPO / "lit_tests" / "examples" / "Inputs"

# bug tag -> example name (all at tp=4).
BUGS = {
    "missing_psum": "megatron_mlp_missing_psum_tp4",
    "pmean": "megatron_mlp_pmean_tp4",
    "bias_before_psum": "megatron_mlp_bias_before_psum_tp4",
    "gelu_before_psum": "row_linear_gelu_gelu_before_psum_tp4",
    "all_gather_wrong_dim": "seqpar_mlp_all_gather_wrong_dim_tp4",
    "local_stats": "layernorm_hidden_local_stats_tp4",
    "psum_wrong_axis": "gpt2_block_psum_wrong_axis_dp2_tp4",
}


def correct_names() -> list[str]:
    """The correct examples at tp=4 (every mesh with a tp=4 axis)."""
    from examples.catalog import EXAMPLES

    return [e.name for e in EXAMPLES if e.bug is None and dict(e.mesh_axes).get("tp") == 4]


def _quiet_frames() -> None:
    """Keep this script and the Python runtime out of the recorded call stacks."""
    from jax._src import source_info_util

    for prefix in (str(Path(__file__).resolve()), "<frozen ", str(Path(sys.prefix))):
        source_info_util.register_exclusion(prefix)
    try:
        import _pytest
        import pluggy

        for module in (_pytest, pluggy):
            source_info_util.register_exclusion(str(Path(module.__file__).resolve().parent))
    except ImportError:
        pass


def relative_paths(text: str) -> str:
    """Strip the repo root from recorded file names: "/x/repo/examples/m.py" -> "examples/m.py"."""
    return text.replace(f'"{REPO}/', '"')


def render() -> dict[Path, str]:
    """Path -> text of every input file."""
    from examples.catalog import by_name, lower_pair

    _quiet_frames()
    out: dict[Path, str] = {}
    targets = [(BUGS_DIR, name) for name in BUGS.values()]
    targets += [(EXAMPLES_DIR, name) for name in correct_names()]
    for directory, name in targets:
        ref, sharded = lower_pair(by_name(name))
        out[directory / f"{name}.ref.mlir"] = relative_paths(ref)
        out[directory / f"{name}.sharded.mlir"] = relative_paths(sharded)
    return out


def stale(files: dict[Path, str]) -> list[str]:
    """A unified diff (first lines) per committed file that differs from `files`."""
    problems = []
    for path, text in files.items():
        old = path.read_text() if path.exists() else ""
        if old != text:
            diff = difflib.unified_diff(old.splitlines(), text.splitlines(), str(path),
                                        "regenerated", lineterm="", n=1)
            problems.append("\n".join(list(diff)[:12]))
    for directory in (BUGS_DIR, EXAMPLES_DIR):
        for path in sorted(directory.glob("*.mlir")):
            if path not in files:
                problems.append(f"{path}: not produced by the generator (delete it)")
    return problems


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true",
                        help="do not write; exit 1 if a committed input is stale")
    args = parser.parse_args(argv)
    files = render()
    if args.check:
        problems = stale(files)
        for problem in problems:
            print(problem)
        if problems:
            print(f"{len(problems)} stale lit input(s): run python -m examples.generate_lit")
        return 1 if problems else 0
    for path, text in files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    print(f"wrote {len(files)} files under {BUGS_DIR.parent.parent}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
