"""Files: the one atomic writer (a crash or power cut leaves the old file or the new one, never half of
one), the one atomic symlink swap, and the one JSON file reader."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any


def write_atomic(path: Path, data: bytes, mode: int = 0o644, *, sync_dir: bool = True) -> None:
    """Write data to a temp file beside path, fsync, chmod, rename over path (and fsync the directory).

    The rename replaces a symlink at path itself, never the file it points to.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    if sync_dir:
        dfd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)


def replace_symlink(link: Path, target: str | Path) -> None:
    """Point link at target in one rename: readers see the old link or the new one, never none."""
    tmp = link.with_name(f".{link.name}.{os.getpid()}.tmp")
    if tmp.is_symlink() or tmp.exists():
        tmp.unlink()
    os.symlink(target, tmp)
    os.replace(tmp, link)  # rename(2) over the old link


def read_json(path: Path) -> Any:
    """The JSON document in path, read as UTF-8 (as JSON files are, whatever the locale says).

    Raises what reading and parsing raise: OSError, or ValueError (UnicodeDecodeError and
    json.JSONDecodeError are both ValueErrors); each caller says what a bad file means to it.
    """
    return json.loads(path.read_text(encoding="utf-8"))


def dir_bytes(path: Path) -> int:
    """The sizes of the files under path, added up (links not followed; a file that vanishes counts 0)."""
    total = 0
    for root, _, files in os.walk(path):
        for f in files:
            try:
                total += os.lstat(os.path.join(root, f)).st_size
            except OSError:
                pass
    return total
