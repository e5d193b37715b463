"""`gptoss-spark` command line. Each feature module registers its own subcommands.

A module in COMMAND_MODULES exposes register(subparsers); each parser it adds
sets `func(args) -> int`. UserError ends in one line on stderr and its exit
code, never a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from . import __version__
from .errors import UserError
from .exit_codes import EXIT_INTERRUPTED

COMMAND_MODULES = (
    "gptoss_spark.commands",
    "gptoss_spark.bench.commands", "gptoss_spark.draft.commands",
    "gptoss_spark.admin_cli",
    "gptoss_spark.install",
    "gptoss_spark.install.demo_model",
    "gptoss_spark.install.patching",
    "gptoss_spark.kernels.cli",
    "gptoss_spark.flashinfer_jit.cli",
    "gptoss_spark.doctor",
    "gptoss_spark.gpuclock",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gptoss-spark", description="gpt-oss on a DGX Spark as a host service.")
    parser.add_argument("--version", action="version", version=f"gptoss-spark {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except UserError as e:
        print(f"gptoss-spark: error: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
