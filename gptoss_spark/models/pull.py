"""Fetch one checkpoint from the Hugging Face Hub into place: staged, hash-checked, renamed in whole.

    <parent>/.<name>.partial/    the staging directory, on the same filesystem as the destination
        <files>                  fetched by huggingface_hub (hf_hub_download into a local_dir)
        .gptoss-spark-pull.json  which files are already verified, and at which commit
    <parent>/<name>/             appears only complete: every file verified, the manifest written,
                                 ownership set, then one rename

What huggingface_hub 2.4.0 does and does not do (file_download.py): each file is written to a
process-unique temporary file and renamed into the local_dir when complete, and a dropped
connection is resumed with an HTTP Range request (http_get, up to 5 retries); but a file cut off
by a killed process is deleted, not resumed, and content is only checked for its size. So here:
- resume across runs is per file: files verified by an earlier run are kept (and not fetched
  again); leftovers of a file cut off mid-way are deleted first;
- every file is hashed against the Hub's listing (model_info with files_metadata: the sha256 of
  an LFS file, the git blob sha1 of a small one); a file that differs is deleted and the pull stops;
- free space is checked before anything is fetched, against what is still missing;
- the whole revision is pinned: the listing's commit is what every file is fetched at;
- progress within a file: huggingface_hub's bars on a terminal, else bounded-rate lines
  (pull_progress.py: tqdm draws nothing when stderr is not a terminal, e.g. the installer's log);
- a destination that already holds the revision is re-hashed against its manifest, and only the
  files that differ (or are gone) are fetched again, staged and verified, then each renamed over
  the bad one: the good files keep their bytes and mtimes (a repair in place, as `ollama pull` does).
"""

from __future__ import annotations

import datetime as dt
import json
import os
import pwd
import shutil
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from fnmatch import fnmatch
from pathlib import Path

from ..base.errors import UserError
from ..base.exit_codes import EXIT_MODEL_CORRUPT, EXIT_MODEL_FETCH, EXIT_MODEL_SPACE
from ..base.fsutil import read_json, write_atomic
from .catalog import Checkpoint
from .hashing import digests
from .manifest import MANIFEST_NAME, Manifest, read_manifest, verify, write_manifest
from .pull_progress import progress_for

PROGRESS_NAME = ".gptoss-spark-pull.json"
HF_METADATA_DIR = Path(".cache") / "huggingface"  # what hf_hub_download(local_dir=...) keeps beside the files
GIB = 1 << 30
# Kept free beyond the checkpoint: the state dir, logs and the journal may share the filesystem.
SPACE_RESERVE = 1 * GIB


class FetchError(UserError):
    exit_code = EXIT_MODEL_FETCH


class CorruptError(UserError):
    exit_code = EXIT_MODEL_CORRUPT


class SpaceError(UserError):
    exit_code = EXIT_MODEL_SPACE


@dataclass(frozen=True)
class RemoteFile:
    path: str
    size: int
    lfs_sha256: str | None   # LFS files: the Hub's sha256 of the content
    git_sha1: str | None     # every file: its git blob id (for an LFS file, that of the pointer)

    @property
    def hub_hash(self) -> str:
        return f"sha256:{self.lfs_sha256}" if self.lfs_sha256 else f"git-sha1:{self.git_sha1}"


@dataclass(frozen=True)
class Listing:
    commit: str
    files: tuple[RemoteFile, ...]

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)


def staging_dir(dest: Path) -> Path:
    return dest.parent / f".{dest.name}.partial"


def disk_free(path: Path) -> int:
    """Free bytes on the filesystem that holds path (its nearest existing ancestor)."""
    for p in (path, *path.parents):
        if p.exists():
            return shutil.disk_usage(p).free
    return shutil.disk_usage("/").free


def _hub_errors() -> tuple[type[BaseException], ...]:
    import httpx2
    from huggingface_hub.errors import FileMetadataError, HfHubHTTPError, LocalEntryNotFoundError

    return (HfHubHTTPError, LocalEntryNotFoundError, FileMetadataError, httpx2.HTTPError, ConnectionError)


def list_remote(entry: Checkpoint, revision: str, endpoint: str | None) -> Listing:
    """The files to fetch and their hashes, from GET /api/models/{repo}/revision/{rev}?blobs=true."""
    from huggingface_hub import HfApi

    try:
        info = HfApi(endpoint=endpoint).model_info(entry.repo_id, revision=revision, files_metadata=True)
    except _hub_errors() as e:
        raise FetchError(f"could not list {entry.repo_id}@{revision} on {endpoint or _default_endpoint()}: "
                         f"{_first_line(e)}; check the network (or HF_ENDPOINT) and run the pull again") from None
    files = []
    for s in info.siblings or []:
        if any(fnmatch(s.rfilename, pat) for pat in entry.ignore):
            continue
        if s.size is None or (s.lfs is None and s.blob_id is None):
            raise FetchError(f"{entry.repo_id}: the hub listed no size or hash for {s.rfilename}; "
                             "nothing was fetched; try again later")
        files.append(RemoteFile(s.rfilename, s.lfs.size if s.lfs else s.size, s.lfs.sha256 if s.lfs else None,
                                s.blob_id))
    if not files:
        raise FetchError(f"{entry.repo_id}@{revision} lists no files to fetch; check the repository name")
    return Listing(info.sha, tuple(sorted(files, key=lambda f: f.path)))


def _default_endpoint() -> str:
    from huggingface_hub import constants

    return constants.ENDPOINT


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0]}" if text else type(e).__name__


class _Progress:
    """The verified files of a staging directory, so an interrupted pull resumes where it stopped."""

    def __init__(self, staging: Path, commit: str):
        self.path = staging / PROGRESS_NAME
        self.staging = staging
        self.commit = commit
        self.verified: dict[str, dict] = {}
        self.missing: list[RemoteFile] = []   # what this run fetches, and its bytes
        self.need = 0

    def load(self) -> bool:
        """Read the record; False if it is for another commit (the staging is then stale)."""
        try:
            data = read_json(self.path)
        except (OSError, ValueError):
            return True
        if data.get("commit") != self.commit:
            return False
        for rel, rec in (data.get("verified") or {}).items():
            p = self.staging / rel
            try:
                st = p.stat()
            except OSError:
                continue
            if st.st_size == rec.get("size") and st.st_mtime_ns == rec.get("mtime_ns"):
                self.verified[rel] = rec
        return True

    def add(self, rel: str, size: int, sha256: str, hub: str) -> None:
        st = (self.staging / rel).stat()
        self.verified[rel] = {"size": size, "sha256": sha256, "hub": hub, "mtime_ns": st.st_mtime_ns}
        write_atomic(self.path, json.dumps({"commit": self.commit, "verified": self.verified}).encode(),
                     sync_dir=False)


@dataclass(frozen=True)
class PullResult:
    dest: Path
    manifest: Manifest
    fetched: tuple[str, ...]   # files fetched by this run (the others were verified by an earlier one)
    already: bool = False      # dest already held this revision, every file matching: nothing fetched
    repaired: tuple[str, ...] = ()  # files of dest that failed their hash and were replaced


def pull(entry: Checkpoint, dest: Path, *, revision: str = "main", endpoint: str | None = None,
         owner: str | None = None, out: Callable[[str], None] = print,
         free_bytes: Callable[[Path], int] = disk_free,
         bars: Callable[[str], type | None] | None = None) -> PullResult:
    """bars: the tqdm_class to fetch a file with, by its name (pull_progress.progress_for by default)."""
    bars = bars or progress_for(out=out)
    listing = list_remote(entry, revision, endpoint)
    existing = _check_destination(entry, dest, listing)
    if existing is not None:
        return _check_and_repair(entry, dest, existing, listing, endpoint=endpoint, owner=owner, out=out,
                                 free_bytes=free_bytes, bars=bars)

    staging = staging_dir(dest)
    progress = _stage(entry, staging, listing, listing.files, dest, out, free_bytes)
    done = len(listing.files) - len(progress.missing)
    out(f"{entry.name}: {entry.repo_id}@{listing.commit[:12]}, {len(listing.files)} files, "
        f"{size_text(listing.total_bytes)}" + (f"; {done} already verified, {size_text(progress.need)} to fetch"
                                               if done else "") + f" -> {dest}")
    _fetch_missing(entry, listing, progress, staging, endpoint, out, bars, done, len(listing.files))
    manifest = Manifest(entry.name, entry.repo_id, listing.commit, endpoint or _default_endpoint(),
                        dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
                        {rel: {"size": rec["size"], "sha256": rec["sha256"], "hub": rec["hub"]}
                         for rel, rec in sorted(progress.verified.items())})
    _finish(staging, dest, manifest, owner)
    out(f"{entry.name}: {len(listing.files)} files verified against the hub, manifest {dest / MANIFEST_NAME}")
    return PullResult(dest, manifest, tuple(f.path for f in progress.missing))


def _stage(entry: Checkpoint, staging: Path, listing: Listing, wanted: Iterable[RemoteFile], dest: Path,
           out: Callable[[str], None], free_bytes: Callable[[Path], int]) -> _Progress:
    """The staging directory, ready for the wanted files: a stale one dropped, free space checked."""
    progress = _Progress(staging, listing.commit)
    if staging.exists() and not progress.load():
        out(f"{staging}: left by a pull of another revision; starting over")
        shutil.rmtree(staging)
    _drop_partial_downloads(staging)
    progress.missing = [f for f in wanted if f.path not in progress.verified]
    progress.need = sum(f.size for f in progress.missing)
    free = free_bytes(staging)
    if free < progress.need + SPACE_RESERVE:
        raise SpaceError(f"{entry.name}: needs {size_text(progress.need)} more at {dest.parent} (+ "
                         f"{size_text(SPACE_RESERVE)} kept free), {size_text(free)} is free; free some space or "
                         "pull to another --dir; nothing was fetched")
    staging.mkdir(parents=True, exist_ok=True)
    return progress


def _fetch_missing(entry: Checkpoint, listing: Listing, progress: _Progress, staging: Path, endpoint: str | None,
                   out: Callable[[str], None], bars: Callable[[str], type | None], done: int, total: int) -> None:
    for i, f in enumerate(progress.missing, done + 1):
        out(f"[{i}/{total}] {f.path} ({size_text(f.size)})")
        _fetch(entry, f, listing.commit, staging, endpoint, bars(f.path))
        progress.add(f.path, f.size, _verify_fetched(entry, f, staging), f.hub_hash)


def _check_and_repair(entry: Checkpoint, dest: Path, manifest: Manifest, listing: Listing, *,
                      endpoint: str | None, owner: str | None, out: Callable[[str], None],
                      free_bytes: Callable[[Path], int], bars: Callable[[str], type | None]) -> PullResult:
    """dest already holds this revision: re-hash every file against its manifest and fetch again only
    those that differ or are gone (as `ollama pull` does), each staged, verified against the hub, then
    renamed over the bad one; the good files are not touched."""
    out(f"{entry.name}: {dest} holds {entry.repo_id}@{listing.commit[:12]} ({size_text(manifest.total_bytes)}); "
        f"re-hashing its {len(manifest.files)} files against the manifest")
    problems = verify(dest, manifest, progress=lambda i, n, rel, size: out(f"  [{i}/{n}] {rel} ({size_text(size)})"))
    if not problems:
        out(f"{entry.name}: every file matches the manifest (sha256); nothing to fetch")
        return PullResult(dest, manifest, (), already=True)
    bad = {p.path for p in problems}
    for p in problems:
        out(f"  CORRUPT {p.line()}")
    staging = staging_dir(dest)
    wanted = [f for f in listing.files if f.path in bad]
    progress = _stage(entry, staging, listing, wanted, dest, out, free_bytes)
    out(f"{entry.name}: {len(bad)} of {len(manifest.files)} files differ; fetching them again "
        f"({size_text(progress.need)}), the other {len(manifest.files) - len(bad)} are kept")
    _fetch_missing(entry, listing, progress, staging, endpoint, out, bars, 0, len(wanted))
    for f in wanted:
        if progress.verified[f.path]["sha256"] != manifest.files[f.path]["sha256"]:
            raise CorruptError(f"{entry.name}: {f.path} from the hub has sha256 {progress.verified[f.path]['sha256']}, "
                               f"the manifest of {dest} says {manifest.files[f.path]['sha256']}; nothing was "
                               f"replaced; move {dest} away and pull it again")
    if owner is not None:
        _chown_tree(staging, owner)
    for f in wanted:  # each rename replaces one file whole: a reader sees the old inode or the new one
        target = dest / f.path
        target.parent.mkdir(parents=True, exist_ok=True)
        os.replace(staging / f.path, target)
        _fsync_dir(target.parent)
    shutil.rmtree(staging)
    out(f"{entry.name}: repaired {len(wanted)} file(s) in {dest}; every file now matches the manifest")
    return PullResult(dest, manifest, tuple(f.path for f in progress.missing), repaired=tuple(f.path for f in wanted))


def _check_destination(entry: Checkpoint, dest: Path, listing: Listing) -> Manifest | None:
    """None if dest is free to be created; its manifest if it already holds this revision; else refuse."""
    if not dest.exists():
        return None
    if dest.is_dir() and not any(dest.iterdir()):
        dest.rmdir()  # an empty directory made beforehand: the rename puts the checkpoint there
        return None
    manifest = read_manifest(dest) if dest.is_dir() else None
    if manifest is None:
        raise UserError(f"{dest} exists and was not pulled by gptoss-spark (no {MANIFEST_NAME}); move it away "
                        "or pull to another --dir")
    if manifest.revision == listing.commit and set(manifest.files) == {f.path for f in listing.files}:
        return manifest
    raise UserError(f"{dest} holds {manifest.repo}@{manifest.revision[:12]}, the hub has "
                    f"{entry.repo_id}@{listing.commit[:12]}; move it away to pull that one (the service "
                    f"keeps serving the one it has), or pass --revision {manifest.revision} to check and repair "
                    "the one it holds")


def _drop_partial_downloads(staging: Path) -> None:
    """huggingface_hub's temporary files of a download cut off by a killed process: never reused."""
    meta = staging / HF_METADATA_DIR
    if meta.is_dir():
        for p in meta.rglob("*.incomplete"):
            p.unlink(missing_ok=True)


def _fetch(entry: Checkpoint, f: RemoteFile, commit: str, staging: Path, endpoint: str | None,
           tqdm_class: type | None) -> None:
    from huggingface_hub import hf_hub_download

    try:
        hf_hub_download(entry.repo_id, f.path, revision=commit, local_dir=staging, endpoint=endpoint,
                        tqdm_class=tqdm_class)
    except _hub_errors() as e:
        raise FetchError(f"{entry.name}: fetching {f.path} failed: {_first_line(e)}; run the pull again "
                         f"(verified files are kept in {staging})") from None


def _verify_fetched(entry: Checkpoint, f: RemoteFile, staging: Path) -> str:
    """The file's sha256 if it is what the hub lists; else delete it and raise CorruptError."""
    path = staging / f.path
    d = digests(path, git_sha1=f.lfs_sha256 is None)
    if f.lfs_sha256:
        ok, got, want = d.sha256 == f.lfs_sha256, f"sha256 {d.sha256}", f"sha256 {f.lfs_sha256}"
    else:
        ok, got, want = d.git_sha1 == f.git_sha1, f"git sha1 {d.git_sha1}", f"git sha1 {f.git_sha1}"
    if d.size != f.size:
        ok, got, want = False, f"{d.size} bytes", f"{f.size} bytes"
    if not ok:
        path.unlink()
        (staging / HF_METADATA_DIR / "download" / f"{f.path}.metadata").unlink(missing_ok=True)
        raise CorruptError(f"{entry.name}: {f.path} arrived with {got}, the hub lists {want}; it was deleted and "
                           "nothing was put in place; run the pull again")
    return d.sha256


def _finish(staging: Path, dest: Path, manifest: Manifest, owner: str | None) -> None:
    shutil.rmtree(staging / ".cache", ignore_errors=True)
    (staging / PROGRESS_NAME).unlink(missing_ok=True)
    write_manifest(staging, manifest)
    if owner is not None:
        _chown_tree(staging, owner)
    dest.parent.mkdir(parents=True, exist_ok=True)
    os.rename(staging, dest)
    _fsync_dir(dest.parent)


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _chown_tree(root: Path, owner: str) -> None:
    try:
        pw = pwd.getpwnam(owner)
    except KeyError:
        raise UserError(f"no user {owner!r} to own the checkpoint; pass --owner USER (or run install.sh first, "
                        "which creates gptoss-spark)") from None
    for p in (root, *root.rglob("*")):
        if p.is_symlink():
            continue
        os.chown(p, pw.pw_uid, pw.pw_gid)
        os.chmod(p, 0o755 if p.is_dir() else 0o644)


def size_text(n: int) -> str:
    """A byte count as people read it: GB, MB or bytes."""
    return f"{n / 1e9:.1f} GB" if n >= 1e8 else f"{n / 1e6:.1f} MB" if n >= 1e5 else f"{n} B"
