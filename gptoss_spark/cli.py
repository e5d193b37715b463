"""`gptoss-spark` command line.

One convention: each package with commands has a `cli.py` whose register(subparsers) adds
them (the top-level modules commands.py, admin_cli.py, doctor.py, gpuclock.py, model_cli.py
and warmup.py are such modules themselves), imported here by name; each parser it adds sets
`func(args) -> int`. tests/unit/test_house_rules.py holds the convention.
base/errors.run_command runs the chosen one: a UserError ends in one line on stderr and its exit
code, never a traceback.
"""

from __future__ import annotations

import argparse
import sys

from . import __version__, admin_cli, commands, doctor, gpuclock, model_cli, warmup
from .base.errors import run_command
from .bench import cli as bench_cli
from .draft import cli as draft_cli
from .flashinfer_jit import cli as flashinfer_cli
from .install import cli as install_cli
from .kernel_tools import cli as kernels_cli

# In the order `gptoss-spark --help` lists them.
COMMAND_MODULES = (commands, bench_cli, draft_cli, admin_cli, install_cli, kernels_cli, flashinfer_cli, doctor,
                   warmup, gpuclock, model_cli)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gptoss-spark", description="gpt-oss on a DGX Spark as a host service.")
    parser.add_argument("--version", action="version", version=f"gptoss-spark {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for module in COMMAND_MODULES:
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    return run_command(args.func, args, "gptoss-spark")


if __name__ == "__main__":
    sys.exit(main())
