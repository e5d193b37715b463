"""systemd/gptoss-spark.service: `systemd-analyze verify` passes and the unit agrees
with the supervisor's contract (timeouts, exit codes, notify, kill mode)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from gptoss_spark.service.config import Settings

UNIT = Path(__file__).resolve().parents[2] / "systemd" / "gptoss-spark.service"
DROPINS = UNIT.with_name(UNIT.name + ".d")
# systemd-analyze security's exposure (0 best, 10 worst): the goal for the unit
# alone (what a Spark owner runs with the syscall filter turned off), and what the
# unit with its default drop-ins measures now, so neither can drift back.
GOAL_WITHOUT_FILTER = 3.0
SHIPPED_WITH_DROPINS = 1.5
EXEC = "/opt/gptoss-spark/current/bin/gptoss-spark"


def directives() -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for line in UNIT.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith(("#", "[")) and "=" in line:
            k, v = line.split("=", 1)
            out.setdefault(k, []).append(v)
    return out


def seconds(v: str) -> float:
    v = v.strip()
    for suffix, mult in (("min", 60), ("h", 3600), ("s", 1)):
        if v.endswith(suffix):
            return float(v[: -len(suffix)]) * mult
    return float(v)


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze not installed")
def test_systemd_analyze_verify(tmp_path):
    # verify checks that ExecStart exists: point it at a stub for the check.
    stub = tmp_path / "gptoss-spark"
    stub.write_text("#!/bin/sh\n")
    stub.chmod(0o755)
    unit = tmp_path / "gptoss-spark.service"
    unit.write_text(UNIT.read_text().replace(EXEC, str(stub)))
    p = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    assert "gptoss-spark.service" not in p.stderr, p.stderr  # no warnings about our unit either


def test_contract_with_the_supervisor():
    d = directives()
    s = Settings()
    assert d["Type"] == ["notify"] and d["NotifyAccess"] == ["main"]
    assert d["ExecStart"][0].startswith(EXEC + " serve")
    # A reload waits for the restarted engine (systemd 252 has no Type=notify-reload), SIGHUP as fallback.
    assert d["ExecReload"] == ["/opt/gptoss-spark/current/bin/gptoss-spark restart --config "
                               "/etc/gptoss-spark/gptoss-spark.toml --signal-if-down $MAINPID"]
    assert d["KillMode"] == ["mixed"]
    assert seconds(d["TimeoutStopSec"][0]) > s.timeouts.drain + s.timeouts.shutdown_grace + 15
    assert seconds(d["WatchdogSec"][0]) >= 30
    assert d["Restart"] == ["on-failure"]
    assert set(d["RestartPreventExitStatus"][0].split()) == {"2", "3", "4"}
    assert int(d["LimitNOFILE"][0]) >= 65535
    assert d["User"] == ["gptoss-spark"] and d["Group"] == ["gptoss-spark"]
    assert d["OOMPolicy"] == ["continue"]
    # No start limit: systemd's counts the owner's restarts too and leaves the service down after a few.
    assert d["StartLimitIntervalSec"] == ["0"] and "StartLimitBurst" not in d


def test_hardening_keeps_the_gpu():
    d = directives()
    assert d["ProtectSystem"] == ["strict"] and d["PrivateTmp"] == ["true"] and d["NoNewPrivileges"] == ["true"]
    assert d["DevicePolicy"] == ["closed"]
    assert any(v.startswith("char-nvidia") for v in d["DeviceAllow"])
    assert "PrivateDevices" not in d and "MemoryDenyWriteExecute" not in d
    assert d["StateDirectory"] == ["gptoss-spark"]  # writable under ProtectSystem=strict
    assert "AF_UNIX" in d["RestrictAddressFamilies"][0] and "AF_INET" in d["RestrictAddressFamilies"][0]


def test_hardening_directives():
    d = directives()
    assert d["CapabilityBoundingSet"] == [""] and d["AmbientCapabilities"] == [""]
    assert d["SystemCallArchitectures"] == ["native"]
    assert d["ProtectProc"] == ["invisible"] and "ProcSubset" not in d  # the guard reads /proc/meminfo
    assert d["PrivateMounts"] == ["true"] and d["RemoveIPC"] == ["true"] and d["KeyringMode"] == ["private"]
    assert d["UMask"] == ["0077"]
    assert d["IPAddressDeny"] == ["any"] and d["IPAddressAllow"] == ["localhost"]
    assert "SystemCallFilter" not in d  # lives in its own drop-in, so it can be turned off alone
    text = UNIT.read_text()
    for left_out in ("MemoryDenyWriteExecute", "PrivateDevices", "PrivateUsers", "PrivateNetwork", "ProcSubset"):
        assert re.search(rf"^# - {left_out}[=:]", text, re.M), f"{left_out} is left out without a reason in the unit"


def exposure(tmp_path: Path, with_dropins: bool) -> tuple[float, str]:
    """`systemd-analyze security --offline=true` of the shipped unit. --offline reads drop-ins
    only from a unit search path, so the files are placed in a temporary root (--root)."""
    unit_dir = tmp_path / "etc" / "systemd" / "system"
    unit_dir.mkdir(parents=True)
    shutil.copy(UNIT, unit_dir)
    if with_dropins:
        shutil.copytree(DROPINS, unit_dir / DROPINS.name)
    p = subprocess.run(["systemd-analyze", "security", "--offline=true", f"--root={tmp_path}", "--no-pager",
                        UNIT.name], capture_output=True, text=True)
    m = re.search(r"Overall exposure level for gptoss-spark\.service: ([0-9.]+)", p.stdout)
    assert m, p.stdout + p.stderr
    return float(m.group(1)), p.stdout


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze not installed")
def test_exposure_score_with_the_default_dropins(tmp_path):
    score, report = exposure(tmp_path, with_dropins=True)
    assert score <= SHIPPED_WITH_DROPINS, report
    assert "SystemCallFilter=~@privileged" in report and "System call allow list defined" in report


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze not installed")
def test_exposure_score_with_the_syscall_filter_off(tmp_path):
    score, report = exposure(tmp_path, with_dropins=False)
    assert score <= GOAL_WITHOUT_FILTER, report


def test_dropins_are_valid_and_only_filter():
    text = (DROPINS / "20-syscall-filter.conf").read_text()
    lines = [ln for ln in text.splitlines() if ln and not ln.startswith("#")]
    assert lines[0] == "[Service]"
    assert all(ln.startswith("SystemCallFilter=") for ln in lines[1:]), lines
    assert "SystemCallFilter=@system-service" in lines
    assert "ln -sf /dev/null /etc/systemd/system/gptoss-spark.service.d/20-syscall-filter.conf" in text
