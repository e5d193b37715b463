"""The admin API's client: what the admin CLI (`status`, `profile`, `restart`) and `bench ab` send.

The admin URL comes from the settings file ([admin] host/port); the token from
[admin] token_file, read only for mutations. Every failure is a UserError with its exit
code: 69 the service is not answering, 77 the token file is unreadable or the token was
refused, 1 the API said no. States and operations in the API's JSON are parsed into the
service's own enums (service/status.py): a value this version does not know is an
ApiError, not a silent "not ready".
"""

from __future__ import annotations

import time
from typing import Any

import httpx

from ..base.errors import UserError
from ..base.exit_codes import EXIT_FAILED, EXIT_NOPERM, EXIT_UNAVAILABLE
from ..base.net import local_url
from ..base.token import TokenUnavailable, read_token
from ..service.config import Settings
from ..service.states import State
from ..service.status import OperationView, StatusFormatError, parse_state

REQUEST_TIMEOUT = 10.0
POLL_SECONDS = 1.0


class ServiceDown(UserError):
    exit_code = EXIT_UNAVAILABLE


class TokenUnreadable(UserError):
    exit_code = EXIT_NOPERM


class ApiError(UserError):
    exit_code = EXIT_FAILED


def admin_url(settings: Settings) -> str:
    return local_url(settings.admin.host, settings.admin.port)


def read_token_for_cli(settings: Settings) -> str:
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


def switch_limit(settings: Settings) -> float:
    """How long a switch or restart may take: drain, stop, and a full load, with a minute to spare."""
    t = settings.timeouts
    return t.drain + t.shutdown_grace + t.load + 60


def _state(client: Client):
    r = client.request("GET", "/admin/health")
    health = r.json() if r.headers.get("content-type", "").startswith("application/json") else {}
    return state_of(health) if health.get("state") else None  # an error body has none: skip it


def wait_operation(client: Client, op: dict, limit: float, on_state=None) -> dict:
    """Poll the operation until it ends; on_state(state) hears each new service state on the way:
    each one after the state the service was in when the operation was accepted (that one is the
    old engine's: a switch refused before it stopped anything would show `ready` just before FAILED)."""
    deadline = time.monotonic() + limit
    last_state = _state(client) if on_state is not None else None
    while operation_of(op).status.in_progress:
        if time.monotonic() > deadline:
            raise ApiError(f"operation {op['id']} still {op['status']} after {limit:g} s; "
                           "follow it with `gptoss-spark status`")
        time.sleep(POLL_SECONDS)
        if on_state is not None:
            state = _state(client)
            if state and state != last_state:
                on_state(state.value)
                last_state = state
        _, op = client.json("GET", op["poll"])
    return op
