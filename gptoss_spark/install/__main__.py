"""`python3 -m gptoss_spark.install STEP ...`: install.sh's entry, before the package is installed."""

from __future__ import annotations

import argparse
import sys

from ..base.errors import run_command
from .cli import register_steps


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gptoss-spark")
    register_steps(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["install", *(sys.argv[1:] if argv is None else argv)])
    return run_command(args.func, args, "gptoss-spark install")


if __name__ == "__main__":
    sys.exit(main())
