"""Preflight for a cluster node: does the other node's supervisor answer, paired with this one?

Asked over its admin API, as the running supervisors ask each other (service/cluster.py):
`GET /admin/cluster` gives its role and venv id; the token both must share is tried
with a `POST /admin/cluster/order` whose body is not JSON, which the admin API
answers 400 after a good token and 401/403 after a wrong one, and carries out
nothing either way (admin/app.py: token, then JSON, then the order).

Install order (docs/CLUSTER.md): the worker first, then the head. The worker has
no head to ask yet, so a head that does not answer is only a note there; the
head's install is the one that checks the pair, and refuses a worker that does
not answer, runs another venv than the one this install builds, or holds another
admin token. Whichever node installs, a peer that answers in the same role, or
with another token, fails: the pair could not work.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path
from typing import Callable

from .checks import Check
from .cluster import Cluster
from ..base import token as base_token
from ..base.exit_codes import EXIT_PEER
TIMEOUT_S = 3.0
# Proxies from the environment must not see the cluster link (or the token).
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def admin_url(host: str, port: int) -> str:
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def http_request(req: urllib.request.Request, timeout: float) -> tuple[int, bytes] | str:
    """(status, body), or why there was no HTTP answer."""
    try:
        with _OPENER.open(req, timeout=timeout) as r:
            return r.status, r.read(65536)
    except urllib.error.HTTPError as e:
        return e.code, e.read(65536)
    except (urllib.error.URLError, OSError, ValueError) as e:
        reason = getattr(e, "reason", e)
        return f"{type(reason).__name__}: {reason}" if not isinstance(reason, str) else reason


def check_peer(c: Cluster, url: str, *, venv_id: str, token: str | None, token_path: str,
               timeout: float = TIMEOUT_S,
               request: Callable[[urllib.request.Request, float], tuple[int, bytes] | str] = http_request) -> Check:
    """One line: the peer at `url` (its admin API) is the other role, on venv `venv_id`, with `token`."""
    other = "worker" if c.role == "head" else "head"
    me = f"--role {other} --{c.role} {c.address}"
    got = request(urllib.request.Request(f"{url}/admin/cluster"), timeout)
    if isinstance(got, str):
        if c.role == "worker":
            return Check("peer", True, f"the head's admin API at {url} does not answer ({got}): fine while the "
                         "head is not installed yet; install it next (sudo ./install.sh --role head --worker "
                         f"{c.address}), its install checks this worker", warning=True)
        return Check("peer", False, f"the worker's admin API at {url} does not answer within {timeout:g} s ({got}); "
                     f"install the worker first (sudo ./install.sh {me} on it) and check the link "
                     f"(ping {c.peer})", EXIT_PEER)
    status, body = got
    try:
        view = json.loads(body)
    except ValueError:
        view = None
    if status == 404 and isinstance(view, dict) and view.get("error") == "not_clustered":
        msg = (f"the gptoss-spark at {url} has no [cluster] setting: install it with "
               f"sudo ./install.sh {me}")
        if c.role == "worker":  # the head's own install, next, sets it
            return Check("peer", True, msg + " (next)", warning=True)
        return Check("peer", False, msg, EXIT_PEER)
    if status != 200 or not isinstance(view, dict):
        return Check("peer", False, f"{url}/admin/cluster answered HTTP {status}, not a gptoss-spark node view: "
                     f"is {c.peer} the other Spark, and its admin port this node's admin.port?", EXIT_PEER)
    if view.get("role") != other:
        return Check("peer", False, f"{url} is a cluster {view.get('role')}, like this node: one Spark is the head, "
                     f"the other the worker (sudo ./install.sh {me} on it)", EXIT_PEER)
    if token is None:
        return Check("peer", False, f"this node has no admin token yet, and the {other}'s must be the same: copy "
                     f"the {other}'s {token_path} to {token_path} here, then run install.sh again", EXIT_PEER)
    probe = urllib.request.Request(f"{url}/admin/cluster/order", data=b"-", method="POST",
                                   headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
    got = request(probe, timeout)
    if isinstance(got, str) or got[0] != 400:
        why = got if isinstance(got, str) else f"HTTP {got[0]}"
        hint = (f"copy one node's {token_path} to the other (the same file on both)" if not isinstance(got, str)
                and got[0] in (401, 403) else f"the {other}'s admin API must take this node's token")
        return Check("peer", False, f"the {other} at {url} does not take this node's admin token ({why}): {hint}",
                     EXIT_PEER)
    venv = view.get("venv")
    if venv != venv_id:
        if c.role == "worker":  # the worker goes first on an upgrade too: the head follows
            return Check("peer", True, f"the head at {url} runs venv {venv}, this install {venv_id}: upgrade the "
                         "head next with this same version (until then it does not start with this worker)",
                         warning=True)
        return Check("peer", False, f"the worker at {url} runs venv {venv}, this install builds {venv_id}: install "
                     "this same version on the worker first (the same source, sudo ./install.sh there)", EXIT_PEER)
    return Check("peer", True, f"the {other} at {url} answers, same venv ({venv_id}) and admin token, "
                 f"state {view.get('state')}")


def _unit_state() -> str:
    import subprocess

    p = subprocess.run(["systemctl", "is-active", "gptoss-spark"], capture_output=True, text=True)
    return p.stdout.strip() or "unknown"


def wait_worker_up(url: str, *, timeout: float, poll: float = 1.0,
                   request: Callable[[urllib.request.Request, float], tuple[int, bytes] | str] = http_request,
                   unit_state: Callable[[], str] = _unit_state, sleep: Callable[[float], None] | None = None,
                   clock: Callable[[], float] | None = None) -> tuple[bool, str]:
    """(answered as the worker, one line). A worker turns ready only when the head orders it to join, so
    its install waits for its supervisor to answer, not for READY; a unit that failed ends the wait."""
    import time

    sleep, clock = sleep or time.sleep, clock or time.monotonic
    deadline, last = clock() + timeout, "no answer yet"
    while True:
        got = request(urllib.request.Request(f"{url}/admin/cluster"), TIMEOUT_S)
        if not isinstance(got, str) and got[0] == 200:
            try:
                view = json.loads(got[1])
            except ValueError:
                view = None
            if isinstance(view, dict) and view.get("role") == "worker":
                waits = " (waits for the head's order to join)" if view.get("state") != "ready" else ""
                return True, (f"the worker's supervisor answers at {url}: state {view.get('state')}{waits}, "
                              f"venv {view.get('venv')}")
            last = f"{url}/admin/cluster is not a worker's node view"
        elif not isinstance(got, str):
            last = f"{url}/admin/cluster answered HTTP {got[0]}"
        else:
            last = got
        state = unit_state()
        if state == "failed":  # not "inactive": right after --no-block the start job may not have begun
            return False, f"gptoss-spark is {state} ({last})"
        if clock() >= deadline:
            return False, f"the worker's supervisor did not answer at {url} within {timeout:g} s ({last})"
        sleep(poll)


def read_token(path: Path) -> str | None:
    """This node's admin token as the admin API reads it, None when there is no usable one yet."""
    try:
        return base_token.read_token(path)
    except base_token.TokenUnavailable:
        return None

