"""Core subcommands: serve, check. (Feature modules register their own.)"""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:
    from . import serve_cmd  # noqa: F401  (filled in by the service-core work)
