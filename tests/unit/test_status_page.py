"""The status page (admin/page.py, GET /) against a real, not running Supervisor: what it shows,
that it loads nothing from elsewhere, and that its script runs only under its own nonce.
The page in a real browser, with a real engine: tests/integration/test_admin_real_engine.py."""

from __future__ import annotations

import time
import re

from gptoss_spark.service.gpu import GpuDevice, GpuReading
from gptoss_spark.service.hostmem import HostMemory
from gptoss_spark.service.probes import GENERATED, RUNNING
from gptoss_spark.service.telemetry import SampleContext
from tests.unit.test_admin_api import call, env, make_ready  # noqa: F401 (env is a fixture)


def get_page(sup, settings):
    async def go(c):
        return await c.get("/")
    return call(sup, settings, go)


def test_page_shows_state_profile_switch_control_and_says_no_gpu_sample_yet(env):  # noqa: F811
    sup, settings, _ = env
    make_ready(sup)
    r = get_page(sup, settings)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    assert r.headers["cache-control"] == "no-store"
    page = r.text
    assert '<span id="state" class="state ready">ready</span>' in page
    assert '<option value="demo" selected title="demo (active) - the demo">demo (active) - the demo</option>' in page
    assert '<option value="demo-b" title="demo-b - the other demo">demo-b - the other demo</option>' in page
    assert 'type="password"' in page and "no telemetry sample yet" in page
    assert "100.0 of 128.0 GiB" not in page  # the guard has not read yet: no made-up figure


def test_page_loads_nothing_from_elsewhere_and_scripts_need_the_responses_nonce(env):  # noqa: F811
    sup, settings, _ = env
    r = get_page(sup, settings)
    policy = r.headers["content-security-policy"]
    nonce = re.search(r"'nonce-([^']+)'", policy).group(1)
    assert "default-src 'none'" in policy and "connect-src 'self'" in policy
    assert re.findall(r"<script[^>]*>", r.text) == [f'<script nonce="{nonce}">']
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", r.text)  # no CDN, no other host
    assert get_page(sup, settings).headers["content-security-policy"] != policy  # a new nonce each time


def test_page_renders_telemetry_charts_memory_and_gpu_and_escapes_what_it_shows(env):  # noqa: F811
    sup, settings, _ = env
    make_ready(sup)
    sup.last_error = "<script>alert(1)</script>"
    sup.guard.read()
    dev = GpuDevice(0, "NVIDIA GB10", 81.0, 2400.0, None, 3000.0, 98.0, 140.0, 93.0, frozenset({"sw_thermal"}),
                    None, None, None)
    ctx = SampleContext("ready", "demo", 42, "http://127.0.0.1:1")
    mem = HostMemory(100 << 30, 128 << 30, 0.5, 70 << 30, "/x", 66 << 30)
    t = sup.telemetry
    for i in range(5):
        t.record(ctx, GpuReading((dev,), driver_version="580"), mem, {RUNNING: 2.0, GENERATED: 1000.0 * i})
        time.sleep(0.01)  # distinct sample times: a rate needs two
    page = get_page(sup, settings).text
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page and "<script>alert" not in page
    assert page.count("<polyline") == 2
    assert "81 °C" in page and "2400 MHz (max 3000)" in page and "98 W of 140 W" in page
    assert "sw_thermal" in page
    assert "70.0 GiB" in page and "66.0 GiB" in page and "100.0 of 128.0 GiB" in page


def test_page_on_a_host_without_nvml_says_so(env):  # noqa: F811
    sup, settings, _ = env
    sup.telemetry.record(SampleContext("stopped", None, None, None), GpuReading(unavailable="no NVML: library"),
                         HostMemory(*[None] * 6), None)
    page = get_page(sup, settings).text
    assert "<td>no NVML: library</td>" in page
    assert "generated tokens/s: no samples yet" in page



def test_page_says_which_throttle_episodes_were_alerted(tmp_path):
    """gpu.alerts from the settings to the supervisor's watch to the page: a kind left out is shown
    as an episode, and as not alerted."""
    from gptoss_spark.admin.page import render_page
    from gptoss_spark.service.supervisor import Supervisor
    from tests.helpers.supervisor_settings import FakeMemory, make_settings

    sup = Supervisor(make_settings(tmp_path, {"demo": ""}, gpu={"alerts": ["thermal"], "alert_after_seconds": 1}),
                     memory_source=FakeMemory())
    assert sup.telemetry.watch.alerts == {"thermal"}
    now = [0.0]
    sup.telemetry.watch.clock = lambda: now[0]
    dev = GpuDevice(0, "NVIDIA GB10", 91.0, 1000.0, None, 3000.0, 139.0, 140.0, 99.0,
                    frozenset({"sw_thermal", "sw_power_cap"}), None, None, None)
    for _ in range(3):
        now[0] += 1
        sup.telemetry.record(SampleContext("ready", "demo", 42, None), GpuReading((dev,)),
                             HostMemory(*[None] * 6), None)
    assert sup.telemetry.latest.episodes == (("power", 0), ("thermal", 0))
    page = render_page(sup.status(), "nonce")
    assert "<th>episode</th><td>power on GPU 0 (not alerted: not in gpu.alerts)</td>" in page
    assert "<th>episode</th><td>thermal on GPU 0 (alerted)</td>" in page


def test_a_stopped_engines_figures_are_not_shown_as_current(tmp_path):
    """During a switch the old engine is stopped: its last tokens/s and running requests are history,
    not `now` (on the page, in /admin/status and so in `gptoss-spark status`)."""
    import dataclasses

    from gptoss_spark.admin.page import render_page
    from gptoss_spark.service.supervisor import Supervisor
    from tests.helpers.supervisor_settings import FakeMemory, make_settings

    sup = Supervisor(make_settings(tmp_path, {"demo": ""}), memory_source=FakeMemory())
    ctx = SampleContext("ready", "demo", 42, "http://127.0.0.1:1")
    for i in range(3):
        sup.telemetry.record(ctx, GpuReading(unavailable="no NVML"), HostMemory(*[None] * 6),
                             {RUNNING: 2.0, GENERATED: 1000.0 * i})
        time.sleep(0.01)
    running = sup.status()
    running = dataclasses.replace(running, engine=dataclasses.replace(running.engine, pid=42))
    assert "running requests: now 2.0 requests" in render_page(running, "n")  # the engine that runs
    assert running.telemetry.to_json()["engine"]["running"] == 2.0
    sup.telemetry.record(SampleContext("stopping", "demo", None, None), GpuReading(unavailable="no NVML"),
                         HostMemory(*[None] * 6), None)  # the engine was stopped for the switch
    page = render_page(sup.status(), "n")
    assert "now 2.0" not in page and "running requests: no engine running now" in page
    assert sup.status().telemetry.to_json()["engine"] is None


def test_page_marks_unrunnable_profiles_shows_the_start_phases_and_keeps_the_list_in_its_column(tmp_path):
    """A profile this host cannot run is marked with why and cannot be picked; the start under way and
    the last start show their phases; the profile list may not grow wider than its column."""
    import dataclasses

    from gptoss_spark.admin.page import STYLE, render_page
    from gptoss_spark.service.status import StartStatus
    from gptoss_spark.service.supervisor import Supervisor
    from tests.helpers.supervisor_settings import FakeMemory, make_settings

    sup = Supervisor(make_settings(tmp_path, {"demo": "", "spark": ""}), memory_source=FakeMemory())
    st = dataclasses.replace(sup.status(), profile="demo", start=StartStatus(
        current={"phase": "weights", "seconds": 41.0, "phases": {"process": 12.0}},
        last={"profile": "demo", "ready_seconds": 30.5, "phases": {"process": 10.0, "weights": 20.5},
              "compiled": [], "cache_hits": 0}, histograms={}))
    page = render_page(st, "n", unrunnable={"spark": ["needs an NVIDIA GPU, none found (/proc/driver/nvidia/gpus)"]})
    assert re.search(r'<option value="spark" disabled title="[^"]*">spark - [^<]*cannot run here: needs an NVIDIA '
                     r'GPU, none found', page), page
    assert "<th>start now</th><td>weights, 41 s since spawn (done: process 12.0 s)</td>" in page
    assert "<th>last start</th><td>demo: ready in 30.5 s; process 10.0 s, weights 20.5 s; compiled nothing</td>" in page
    assert ".grid>section{min-width:0" in STYLE and "select{max-width:100%" in STYLE


def test_the_served_page_marks_a_profile_this_host_cannot_run(env):  # noqa: F811
    """GET / passes the fit verdict to the page (the same one GET /admin/profile gives as why_not)."""
    sup, settings, _ = env
    make_ready(sup)
    page = get_page(sup, settings).text
    assert re.search(r'<option value="huge" disabled title="[^"]*">huge - [^<]*cannot run here: needs 1000 GiB, '
                     r'the host has ', page), page[page.find('value="huge"') - 20:page.find('value="huge"') + 300]
    assert '<option value="demo-b" title="demo-b - the other demo">' in page  # one that runs is not marked
