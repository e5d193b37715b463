"""What the config step changed in /etc/gptoss-spark, kept until the install ends, so that an
install that fails puts the admin's files back as they were.

The config step writes the new version's settings file and shipped profiles (where absent or
never edited) before the new version is checked: its profiles' engine arguments under its vLLM
(exit 29), its warm-up (exit 32), its start. A refusal must not leave the refused profile
installed (and recorded as shipped) for the old version's next engine start to load. So before
writing, the step records every file it may touch, as it is (bytes, or absent), in one file;
install.sh's exit puts them back when the install failed (`install config-undo`) and drops the
record when it succeeded (`install config-keep`). A record left by an installer that was killed
(its process gone) is put back by the next config step before it writes anything.
"""

from __future__ import annotations

import base64
import json
import os
from pathlib import Path
from typing import Iterable

from ..base.fsutil import read_json, write_atomic
from .layout import Layout

RECORD = ".install-undo.json"


def record_path(layout: Layout) -> Path:
    return layout.etc_dir / RECORD


def record(layout: Layout, paths: Iterable[Path], *, owner: int | None = None) -> None:
    """Note how each of `paths` is now (its bytes and mode, or absent), before the step writes any.
    owner: the install.sh whose exit resolves the record (default: the step's parent process)."""
    files: dict[str, object] = {"owner": os.getppid() if owner is None else owner}
    for p in paths:
        if p.is_file() and not p.is_symlink():
            files[str(p)] = {"mode": p.stat().st_mode & 0o7777, "data": base64.b64encode(p.read_bytes()).decode()}
        elif not p.exists() and not p.is_symlink():
            files[str(p)] = None
    write_atomic(record_path(layout), (json.dumps(files, indent=1, sort_keys=True) + "\n").encode(), 0o600)


def _alive(pid: object) -> bool:
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def restore(layout: Layout, *, only_if_abandoned: bool = False) -> list[Path]:
    """Put every recorded file back as it was, drop the record; the paths that changed back.
    only_if_abandoned: only a record whose install.sh is gone (killed before its exit resolved it);
    one whose owner still runs is left to that owner (steps run by hand or by tests)."""
    path = record_path(layout)
    if not path.exists():
        return []
    files = dict(read_json(path))
    owner = files.pop("owner", None)
    if only_if_abandoned and _alive(owner):
        return []
    changed = []
    for name, was in sorted(files.items()):
        p = Path(name)
        if was is None:
            if p.exists() or p.is_symlink():
                p.unlink()
                changed.append(p)
            continue
        assert isinstance(was, dict)
        data = base64.b64decode(str(was["data"]))
        if not p.is_file() or p.read_bytes() != data:
            write_atomic(p, data, int(was["mode"]))
            changed.append(p)
    path.unlink()
    return changed


def keep(layout: Layout) -> bool:
    """The install succeeded: its files stay. True if there was a record to drop."""
    path = record_path(layout)
    if path.exists():
        path.unlink()
        return True
    return False
