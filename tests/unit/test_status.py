"""The supervisor's published status (service/status.py): one frozen snapshot that the admin JSON,
/metrics and the CLI all come from.

The supervisor here is real but not running; tests walk its state machine by hand, as
test_admin_api.py does.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from pathlib import Path

import httpx
import pytest

from gptoss_spark import admin_cli
from gptoss_spark.admin import client as admin_client
from gptoss_spark.admin import create_app
from gptoss_spark.admin.metrics import make_registry, render
from gptoss_spark.service.memory import MemoryGuard
from gptoss_spark.service.profiles import load_profiles
from gptoss_spark.service.states import RestartPolicy, State
from gptoss_spark.service.status import (CommandKind, OperationView, OpStatus, StatusFormatError,
                                         SupervisorStatus, parse_state)
from gptoss_spark.service.store import PersistedState, StateStore
from gptoss_spark.service.supervisor import Supervisor, SupervisorParts
from tests.helpers.supervisor_settings import FakeMemory, make_settings


@pytest.fixture
def sup(tmp_path: Path) -> Supervisor:
    settings = make_settings(tmp_path, {"demo": "", "demo-b": ""})
    return Supervisor(settings, memory_source=FakeMemory(available_gib=50.0, psi=1.5))


def make_ready(sup: Supervisor, name: str = "demo") -> None:
    sup.profile_name = name
    for s in (State.STARTING, State.LOADING, State.READY):
        sup.sm.to(s, "test", name)
    sup.store.save(PersistedState(active_profile=name, last_good_profile=name))


def metric_lines(status: SupervisorStatus) -> dict[str, float]:
    """name{labels} -> value of one snapshot's metrics."""
    out = {}
    for line in render(make_registry(lambda: status)).decode().splitlines():
        if line and not line.startswith("#"):
            key, value = line.rsplit(" ", 1)
            out[key] = float(value)
    return out


def test_json_and_metrics_of_one_snapshot_agree_and_later_changes_do_not_leak_in(sup):
    make_ready(sup)
    sup.guard.read()
    sup.switches["ok"] += 2
    sup.switches["failed"] += 1
    sup.guard.trips = 4
    st = sup.status()
    # The supervisor moves on: the snapshot already taken must not.
    sup.switches["ok"] += 10
    sup.guard.trips = 99
    sup.sm.to(State.DRAINING, "test", "demo")

    body, m = st.to_json(), metric_lines(st)
    assert body["state"] == "ready" and m['gptoss_spark_state{state="ready"}'] == 1.0
    assert m["gptoss_spark_ready"] == 1.0 and m['gptoss_spark_state{state="draining"}'] == 0.0
    assert body["profile"] == "demo" and m['gptoss_spark_profile_info{profile="demo"}'] == 1.0
    assert body["switches"] == {"ok": 2, "failed": 1}
    assert (m['gptoss_spark_profile_switches_total{outcome="ok"}'],
            m['gptoss_spark_profile_switches_total{outcome="failed"}']) == (2.0, 1.0)
    assert body["memory"]["guard_trips"] == 4 == m["gptoss_spark_memory_guard_trips_total"]
    assert body["memory"]["available_gib"] == 50.0
    assert m["gptoss_spark_memory_available_bytes"] == 50.0 * 2**30
    assert body["memory"]["psi_some_avg10"] == 1.5 == m["gptoss_spark_memory_pressure_some_avg10"]
    assert body["restarts"] == 0 == m["gptoss_spark_engine_restarts_total"]
    assert m["gptoss_spark_start_time_seconds"] == st.started_at
    assert [t["to"] for t in body["transitions"]] == ["starting", "loading", "ready"]
    assert body["saved"] == {"active_profile": "demo", "last_good_profile": "demo"}


def test_the_snapshot_is_frozen(sup):
    op = sup.request_switch("demo-b")
    st = sup.status()
    with pytest.raises(dataclasses.FrozenInstanceError):
        st.state = State.READY  # type: ignore[misc]
    with pytest.raises(TypeError):
        st.operations["x"] = st.operations[op.id]  # type: ignore[index]
    with pytest.raises(TypeError):
        st.profiles["x"] = st.profiles["demo"]  # type: ignore[index]
    op.finish(False, "later")
    assert st.operations[op.id].status == OpStatus.PENDING  # as it was then
    assert sup.status().operations[op.id].status == OpStatus.FAILED


def test_every_admin_read_renders_the_published_status_only(sup):
    """Replace what the supervisor publishes: each read answers from it, not from the attributes
    (the supervisor itself stays stopped, with no profile)."""
    make_ready(sup, "demo-b")
    published = sup.status()
    sup.sm.to(State.STOPPING, "test", "demo-b")
    sup.sm.to(State.STOPPED, "test", "demo-b")
    sup.profile_name = None
    sup.status = lambda: published  # type: ignore[method-assign]

    async def main():
        app = create_app(sup, sup.settings)
        transport = httpx.ASGITransport(app=app, client=("127.0.0.1", 50000))
        async with httpx.AsyncClient(transport=transport, base_url="http://admin") as c:
            return [await c.get(p) for p in ("/admin/health", "/admin/profile", "/admin/status", "/metrics")]

    health, profile, status, metrics = asyncio.run(main())
    assert health.status_code == 200 and health.json() == {"status": "ok", "state": "ready", "profile": "demo-b"}
    body = profile.json()
    assert body["active"] == "demo-b" and body["state"] == "ready"
    assert [p["name"] for p in body["profiles"] if p["active"]] == ["demo-b"]
    full = status.json()
    assert full.pop("version")
    assert full == json.loads(json.dumps(published.to_json()))
    assert 'gptoss_spark_state{state="ready"} 1.0' in metrics.text


def test_operation_json_round_trips_and_unknown_values_are_one_line_errors(sup):
    make_ready(sup)
    view = sup.request_switch("demo-b").view()
    assert OperationView.from_json(view.to_json()) == view
    assert view.kind == CommandKind.SWITCH and view.status.in_progress
    with pytest.raises(StatusFormatError, match="operation status 'paused', not one of pending, running"):
        OperationView.from_json({**view.to_json(), "status": "paused"})
    assert parse_state("ready") == State.READY
    with pytest.raises(StatusFormatError, match="same version"):
        parse_state("sleeping")


def test_the_cli_parses_states_and_operations_with_the_enums():
    assert admin_client.state_of({"state": "backoff"}) == State.BACKOFF
    with pytest.raises(admin_client.ApiError, match="state 'sleeping'"):
        admin_client.state_of({"state": "sleeping"})
    with pytest.raises(admin_client.ApiError, match="without 'status'"):
        admin_client.operation_of({"id": "0" * 12, "kind": "switch"})
    running = {"id": "0" * 12, "kind": "restart", "target": "demo", "status": "running"}
    out = admin_cli.render_profiles({"active": "demo", "state": "ready", "profiles": [], "operation": running})
    assert out.endswith("in progress: restart -> demo (running)")
    done = admin_cli.render_profiles({"active": "demo", "state": "ready", "profiles": [],
                                      "operation": {**running, "status": "succeeded"}})
    assert "in progress" not in done


def test_serve_s_parts_are_the_ones_the_supervisor_uses(tmp_path):
    settings = make_settings(tmp_path, {"demo": ""})
    parts = SupervisorParts(store=StateStore(tmp_path / "elsewhere.json"),
                            guard=MemoryGuard(settings.memory, FakeMemory(available_gib=3.0)),
                            policy=RestartPolicy(settings.restart), profiles=load_profiles(settings))
    sup = Supervisor(settings, parts)
    assert sup.store is parts.store and sup.guard is parts.guard and sup.policy is parts.policy
    assert set(sup.status().profiles) == {"demo"}
    assert sup.status().guard.host_total_bytes == 128 * 2**30  # read from parts.guard's source
    with pytest.raises(TypeError, match="memory_source"):
        Supervisor(settings, parts, memory_source=FakeMemory())
