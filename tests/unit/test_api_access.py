"""Serving beyond loopback: the key is required, the bind address must be this host's, bench sends the key."""

from __future__ import annotations

import argparse
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from gptoss_spark.base.net import is_loopback
from gptoss_spark.service.api_access import check_engine_address, read_api_key
from gptoss_spark.bench.target import api_key_for
from gptoss_spark.service.config import Settings, load_settings
from gptoss_spark.base.errors import ConfigError
from gptoss_spark.install import placement
from gptoss_spark.install.layout import Layout

NOT_HERE = "192.0.2.1"  # TEST-NET-1 (RFC 5737): assigned to no host


def write(tmp: Path, engine: str) -> Path:
    cfg = tmp / "gs.toml"
    cfg.write_text(f"[engine]\n{engine}\n")
    return cfg


@pytest.mark.parametrize("host, expected", [("127.0.0.1", True), ("127.1.2.3", True), ("::1", True),
                                            ("localhost", True), ("0.0.0.0", False), ("::", False),
                                            ("10.0.0.5", False), ("spark.lan", False)])
def test_is_loopback(host, expected):
    assert is_loopback(host) is expected


def test_network_address_without_a_key_is_a_one_line_error(tmp_path):
    cfg = write(tmp_path, 'host = "0.0.0.0"')
    with pytest.raises(ConfigError) as e:
        load_settings(cfg)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(f"{cfg}: engine.host '0.0.0.0' serves the network")
    assert "engine.api_key_file is required" in msg and "/etc/gptoss-spark/api.key" in msg


def test_network_address_with_a_key_loads(tmp_path):
    key = tmp_path / "api.key"
    key.write_text("k3y\n")
    s = load_settings(write(tmp_path, f'host = "0.0.0.0"\napi_key_file = "{key}"'))
    assert s.engine.host == "0.0.0.0" and read_api_key(s) == "k3y"
    check_engine_address(s)  # the wildcard is always this host's


def test_loopback_needs_no_key():
    assert read_api_key(Settings()) is None


@pytest.mark.parametrize("content, problem", [(None, "does not exist"), ("\n", "is empty")])
def test_a_bad_key_file_is_a_one_line_error(tmp_path, content, problem):
    key = tmp_path / "api.key"
    if content is not None:
        key.write_text(content)
    s = Settings.model_validate({"engine": {"api_key_file": str(key)}})
    with pytest.raises(ConfigError, match=f"engine.api_key_file: {key} {problem}") as e:
        read_api_key(s)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("host, problem", [(NOT_HERE, "is not an address of this host"),
                                           ("no-such-host.invalid", "does not resolve")])
def test_bind_address_not_on_this_host(tmp_path, host, problem):
    key = tmp_path / "api.key"
    key.write_text("k\n")
    s = Settings.model_validate({"engine": {"host": host, "api_key_file": str(key)}})
    with pytest.raises(ConfigError) as e:
        check_engine_address(s)
    msg = str(e.value)
    assert "\n" not in msg and f"engine.host: {host!r} {problem}" in msg and "ip -brief address" in msg


def test_check_command_refuses_an_address_not_on_this_host(tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    (tmp_path / "profiles").mkdir()
    (tmp_path / "profiles" / "plain.toml").write_text('description = "p"\n')
    (tmp_path / "api.key").write_text("k\n")
    cfg = tmp_path / "gs.toml"
    cfg.write_text(f'[model]\ndir = "{model}"\n[engine]\nhost = "{NOT_HERE}"\napi_key_file = "{tmp_path}/api.key"\n'
                   f'[paths]\nstate_dir = "{tmp_path}/s"\nprofile_dirs = ["{tmp_path}/profiles"]\n')
    r = subprocess.run([sys.executable, "-m", "gptoss_spark.cli", "check", "--config", str(cfg)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2, r
    assert r.stderr.count("\n") == 1 and f"engine.host: '{NOT_HERE}' is not an address of this host" in r.stderr


def test_api_key_made_once_0640_and_never_overwritten(tmp_path):
    lay = Layout(root=tmp_path / "root")
    assert placement.ensure_api_key(lay, gid=os.getgid(), make=lambda: "key-1").action == "created"
    st = lay.api_key_file.stat()
    assert lay.api_key_file == lay.etc_dir / "api.key"
    assert stat.S_IMODE(st.st_mode) == 0o640 and st.st_gid == os.getgid()
    assert placement.ensure_api_key(lay, gid=os.getgid(), make=lambda: "key-2").action == "unchanged"
    assert lay.api_key_file.read_text() == "key-1\n"  # an upgrade keeps the key clients hold


def args(**kw):
    return argparse.Namespace(**{"api_key_file": None, "config": None, **kw})


def test_bench_sends_the_settings_key_only_to_the_settings_engine(tmp_path):
    key = tmp_path / "api.key"
    key.write_text("svc-key\n")
    s = Settings.model_validate({"engine": {"host": "0.0.0.0", "port": 8100, "api_key_file": str(key)}})
    assert api_key_for(args(), "http://127.0.0.1:8100", s) == "svc-key"
    assert api_key_for(args(), "http://elsewhere.example:8100", s) is None  # never leaked to another server
    mine = tmp_path / "mine.key"
    mine.write_text("my-key\n")
    assert api_key_for(args(api_key_file=mine), "http://elsewhere.example:8100", s) == "my-key"
