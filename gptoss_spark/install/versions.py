"""Which version serves, which one served before it, and the unit each one ships.

A version is a complete venv under venvs/<id> (venvs.py). Beside its files it keeps:
- `.shipped/systemd/`: the unit file and the drop-ins of the source it was installed
  from. The unit belongs to its version: a switch (upgrade, switch back, --rollback)
  installs the unit of the version it switches to, so no version ever starts under
  another's unit (a new ExecStart option the old `serve` does not know: exit 2).
- `.served`: when it last became ready (install.sh writes it after `systemctl restart`
  returned, i.e. after the supervisor's READY=1).

`previous` only ever names a version that served: a version that failed to become ready
is never offered by --rollback, and its venv is removed when install.sh switches back.

A switch first writes opt_dir/.switch.json (what current and previous were), then moves
the links and installs the unit; switch_back undoes exactly that. mark_served ends the
switch: the record goes, and venvs no link names are removed (kept until then, so a
switch back still finds the version before).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from pathlib import Path
from typing import Callable

from . import dropins, instances, placement
from ..base.exit_codes import EXIT_NO_PREVIOUS, EXIT_VENV
from ..base.fsutil import read_json, replace_symlink, write_atomic
from .layout import UNIT_NAME, InstallError, Layout
from .placement import Placed
from .venvs import is_complete, prune, read_link_id

SHIPPED = ".shipped"
SERVED = ".served"
SWITCH_RECORD = ".switch.json"
UNIT_RECORD = ".unit-written.json"   # sha256 of what the installer last wrote into /etc/systemd/system


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _read_json(path: Path) -> dict:
    try:
        return read_json(path)
    except (OSError, ValueError):
        return {}


def _write_json(path: Path, data: dict) -> None:
    write_atomic(path, (json.dumps(data, indent=2) + "\n").encode())


# ---------------------------------------------------------------- served

def mark_served(layout: Layout, vid: str | None = None, *, keep: tuple[str, ...] = ()) -> list[str]:
    """Record that `vid` (default: current) serves now; end a switch; remove the venvs that
    no link names, but `keep` (a version built and about to be switched to)."""
    vid = vid or read_link_id(layout.current)
    if not vid or not is_complete(layout.venvs_dir / vid):
        return []
    (layout.venvs_dir / vid / SERVED).write_text(time.strftime("%Y-%m-%d %H:%M:%S %Z") + "\n")
    (layout.opt_dir / SWITCH_RECORD).unlink(missing_ok=True)
    return prune(layout, keep=keep)


def last_served(layout: Layout, vid: str) -> str | None:
    try:
        return (layout.venvs_dir / vid / SERVED).read_text().strip() or None
    except OSError:
        return None


# ---------------------------------------------------------------- the unit of a version

def store_shipped(layout: Layout, source: Path, vid: str) -> None:
    """Keep the unit and drop-ins of `source` with venvs/<vid>: they go in with its switch."""
    dest = layout.venvs_dir / vid / SHIPPED / "systemd"
    tmp = dest.with_name(f".systemd.{os.getpid()}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    (tmp / dropins.SHIPPED_DIR.name).mkdir(parents=True)
    shutil.copy2(source / "systemd" / UNIT_NAME, tmp / UNIT_NAME)
    for f in sorted((source / dropins.SHIPPED_DIR).glob("*.conf")):
        shutil.copy2(f, tmp / dropins.SHIPPED_DIR.name / f.name)
    shutil.rmtree(dest, ignore_errors=True)
    os.replace(tmp, dest)


def _adopt_installed_unit(layout: Layout, vid: str) -> None:
    """A version installed before units were kept per version: the unit it runs under is the one
    on disk now; keep that with it, so switching back to it restores it."""
    dest = layout.venvs_dir / vid / SHIPPED / "systemd"
    (dest / dropins.SHIPPED_DIR.name).mkdir(parents=True, exist_ok=True)
    shutil.copy2(layout.unit_file, dest / UNIT_NAME)


def has_shipped(layout: Layout, vid: str) -> bool:
    return (layout.venvs_dir / vid / SHIPPED / "systemd" / UNIT_NAME).is_file()


def apply_unit(layout: Layout, vid: str, *, dry_run: bool = False) -> list[Placed]:
    """Install venvs/<vid>'s unit, the gptoss-spark@ template rendered from it (instances.py) and its
    drop-ins; remove a drop-in we wrote that it does not ship.

    The unit on disk is saved as .service.old only when it differs from what the
    installer last wrote there (someone edited it). A version installed before units
    were kept per version has none stored: the unit on disk stays."""
    if not has_shipped(layout, vid):
        return []
    root = layout.venvs_dir / vid / SHIPPED
    record = _read_json(layout.opt_dir / UNIT_RECORD)
    placed = [placement.install_unit(layout, root, dry_run=dry_run, last_written=record.get("unit"))]
    try:
        placed.append(instances.install_template(layout, root, dry_run=dry_run, last_written=record.get("template")))
    except instances.TemplateError:
        pass  # a version from before the template (its unit renders none): the template on disk stays
    shipped_dropins = dropins.install_shipped(layout, root, dry_run=dry_run)
    placed += shipped_dropins
    shipped = {p.path.name for p in shipped_dropins}
    placed += instances.link_dropins(layout, shipped, dry_run=dry_run)
    for name, sha in sorted(record.get("dropins", {}).items()):
        dest = layout.dropin_dir / name
        if name in shipped or dest.is_symlink() or not dest.is_file() or _sha(dest.read_bytes()) != sha:
            continue  # still shipped, or no longer ours as written
        if not dry_run:
            dest.unlink()
        placed.append(Placed(dest, "would-remove" if dry_run else "removed"))
    if not dry_run:
        _write_json(layout.opt_dir / UNIT_RECORD, {
            "unit": _sha(layout.unit_file.read_bytes()),
            "template": _sha(layout.template_file.read_bytes()) if layout.template_file.is_file() else None,
            "dropins": {p.path.name: _sha(p.path.read_bytes()) for p in shipped_dropins
                        if p.action != "masked" and p.path.is_file()}})
    return placed


# ---------------------------------------------------------------- switching

def switch_to(layout: Layout, vid: str, *, dry_run: bool = False) -> tuple[bool, list[Placed]]:
    """Make venvs/<vid> current, with its unit. `previous` becomes the old current only if that
    one served. (moved, unit files placed); moved is False when vid already is current."""
    venv = layout.venvs_dir / vid
    if not is_complete(venv):
        if dry_run:
            return True, []  # it would be built first
        raise InstallError(f"{venv} is not a complete install; run install.sh again", EXIT_VENV)
    cur, prev = read_link_id(layout.current), read_link_id(layout.previous)
    if cur == vid:
        return False, []
    if dry_run:
        return True, apply_unit(layout, vid, dry_run=True)
    layout.opt_dir.mkdir(parents=True, exist_ok=True)
    if cur and is_complete(layout.venvs_dir / cur) and not has_shipped(layout, cur) and layout.unit_file.is_file():
        _adopt_installed_unit(layout, cur)
    _write_json(layout.opt_dir / SWITCH_RECORD, {"to": vid, "current": cur, "previous": prev})
    replace_symlink(layout.current, f"venvs/{vid}")
    if cur and is_complete(layout.venvs_dir / cur) and last_served(layout, cur):
        replace_symlink(layout.previous, f"venvs/{cur}")
    elif prev == vid:
        layout.previous.unlink()  # a rollback: the old current never served, so nothing is left to go back to
    return True, apply_unit(layout, vid)


def switch_back(layout: Layout) -> tuple[str | None, str | None, list[Placed]]:
    """Undo the last switch: current and previous as they were, with that version's unit;
    the version switched to is no longer linked (removed by the next mark_served or prune).
    (restored id or None if there was none, failed id, placed)."""
    record = _read_json(layout.opt_dir / SWITCH_RECORD)
    failed, old, prev = record.get("to"), record.get("current"), record.get("previous")
    if not failed or read_link_id(layout.current) != failed:
        raise InstallError("no switch to undo (no record of one in progress)", EXIT_NO_PREVIOUS)
    if not old or not is_complete(layout.venvs_dir / old):
        return None, failed, []  # a first install: nothing to go back to, and its venv stays to fix
    replace_symlink(layout.current, f"venvs/{old}")
    if prev and prev != failed and is_complete(layout.venvs_dir / prev) and last_served(layout, prev):
        replace_symlink(layout.previous, f"venvs/{prev}")
    elif layout.previous.is_symlink():
        layout.previous.unlink()
    placed = apply_unit(layout, old)
    (layout.venvs_dir / failed / SERVED).unlink(missing_ok=True)  # it may have served once: not any more
    (layout.opt_dir / SWITCH_RECORD).unlink()
    # The failed venv is removed by the mark_served (or reclaim) after the restart: removing
    # gigabytes of files here would lengthen the gap before the old version serves again.
    return old, failed, placed


def rollback_target(layout: Layout) -> tuple[str, str]:
    """(the version --rollback switches to, when it last served). Refuses one that never served."""
    prev = read_link_id(layout.previous)
    served = last_served(layout, prev) if prev and is_complete(layout.venvs_dir / prev) else None
    if not prev or served is None:
        raise InstallError("no previous version that served to roll back to (only one version served here)",
                           EXIT_NO_PREVIOUS)
    return prev, served


def rollback(layout: Layout, *, dry_run: bool = False, log: Callable[[str], None] = print) -> str:
    target, served = rollback_target(layout)
    log(f"  {'would switch' if dry_run else 'switching'} {layout.real(layout.current)}: "
        f"{read_link_id(layout.current)} -> {target} (last served {served})")
    _, placed = switch_to(layout, target, dry_run=dry_run)
    for p in placed:
        if p.action not in ("unchanged", "masked"):
            log(p.line(layout))
    return target
