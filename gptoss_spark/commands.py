"""Core subcommands: `serve` (the unit's ExecStart) and `check` (validate settings and profiles)."""

from __future__ import annotations

import argparse
import asyncio
import sys

from .service import logs
from .service.api_access import check_api_access
from .service.argcheck import profiles_rejected
from .service.config import load_settings, resolve_config_path
from .service.instance import check_instance
from .base.defaults import CONFIG_HELP
from .base.errors import ConfigError
from .service.profiles import get_profile, load_profiles
from .service.store import StateStore
from .service.supervisor import Supervisor, SupervisorParts
from .service.systemd import Notifier


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("serve", help="run the supervisor and its engine (what the systemd unit starts)")
    p.add_argument("--config", help=CONFIG_HELP)
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    p.set_defaults(func=cmd_serve)

    p = sub.add_parser("check", help="validate the settings, the profiles and the active profile's requirements")
    p.add_argument("--config", help=CONFIG_HELP)
    p.add_argument("--profile", help="check this profile alone (default: the active one's requirements and "
                                     "every profile's engine arguments)")
    p.add_argument("--all-profiles", action="store_true",
                   help="only check every profile's engine arguments: vLLM's parser, its ModelConfig, the parallel "
                        "sizes and the memory arithmetic (what an upgrade checks before it stops the running "
                        "engine); exit 1 if any is rejected")
    p.add_argument("--skip-profiles", default="", metavar="NAME[,NAME]",
                   help="with --all-profiles: leave these out (the installer checks the shipped, unedited "
                        "profiles alone to tell whether the new version or an edit is at fault)")
    p.add_argument("--engine-python", help="check with this interpreter's vLLM instead of engine.python's")
    p.set_defaults(func=cmd_check)


def cmd_check(args: argparse.Namespace) -> int:
    settings = load_settings(resolve_config_path(args.config))
    check_instance(settings, resolve_config_path(args.config))  # gptoss-spark@NAME's file: not the default's dirs
    if args.engine_python:
        engine = settings.engine.model_copy(update={"python": args.engine_python})
        settings = settings.model_copy(update={"engine": engine})
    profiles = load_profiles(settings)
    if args.all_profiles:
        skipped = {n for n in args.skip_profiles.split(",") if n}
        return _check_all(settings, {n: p for n, p in profiles.items() if n not in skipped})
    active = StateStore(settings.state_file).load().active_profile
    name = args.profile or active or settings.default_profile
    profile = get_profile(profiles, name, settings)
    profile.check_requirements(settings)
    check_api_access(settings)
    # What was asked: --profile NAME, that one; --config FILE, the profiles FILE serves (the active
    # one and default_profile: an instance's file shares profile_dirs with the default service, whose
    # other profiles are not its business); neither, the default service's check: every installed
    # profile (a switch to any of them must not be the first to find a bad flag). One vLLM import
    # per interpreter and environment (argcheck.py).
    if args.profile:
        checked = {name: profile}
    elif args.config:
        checked = {n: get_profile(profiles, n, settings) for n in dict.fromkeys((name, settings.default_profile))}
    else:
        checked = profiles
    results = asyncio.run(profiles_rejected(settings, checked))
    verdict, line = results[name]
    if verdict == "unchecked":
        raise ConfigError(profile.source, "engine.args", f"could not be checked: {line}",
                          "check engine.python in the settings names the venv's python")
    rejected = [n for n, (v, _) in results.items() if v == "rejected"]
    if rejected:
        first = profiles[rejected[0]]
        more = f" (vLLM rejects {len(rejected) - 1} more: {', '.join(rejected[1:])})" if len(rejected) > 1 else ""
        raise ConfigError(first.source, "engine.args", f"vLLM rejects profile {first.name}'s engine arguments: "
                          f"{results[first.name][1]}{more}", "fix the argument (vllm serve --help lists them)")
    for other, (v, why) in results.items():
        if v == "unchecked":
            print(f"  profile {other}: not checked: {why}")
    others = f"; vLLM accepts the arguments of all {len(checked)}" if len(checked) > 1 else ""
    print(f"ok: {settings.source}, {len(profiles)} profile(s) ({', '.join(sorted(profiles))}); "
          f"profile {name} can start (vLLM accepts its engine arguments){others}")
    if len(checked) < len(profiles) and not args.profile:
        print(f"  not checked: {', '.join(sorted(set(profiles) - set(checked)))} (not served by "
              f"{settings.source}; --all-profiles checks every profile)")
    if settings.cluster is not None:
        from .service.cluster import check_peer

        print(f"cluster {settings.cluster.role}: {asyncio.run(check_peer(settings))}")
    return 0


def _check_all(settings, profiles) -> int:
    """One line per profile; a profile vLLM cannot be asked about (its engine does not run on this
    machine: a Spark profile beside a --cpu demonstration) is named but is no failure."""
    results = asyncio.run(profiles_rejected(settings, profiles))
    for name, (verdict, line) in results.items():
        where = profiles[name].source
        if verdict == "rejected":
            print(f"profile {name} ({where}): vLLM rejects its engine arguments: {line}", file=sys.stderr)
        elif verdict == "unchecked":
            print(f"  profile {name}: not checked: {line}")
        else:
            print(f"  profile {name}: vLLM accepts its engine arguments")
    return 1 if any(v == "rejected" for v, _ in results.values()) else 0


def cmd_serve(args: argparse.Namespace) -> int:
    logs.configure(args.log_level)
    notifier = Notifier()  # takes NOTIFY_SOCKET out of the environment before anything can inherit it
    settings = load_settings(resolve_config_path(args.config))
    check_instance(settings, resolve_config_path(args.config))  # an instance sharing the default's state: exit 2
    # The parts are built here, where a bad profile file is still a clean config error (exit 2).
    supervisor = Supervisor(settings, SupervisorParts.from_settings(settings), notifier=notifier)
    supervisor.initial_profile()  # a bad default_profile is a config error: exit before anything starts
    check_api_access(settings)  # likewise a bind address not on this host, or an unreadable key
    return asyncio.run(_serve(supervisor))


async def _serve(supervisor: Supervisor) -> int:
    supervisor.install_signal_handlers(asyncio.get_running_loop())
    # Imported here, not at the top: every CLI command loads this module, and only serve needs FastAPI.
    from .admin import run_admin_server

    admin = asyncio.create_task(run_admin_server(supervisor, supervisor.settings), name="admin-api")
    try:
        return await supervisor.run()
    finally:
        admin.cancel()
        await asyncio.gather(admin, return_exceptions=True)

