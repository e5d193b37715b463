"""systemd/gptoss-spark.service: `systemd-analyze verify` passes and the unit agrees
with the supervisor's contract (timeouts, exit codes, notify, kill mode)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from gptoss_spark.config import Settings

UNIT = Path(__file__).resolve().parents[2] / "systemd" / "gptoss-spark.service"
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


def test_hardening_keeps_the_gpu():
    d = directives()
    assert d["ProtectSystem"] == ["strict"] and d["PrivateTmp"] == ["true"] and d["NoNewPrivileges"] == ["true"]
    assert d["DevicePolicy"] == ["closed"]
    assert any(v.startswith("char-nvidia") for v in d["DeviceAllow"])
    assert "PrivateDevices" not in d and "MemoryDenyWriteExecute" not in d
    assert d["StateDirectory"] == ["gptoss-spark"]  # writable under ProtectSystem=strict
    assert "AF_UNIX" in d["RestrictAddressFamilies"][0] and "AF_INET" in d["RestrictAddressFamilies"][0]
