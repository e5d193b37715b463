"""What --uninstall removes: the unit, the code and our link on PATH. The admin's config and the
service's state (caches, demo model, last-good profile) stay unless --purge.
Stopping the unit and deleting the user are install.sh's (systemctl, userdel)."""

from __future__ import annotations

import shutil
from pathlib import Path

from .layout import Layout
from .placement import cli_link_is_ours


def uninstall_plan(layout: Layout, *, purge: bool) -> tuple[list[Path], list[Path]]:
    """(remove, keep): existing paths only."""
    remove = [layout.unit_file, layout.unit_file.with_name(layout.unit_file.name + ".old"), layout.opt_dir]
    if cli_link_is_ours(layout):
        remove.append(layout.cli_link)  # someone else's file there is left alone
    keep = [layout.dropin_dir, layout.etc_dir, layout.state_dir]
    if purge:
        remove += keep
        keep = []
    return [p for p in remove if p.exists() or p.is_symlink()], [p for p in keep if p.exists()]


def uninstall(layout: Layout, *, purge: bool, dry_run: bool = False) -> list[str]:
    remove, keep = uninstall_plan(layout, purge=purge)
    lines = []
    for p in remove:
        lines.append(f"  {'would remove' if dry_run else 'removed'} {layout.real(p)}")
        if dry_run:
            continue
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p)
        else:
            p.unlink()
    for p in keep:
        lines.append(f"  kept {layout.real(p)} (--purge removes it)")
    return lines
