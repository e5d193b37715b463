"""`gptoss-spark doctor`: one screen that says whether this host can serve, and what to fix if not.

Each check is a small function returning a Finding; none of them changes anything.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import httpx

from .service.config import Settings, load_settings, resolve_config_path
from .base.defaults import CONFIG_HELP
from .base.errors import ConfigError, UserError
from .service.exit_reason import SYSCALL_FILTER_DROPIN, SYSCALL_FILTER_OFF
from .service.memory import ProcMemorySource
from .service.profiles import Profile, load_profiles
from .service.store import StateStore

OK, WARN, FAIL = "ok", "warn", "fail"


@dataclass(frozen=True)
class Finding:
    check: str
    level: str
    detail: str


def check_profile(settings: Settings) -> tuple[Finding, Profile | None]:
    try:
        profiles = load_profiles(settings)
    except ConfigError as e:
        return Finding("profiles", FAIL, str(e)), None
    name = StateStore(settings.state_file).load().active_profile or settings.default_profile
    if name not in profiles:
        return Finding("profiles", FAIL, f"active profile {name!r} not found (known: {', '.join(sorted(profiles))})"), None
    try:
        profiles[name].check_requirements(settings)
    except UserError as e:
        return Finding("profiles", FAIL, str(e)), profiles[name]
    return Finding("profiles", OK, f"{len(profiles)} loaded; active {name} has what it needs"), profiles[name]


def check_tiktoken(settings: Settings) -> Finding:
    from .install.tiktoken_file import FILE_NAME, verify_tiktoken_file

    if settings.model.tiktoken_dir is None:
        return Finding("tiktoken", WARN, "model.tiktoken_dir unset: the engine will try to download o200k_base.tiktoken")
    try:
        verify_tiktoken_file(settings.model.tiktoken_dir / FILE_NAME)
    except UserError as e:
        return Finding("tiktoken", FAIL, str(e))
    return Finding("tiktoken", OK, f"{settings.model.tiktoken_dir / FILE_NAME} verified")


def check_patches(venv: Path) -> Finding:
    from .install.patching import inspect_venv

    try:
        report = inspect_venv(venv)
    except UserError as e:
        return Finding("patches", WARN, str(e))
    level = {"patched": OK, "unpatched": WARN}.get(report.state, FAIL)
    return Finding("patches", level, f"{report.state}: {report.detail}")


def check_memory(settings: Settings) -> Finding:
    r = ProcMemorySource().read()
    detail = f"MemAvailable {r.available_gib:.1f} GiB of {r.total_bytes / 2**30:.1f} GiB"
    if r.psi_some_avg10 is not None:
        detail += f", PSI some avg10 {r.psi_some_avg10:.1f}%"
    if r.available_gib < settings.memory.danger_available_gib:
        return Finding("memory", FAIL, detail + " (below the danger line)")
    return Finding("memory", OK, detail)


def check_gpu() -> Finding:
    if shutil.which("nvidia-smi") is None:
        return Finding("gpu", WARN, "no nvidia-smi: no NVIDIA driver (fine for an install.sh --cpu demonstration)")
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name,compute_cap", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20).stdout.strip()
    except (OSError, subprocess.TimeoutExpired) as e:
        return Finding("gpu", FAIL, f"nvidia-smi failed: {e}")
    if not out:
        return Finding("gpu", FAIL, "nvidia-smi lists no GPU")
    name, _, cap = out.splitlines()[0].partition(",")
    level = OK if cap.strip() == "12.1" else WARN
    return Finding("gpu", level, f"{name.strip()}, compute capability {cap.strip()}"
                   + ("" if level == OK else " (the profiles are tuned for a DGX Spark, 12.1)"))


def check_flashinfer(settings: Settings, profile: Profile | None) -> list[Finding]:
    """The kernel caches the active profile needs: each FlashInfer JIT module, built or missing, for which arch."""
    if profile is None:
        return [Finding("flashinfer", WARN, "no active profile to list FlashInfer modules for")]
    from .service import flashinfer_cache as cache
    from .flashinfer_jit.build import status

    if cache.dist_version(cache.FLASHINFER_DIST) is None:
        return [Finding("flashinfer", OK, "flashinfer-python is not in this venv (the CPU engine uses none)")]
    rows, notes = status(settings, {profile.name: profile})
    findings = []
    for r in rows:
        if r.built and r.linked:
            findings.append(Finding("flashinfer", OK, f"{r.name} for {r.arch_list}: built, linked into this venv"))
        elif r.built:
            findings.append(Finding("flashinfer", WARN, f"{r.name} for {r.arch_list}: built at {r.path} but not "
                                    "linked into this venv (run install.sh again)"))
        else:
            findings.append(Finding("flashinfer", WARN, f"{r.name} for {r.arch_list}: missing; the engine compiles "
                                    "it at its first start (run `gptoss-spark flashinfer build` as gptoss-spark)"))
    if not rows:
        findings.append(Finding("flashinfer", OK, f"profile {profile.name} loads no FlashInfer JIT module"))
    findings += [Finding("flashinfer", WARN if n.gap else OK, n.text) for n in notes]
    return findings


def check_draft_head(settings: Settings, profile: Profile | None) -> list[Finding]:
    """For a profile that drafts with the Eagle3 head: its aux layers against its fc and the target
    (draft/aux_layers.py; a mismatch serves, but hardly a draft is accepted)."""
    if profile is None or not any("eagle3" in a for a in profile.engine_args(settings)):
        return []
    from .draft.aux_layers import check_aux_layers, read_target
    from .draft.head import open_head
    # The profile's own head: spec-20b drafts with the 20b's (model.eagle3_20b_dir).
    head_dir = (settings.model.eagle3_20b_dir if any("{eagle3_20b_dir}" in a for a in profile.args)
                else settings.model.eagle3_dir)
    try:
        head = open_head(head_dir)
        report, problems = check_aux_layers(head, read_target(settings.model.dir))
    except (UserError, OSError, ValueError) as e:
        return [Finding("draft", FAIL, f"{head_dir}: {e}")]
    if problems:
        return [Finding("draft", FAIL, f"{head_dir}: {'; '.join(problems)}")]
    return [Finding("draft", OK, f"Eagle3 head taps target layers {report.get('aux_layer_ids')}, "
                                 f"fc takes {report.get('fc_in_features')} inputs")]


def check_warm(settings: Settings) -> Finding:
    """Which profiles this host can run would start without compiling (warmup.py's markers)."""
    from .warmup import runnable, warm_state

    try:
        can, _ = runnable(settings, load_profiles(settings))
    except ConfigError as e:
        return Finding("warm", FAIL, str(e))
    cold = {p.name: warm_state(settings, p) for p in can}
    cold = {n: s for n, s in cold.items() if s != "warm"}
    if not can:
        return Finding("warm", WARN, "no profile can run on this host")
    if not cold:
        return Finding("warm", OK, f"{', '.join(p.name for p in can)}: a start compiles nothing")
    paired = {p.name for p in can if p.needs_cluster}  # warmup cannot start these alone (warmup.py)
    listed = ", ".join(f"{n} ({'never warmed' if s == 'never' else 'warmed under other versions'}"
                       f"{'; its first start on the pair is its warm-up' if n in paired else ''})"
                       for n, s in sorted(cold.items()))
    fix = ("" if set(cold) <= paired else ": sudo -u gptoss-spark gptoss-spark warmup --if-cold")
    return Finding("warm", WARN, f"not warm: {listed}; their next start compiles (minutes on a Spark){fix}")


def check_service(settings: Settings) -> Finding:
    host = "127.0.0.1" if settings.admin.host in ("0.0.0.0", "::") else settings.admin.host
    try:
        r = httpx.get(f"http://{host}:{settings.admin.port}/admin/health", timeout=3)
    except httpx.HTTPError:
        return Finding("service", WARN, f"admin API not answering on {host}:{settings.admin.port} "
                       "(start it: systemctl start gptoss-spark)")
    if r.status_code == 200:
        return Finding("service", OK, "ready")
    try:
        state = r.json().get("state")
    except ValueError:
        state = r.text[:80]
    return Finding("service", WARN, f"not ready: {state} (see gptoss-spark status, journalctl -u gptoss-spark)")


def check_syscall_filter(dropin: Path = Path(SYSCALL_FILTER_DROPIN)) -> Finding:
    """Say whether the unit's syscall filter is on, and how to turn it off: it is the
    hardening that could not be tried on a Spark's CUDA path before shipping."""
    if dropin.is_symlink() and str(dropin.readlink()) == "/dev/null":
        return Finding("seccomp", WARN, f"syscall filter turned off ({dropin} -> /dev/null); "
                       f"to turn it back on: sudo rm {dropin} && sudo install.sh")
    if not dropin.exists():
        return Finding("seccomp", OK, f"no syscall filter drop-in ({dropin} absent)")
    return Finding("seccomp", OK, f"syscall filter on ({dropin}); if the engine dies with SIGSYS under it, "
                   f"turn it off: {SYSCALL_FILTER_OFF}")


def check_lan_dropin(settings: Settings,
                     dropin: Path = Path("/etc/systemd/system/gptoss-spark.service.d/30-lan.conf")) -> Finding:
    """The unit lets loopback traffic through only; a host off loopback needs the drop-in
    install.sh writes, or clients get no answer at all (their connections time out)."""
    from .base.net import is_loopback
    from .install.dropins import is_masked

    off = [f"{name}.host {host}" for name, host in (("engine", settings.engine.host), ("admin", settings.admin.host))
           if not is_loopback(host)]
    if not off:
        return Finding("ip-rules", OK, "loopback only (IPAddressDeny=any, IPAddressAllow=localhost)")
    if dropin.exists() and not is_masked(dropin):
        return Finding("ip-rules", OK, f"{', '.join(off)}: networks allowed by {dropin}")
    return Finding("ip-rules", FAIL, f"{', '.join(off)} is off loopback but the unit allows loopback traffic only "
                   f"({dropin} missing): clients elsewhere get no answer; run install.sh again to write it")


def run_checks(settings: Settings, venv: Path) -> list[Finding]:
    findings = [Finding("settings", OK, str(settings.source or "defaults"))]
    profile_finding, profile = check_profile(settings)
    checks: list[Callable[[], Finding]] = [
        lambda: profile_finding, lambda: check_tiktoken(settings), lambda: check_patches(venv),
        lambda: check_memory(settings), check_gpu, lambda: check_warm(settings), check_syscall_filter,
        lambda: check_lan_dropin(settings),
        lambda: check_service(settings)]
    findings += [c() for c in checks]
    findings[-1:-1] = check_flashinfer(settings, profile) + check_draft_head(settings, profile)  # before the service
    return findings


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("doctor", help="check settings, profiles, tokenizer file, vLLM patches, memory, GPU, "
                                      "FlashInfer modules, syscall filter, IP rules, service")
    p.add_argument("--config", help=CONFIG_HELP)
    p.add_argument("--venv", default=sys.prefix, help="venv whose vLLM patches to check (default: this one)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_doctor)


def cmd_doctor(args: argparse.Namespace) -> int:
    try:
        settings = load_settings(resolve_config_path(args.config))
    except ConfigError as e:
        findings = [Finding("settings", FAIL, str(e))]
    else:
        findings = run_checks(settings, Path(args.venv))
    if args.json:
        print(json.dumps([asdict(f) for f in findings], indent=2))
    else:
        for f in findings:
            print(f"{f.level:<5} {f.check:<10} {f.detail}")
    return 1 if any(f.level == FAIL for f in findings) else 0
