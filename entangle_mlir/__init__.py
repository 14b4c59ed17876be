"""entangle: prove that a sharded StableHLO program refines its unsharded reference."""

import argparse


def version() -> str:
    """The installed distribution's version ("unknown" when entangle runs from a source tree
    that was never installed)."""
    from importlib import metadata  # lazy: only --version needs it

    try:
        return metadata.version("entangle-mlir")
    except metadata.PackageNotFoundError:
        return "unknown (not installed)"


class VersionFlag(argparse.Action):
    """`--version`: prints the program's name and entangle's version (looked up only then)."""

    def __init__(self, option_strings, dest, **kwargs):
        super().__init__(option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS,
                         nargs=0, help="print the version and exit")

    def __call__(self, parser, namespace, values, option_string=None):
        print(f"{parser.prog} {version()}")
        parser.exit()
