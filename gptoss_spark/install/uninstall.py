"""What --uninstall removes: the unit, the gptoss-spark@ template and our drop-in links for it, the
code and our link on PATH. The admin's config, drop-ins, the services' state (caches, demo model,
last-good profile) and install.sh's log stay unless --purge. Stopping the units (the instances first) and deleting the
user are install.sh's (systemctl, userdel)."""

from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path

from .instances import is_our_link
from .layout import SERVICE, Layout
from .placement import cli_link_is_ours


def uninstall_plan(layout: Layout, *, purge: bool) -> tuple[list[Path], list[Path]]:
    """(remove, keep): existing paths only."""
    remove = [layout.unit_file, layout.unit_file.with_name(layout.unit_file.name + ".old"),
              layout.template_file, layout.template_file.with_name(layout.template_file.name + ".old")]
    tdir = layout.template_dropin_dir
    ours = [p for p in sorted(tdir.iterdir()) if is_our_link(p)] if tdir.is_dir() else []
    theirs = [p for p in sorted(tdir.iterdir()) if p not in ours] if tdir.is_dir() else []
    remove += ours + ([tdir] if tdir.is_dir() and not theirs else [])  # the admin's drop-ins keep theirs
    remove.append(layout.opt_dir)
    if cli_link_is_ours(layout):
        remove.append(layout.cli_link)  # someone else's file there is left alone
    # Drop-ins of single instances (gptoss-spark@NAME.service.d) are the admin's as well.
    keep = [layout.dropin_dir, *([tdir] if theirs else []),
            *sorted(layout.unit_dir.glob(f"{SERVICE}@?*.service.d")), layout.etc_dir, layout.state_dir, layout.install_log]
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
        elif p.exists() or p.is_symlink():  # a link in a directory removed just before is gone already
            p.unlink()
    for p in keep:
        lines.append(f"  kept {layout.real(p)} (--purge removes it)")
    if keep:
        handed = hand_to_root(layout, keep, dry_run=dry_run)
        if handed:
            lines.append(f"  {'would give' if dry_run else 'gave'} {handed} kept files to root:root "
                         f"(the service user and group are deleted next), {layout.real(layout.token_file)} and "
                         f"{layout.real(layout.api_key_file)} mode 0600")
    return lines


def hand_to_root(layout: Layout, kept: list[Path], *, dry_run: bool = False) -> int:
    """chown what is kept to root:root and make the token and API key 0600, before userdel/groupdel:
    files owned by a deleted uid/gid would be readable by whoever gets that number next.
    Returns how many paths were (or would be) changed."""
    changed: set[Path] = set()
    for top in kept:
        for p in [top, *top.rglob("*")]:
            st = p.lstat()
            if (st.st_uid, st.st_gid) != (0, 0):
                changed.add(p)
                if not dry_run:
                    os.chown(p, 0, 0, follow_symlinks=False)
    for tok in (layout.token_file, layout.api_key_file):
        if tok.is_file() and not tok.is_symlink() and stat.S_IMODE(tok.stat().st_mode) != 0o600:
            changed.add(tok)
            if not dry_run:
                os.chmod(tok, 0o600)
    return len(changed)
