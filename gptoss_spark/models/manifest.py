"""The manifest a pull leaves in the checkpoint directory, and `model verify` against it (offline).

    .gptoss-spark-manifest.json
    {"format": 1, "name": "gpt-oss-120b", "repo": "openai/gpt-oss-120b", "revision": "<commit>",
     "endpoint": "https://huggingface.co", "pulled_at": "2026-12-03T12:00:00Z",
     "files": {"config.json": {"size": 1234, "sha256": "...", "hub": "git-sha1:..."}, ...}}

Every file has its sha256 (the Hub's own for LFS files; computed after the git sha1 matched for
the small ones), so verify needs one hash and no network.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from ..base.fsutil import read_json, write_atomic
from .hashing import sha256_file

MANIFEST_NAME = ".gptoss-spark-manifest.json"
FORMAT = 1


@dataclass(frozen=True)
class Manifest:
    name: str
    repo: str
    revision: str
    endpoint: str
    pulled_at: str
    files: dict[str, dict] = field(default_factory=dict)

    @property
    def total_bytes(self) -> int:
        return sum(f["size"] for f in self.files.values())

    def to_json(self) -> bytes:
        body = {"format": FORMAT, "name": self.name, "repo": self.repo, "revision": self.revision,
                "endpoint": self.endpoint, "pulled_at": self.pulled_at, "files": self.files}
        return (json.dumps(body, indent=1, sort_keys=True) + "\n").encode()


def write_manifest(directory: Path, manifest: Manifest) -> None:
    write_atomic(directory / MANIFEST_NAME, manifest.to_json())


def read_manifest(directory: Path) -> Manifest | None:
    """The manifest in directory; None if there is none (a checkpoint placed by hand)."""
    path = directory / MANIFEST_NAME
    try:
        data = read_json(path)
        if data.get("format") != FORMAT:
            return None
        return Manifest(data["name"], data["repo"], data["revision"], data["endpoint"], data["pulled_at"],
                        dict(data["files"]))
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        from ..base.errors import UserError

        raise UserError(f"{path}: unreadable manifest ({e}); pull the checkpoint again "
                        "(gptoss-spark model pull)") from None


@dataclass(frozen=True)
class Problem:
    path: str
    what: str   # "missing", "size", "sha256"
    detail: str

    def line(self) -> str:
        return f"{self.what:<7} {self.path}: {self.detail}"


def verify(directory: Path, manifest: Manifest, progress=None) -> list[Problem]:
    """Re-hash every file the manifest lists; each one that differs is a Problem."""
    problems = []
    for i, (rel, want) in enumerate(sorted(manifest.files.items()), 1):
        path = directory / rel
        if progress:
            progress(i, len(manifest.files), rel, want["size"])
        if not path.is_file():
            problems.append(Problem(rel, "missing", "not in the directory"))
            continue
        size = path.stat().st_size
        if size != want["size"]:
            problems.append(Problem(rel, "size", f"{size} bytes, the manifest says {want['size']}"))
            continue
        got = sha256_file(path)
        if got != want["sha256"]:
            problems.append(Problem(rel, "sha256", f"{got}, the manifest says {want['sha256']}"))
    return problems
