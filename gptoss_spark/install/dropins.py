"""The unit's drop-ins that install.sh owns, in /etc/systemd/system/gptoss-spark.service.d/.

- 20-syscall-filter.conf: shipped in systemd/gptoss-spark.service.d/, replaced on
  upgrade like the unit. An admin turns it off by replacing it with a link to
  /dev/null (`ln -sf /dev/null ...`); that link is theirs and is kept.
- 30-lan.conf: generated from the installed config. The unit allows loopback
  traffic only (IPAddressDeny=any); when engine.host or admin.host is not a
  loopback address, this drop-in allows the networks of the addresses the
  service binds, read from `ip -json addr`, and nothing else. Removed again
  when both hosts are back on loopback.

Other files in that directory (10-*.conf, override.conf from `systemctl edit`)
are the admin's and never touched.
"""

from __future__ import annotations

import ipaddress
import json
import os
import subprocess
from pathlib import Path

from ..base.defaults import LOOPBACK
from ..base.fsutil import write_atomic
from ..base.net import is_loopback
from .layout import Layout
from .placement import Placed, read_config

SHIPPED_DIR = Path("systemd") / "gptoss-spark.service.d"
SYSCALL_FILTER = "20-syscall-filter.conf"
LAN = "30-lan.conf"
MASK = "/dev/null"


def is_masked(path: Path) -> bool:
    """The admin's way of turning one of our drop-ins off: a link to /dev/null."""
    return path.is_symlink() and os.readlink(path) == MASK


def install_shipped(layout: Layout, source: Path, *, dry_run: bool = False) -> list[Placed]:
    """Each shipped drop-in, replaced when this version's differs, kept when masked."""
    out = []
    for src in sorted((source / SHIPPED_DIR).glob("*.conf")):
        dest = layout.dropin_dir / src.name
        new = src.read_bytes()
        if is_masked(dest):
            out.append(Placed(dest, "masked"))
        elif dest.exists() and not dest.is_symlink() and dest.read_bytes() == new:
            out.append(Placed(dest, "unchanged"))
        elif dry_run:
            out.append(Placed(dest, "would-replace" if dest.exists() else "would-create"))
        else:
            existed = dest.exists() or dest.is_symlink()
            dest.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(dest, new, 0o644)
            out.append(Placed(dest, "replaced" if existed else "created"))
    return out


# ------------------------------------------------------------ 30-lan.conf

def bound_hosts(config_file: Path) -> list[str]:
    """engine.host and admin.host of the installed config (defaults: loopback)."""
    data = read_config(config_file)
    return [data.get(s, {}).get("host", LOOPBACK) for s in ("engine", "admin")]


def links(addr_json: str) -> list[tuple[str, str, str]]:
    """(interface, address, network) of each non-loopback address in `ip -json addr` output."""
    out = []
    for link in json.loads(addr_json or "[]"):
        for a in link.get("addr_info", []):
            try:
                iface = ipaddress.ip_interface(f"{a['local']}/{a['prefixlen']}")
            except (KeyError, ValueError):
                continue
            if not iface.ip.is_loopback:
                out.append((link.get("ifname", ""), str(iface.ip), str(iface.network)))
    return out


def host_networks(addr_json: str) -> list[tuple[str, str]]:
    """(address, network) of every non-loopback address in `ip -json addr` output."""
    return [(address, network) for _, address, network in links(addr_json)]


def lan_allow(hosts: list[str], networks: list[tuple[str, str]]) -> list[str]:
    """The networks to allow for these bind hosts: those of the bound address, or of every
    address for a wildcard host. Raises ValueError for a host this machine does not have."""
    allow: list[str] = []
    for host in hosts:
        if is_loopback(host):
            continue
        if host in ("0.0.0.0", "::"):
            picked = [net for _, net in networks if host == "::" or ":" not in net]
        else:
            picked = [net for addr, net in networks if addr == host]
            if not picked:
                raise ValueError(f"host {host} in the config is not an address of this machine "
                                 "(ip addr lists its addresses); set engine.host/admin.host to one of them")
        allow += [n for n in picked if n not in allow]
    return allow


def lan_dropin(allow: list[str]) -> bytes:
    return ("# Written by install.sh from engine.host/admin.host in gptoss-spark.toml;\n"
            "# rewritten on every install, removed when both are loopback again.\n"
            "# The unit allows loopback only (IPAddressDeny=any): these are the networks\n"
            "# of the addresses the service binds. Clients elsewhere (routed, VPN): add\n"
            "# your own drop-in, e.g. 90-clients.conf with IPAddressAllow=10.8.0.0/24.\n"
            "[Service]\n" + "".join(f"IPAddressAllow={n}\n" for n in allow)).encode()


def read_addresses() -> str:
    p = subprocess.run(["ip", "-json", "addr"], capture_output=True, text=True)
    if p.returncode != 0:
        raise ValueError(f"`ip -json addr` failed: {p.stderr.strip()} (install iproute2)")
    return p.stdout


def place_lan(layout: Layout, *, addresses: str | None = None, dry_run: bool = False) -> Placed | None:
    """Write, rewrite or remove 30-lan.conf to match the config; None when neither is needed."""
    dest = layout.dropin_dir / LAN
    hosts = bound_hosts(layout.config_file)
    if all(is_loopback(h) for h in hosts):
        if not (dest.exists() or dest.is_symlink()) or is_masked(dest):
            return None
        if not dry_run:
            dest.unlink()
        return Placed(dest, "would-remove" if dry_run else "removed")
    if is_masked(dest):
        return Placed(dest, "masked")
    allow = lan_allow(hosts, host_networks(read_addresses() if addresses is None else addresses))
    new = lan_dropin(allow)
    if dest.exists() and dest.read_bytes() == new:
        return Placed(dest, "unchanged")
    if dry_run:
        return Placed(dest, "would-replace" if dest.exists() else "would-create")
    existed = dest.exists()
    dest.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(dest, new, 0o644)
    return Placed(dest, "replaced" if existed else "created")
