"""`gptoss-spark status | profile [NAME] | restart`: the admin API from a shell.

Human output by default, `--json` for scripts (the API's own JSON, one object).
The admin URL comes from the settings file ([admin] host/port); the token from
[admin] token_file, read only for mutations, so `status` and `profile` work
for any user while a switch needs root or the gptoss-spark group.

States and operations in the API's JSON are parsed into the service's own enums
(service/status.py): a value this version does not know is a one-line error,
not a silent "not ready".

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

import httpx

from .service.config import Settings, load_settings, resolve_config_path
from .service.defaults import CONFIG_HELP
from .service.states import State
from .service.status import CommandKind, OperationView, OpStatus, StatusFormatError, parse_state
from .errors import UserError
from .exit_codes import EXIT_FAILED, EXIT_NOPERM, EXIT_UNAVAILABLE

REQUEST_TIMEOUT = 10.0
POLL_SECONDS = 1.0


class ServiceDown(UserError):
    exit_code = EXIT_UNAVAILABLE


class TokenUnreadable(UserError):
    exit_code = EXIT_NOPERM


class ApiError(UserError):
    exit_code = EXIT_FAILED


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


# ---- talking to the service -------------------------------------------------------------------

def local_url(host: str, port: int) -> str:
    """http URL for a listener from this host: a wildcard bind is reached on loopback."""
    if host in ("", "0.0.0.0"):
        host = "127.0.0.1"
    elif host == "::":
        host = "::1"
    if ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{port}"


def admin_url(settings: Settings) -> str:
    return local_url(settings.admin.host, settings.admin.port)


def read_token_for_cli(settings: Settings) -> str:
    from .admin.auth import TokenUnavailable, read_token
    path = settings.admin.token_file
    try:
        with path.open("rb"):
            pass
    except FileNotFoundError:
        raise TokenUnreadable(f"admin token file {path} does not exist; is the service installed? "
                              "(install.sh creates it; [admin] token_file in the settings names it)") from None
    except PermissionError:
        raise TokenUnreadable(
            f"cannot read the admin token file {path} (permission denied); run with sudo, or add yourself "
            "to the gptoss-spark group (sudo usermod -aG gptoss-spark $USER, then log in again)") from None
    except OSError:
        pass  # read_token says what is wrong
    try:
        return read_token(path)
    except TokenUnavailable as e:
        raise TokenUnreadable(str(e)) from None


class Client:
    def __init__(self, settings: Settings, token: str | None = None):
        self.base = admin_url(settings)
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.http = httpx.Client(base_url=self.base, headers=headers, timeout=REQUEST_TIMEOUT)

    def request(self, method: str, path: str, **kw: Any) -> httpx.Response:
        try:
            return self.http.request(method, path, **kw)
        except httpx.ConnectError:
            raise ServiceDown(f"the service is not answering at {self.base}; is it running? "
                              "(systemctl status gptoss-spark; journalctl -u gptoss-spark)") from None
        except httpx.TimeoutException:
            raise ServiceDown(f"the service at {self.base} did not answer within {REQUEST_TIMEOUT:g} s") from None
        except httpx.HTTPError as e:
            raise ServiceDown(f"talking to {self.base} failed: {type(e).__name__}") from None

    def json(self, method: str, path: str, ok: tuple[int, ...] = (200,), **kw: Any) -> tuple[int, dict]:
        r = self.request(method, path, **kw)
        try:
            body = r.json()
        except ValueError:
            raise ApiError(f"{method} {path} answered HTTP {r.status_code} without JSON "
                           f"(is {self.base} the gptoss-spark admin API?)") from None
        if r.status_code not in ok:
            raise api_error(r.status_code, body)
        return r.status_code, body


def api_error(status: int, body: dict) -> UserError:
    message = body.get("message") or body.get("error") or f"HTTP {status}"
    if status == 401 or status == 403:
        return TokenUnreadable(f"the service refused the token ({message}); is the token file the one "
                               "the service reads?")
    if status == 503 and body.get("error") == "token_unavailable":
        return ApiError(f"the service cannot check tokens: {message}")
    return ApiError(message)


def _settings(args: argparse.Namespace) -> Settings:
    return load_settings(resolve_config_path(args.config), must_exist=False)


def state_of(body: dict) -> State:
    """The "state" of an admin API answer; a value this version does not know is an ApiError."""
    try:
        return parse_state(body.get("state"))
    except StatusFormatError as e:
        raise ApiError(str(e)) from None


def operation_of(body: dict) -> OperationView:
    """An operation of an admin API answer, typed; a malformed one is an ApiError."""
    try:
        return OperationView.from_json(body)
    except StatusFormatError as e:
        raise ApiError(str(e)) from None
    except KeyError as e:
        raise ApiError(f"the service answered an operation without {e.args[0]!r}; "
                       "is this CLI the same version as the service?") from None


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


def switch_limit(settings: Settings) -> float:
    """How long a switch or restart may take: drain, stop, and a full load, with a minute to spare."""
    t = settings.timeouts
    return t.drain + t.shutdown_grace + t.load + 60


def wait_operation(client: Client, op: dict, limit: float, on_state=None) -> dict:
    """Poll the operation until it ends; on_state(state) hears each new service state on the way."""
    deadline = time.monotonic() + limit
    last_state = None
    while operation_of(op).status.in_progress:
        if time.monotonic() > deadline:
            raise ApiError(f"operation {op['id']} still {op['status']} after {limit:g} s; "
                           "follow it with `gptoss-spark status`")
        time.sleep(POLL_SECONDS)
        if on_state is not None:
            r = client.request("GET", "/admin/health")
            health = r.json() if r.headers.get("content-type", "").startswith("application/json") else {}
            state = state_of(health) if health.get("state") else None  # an error body has none: skip it
            if state and state != last_state:
                on_state(state.value)
                last_state = state
        _, op = client.json("GET", op["poll"])
    return op


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
    op = snap.get("operation")
    if op:
        line = f"{op['kind']} -> {op['target']}: {op['status']}"
        if op.get("error"):
            line += f" ({op['error']})"
        rows.append(("operation", line))
    rows.append(("last error", snap.get("last_error") or "-"))
    out = [f"{k:<11}{v}" for k, v in rows]
    transitions = snap.get("transitions") or []
    if transitions:
        out.append("recent transitions:")
        for t in transitions[-10:]:
            when = datetime.fromtimestamp(t["at"]).strftime("%H:%M:%S")
            out.append(f"  {when}  {t['from']:>8} -> {t['to']:<8}  {t.get('profile') or '-'}: {t['reason']}")
    return "\n".join(out)


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
