"""Does the installed service serve? Asked of its supervisor's /admin/health, not of systemd.

`systemctl is-active` says only that the supervisor runs: a supervisor in state `failed`
(it gave up on its engine and stays up for the admin API) is `active` too. A re-run of
install.sh that finds nothing to change uses this to tell "installed and serving" from
"installed, up, and serving nothing" (which it then restarts) and from "still starting"
(which it leaves alone: a restart would throw the load away).
"""

from __future__ import annotations

import json
import urllib.request
from typing import Callable

from .peer import http_request

TIMEOUT_S = 5.0
# The states in which the supervisor is on its way to ready by itself (service/states.py).
ON_ITS_WAY = ("starting", "loading", "draining", "stopping")

SERVES, DOWN, ON_THE_WAY = 0, 1, 3  # `install serving`'s exit codes, read by install.sh


def get_health(url: str, timeout: float) -> tuple[int, bytes] | str:
    """(HTTP status, body) of GET url, or why there was no HTTP answer (peer.http_request)."""
    return http_request(urllib.request.Request(url), timeout)


def serving(admin_url: str, *,
            get: Callable[[str, float], tuple[int, bytes] | str] = get_health) -> tuple[int, str]:
    """(SERVES | DOWN | ON_THE_WAY, one line naming the supervisor's state and profile)."""
    got = get(f"{admin_url}/admin/health", TIMEOUT_S)
    if isinstance(got, str):
        return DOWN, f"its admin API at {admin_url} does not answer ({got})"
    code, body = got
    try:
        view = json.loads(body)
    except ValueError:
        view = None
    if not isinstance(view, dict) or "state" not in view:
        return DOWN, f"{admin_url}/admin/health answered HTTP {code}, not the supervisor's health"
    state, profile = view.get("state"), view.get("profile")
    line = f"state {state}, profile {profile}"
    if code == 200:
        return SERVES, line
    return (ON_THE_WAY if state in ON_ITS_WAY else DOWN), line
