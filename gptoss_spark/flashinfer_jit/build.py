"""Build the installed profiles' FlashInfer modules, link them into the venv, and say what is there.

build  (the service user, at install): each module the profiles need (modules.py), one
       process per module, its ninja output to a log, parallelism from cache.jobs_for,
       progress per module and a total. A module already built for the key is skipped
       without running ninja (see service/flashinfer_cache.py for why ninja must not decide).
link   (root, at install): the running venv's flashinfer/data/aot/<name> -> the built
       module's directory, so the engine loads it as an ahead-of-time module.
status (doctor, `flashinfer status`): per profile, each module built or missing, linked or not.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable

from ..service.config import Settings
from ..base.errors import UserError
from ..base.exit_codes import EXIT_FLASHINFER
from ..base.fsutil import dir_bytes, replace_symlink, write_atomic
from ..service.memory import ProcMemorySource
from ..service.profiles import Profile, load_profiles, unknown_profiles
from ..service import flashinfer_cache as cache
from .modules import Derivation, JitModule, Note, derive

HEARTBEAT_SECONDS = 60.0


def _print(line: str) -> None:
    print(line, flush=True)  # progress of a long build: never sit in a pipe's buffer
_NINJA_STEP_RE = re.compile(rb"^\[(\d+)/(\d+)\]", re.M)


class FlashInferBuildError(UserError):
    exit_code = EXIT_FLASHINFER


def torch_cuda_version() -> str | None:
    """torch.version.cuda of this environment, read from torch/version.py without importing torch."""
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(list(spec.submodule_search_locations)[0]) / "version.py"
    try:
        tree = ast.parse(path.read_text())
    except (OSError, SyntaxError):
        return None
    for node in tree.body:
        target = node.target if isinstance(node, ast.AnnAssign) else (
            node.targets[0] if isinstance(node, ast.Assign) and len(node.targets) == 1 else None)
        if isinstance(target, ast.Name) and target.id == "cuda" and node.value is not None:
            try:
                value = ast.literal_eval(node.value)
            except ValueError:
                return None
            return value if isinstance(value, str) else None
    return None


def derive_profile(profile: Profile, settings: Settings, torch_cuda: str | None) -> Derivation:
    d = derive(profile.name, profile.engine_args(settings), profile.engine_env(settings), torch_cuda=torch_cuda)
    try:
        cache.arch_dir_name(d.arch_list)
    except ValueError as e:
        raise FlashInferBuildError(f"{profile.source}: engine.env.FLASHINFER_CUDA_ARCH_LIST: {e}") from None
    return d


@dataclass
class Needed:
    arch_list: str
    module: JitModule
    profiles: list[str] = field(default_factory=list)


def needed_modules(derivations: Iterable[Derivation]) -> list[Needed]:
    """Each (arch list, module) once, in first-seen order, with the profiles that need it."""
    out: dict[tuple[str, str], Needed] = {}
    for d in derivations:
        for m in d.modules:
            out.setdefault((d.arch_list, m.name), Needed(d.arch_list, m)).profiles.append(d.profile)
    return list(out.values())


def _installed(settings: Settings, only_profiles: Iterable[str] | None = None) -> list[Derivation]:
    profiles = load_profiles(settings)
    if only_profiles:
        missing = sorted(set(only_profiles) - set(profiles))
        if missing:
            raise FlashInferBuildError(unknown_profiles(missing, profiles))
        profiles = {k: v for k, v in profiles.items() if k in set(only_profiles)}
    if not profiles:
        dirs = ", ".join(str(d) for d in settings.paths.profile_dirs)
        raise FlashInferBuildError(f"no profiles found in {dirs}; install the configuration first")
    torch_cuda = torch_cuda_version()
    return [derive_profile(p, settings, torch_cuda) for _, p in sorted(profiles.items())]


def _key() -> cache.CacheKey:
    try:
        return cache.current_key()
    except cache.NoCacheKey as e:
        raise FlashInferBuildError(f"cannot build FlashInfer modules: {e}") from None


def log_path(settings: Settings, key: cache.CacheKey, need: Needed) -> Path:
    return (key.workspace_base(settings.cache_dir / "flashinfer") / "logs"
            / cache.arch_dir_name(need.arch_list) / f"{need.module.name}.log")


def worker_env(key: cache.CacheKey, settings: Settings, arch_list: str, jobs: int,
               base: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ if base is None else base)
    env.update({
        "FLASHINFER_WORKSPACE_BASE": str(key.workspace_base(settings.cache_dir / "flashinfer")),
        "FLASHINFER_CUDA_ARCH_LIST": arch_list,
        "MAX_JOBS": str(jobs),
        "FLASHINFER_NVCC_THREADS": str(cache.NVCC_THREADS),
        "CUDA_HOME": str(cache.cuda_home(env)),
        # FlashInfer runs `ninja` from PATH; the ninja wheel puts it beside this interpreter.
        "PATH": os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", os.defpath)]),
        "PYTHONUNBUFFERED": "1",
        # As the engine has it: whatever FlashInfer's imports cache under ~ lands in the state dir, not in
        # the HOME of whoever ran setpriv.
        "XDG_CACHE_HOME": settings.cache_env()["XDG_CACHE_HOME"],
    })
    return env


def _fmt_duration(seconds: float) -> str:
    m, s = divmod(int(seconds), 60)
    return f"{m}m{s:02d}s" if m else f"{seconds:.1f} s"


def _last_ninja_step(log: Path) -> tuple[int, int] | None:
    try:
        with log.open("rb") as f:
            f.seek(max(0, log.stat().st_size - 65536))
            steps = _NINJA_STEP_RE.findall(f.read())
    except OSError:
        return None
    return (int(steps[-1][0]), int(steps[-1][1])) if steps else None


@dataclass
class ModuleResult:
    name: str
    arch_list: str
    state: str              # "built" | "cached"
    seconds: float = 0.0
    peak_rss_bytes: int = 0


@dataclass
class BuildReport:
    key: cache.CacheKey
    jobs: int
    results: list[ModuleResult]
    seconds: float
    cache_bytes: int


def _run_worker(need: Needed, env: dict[str, str], log: Path, prefix: str,
                say: Callable[[str], None]) -> tuple[int, int, float]:
    """Run the worker with output to log; heartbeat lines while it runs. Returns (rc, peak RSS bytes, s)."""
    log.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    next_beat = t0 + HEARTBEAT_SECONDS
    with log.open("wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "gptoss_spark.flashinfer_jit.worker", need.module.name,
                                 need.module.generator], stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, env=env)
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid == proc.pid:
                break
            now = time.monotonic()
            if now >= next_beat:
                step = _last_ninja_step(log)
                where = f"step {step[0]}/{step[1]}, " if step else ""
                say(f"{prefix} {need.module.name}: {where}{_fmt_duration(now - t0)}")
                next_beat = now + HEARTBEAT_SECONDS
            time.sleep(0.5)
    proc.returncode = os.waitstatus_to_exitcode(status)
    # ru_maxrss (KiB) of the worker and its descendants: the largest single process, i.e. one compile job.
    return proc.returncode, usage.ru_maxrss * 1024, time.monotonic() - t0


def build(settings: Settings, *, modules: Iterable[str] | None = None, profiles: Iterable[str] | None = None,
          jobs: int | None = None, say: Callable[[str], None] = _print) -> BuildReport:
    """Build what the installed profiles need (or only `modules`, which must be among them)."""
    t_start = time.monotonic()
    derivations = _installed(settings, profiles)
    key = _key()
    cache_root = settings.cache_dir / "flashinfer"
    needs = needed_modules(derivations)
    if modules:
        wanted = set(modules)
        unknown = sorted(wanted - {n.module.name for n in needs})
        if unknown:
            raise FlashInferBuildError(
                f"module(s) {', '.join(unknown)} are not needed by the installed profiles "
                f"(they need: {', '.join(n.module.name for n in needs) or 'none'})")
        needs = [n for n in needs if n.module.name in wanted]
    # Smallest first: a missing header or a broken toolkit shows in minutes, not after the hour-long MoE module.
    needs.sort(key=lambda n: n.module.sources)
    for d in derivations:
        for note in d.notes:
            say(f"  {'warning' if note.gap else 'note'} ({d.profile}): {note.text}")
    if jobs is None:
        available = ProcMemorySource().read().available_bytes
        jobs = cache.jobs_for(available, cache.cores())
        how = f"MemAvailable {available / cache.GIB:.1f} GiB, {cache.cores()} cores"
        one_job_gib = cache.RESERVE_GIB + cache.PER_JOB_GIB
        if available / cache.GIB < one_job_gib:
            how += f"; less than {one_job_gib:.0f} GiB available, one job anyway"
    else:
        how = "--jobs"
    say(f"FlashInfer {key.flashinfer} JIT modules: {len(needs)} for "
        f"{', '.join(sorted({n.arch_list for n in needs})) or '-'}, {jobs} job(s) ({how}), "
        f"cache {key.workspace_base(cache_root)}")
    results: list[ModuleResult] = []
    for i, need in enumerate(needs, 1):
        prefix = f"  [{i}/{len(needs)}]"
        mdir = key.module_dir(cache_root, need.arch_list, need.module.name)
        if cache.is_built(mdir, need.module.name):
            say(f"{prefix} {need.module.name} ({need.arch_list}): already built")
            results.append(ModuleResult(need.module.name, need.arch_list, "cached"))
            continue
        log = log_path(settings, key, need)
        say(f"{prefix} {need.module.name} ({need.arch_list}, for {', '.join(need.profiles)}): building; log {log}")
        rc, peak, seconds = _run_worker(need, worker_env(key, settings, need.arch_list, jobs), log, prefix, say)
        if rc != 0:
            raise FlashInferBuildError(
                f"FlashInfer module {need.module.name} did not build (exit {rc}); see {log}")
        if not (mdir / f"{need.module.name}.so").is_file():
            raise FlashInferBuildError(f"FlashInfer module {need.module.name} built, but {mdir} has no "
                                       f"{need.module.name}.so: FlashInfer's layout changed; see {log}")
        marker = {"module": need.module.name, "arch_list": need.arch_list, "flashinfer": key.flashinfer,
                  "nvcc": key.nvcc, "tvm_ffi": key.tvm_ffi, "seconds": round(seconds, 1),
                  "peak_rss_bytes": peak, "jobs": jobs, "built_at": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
        write_atomic(mdir / cache.BUILT_MARKER, (json.dumps(marker, indent=2) + "\n").encode())
        say(f"{prefix} {need.module.name}: built in {_fmt_duration(seconds)}, "
            f"peak {peak / cache.GIB:.1f} GiB in one process")
        results.append(ModuleResult(need.module.name, need.arch_list, "built", seconds, peak))
    total = time.monotonic() - t_start
    size = dir_bytes(key.workspace_base(cache_root)) if key.workspace_base(cache_root).exists() else 0
    built = sum(r.state == "built" for r in results)
    say(f"FlashInfer: {len(results)} module(s) ready ({built} built, {len(results) - built} already there) "
        f"in {_fmt_duration(total)}; cache {size / cache.GIB:.2f} GiB")
    return BuildReport(key, jobs, results, total, size)


# ---------------------------------------------------------------- link

def aot_dir() -> Path:
    """This environment's flashinfer/data/aot (jit/env.py FLASHINFER_AOT_DIR), found without importing it."""
    spec = importlib.util.find_spec("flashinfer")
    if spec is None or not spec.submodule_search_locations:
        raise FlashInferBuildError("flashinfer-python is not installed in this environment")
    return Path(list(spec.submodule_search_locations)[0]).resolve() / "data" / "aot"


def link(settings: Settings, *, target: Path | None = None, say: Callable[[str], None] = _print) -> list[Path]:
    """Point target/<name> at each built module the installed profiles need; drop our stale links."""
    target = target or aot_dir()
    key = _key()
    cache_root = settings.cache_dir / "flashinfer"
    needs = needed_modules(_installed(settings))
    by_name: dict[str, Needed] = {}
    for n in needs:
        if n.module.name in by_name:
            raise FlashInferBuildError(
                f"module {n.module.name} is needed for arch lists {by_name[n.module.name].arch_list} and "
                f"{n.arch_list} (profiles {', '.join(by_name[n.module.name].profiles + n.profiles)}); FlashInfer "
                "loads one prebuilt copy per name: give the profiles the same FLASHINFER_CUDA_ARCH_LIST")
        by_name[n.module.name] = n
    target.mkdir(parents=True, exist_ok=True)
    os.chmod(target, 0o755)  # root makes it; the engine (the service user) must read it whatever root's umask
    linked = []
    for name, n in by_name.items():
        mdir = key.module_dir(cache_root, n.arch_list, name)
        if not cache.is_built(mdir, name):
            raise FlashInferBuildError(f"FlashInfer module {name} is not built at {mdir}; "
                                       "run `gptoss-spark flashinfer build` as the service user first")
        link_path = target / name
        replace_symlink(link_path, mdir)
        linked.append(link_path)
    for p in target.iterdir():
        if p.is_symlink() and p.name not in by_name:
            p.unlink()
    say(f"FlashInfer: {len(linked)} prebuilt module(s) linked into {target}")
    return linked


# ---------------------------------------------------------------- status

@dataclass(frozen=True)
class ModuleStatus:
    profile: str
    name: str
    arch_list: str
    built: bool
    linked: bool
    path: str


def status(settings: Settings, profiles: dict[str, Profile] | None = None) -> tuple[list[ModuleStatus], list[Note]]:
    """Each needed module of each profile: built for the current key? linked in this venv? Plus notes."""
    profiles = load_profiles(settings) if profiles is None else profiles
    try:
        key: cache.CacheKey | None = cache.current_key()
        problem = None
    except cache.NoCacheKey as e:
        key, problem = None, str(e)
    try:
        aot: Path | None = aot_dir()
    except FlashInferBuildError:
        aot = None
    torch_cuda = torch_cuda_version()
    cache_root = settings.cache_dir / "flashinfer"
    rows: list[ModuleStatus] = []
    notes: list[Note] = []
    if problem:
        notes.append(Note(problem, gap=True))
    for name, p in sorted(profiles.items()):
        d = derive_profile(p, settings, torch_cuda)
        notes += [Note(f"{name}: {n.text}", n.gap) for n in d.notes]
        for m in d.modules:
            mdir = key.module_dir(cache_root, d.arch_list, m.name) if key else None
            built = bool(mdir and cache.is_built(mdir, m.name))
            link_path = aot / m.name if aot else None
            linked = bool(link_path and mdir and link_path.is_symlink() and link_path.resolve() == mdir.resolve())
            rows.append(ModuleStatus(name, m.name, d.arch_list, built, linked, str(mdir) if mdir else ""))
    return rows, notes
