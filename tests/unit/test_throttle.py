"""Throttle episodes (service/throttle.py) with a fake clock, and their alerts through the real
Alerter (service/alerts.py) to a real command."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import pytest

from gptoss_spark.service.alerts import Alerter
from gptoss_spark.service.config import AlertSettings
from gptoss_spark.service.gpu import GpuDevice, GpuReading
from gptoss_spark.service.hostmem import HostMemory
from gptoss_spark.service.probes import GENERATED, RUNNING
from gptoss_spark.service.telemetry import SampleContext, TelemetrySampler
from gptoss_spark.service.alert_kinds import AlertEvent, GpuAlertKind
from gptoss_spark.service.throttle import ThrottleWatch


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def dev(throttle=(), sm=2400.0, max_sm=3000.0, index=0, temp=70.0) -> GpuDevice:
    return GpuDevice(index=index, name="GB10", temperature_c=temp, sm_clock_mhz=sm, memory_clock_mhz=None,
                     max_sm_clock_mhz=max_sm, power_watts=100.0, power_limit_watts=140.0,
                     utilization_percent=90.0, throttle=frozenset(throttle), memory_used_bytes=None,
                     memory_total_bytes=None, engine_memory_bytes=None)


def reading(*devices) -> GpuReading:
    return GpuReading(tuple(devices))


def run(watch, clock, seconds, step, make, generating=False):
    """Observe make() every step seconds for `seconds`; all changes seen."""
    out = []
    end = clock.t + seconds
    while clock.t < end:
        clock.t += step
        out += watch.observe(reading(make()), generating)
    return out


def test_sustained_thermal_throttle_alerts_once_per_episode():
    clock = Clock()
    w = ThrottleWatch(alert_after=60, low_clock_fraction=0.5, clock=clock)
    assert run(w, clock, 55, 5, lambda: dev({"hw_thermal"}, temp=93)) == []  # 50 s held: not yet
    changes = run(w, clock, 300, 5, lambda: dev({"hw_thermal"}, temp=93))
    assert [(c.kind, c.started) for c in changes] == [("thermal", True)]
    c = changes[0]
    assert c.event == "gpu_thermal" and c.seconds == 60
    assert c.reason == "GPU 0: thermal slowdown (hw_thermal) for 60 s: 93 C, SM 2400 MHz of 3000, 100 W of 140 W"
    assert c.figures["temperature_c"] == 93 and c.figures["throttle"] == ["hw_thermal"]
    assert w.active() == [("thermal", 0)]


def test_a_short_clear_does_not_end_the_episode_a_long_one_does_and_the_next_alerts_again():
    clock = Clock()
    w = ThrottleWatch(alert_after=60, low_clock_fraction=0.5, clock=clock)
    hot, cool = (lambda: dev({"sw_thermal"})), (lambda: dev())
    assert len(run(w, clock, 120, 10, hot)) == 1
    assert run(w, clock, 30, 10, cool) == []         # flickers off for 30 s: same episode
    assert run(w, clock, 120, 10, hot) == []         # ... and back: no second alert
    ended = run(w, clock, 70, 10, cool)  # clear from its first cool sample on for 60 s
    assert [(c.kind, c.started) for c in ended] == [("thermal", False)]
    assert w.active() == []
    again = run(w, clock, 70, 10, hot)
    assert [(c.kind, c.started) for c in again] == [("thermal", True)]


def test_a_throttle_that_never_lasts_never_alerts():
    clock = Clock()
    w = ThrottleWatch(alert_after=60, low_clock_fraction=0.5, clock=clock)
    for _ in range(20):
        assert run(w, clock, 50, 10, lambda: dev({"sw_power_cap"})) == []
        assert run(w, clock, 10, 10, lambda: dev()) == []


def test_power_and_thermal_are_separate_episodes_per_device():
    clock = Clock()
    w = ThrottleWatch(alert_after=30, low_clock_fraction=0.5, clock=clock)
    out = []
    for _ in range(10):
        clock.t += 10
        out += w.observe(reading(dev({"sw_power_cap"}, sm=1200.0, index=0),
                                 dev({"hw_thermal", "hw_power_brake"}, index=1)), generating=False)
    assert sorted((c.kind, c.device) for c in out) == [("power", 0), ("power", 1), ("thermal", 1)]


def test_idle_clock_drop_is_no_episode_only_while_generating():
    clock = Clock()
    w = ThrottleWatch(alert_after=60, low_clock_fraction=0.5, clock=clock)
    slow = lambda: dev(sm=900.0, max_sm=3000.0)  # noqa: E731
    assert run(w, clock, 600, 10, slow, generating=False) == []  # idle GPUs clock down
    changes = run(w, clock, 70, 10, slow, generating=True)
    assert [(c.kind, c.started) for c in changes] == [("low_clock", True)]
    assert "SM clock well below its norm while generating" in changes[0].reason
    assert run(w, clock, 70, 10, lambda: dev(sm=2900.0), generating=True)[0].started is False


def test_the_clock_cap_is_the_norm_when_set():
    clock = Clock()
    capped = ThrottleWatch(alert_after=10, low_clock_fraction=0.5, cap_mhz=1600, clock=clock)
    # 1000 MHz is a third of the device's maximum, but well within the capped clock's half: no alert.
    assert run(capped, clock, 100, 10, lambda: dev(sm=1000.0), generating=True) == []
    c = run(capped, clock, 100, 10, lambda: dev(sm=700.0), generating=True)
    assert [x.kind for x in c] == ["low_clock"] and "SM 700 MHz of 1600" in c[0].reason


def test_an_episode_raises_the_configured_alert_command_once_with_figures(tmp_path: Path):
    """Through the sampler's record step to the real Alerter and a real command (the webhook path is
    the same Alerter, tested in tests/integration/test_alerts.py)."""
    out = tmp_path / "alerts.jsonl"
    script = tmp_path / "alert.py"
    script.write_text(f"import sys\nopen({str(out)!r}, 'a').write(sys.stdin.read() + '\\n')\n")
    clock = Clock()

    async def main():
        alerter = Alerter(AlertSettings(command=[sys.executable, str(script)], timeout=10))
        sampler = TelemetrySampler(5.0, memory_source=None, watch=ThrottleWatch(20, 0.5, clock=clock),
                                   alerter=alerter, wall=clock)
        ctx = SampleContext("ready", "demo", 42, "http://127.0.0.1:1")
        mem = HostMemory(*[None] * 6)
        for i in range(20):
            clock.t += 5
            sampler.record(ctx, reading(dev({"sw_thermal"}, temp=91)), mem, {RUNNING: 1.0, GENERATED: 10.0 * i})
        await alerter.drain()
        return sampler

    sampler = asyncio.run(main())
    docs = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(docs) == 1
    d = docs[0]
    assert (d["event"], d["state"], d["profile"]) == ("gpu_thermal", "ready", "demo")
    assert d["figures"]["temperature_c"] == 91 and d["figures"]["throttle"] == ["sw_thermal"]
    assert dict(sampler.latest.episodes_total) == {"thermal": 1}
    assert sampler.latest.episodes == (("thermal", 0),)


def test_a_power_cap_at_a_normal_clock_is_no_episode_one_that_costs_clock_is():
    """The H200's figures under a plain matmul (benchmarks/gpu_telemetry/results/h200.json):
    sw_power_cap at 641 of 700 W with the SM clock at 1725 of 1980 MHz (87%): the GPU working at
    its limit as designed, not an alert every sustained generation."""
    clock = Clock()
    w = ThrottleWatch(alert_after=60, low_clock_fraction=0.5, clock=clock)
    at_limit = lambda: dev({"sw_power_cap"}, sm=1725.0, max_sm=1980.0)  # noqa: E731
    assert run(w, clock, 600, 5, at_limit, generating=True) == []
    costly = lambda: dev({"sw_power_cap"}, sm=1400.0, max_sm=1980.0)  # noqa: E731  71% of its maximum
    c = run(w, clock, 100, 5, costly, generating=True)
    assert [(x.kind, x.started, x.event) for x in c] == [("power", True, "gpu_power")]
    assert c[0].reason.startswith("GPU 0: power capping that costs clock (sw_power_cap) for 60 s: ")
    assert "SM 1400 MHz of 1980" in c[0].reason


@pytest.mark.parametrize("sm,counts", [(2400.0, True), (2401.0, False)])
def test_a_clock_at_exactly_the_power_fraction_counts(sm, counts):
    clock = Clock()
    w = ThrottleWatch(alert_after=10, low_clock_fraction=0.5, power_clock_fraction=0.8, clock=clock)
    c = run(w, clock, 30, 5, lambda: dev({"sw_power_cap"}, sm=sm, max_sm=3000.0))
    assert [x.kind for x in c] == (["power"] if counts else [])


@pytest.mark.parametrize("sm,counts", [(1500.0, True), (1501.0, False)])
def test_a_clock_at_exactly_the_low_clock_fraction_counts(sm, counts):
    clock = Clock()
    w = ThrottleWatch(alert_after=10, low_clock_fraction=0.5, clock=clock)
    c = run(w, clock, 30, 5, lambda: dev(sm=sm, max_sm=3000.0), generating=True)
    assert [x.kind for x in c] == (["low_clock"] if counts else [])


def test_the_power_brake_counts_at_any_clock_and_a_cap_without_a_clock_counts():
    clock = Clock()
    w = ThrottleWatch(alert_after=10, low_clock_fraction=0.5, clock=clock)
    c = run(w, clock, 30, 5, lambda: dev({"hw_power_brake"}, sm=2900.0, index=0))
    assert [(x.kind, x.device) for x in c] == [("power", 0)]
    # No clock from NVML: the cap's cost cannot be told, so the reason alone counts.
    c = run(w, clock, 30, 5, lambda: dev({"sw_power_cap"}, sm=None, index=1))
    assert [(x.kind, x.device) for x in c] == [("power", 1)]


def test_hardware_slowdown_is_its_own_kind_unless_a_thermal_or_brake_reason_names_it():
    clock = Clock()
    w = ThrottleWatch(alert_after=10, low_clock_fraction=0.5, clock=clock)
    c = run(w, clock, 30, 5, lambda: dev({"hw_slowdown"}, sm=1200.0))
    assert [(x.kind, x.event) for x in c] == [("hw_slowdown", "gpu_hw_slowdown")]
    assert "hardware slowdown (power supply brake or over-current) (hw_slowdown)" in c[0].reason
    clock2 = Clock()
    w2 = ThrottleWatch(alert_after=10, low_clock_fraction=0.5, clock=clock2)
    c = run(w2, clock2, 30, 5, lambda: dev({"hw_slowdown", "hw_thermal"}, sm=1200.0))
    assert [x.kind for x in c] == ["thermal"]  # one alert for one cause, not two
    c = run(w2, clock2, 30, 5, lambda: dev({"hw_slowdown", "hw_power_brake"}, sm=1200.0))
    assert [(x.kind, x.started) for x in c] == [("thermal", False), ("power", True)]


def test_kinds_left_out_of_alerts_are_tracked_but_send_nothing():
    clock = Clock()
    sent = []

    class Recorder:
        def notify(self, event, state, profile, reason, figures=None):
            sent.append(event)

    w = ThrottleWatch(alert_after=10, low_clock_fraction=0.5, alerts=["thermal"], clock=clock)
    sampler = TelemetrySampler(5.0, memory_source=None, watch=w, alerter=Recorder(), wall=clock)
    ctx = SampleContext("ready", "demo", 42, None)
    for _ in range(5):
        clock.t += 5
        sampler.record(ctx, reading(dev({"sw_power_cap"}, sm=1000.0)), HostMemory(*[None] * 6), None)
    assert sent == [] and sampler.latest.episodes == (("power", 0),)
    assert dict(sampler.latest.episodes_total) == {"power": 1}
    for _ in range(5):
        clock.t += 5
        sampler.record(ctx, reading(dev({"sw_power_cap", "sw_thermal"}, sm=1000.0)), HostMemory(*[None] * 6), None)
    assert sent == ["gpu_thermal"]


def test_an_unknown_alert_kind_is_refused():
    with pytest.raises(ValueError, match=r"unknown throttle kinds \['clock_low'\]: known are thermal, power"):
        ThrottleWatch(60, 0.5, alerts=["thermal", "clock_low"])
    assert tuple(GpuAlertKind) == ("thermal", "power", "hw_slowdown", "low_clock")


def test_each_gpu_kind_names_its_own_alert_event():
    events = [k.event for k in GpuAlertKind]
    assert events == ["gpu_thermal", "gpu_power", "gpu_hw_slowdown", "gpu_clock_low"]
    assert all(isinstance(e, AlertEvent) for e in events) and len(set(events)) == len(events)
