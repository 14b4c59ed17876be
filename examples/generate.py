"""Write the reference and sharded MLIR of the examples.

Usage: ``python -m examples.generate [OUTDIR] [--all] [-k SUBSTRING]``.

By default it writes the *bundled* set into entangle_mlir/demo (the files `entangle demo` checks and
that are committed): the tp=4 variant of every example, correct and buggy, plus the dp=2 x tp=4
GPT-2 block and its bug. ``--all`` writes every mesh size (tp=2/4/8, dp2 x tp2); those extra
files are git-ignored. Each pair is ``OUTDIR/<name>.ref.mlir`` and ``OUTDIR/<name>.sharded.mlir``
with debug locations; absolute paths under the repository root are rewritten to paths relative
to it (``/path/to/repo/examples/models.py`` -> ``examples/models.py``) so the committed files do
not depend on where the repository was cloned.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from examples.catalog import EXAMPLES, Example, lower_pair

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUTDIR = Path(__file__).resolve().parents[1] / "entangle_mlir" / "demo"


def is_bundled(ex: Example) -> bool:
    """The demo set: every example at tp=4 (1-D tp mesh, or the dp=2 x tp=4 GPT-2 block)."""
    return dict(ex.mesh_axes).get("tp") == 4 and dict(ex.mesh_axes).get("dp", 2) == 2


def relativize(text: str, root: Path = REPO_ROOT) -> str:
    """Rewrite `"<root>/x/y.py"` in MLIR locations to `"x/y.py"`."""
    for spelling in {str(root), str(root.resolve())}:
        text = text.replace(f'"{spelling}/', '"')
    return text


def generate(outdir: Path, substring: str = "", everything: bool = False) -> list[Path]:
    """Lower the bundled (or every) example whose name contains ``substring``; return paths."""
    outdir.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    for ex in EXAMPLES:
        if substring not in ex.name or not (everything or is_bundled(ex)):
            continue
        ref, shd = lower_pair(ex)
        for suffix, text in (("ref", ref), ("sharded", shd)):
            path = outdir / f"{ex.name}.{suffix}.mlir"
            path.write_text(relativize(text))
            written.append(path)
    return written


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("outdir", nargs="?", type=Path, default=DEFAULT_OUTDIR)
    parser.add_argument("--all", dest="everything", action="store_true",
                        help="every mesh size, not only the bundled tp=4 set")
    parser.add_argument("-k", dest="substring", default="", help="only names containing this")
    args = parser.parse_args(argv)
    paths = generate(args.outdir, args.substring, args.everything)
    print(f"wrote {len(paths)} files to {args.outdir}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
