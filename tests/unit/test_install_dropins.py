"""The drop-ins install.sh owns: the shipped syscall filter (replaced on upgrade, kept off
when the admin masked it) and 30-lan.conf generated from engine.host/admin.host."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from gptoss_spark.install import dropins
from gptoss_spark.install.cli import cmd_unit
from gptoss_spark.base.exit_codes import EXIT_LAN
from gptoss_spark.install.layout import InstallError, Layout

REPO = Path(__file__).resolve().parents[2]

# `ip -json addr` as iproute2 prints it (trimmed): loopback, one IPv4 LAN, one IPv6.
ADDRS = json.dumps([
    {"ifname": "lo", "addr_info": [{"family": "inet", "local": "127.0.0.1", "prefixlen": 8},
                                   {"family": "inet6", "local": "::1", "prefixlen": 128}]},
    {"ifname": "enP7s7", "addr_info": [{"family": "inet", "local": "192.168.1.20", "prefixlen": 24},
                                       {"family": "inet6", "local": "fd00::20", "prefixlen": 64}]},
])


@pytest.fixture
def lay(tmp_path) -> Layout:
    return Layout(root=tmp_path / "root")


def config(lay: Layout, text: str) -> None:
    lay.config_file.parent.mkdir(parents=True, exist_ok=True)
    lay.config_file.write_text(text)


def test_shipped_filter_is_installed_replaced_and_kept_off_when_masked(lay):
    dest = lay.dropin_dir / dropins.SYSCALL_FILTER
    assert [p.action for p in dropins.install_shipped(lay, REPO)] == ["created"]
    assert dest.read_bytes() == (REPO / dropins.SHIPPED_DIR / dropins.SYSCALL_FILTER).read_bytes()
    assert [p.action for p in dropins.install_shipped(lay, REPO)] == ["unchanged"]
    dest.write_text("[Service]\n")
    assert [p.action for p in dropins.install_shipped(lay, REPO)] == ["replaced"]
    dest.unlink()
    dest.symlink_to("/dev/null")
    assert [p.action for p in dropins.install_shipped(lay, REPO)] == ["masked"]
    assert dest.is_symlink() and str(dest.readlink()) == "/dev/null"


def test_loopback_hosts_need_no_lan_dropin(lay):
    config(lay, '[engine]\nhost = "127.0.0.1"\n[admin]\nhost = "::1"\n')
    assert dropins.place_lan(lay, addresses=ADDRS) is None
    assert not (lay.dropin_dir / dropins.LAN).exists()


def test_lan_host_allows_exactly_its_network_and_is_removed_again(lay):
    config(lay, '[engine]\nhost = "192.168.1.20"\n')
    assert dropins.place_lan(lay, addresses=ADDRS).action == "created"
    text = (lay.dropin_dir / dropins.LAN).read_text()
    assert [ln for ln in text.splitlines() if ln.startswith("IPAddress")] == ["IPAddressAllow=192.168.1.0/24"]
    assert dropins.place_lan(lay, addresses=ADDRS).action == "unchanged"
    config(lay, '[engine]\nhost = "127.0.0.1"\n')
    assert dropins.place_lan(lay, addresses=ADDRS).action == "removed"
    assert not (lay.dropin_dir / dropins.LAN).exists()


def test_wildcard_hosts_allow_every_local_network_of_their_family():
    nets = dropins.host_networks(ADDRS)
    assert dropins.lan_allow(["0.0.0.0", "127.0.0.1"], nets) == ["192.168.1.0/24"]
    assert dropins.lan_allow(["::"], nets) == ["192.168.1.0/24", "fd00::/64"]


def test_host_not_on_this_machine_fails_before_anything_is_written(lay, monkeypatch):
    config(lay, '[engine]\nhost = "10.9.9.9"\n')
    monkeypatch.setattr(dropins, "read_addresses", lambda: ADDRS)
    args = argparse.Namespace(root=str(lay.root), source=str(REPO), dry_run=False)
    with pytest.raises(InstallError) as e:
        cmd_unit(args)
    assert e.value.exit_code == EXIT_LAN and "10.9.9.9" in str(e.value) and "engine.host" in str(e.value)
    assert not lay.unit_file.exists() and not lay.dropin_dir.exists()
