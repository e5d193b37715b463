"""Core subcommands (serve, check). Feature modules register their own in cli.COMMAND_MODULES."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:
    pass  # serve/check land with the supervisor
