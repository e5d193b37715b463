"""`gptoss-spark status | profile [NAME] | restart`: the admin API from a shell.

Human output by default, `--json` for scripts (the API's own JSON, one object).
It talks through admin/client.py, which `bench ab` uses too. The token is read
only for mutations, so `status` and `profile` work for any user while a switch
needs root or the gptoss-spark group.

Exit codes: 0 ok (status: engine ready), 1 not ready / the operation failed,
2 bad usage or settings, 69 service not answering, 77 token file unreadable.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from datetime import datetime
from typing import Any

from .admin.client import (POLL_SECONDS, Client, ServiceDown, operation_of, read_token_for_cli, state_of,
                           switch_limit, wait_operation)
from .base.defaults import CONFIG_HELP
from .service.config import Settings, load_settings, resolve_config_path
from .service.states import State
from .service.status import CommandKind, OpStatus


def register(sub: argparse._SubParsersAction) -> None:
    def common(p: argparse.ArgumentParser) -> None:
        p.add_argument("--config", help=CONFIG_HELP)
        p.add_argument("--json", action="store_true", help="print the API's JSON instead of text")

    def waiting(p: argparse.ArgumentParser) -> None:
        p.add_argument("--no-wait", action="store_true", help="return once accepted; poll with `status`")
        p.add_argument("--timeout", type=float, default=None, metavar="SECONDS",
                       help="give up waiting after this long (default: drain + shutdown grace + load timeouts)")

    p = sub.add_parser("status", help="state, profile, engine pid, uptime, restarts, last error, recent transitions")
    common(p)
    p.set_defaults(func=cmd_status)

    p = sub.add_parser("profile", help="show the profiles, or switch to NAME (rolls back if it fails)")
    p.add_argument("name", nargs="?", help="profile to switch to")
    common(p)
    waiting(p)
    p.set_defaults(func=cmd_profile)

    p = sub.add_parser("restart", help="warm restart of the engine, same profile (like systemctl reload)")
    common(p)
    waiting(p)
    p.add_argument("--signal-if-down", type=int, metavar="PID",
                   help="if the admin API does not answer, send SIGHUP to PID instead (not waited for); "
                        "the unit's ExecReload passes $MAINPID")
    p.set_defaults(func=cmd_restart)


def _settings(args: argparse.Namespace) -> Settings:
    return load_settings(resolve_config_path(args.config), must_exist=False)


def _print_json(obj: Any) -> None:
    print(json.dumps(obj, indent=2, sort_keys=True))


# ---- commands ---------------------------------------------------------------------------------

def cmd_status(args: argparse.Namespace) -> int:
    _, snap = Client(_settings(args)).json("GET", "/admin/status")
    state = state_of(snap)
    if args.json:
        _print_json(snap)
    else:
        print(render_status(snap))
    return 0 if state == State.READY else 1


def cmd_profile(args: argparse.Namespace) -> int:
    settings = _settings(args)
    if not args.name:
        _, body = Client(settings).json("GET", "/admin/profile")
        if args.json:
            _print_json(body)
        else:
            print(render_profiles(body))
        return 0
    client = Client(settings, read_token_for_cli(settings))
    status, body = client.json("PUT", "/admin/profile", ok=(200, 202), json={"name": args.name})
    if status == 200:  # already active and ready
        if args.json:
            _print_json(body)
        else:
            print(body.get("message", f"profile {args.name} is already active"))
        return 0
    if not args.json:
        print(f"switching {body.get('from') or '-'} -> {args.name} (operation {body['id']})")
    return follow(client, body, args, settings)


def cmd_restart(args: argparse.Namespace) -> int:
    settings = _settings(args)
    client = Client(settings, read_token_for_cli(settings))
    try:
        _, body = client.json("POST", "/admin/restart", ok=(202,))
    except ServiceDown as e:
        if not args.signal_if_down:
            raise
        # The admin API may be down while the supervisor serves (its port taken): a reload still works,
        # by the signal, only it cannot be waited for.
        os.kill(args.signal_if_down, signal.SIGHUP)
        print(f"{e}; sent SIGHUP to {args.signal_if_down} instead (warm restart, not waited for)", file=sys.stderr)
        return 0
    if not args.json:
        print(f"warm restart of {body.get('target')} (operation {body['id']})")
    return follow(client, body, args, settings)


def follow(client: Client, op: dict, args: argparse.Namespace, settings: Settings) -> int:
    """Poll the operation until it ends, showing the states it goes through."""
    if args.no_wait:
        if args.json:
            _print_json(op)
        else:
            print(f"accepted; follow it with: gptoss-spark status  (or GET {op['poll']})")
        return 0
    limit = args.timeout if args.timeout is not None else switch_limit(settings)
    started = time.monotonic()
    op = wait_operation(client, op, limit, on_state=None if args.json else (lambda state: print(f"  {state}")))
    took = time.monotonic() - started
    view = operation_of(op)
    succeeded = view.status == OpStatus.SUCCEEDED
    if args.json:
        _print_json(op)
    elif succeeded:
        what = f"switched to {view.target}" if view.kind == CommandKind.SWITCH else f"restarted {view.target}"
        print(f"{what}: ready after {took:.0f} s")
    else:
        print(f"{view.kind.value} to {view.target} FAILED: {view.error}", file=sys.stderr)
        if view.rolled_back_to:
            print(f"rolled back to {view.rolled_back_to}: it is starting again", file=sys.stderr)
            print(serving_again(client, view.rolled_back_to, max(0.0, limit - took), started), file=sys.stderr)
    return 0 if succeeded else 1


def serving_again(client: Client, profile: str, limit: float, started: float) -> str:
    """Wait (up to limit) for the rollback's engine: one line that says whether the service serves again."""
    deadline = time.monotonic() + limit
    state: State | None = None
    while True:
        r = client.request("GET", "/admin/health")
        try:
            body = r.json()
        except ValueError:
            body = {}
        state = state_of(body) if body.get("state") else state
        if state == State.READY:
            return f"{profile} serves again, {time.monotonic() - started:.0f} s after the switch began"
        if state == State.FAILED:
            return (f"{profile} did not get ready either (state failed); see `gptoss-spark status` "
                    "and journalctl -u gptoss-spark")
        if time.monotonic() > deadline:
            return f"{profile} not ready yet after {limit:g} s; follow it with `gptoss-spark status`"
        time.sleep(POLL_SECONDS)


# ---- rendering --------------------------------------------------------------------------------

def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    s = int(seconds)
    d, s = divmod(s, 86400)
    h, s = divmod(s, 3600)
    m, s = divmod(s, 60)
    parts = [f"{d}d"] if d else []
    if d or h:
        parts.append(f"{h}h")
    if d or h or m:
        parts.append(f"{m}m")
    parts.append(f"{s}s")
    return "".join(parts)


def _gib(b: float | None) -> str:
    return "-" if b is None else f"{b / 2**30:.1f} GiB"


def telemetry_rows(tel: dict | None) -> list[tuple[str, str]]:
    """`gpu` (one row per device, or why there is none) and `engine mem` rows from /admin/status's telemetry."""
    if not tel:
        return [("gpu", "no sample yet")]
    gpu = tel.get("gpu") or {}
    rows = []
    if not gpu.get("available"):
        rows.append(("gpu", gpu.get("reason") or "unavailable"))
    for d in gpu.get("devices") or []:
        bits = []
        if d.get("temperature_c") is not None:
            bits.append(f"{d['temperature_c']:g} C")
        if d.get("sm_clock_mhz") is not None:
            bits.append(f"SM {d['sm_clock_mhz']:g} MHz"
                        + (f" of {d['max_sm_clock_mhz']:g}" if d.get("max_sm_clock_mhz") else ""))
        if d.get("power_watts") is not None:
            limit = d.get("power_limit_watts")
            bits.append(f"{d['power_watts']:.0f} W" + (f" of {limit:.0f} W" if limit else ""))
        if d.get("utilization_percent") is not None:
            bits.append(f"util {d['utilization_percent']:g}%")
        slow = [r for r in d.get("throttle") or [] if r != "idle"]
        if slow:
            bits.append("throttle: " + ", ".join(slow))
        rows.append((f"gpu {d['index']}", ", ".join(bits) or "no figures"))
    episodes = tel.get("throttle_episodes") or []
    if episodes:
        rows.append(("throttling", ", ".join(f"{e['kind']} (gpu {e['gpu']})" for e in episodes)))
    mem = tel.get("memory") or {}
    engine = tel.get("engine") or {}
    rate = engine.get("tokens_per_second")
    rows.append(("engine mem", f"unit cgroup {_gib(mem.get('cgroup_bytes'))}, engine RSS {_gib(mem.get('engine_rss_bytes'))}"
                 + (f", {rate:.1f} tokens/s" if rate is not None else "")))
    return rows


def render_status(snap: dict) -> str:
    saved = snap.get("saved") or {}
    mem = snap.get("memory")
    state = snap.get("state", "?")
    if state == State.READY and snap.get("ready_seconds") is not None:
        state += f" for {_duration(snap['ready_seconds'])}"
    engine = "-"
    if snap.get("engine_pid"):
        engine = f"pid {snap['engine_pid']}, {snap.get('engine_url')}"
    sw = snap.get("switches") or {}
    rows = [
        ("state", state),
        ("profile", f"{snap.get('profile') or '-'} (last good: {saved.get('last_good_profile') or '-'})"),
        ("engine", engine),
        ("uptime", _duration(snap.get("uptime_seconds"))),
        ("restarts", f"{snap.get('restarts', 0)} (failures in window: {snap.get('recent_failures', 0)})"),
        ("switches", f"{sw.get('ok', 0)} ok, {sw.get('failed', 0)} failed"),
    ]
    if mem:
        psi = mem.get("psi_some_avg10")
        rows.append(("memory", f"{mem['available_gib']:.1f} of {mem['total_gib']:.1f} GiB available"
                               + (f", PSI some avg10 {psi:.1f}%" if psi is not None else "")
                               + f", guard trips {mem.get('guard_trips', 0)}"))
    rows.extend(telemetry_rows(snap.get("telemetry")))
    op = snap.get("operation")
    if op:
        line = f"{op['kind']} -> {op['target']}: {op['status']}"
        if op.get("error"):
            line += f" ({op['error']})"
        rows.append(("operation", line))
    start = snap.get("start") or {}
    if start.get("current"):
        cur = start["current"]
        rows.append(("starting", f"{cur['phase']} phase, {cur['seconds']:.0f} s since spawn"))
    if start.get("last"):
        rows.append(("last start", render_start(start["last"])))
    rows.append(("last error", snap.get("last_error") or "-"))
    out = [f"{k:<11}{v}" for k, v in rows]
    transitions = snap.get("transitions") or []
    if transitions:
        out.append("recent transitions:")
        for t in transitions[-10:]:
            when = datetime.fromtimestamp(t["at"]).strftime("%H:%M:%S")
            out.append(f"  {when}  {t['from']:>8} -> {t['to']:<8}  {t.get('profile') or '-'}: {t['reason']}")
    return "\n".join(out)


def render_start(last: dict) -> str:
    """One line: how long the last engine start took, by phase, and what it compiled."""
    took = f"{last['ready_seconds']:.1f} s" if last.get("ready_seconds") is not None else "not ready"
    phases = ", ".join(f"{p} {v:.1f}" for p, v in (last.get("phases") or {}).items())
    compiled = "; ".join(last.get("compiled") or []) or "nothing"
    return f"{took} ({phases}); compiled {compiled}"


def render_profiles(body: dict) -> str:
    out = [f"active: {body.get('active') or '-'} ({body.get('state')}); last good: {body.get('last_good') or '-'}"]
    profiles = body.get("profiles") or []
    width = max((len(p["name"]) for p in profiles), default=4)
    for p in profiles:
        mark = "*" if p.get("active") else " "
        out.append(f" {mark} {p['name']:<{width}}  {p['description']}")
        if p.get("why_not"):
            out.append(f"   {'':<{width}}  cannot run here: {'; '.join(p['why_not'])}")
    if body.get("profiles_error"):
        out.append(f"a profile file is broken (listed: the profiles loaded before): {body['profiles_error']}")
    if body.get("operation") and (op := operation_of(body["operation"])).status.in_progress:
        out.append(f"in progress: {op.kind.value} -> {op.target} ({op.status.value})")
    return "\n".join(out)
