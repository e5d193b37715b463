"""The two hashes the Hub states for a file: sha256 for an LFS file, the git blob sha1 for the rest.

huggingface_hub (2.4.0) checks only the size of what it downloads (http_get's "Consistency check");
it hashes a file only to decide whether one already in a local_dir is current. So the pull hashes
every file itself against the Hub's listing (model_info with files_metadata: `lfs.sha256`, `blobId`).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

CHUNK = 8 << 20


@dataclass(frozen=True)
class Digests:
    size: int
    sha256: str
    git_sha1: str | None


def digests(path: Path, git_sha1: bool = True) -> Digests:
    """sha256 and (git_sha1=True) the git blob sha1, sha1 of "blob <size>\\0" + content, in one read.
    The pull asks for the sha1 of small files only: an LFS shard's git id is that of its pointer."""
    size = path.stat().st_size
    sha256 = hashlib.sha256()
    sha1 = hashlib.sha1(b"blob %d\0" % size) if git_sha1 else None
    with path.open("rb") as f:
        while chunk := f.read(CHUNK):
            sha256.update(chunk)
            if sha1 is not None:
                sha1.update(chunk)
    return Digests(size, sha256.hexdigest(), sha1.hexdigest() if sha1 is not None else None)


def sha256_file(path: Path) -> str:
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()
