"""The admin API against a real (not running) Supervisor: status codes, auth, schemas, limits, metrics.

No engine here: the supervisor stays in `stopped` unless a test walks its
state machine by hand. Switches and restarts are only queued, which is all the
API does; carrying them out is the supervisor's job (and the integration tests').
"""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import httpx
import pytest

from gptoss_spark.admin import create_app
from gptoss_spark.admin.auth import authorize
from gptoss_spark.base.token import TokenUnavailable, read_token
from gptoss_spark.service.config import Settings
from gptoss_spark.service.memory import GIB, MemoryReading
from gptoss_spark.service.store import PersistedState
from gptoss_spark.service.states import State
from gptoss_spark.service.supervisor import Supervisor

TOKEN = "t0k3n-" + "a" * 40


class PlentyOfMemory:
    def read(self) -> MemoryReading:
        return MemoryReading(available_bytes=100 * GIB, total_bytes=128 * GIB, psi_some_avg10=0.5)


def write_profile(d: Path, name: str, description: str, args: list[str], memory_gib: float = 0) -> None:
    (d / f"{name}.toml").write_text(
        f'description = "{description}"\nmemory_gib = {memory_gib}\n[engine]\nargs = {json.dumps(args)}\n')


@pytest.fixture
def env(tmp_path: Path):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    profiles = tmp_path / "profiles"
    profiles.mkdir()
    write_profile(profiles, "demo", "the demo", ["--max-num-seqs", "4"])
    write_profile(profiles, "demo-b", "the other demo", ["--max-num-seqs", "2"])
    write_profile(profiles, "huge", "needs more than the host has", [], memory_gib=1000)
    token_file = tmp_path / "admin.token"
    token_file.write_text(TOKEN + "\n")
    token_file.chmod(0o640)
    settings = Settings.model_validate({
        "default_profile": "demo",
        "model": {"dir": str(model)},
        "admin": {"token_file": str(token_file)},
        "paths": {"state_dir": str(tmp_path / "state"), "profile_dirs": [str(profiles)]},
    })
    sup = Supervisor(settings, memory_source=PlentyOfMemory())
    return sup, settings, token_file


def call(sup: Supervisor, settings: Settings, fn):
    """Run fn(client) against the app inside one event loop (the app shares it with the supervisor)."""
    async def main():
        app = create_app(sup, settings)
        transport = httpx.ASGITransport(app=app, client=("127.0.0.1", 50000))
        async with httpx.AsyncClient(transport=transport, base_url="http://admin") as client:
            return await fn(client)
    return asyncio.run(main())


def auth(token: str = TOKEN) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def make_ready(sup: Supervisor, name: str = "demo") -> None:
    sup.profile_name = name
    sup.sm.to(State.STARTING, "test", name)
    sup.sm.to(State.LOADING, "test", name)
    sup.sm.to(State.READY, "test", name)
    sup.store.save(PersistedState(active_profile=name, last_good_profile=name))


def fingerprint(sup: Supervisor) -> tuple:
    """Everything a refused request must leave alone."""
    f = sup.settings.state_file
    return (sup.profile_name, sup.state, f.read_bytes() if f.exists() else None, sup.commands.pending,
            len(sup.operations), dict(sup.switches))


# ---- reads ------------------------------------------------------------------------------------

def test_health_is_503_with_the_state_until_ready_then_200(env):
    sup, settings, _ = env

    async def go(c):
        before = await c.get("/admin/health")
        make_ready(sup)
        after = await c.get("/admin/health")
        return before, after

    before, after = call(sup, settings, go)
    assert before.status_code == 503 and before.json()["state"] == "stopped"
    assert after.status_code == 200 and after.json() == {"status": "ok", "state": "ready", "profile": "demo"}
    assert after.headers["cache-control"] == "no-store"


def test_profile_lists_profiles_with_descriptions_and_the_active_one(env):
    sup, settings, _ = env
    make_ready(sup, "demo")
    r = call(sup, settings, lambda c: c.get("/admin/profile"))
    assert r.status_code == 200
    body = r.json()
    assert body["active"] == "demo" and body["state"] == "ready" and body["last_good"] == "demo"
    by_name = {p["name"]: p for p in body["profiles"]}
    assert set(by_name) == {"demo", "demo-b", "huge"}
    assert by_name["demo-b"]["description"] == "the other demo"
    assert by_name["demo"]["active"] and not by_name["demo-b"]["active"]
    assert (by_name["demo"]["runs_here"], by_name["demo"]["why_not"]) == (True, [])
    assert by_name["huge"]["runs_here"] is False
    assert by_name["huge"]["why_not"][0].startswith("needs 1000 GiB, the host has ")


def test_status_has_state_profile_transitions_and_saved_state(env):
    sup, settings, _ = env
    make_ready(sup)
    r = call(sup, settings, lambda c: c.get("/admin/status"))
    body = r.json()
    assert r.status_code == 200
    assert body["state"] == "ready" and body["profile"] == "demo"
    assert [t["to"] for t in body["transitions"]] == ["starting", "loading", "ready"]
    assert body["saved"] == {"active_profile": "demo", "last_good_profile": "demo"}
    for key in ("engine_pid", "uptime_seconds", "restarts", "last_error", "switches"):
        assert key in body


def test_metrics_reflect_the_supervisor_at_scrape_time(env):
    sup, settings, _ = env

    async def go(c):
        first = (await c.get("/metrics")).text
        make_ready(sup)
        sup.switches["ok"] += 2
        sup.switches["failed"] += 1
        sup.guard.trips = 3
        return first, await c.get("/metrics")

    first, r = call(sup, settings, go)
    assert 'gptoss_spark_state{state="stopped"} 1.0' in first
    text = r.text
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    assert 'gptoss_spark_state{state="ready"} 1.0' in text
    assert 'gptoss_spark_state{state="stopped"} 0.0' in text
    assert "gptoss_spark_ready 1.0" in text
    assert 'gptoss_spark_profile_switches_total{outcome="ok"} 2.0' in text
    assert 'gptoss_spark_profile_switches_total{outcome="failed"} 1.0' in text
    assert "gptoss_spark_memory_guard_trips_total 3.0" in text
    assert "gptoss_spark_engine_restarts_total 0.0" in text
    assert 'gptoss_spark_profile_info{profile="demo"} 1.0' in text
    assert 'gptoss_spark_state_seconds_total{state="loading"}' in text
    # A private registry: nothing from the process-wide default one (python_gc_*, process_*).
    assert "python_gc" not in text and "process_cpu" not in text


def test_docs_and_openapi_are_not_served(env):
    sup, settings, _ = env

    async def go(c):
        return [await c.get(p) for p in ("/docs", "/redoc", "/openapi.json", "/nope")]

    for r in call(sup, settings, go):
        assert r.status_code == 404 and r.json()["error"] == "not_found"


# ---- mutations that are accepted ----------------------------------------------------------------

def test_switch_is_accepted_with_202_and_an_operation_to_poll(env):
    sup, settings, _ = env
    make_ready(sup, "demo")

    async def go(c):
        r = await c.put("/admin/profile", json={"name": "demo-b"}, headers=auth())
        poll = await c.get(r.headers["location"])
        return r, poll

    r, poll = call(sup, settings, go)
    assert r.status_code == 202, r.text
    body = r.json()
    assert body["kind"] == "switch" and body["target"] == "demo-b" and body["from"] == "demo"
    assert body["status"] == "pending" and body["poll"] == f"/admin/operations/{body['id']}"
    assert poll.status_code == 200 and poll.json()["id"] == body["id"]
    assert sup.commands.pending is not None and sup.commands.pending.op.id == body["id"]


def test_switch_to_the_active_ready_profile_is_a_200_noop(env):
    sup, settings, _ = env
    make_ready(sup, "demo")
    before = fingerprint(sup)
    r = call(sup, settings, lambda c: c.put("/admin/profile", json={"name": "demo"}, headers=auth()))
    assert r.status_code == 200 and r.json()["status"] == "noop"
    assert fingerprint(sup) == before


def test_wait_true_returns_when_the_operation_ends(env):
    sup, settings, _ = env
    make_ready(sup, "demo")

    async def go(c):
        async def finish_soon():
            while sup.commands.pending is None:
                await asyncio.sleep(0.01)
            sup.commands.pending.op.finish(False, "profile demo-b failed: boom; rolled back to demo")
        helper = asyncio.create_task(finish_soon())
        r = await c.put("/admin/profile?wait=true", json={"name": "demo-b"}, headers=auth())
        await helper
        return r

    r = call(sup, settings, go)
    assert r.status_code == 500 and r.json()["status"] == "failed"
    assert "rolled back to demo" in r.json()["error"]


def test_restart_is_accepted_with_202_and_rejected_before_first_start(env):
    sup, settings, _ = env

    async def go(c):
        early = await c.post("/admin/restart", headers=auth())
        make_ready(sup)
        ok = await c.post("/admin/restart", headers=auth())
        again = await c.post("/admin/restart", json={}, headers=auth())
        return early, ok, again

    early, ok, again = call(sup, settings, go)
    assert early.status_code == 409 and early.json()["error"] == "state"
    assert ok.status_code == 202 and ok.json()["kind"] == "restart" and ok.json()["target"] == "demo"
    assert again.status_code == 409 and again.json()["error"] == "busy"


# ---- the bad-input table: exact status, nothing changed -------------------------------------

BAD_SWITCHES = [
    # (id, raw body or json, headers, status, error code)
    ("malformed-json", b'{"name": "demo-b"', auth(), 400, "malformed_json"),
    ("not-utf8", b'{"name": "\xff"}', auth(), 400, "malformed_json"),
    ("nested-within-limit", b"[" * 2000 + b"]" * 2000, auth(), 400, "malformed_json"),
    ("empty-body", b"", auth(), 422, "invalid"),
    ("json-array", [], auth(), 422, "invalid"),
    ("json-string", "demo-b", auth(), 422, "invalid"),
    ("name-is-int", {"name": 5}, auth(), 422, "invalid"),
    ("name-is-null", {"name": None}, auth(), 422, "invalid"),
    ("name-is-list", {"name": ["demo-b"]}, auth(), 422, "invalid"),
    ("missing-name", {}, auth(), 422, "invalid"),
    ("unknown-field", {"name": "demo-b", "force": True}, auth(), 422, "invalid"),
    ("empty-name", {"name": ""}, auth(), 422, "invalid"),
    ("overlong-name", {"name": "a" * 33}, auth(), 422, "invalid"),
    ("dotdot-name", {"name": "../demo-b"}, auth(), 422, "invalid"),
    ("slash-name", {"name": "profiles/demo-b"}, auth(), 422, "invalid"),
    ("abs-path-name", {"name": "/etc/passwd"}, auth(), 422, "invalid"),
    ("toml-suffix", {"name": "demo-b.toml"}, auth(), 422, "invalid"),
    ("uppercase", {"name": "Demo-b"}, auth(), 422, "invalid"),
    ("nul-byte", {"name": "demo\u0000"}, auth(), 422, "invalid"),
    ("unknown-name", {"name": "nosuch"}, auth(), 404, "unknown"),
    ("not-enough-memory", {"name": "huge"}, auth(), 409, "memory"),
    ("huge-body", {"name": "demo-b", "pad": "x" * 100_000}, auth(), 413, "body_too_large"),
    ("missing-token", {"name": "demo-b"}, {}, 401, "unauthorized"),
    ("basic-auth", {"name": "demo-b"}, {"Authorization": "Basic dXNlcjpwYXNz"}, 401, "unauthorized"),
    ("bearer-no-token", {"name": "demo-b"}, {"Authorization": "Bearer "}, 401, "unauthorized"),
    ("wrong-token", {"name": "demo-b"}, auth("x" * 46), 403, "forbidden"),
    ("token-prefix", {"name": "demo-b"}, auth(TOKEN[:-1]), 403, "forbidden"),
    ("non-ascii-token", {"name": "demo-b"}, {"Authorization": "Bearer t\u00f6ken".encode("latin-1")}, 403, "forbidden"),
    ("bad-wait", {"name": "demo-b"}, auth(), 422, "invalid"),
]


@pytest.mark.parametrize("body,headers,status,code", [r[1:] for r in BAD_SWITCHES], ids=[r[0] for r in BAD_SWITCHES])
def test_bad_switch_requests_change_nothing(env, body, headers, status, code):
    sup, settings, _ = env
    make_ready(sup, "demo")
    before = fingerprint(sup)
    url = "/admin/profile?wait=maybe" if code == "invalid" and body == {"name": "demo-b"} else "/admin/profile"
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    hdrs = {"Content-Type": "application/json", **headers}
    r = call(sup, settings, lambda c: c.put(url, content=content, headers=hdrs))
    assert r.status_code == status, r.text
    assert r.json()["error"] == code
    assert TOKEN not in r.text
    assert fingerprint(sup) == before


def test_unauthorized_is_checked_before_the_body_is_parsed(env):
    sup, settings, _ = env
    make_ready(sup)
    r = call(sup, settings, lambda c: c.put("/admin/profile", content=b"{nonsense", headers={}))
    assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"


def test_chunked_oversized_body_is_refused_without_content_length(env):
    sup, settings, _ = env
    make_ready(sup)
    before = fingerprint(sup)

    async def chunks():
        for _ in range(10):
            yield b"x" * 1000

    r = call(sup, settings, lambda c: c.put("/admin/profile", content=chunks(), headers=auth()))
    assert r.status_code == 413
    assert fingerprint(sup) == before


def test_restart_with_fields_is_rejected(env):
    sup, settings, _ = env
    make_ready(sup)
    before = fingerprint(sup)
    r = call(sup, settings, lambda c: c.post("/admin/restart", json={"profile": "demo-b"}, headers=auth()))
    assert r.status_code == 422 and "unknown field" in r.json()["message"]
    assert fingerprint(sup) == before


def test_concurrent_switches_one_wins_the_other_gets_409(env):
    sup, settings, _ = env
    make_ready(sup, "demo")

    async def go(c):
        return await asyncio.gather(*(c.put("/admin/profile", json={"name": n}, headers=auth())
                                      for n in ("demo-b", "demo-b", "huge", "demo-b")))

    results = call(sup, settings, go)
    codes = sorted(r.status_code for r in results)
    assert codes.count(202) == 1, [r.text for r in results]
    assert all(r.json()["error"] == "busy" for r in results if r.status_code == 409)
    assert codes.count(409) == 3
    assert len(sup.operations) == 1


@pytest.mark.parametrize("setup,expected_fragment", [
    ("missing", "does not exist"),
    ("unreadable", "not readable"),
    ("empty", "at least 16"),
    ("directory", "is a directory"),
])
def test_mutations_answer_503_without_a_usable_token_file_while_reads_work(env, setup, expected_fragment):
    sup, settings, token_file = env
    make_ready(sup)
    if setup == "missing":
        token_file.unlink()
    elif setup == "unreadable":
        if os.geteuid() == 0:
            pytest.skip("root reads any file")
        token_file.chmod(0o000)
    elif setup == "empty":
        token_file.write_text("\n")
    elif setup == "directory":
        token_file.unlink()
        token_file.mkdir()
    before = fingerprint(sup)

    async def go(c):
        return (await c.put("/admin/profile", json={"name": "demo-b"}, headers=auth()),
                await c.post("/admin/restart", headers=auth()),
                await c.get("/admin/status"), await c.get("/admin/health"))

    put, restart, status, health = call(sup, settings, go)
    for r in (put, restart):
        assert r.status_code == 503 and r.json()["error"] == "token_unavailable"
        assert expected_fragment in r.json()["message"]
    assert status.status_code == 200 and health.status_code == 200
    assert fingerprint(sup) == before


def test_unreadable_token_file_is_reported(tmp_path, monkeypatch):
    f = tmp_path / "admin.token"
    f.write_text(TOKEN)

    def deny(*a, **k):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(Path, "open", deny)
    with pytest.raises(TokenUnavailable, match="not readable by the service user"):
        read_token(f)


def test_authorize_never_puts_the_token_in_its_messages(tmp_path):
    f = tmp_path / "admin.token"
    f.write_text(TOKEN)
    for header in (None, "Bearer nope-nope-nope-nope", f"Bearer {TOKEN}x", "Basic abc"):
        result = authorize(header, f)
        assert not result.ok and TOKEN not in result.message
    assert authorize(f"Bearer {TOKEN}", f).ok
    assert authorize(f"bearer   {TOKEN}  ", f).ok


def test_operations_endpoint_validates_ids(env):
    sup, settings, _ = env

    async def go(c):
        return [await c.get(f"/admin/operations/{i}") for i in ("0123456789ab", "..", "x" * 200)]

    for r in call(sup, settings, go):
        assert r.status_code == 404


def test_mutations_are_logged_with_peer_and_outcome_but_never_the_token(env):
    from structlog.testing import capture_logs
    sup, settings, _ = env
    make_ready(sup)

    async def go(c):
        await c.put("/admin/profile", json={"name": "demo-b"}, headers=auth("w" * 40))
        await c.put("/admin/profile", json={"name": "demo-b"}, headers=auth())

    with capture_logs() as lines:
        call(sup, settings, go)
    audit = [e for e in lines if e.get("event") == "admin mutation"]
    assert [e["outcome"] for e in audit] == ["denied: forbidden", "accepted"]
    assert all(e["peer"] == "127.0.0.1:50000" and e["action"] == "switch" for e in audit)
    assert audit[1]["target"] == "demo-b"
    everything = repr(lines)
    assert TOKEN not in everything and "w" * 40 not in everything


def test_a_switch_in_progress_keeps_refusing_others_until_it_ends(env):
    """Not only while queued: once the supervisor has taken it (draining, loading ...) too."""
    sup, settings, _ = env
    make_ready(sup, "demo")

    async def go(c):
        first = await c.put("/admin/profile", json={"name": "demo-b"}, headers=auth())
        sup.commands.take()  # what the run loop does when it starts carrying it out
        during = await c.put("/admin/profile", json={"name": "demo"}, headers=auth())
        restart = await c.post("/admin/restart", headers=auth())
        shown = (await c.get("/admin/profile")).json()["operation"]
        sup.operations[first.json()["id"]].finish(True)
        after = await c.post("/admin/restart", headers=auth())
        return first, during, restart, shown, after

    first, during, restart, shown, after = call(sup, settings, go)
    assert first.status_code == 202
    assert (during.status_code, during.json()["error"]) == (409, "busy")
    assert (restart.status_code, restart.json()["error"]) == (409, "busy")
    assert shown["id"] == first.json()["id"]
    assert after.status_code == 202
