"""install.sh --role: the [cluster] setting of the installed config (docs/CLUSTER.md).

`--role worker --head ADDR` on the second Spark, `--role head --worker ADDR` on the
first, `--role single` to go back to one node; no role flag keeps what is there.
This node's link address and interface default to the address of this machine on
the peer's network (`ip -json addr`), so the usual call names the peer only.

The new config text is made whole, parsed back and checked before anything is
written, then replaces the old file in one rename (the old one stays beside it as
gptoss-spark.toml.old); the same flags again give the same text and write nothing.
Stdlib only, like the rest of install/: the service's pydantic model
(service/config.py ClusterSettings) checks the same rules again when it starts.
"""

from __future__ import annotations

import ipaddress
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..base.exit_codes import EXIT_LAN, EXIT_USAGE
from ..base.defaults import ADMIN_PORT, ENGINE_PORT, LOOPBACK
from ..base.fsutil import write_atomic
from .dropins import links
from .layout import InstallError, Layout
from .placement import Placed, read_config, render_config, set_toml_keys, toml_literal

ROLES = ("head", "worker", "single")
# vLLM's TCPStore on the head; the service's default (ClusterSettings.master_port).
DEFAULT_MASTER_PORT = 29501
IFNAME_RE = re.compile(r"^[A-Za-z0-9_.:-]{1,15}$")
# What `--role single` puts back; the cluster profiles need [cluster] (profiles.requires.cluster).
CLUSTER_PROFILE = {"spark": "cluster", "cpu": "demo-cluster"}
_HEADER = re.compile(r"^\s*\[\[?\s*([^\[\]]+?)\s*\]\]?\s*(#.*)?$")


def _usage(message: str) -> InstallError:
    return InstallError(message, EXIT_USAGE)


@dataclass(frozen=True)
class RoleFlags:
    """What install.sh was given. role None = no role flag: keep the installed setting."""

    role: str | None = None
    head: str | None = None
    worker: str | None = None
    address: str | None = None
    interface: str | None = None
    master_port: str | None = None


@dataclass(frozen=True)
class Cluster:
    """A [cluster] setting as the installer writes it."""

    role: str
    address: str
    peer: str
    interface: str
    master_port: int = DEFAULT_MASTER_PORT


def _ip(flag: str, value: str, what: str) -> str:
    try:
        ip = ipaddress.ip_address(value)
    except ValueError:
        raise _usage(f"{flag} {value!r} is not an IP address; give {what} on the cluster link, "
                     f"e.g. {'10.100.0.2' if flag == '--worker' else '10.100.0.1'}") from None
    if ip.is_loopback or ip.is_unspecified or ip.is_multicast:
        raise _usage(f"{flag} {value} cannot be {what}: the other Spark cannot reach it; give the "
                     "address on the cluster link, e.g. 10.100.0.1")
    return str(ip)


def check_flags(f: RoleFlags) -> None:
    """Each way the role flags can be wrong, as one line (exit 2); nothing is read or written."""
    node_flags = [n for n, v in (("--address", f.address), ("--cluster-ifname", f.interface),
                                 ("--master-port", f.master_port)) if v is not None]
    if f.role is None:
        given = [n for n, v in (("--head", f.head), ("--worker", f.worker)) if v is not None] + node_flags
        if given:
            raise _usage(f"{given[0]} needs --role: --role worker --head ADDR on the second Spark, "
                         "--role head --worker ADDR on the first")
        return
    if f.role not in ROLES:
        raise _usage(f"--role {f.role!r}: give head, worker or single")
    if f.role == "single":
        given = [n for n, v in (("--head", f.head), ("--worker", f.worker)) if v is not None] + node_flags
        if given:
            raise _usage(f"--role single takes no {given[0]}: it removes [cluster] from this node")
        return
    peer_flag, other_flag = ("--head", "--worker") if f.role == "worker" else ("--worker", "--head")
    if (f.worker if f.role == "worker" else f.head) is not None:
        raise _usage(f"--role {f.role} takes {peer_flag} ADDR (the other node), not {other_flag}: "
                     f"this node is the {f.role}")
    peer = f.head if f.role == "worker" else f.worker
    if peer is None:
        raise _usage(f"--role {f.role} needs {peer_flag} ADDR: the {'head' if f.role == 'worker' else 'worker'}'s "
                     "address on the cluster link")
    peer = _ip(peer_flag, peer, f"the {'head' if f.role == 'worker' else 'worker'}'s address")
    if f.address is not None and _ip("--address", f.address, "this node's address") == peer:
        raise _usage(f"--address and {peer_flag} are both {peer}: give this node's link address "
                     "and the other node's")
    if f.interface is not None and not IFNAME_RE.match(f.interface):
        raise _usage(f"--cluster-ifname {f.interface!r} is not an interface name (ip -br link lists them)")
    if f.master_port is not None:
        if not f.master_port.isdigit() or not 1 <= int(f.master_port) <= 65535:
            raise _usage(f"--master-port {f.master_port!r}: give a TCP port, 1-65535 (default {DEFAULT_MASTER_PORT})")


# ------------------------------------------------------------ this node's link address

def resolve(f: RoleFlags, addr_json: str) -> Cluster:
    """The [cluster] setting for head/worker flags: this node's address and interface from the flags,
    else the address of this machine on the peer's network. check_flags() has passed."""
    assert f.role in ("head", "worker")
    peer = str(ipaddress.ip_address(f.head if f.role == "worker" else f.worker))
    have = links(addr_json)
    if f.address is not None:
        address = str(ipaddress.ip_address(f.address))
        on = [ifn for ifn, a, _ in have if a == address]
        if not on:
            raise InstallError(f"--address {address} is not an address of this machine (ip -br addr lists them); "
                               "give this node's address on the cluster link", EXIT_LAN)
        found_if = on[0]
    else:
        near = [(ifn, a) for ifn, a, net in have if ipaddress.ip_address(peer) in ipaddress.ip_network(net)]
        if not near:
            raise InstallError(f"no address of this machine is on {peer}'s network: set up the cluster link first "
                               "(docs/CLUSTER.md, cabling and addresses) or give --address and --cluster-ifname",
                               EXIT_LAN)
        found_if, address = near[0]
        if address == peer:
            raise _usage(f"{peer} is this machine's own address: give the other node's")
    interface = f.interface or found_if
    if f.interface is not None and f.interface not in {ifn for ifn, _, _ in have}:
        raise InstallError(f"--cluster-ifname {f.interface}: this machine has no such interface with an address "
                           "(ip -br addr lists them)", EXIT_LAN)
    return Cluster(role=f.role, address=address, peer=peer, interface=interface,
                   master_port=int(f.master_port) if f.master_port else DEFAULT_MASTER_PORT)


# ------------------------------------------------------------ the config text

def installed(layout: Layout) -> Cluster | None:
    """The installed config's [cluster], None when there is none (or it is not readable as one)."""
    c = read_config(layout.config_file).get("cluster")
    try:
        return Cluster(role=c["role"], address=str(c["address"]), peer=str(c["peer"]),
                       interface=str(c["interface"]), master_port=int(c.get("master_port", DEFAULT_MASTER_PORT)))
    except (TypeError, KeyError, ValueError):
        return None


def without_section(text: str, section: str) -> str:
    """TOML text with table [section] (and its sub-tables) taken out, everything else as it was."""
    lines, out, skipping = text.splitlines(), [], False
    for ln in lines:
        if (m := _HEADER.match(ln)):
            name = m.group(1)
            skipping = name == section or name.startswith(section + ".")
        if not skipping:
            out.append(ln)
    while out and not out[-1].strip():
        out.pop()
    return "\n".join(out) + "\n"


def _block(c: Cluster, extra: dict[str, Any]) -> str:
    lines = ["[cluster]",
             f"# Written by install.sh --role {c.role} (docs/CLUSTER.md); --role single removes it.",
             f"role = {toml_literal(c.role)}",
             f"address = {toml_literal(c.address)}       # this node's link address",
             f"peer = {toml_literal(c.peer)}          # the other node's",
             f"interface = {toml_literal(c.interface)}  # this node's link interface (Gloo, NCCL)",
             f"master_port = {c.master_port}          # vLLM's TCPStore on the head, the same on both"]
    lines += [f"{k} = {toml_literal(v)}" for k, v in extra.items()]  # the owner's other keys, kept
    return "\n".join(lines) + "\n"


def render(text: str, c: Cluster | None, *, shipped_default: str, cluster_profile: str) -> str:
    """The config text with [cluster] set to `c` (None: removed, back to one node).

    With [cluster], admin.host is this node's link address unless it is a wildcard (the peer's
    supervisor must reach it; 30-lan.conf then opens that network) and default_profile the cluster profile. Without, what
    the installer put there goes back: admin.host to loopback, default_profile to the shipped one."""
    data = tomllib.loads(text)
    if c is None and "cluster" not in data and data.get("default_profile") not in CLUSTER_PROFILE.values():
        return text  # one node already: nothing to take back
    old = data.get("cluster") if isinstance(data.get("cluster"), dict) else {}
    ours = {"role", "address", "peer", "interface", "master_port"}
    values: dict[tuple[str | None, str], Any] = {}
    if c is not None:
        values = {(None, "default_profile"): cluster_profile}
        if data.get("admin", {}).get("host") not in ("0.0.0.0", "::"):  # a wildcard reaches the peer already
            values[("admin", "host")] = c.address
    else:
        if data.get("default_profile") in CLUSTER_PROFILE.values():
            values[(None, "default_profile")] = shipped_default
        if old and data.get("admin", {}).get("host") == str(old.get("address")):
            values[("admin", "host")] = LOOPBACK
    out = without_section(text, "cluster")
    if values:
        out = set_toml_keys(out, values)
    if c is not None:
        out = out.rstrip("\n") + "\n\n" + _block(c, {k: v for k, v in old.items() if k not in ours})
    got = tomllib.loads(out)  # whole and parseable, or nothing is written
    want = None if c is None else {"role": c.role, "address": c.address, "peer": c.peer,
                                   "interface": c.interface, "master_port": c.master_port}
    have = got.get("cluster")
    if (have is None) != (want is None) or (want and any(have.get(k) != v for k, v in want.items())):
        raise InstallError("could not write [cluster] into the config text (a `cluster = ...` key outside a "
                           "[cluster] table?): edit it by hand as docs/CLUSTER.md shows", EXIT_USAGE)
    return out


def _base_text(layout: Layout, source: Path, cpu: bool) -> str:
    if layout.config_file.is_file():
        return layout.config_file.read_text()
    # Dry run of a first install: the config step would have written this.
    return render_config(layout, source, cpu=cpu).decode()


def plan(layout: Layout, source: Path, flags: RoleFlags, *, cpu: bool,
         addr_json: str | None = None) -> tuple[str, str] | None:
    """(the config text now, the text the role flags make of it), None without a role flag.

    Every refusal comes from here, before anything is written: bad flags (exit 2), an address
    this machine lacks (28), a master port that is a service port (2)."""
    check_flags(flags)
    if flags.role is None:
        return None
    c = None if flags.role == "single" else resolve(flags, addr_json if addr_json is not None else _addresses())
    text = _base_text(layout, source, cpu)
    data = tomllib.loads(text)
    ports = {int(data.get("engine", {}).get("port", ENGINE_PORT)), int(data.get("admin", {}).get("port", ADMIN_PORT))}
    if c is not None and c.master_port in ports:
        raise _usage(f"--master-port {c.master_port} is engine.port or admin.port of this node; "
                     f"give another (default {DEFAULT_MASTER_PORT})")
    shipped = read_config(source / "etc" / "gptoss-spark.toml").get("default_profile", "plain")
    new = render(text, c, shipped_default="demo" if cpu else shipped,
                 cluster_profile=CLUSTER_PROFILE["cpu" if cpu else "spark"])
    return text, new


def place(layout: Layout, source: Path, flags: RoleFlags, *, cpu: bool, addr_json: str | None = None,
          dry_run: bool = False) -> Placed | None:
    """Write the role flags' [cluster] into the installed config. None: no role flag, nothing to do."""
    planned = plan(layout, source, flags, cpu=cpu, addr_json=addr_json)
    if planned is None:
        return None
    text, new = planned
    dest = layout.config_file
    if new == text:
        return Placed(dest, "unchanged")
    if dry_run:
        return Placed(dest, "would-replace")
    mode = dest.stat().st_mode & 0o777 if dest.exists() else 0o644
    if dest.exists():
        write_atomic(dest.with_name(dest.name + ".old"), text.encode(), mode)
    write_atomic(dest, new.encode(), mode)
    return Placed(dest, "replaced")


def effective(layout: Layout, flags: RoleFlags, addr_json: str | None = None) -> Cluster | None:
    """The [cluster] this install ends with: the flags', else the installed config's."""
    check_flags(flags)
    if flags.role is None:
        return installed(layout)
    if flags.role == "single":
        return None
    return resolve(flags, addr_json if addr_json is not None else _addresses())


def _addresses() -> str:
    from .dropins import read_addresses  # ip -json addr

    try:
        return read_addresses()
    except (OSError, ValueError) as e:
        raise InstallError(f"cannot list this machine's addresses ({e}); give --address and --cluster-ifname",
                           EXIT_LAN) from None
