"""`gptoss-spark flashinfer ...`: FlashInfer's JIT modules for the installed profiles, ahead of time.

  gptoss-spark flashinfer build  [--config FILE] [--module NAME]... [--profile NAME]... [--jobs N]
  gptoss-spark flashinfer link   [--config FILE]
  gptoss-spark flashinfer status [--config FILE] [--json]

install.sh runs `build` as the service user (the cache is the engine's, under
state_dir) and then `link` as root (the venv is root's). A separate command
from `kernels build`: these are vLLM's dependencies, chosen by the profiles'
flags, with their own failure (exit 27) and log; `kernels` is this package's
own opt-in Triton kernels.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict

from ..service.config import load_settings, resolve_config_path
from ..base.defaults import CONFIG_HELP


def register(sub: argparse._SubParsersAction) -> None:
    fi = sub.add_parser("flashinfer", help="FlashInfer JIT modules of the installed profiles: build, link, status")
    fsub = fi.add_subparsers(dest="flashinfer_command", metavar="ACTION", required=True)

    b = fsub.add_parser("build", help="compile the modules the installed profiles need into the engine's cache")
    b.add_argument("--config", default=None, help=CONFIG_HELP)
    b.add_argument("--module", action="append", default=None, metavar="NAME",
                   help="build only this module (repeatable; it must be one the profiles need)")
    b.add_argument("--profile", action="append", default=None, metavar="NAME",
                   help="only this profile's modules (repeatable; default: every installed profile)")
    b.add_argument("--jobs", type=int, default=None,
                   help="parallel compile jobs (default: from MemAvailable and the core count, docs/INSTALL.md)")
    b.set_defaults(func=cmd_build)

    ln = fsub.add_parser("link", help="link the built modules into this venv's flashinfer/data/aot (root)")
    ln.add_argument("--config", default=None, help=CONFIG_HELP)
    ln.set_defaults(func=cmd_link)

    st = fsub.add_parser("status", help="each profile's modules: built for this FlashInfer/arch/toolkit? linked?")
    st.add_argument("--config", default=None, help=CONFIG_HELP)
    st.add_argument("--json", action="store_true")
    st.set_defaults(func=cmd_status)


def _settings(args: argparse.Namespace):
    return load_settings(resolve_config_path(args.config), must_exist=False)


def cmd_build(args: argparse.Namespace) -> int:
    from .build import FlashInferBuildError, build
    if args.jobs is not None and args.jobs < 1:
        raise FlashInferBuildError(f"--jobs {args.jobs}: give 1 or more")
    build(_settings(args), modules=args.module, profiles=args.profile, jobs=args.jobs)
    return 0


def cmd_link(args: argparse.Namespace) -> int:
    from .build import link
    link(_settings(args))
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    from .build import status
    rows, notes = status(_settings(args))
    if args.json:
        print(json.dumps({"modules": [asdict(r) for r in rows], "notes": [asdict(n) for n in notes]}, indent=2))
    else:
        for r in rows:
            state = "built" if r.built else "missing"
            print(f"{r.profile:<10} {r.name:<24} {r.arch_list:<6} {state:<8} "
                  f"{'linked' if r.linked else 'not linked'}  {r.path}")
        for n in notes:
            print(f"{'warning' if n.gap else 'note'}: {n.text}")
    return 0 if all(r.built for r in rows) else 1
