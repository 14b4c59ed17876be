"""Write the reference and sharded MLIR of every example.

Usage: ``python -m examples.generate [OUTDIR] [-k SUBSTRING]`` (default OUTDIR: examples/mlir).
Produces ``OUTDIR/<name>.ref.mlir`` and ``OUTDIR/<name>.sharded.mlir`` with debug locations.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from examples.catalog import EXAMPLES, lower_pair

DEFAULT_OUTDIR = Path(__file__).resolve().parent / "mlir"


def generate(outdir: Path, substring: str = "") -> list[Path]:
    """Lower every example whose name contains ``substring``; return the written paths."""
    outdir.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    for ex in EXAMPLES:
        if substring not in ex.name:
            continue
        ref, shd = lower_pair(ex)
        for suffix, text in (("ref", ref), ("sharded", shd)):
            path = outdir / f"{ex.name}.{suffix}.mlir"
            path.write_text(text)
            written.append(path)
    return written


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("outdir", nargs="?", type=Path, default=DEFAULT_OUTDIR)
    parser.add_argument("-k", dest="substring", default="", help="only names containing this")
    args = parser.parse_args(argv)
    paths = generate(args.outdir, args.substring)
    print(f"wrote {len(paths)} files to {args.outdir}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
