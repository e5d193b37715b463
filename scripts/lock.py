"""Make or check the lock files under locks/ (gptoss_spark/install/locks.py says what they are).

    scripts/lock.sh refresh [TARGET...]   resolve pyproject.toml afresh for each target, write its lock
    scripts/lock.sh add [TARGET...]       the same, holding every pin the lock has: only what is new comes in
    scripts/lock.sh check [TARGET...]     resolve with the lock's own pins; fail unless it comes out identical

Resolution is uv's (`uv pip compile --python-platform ... --format pylock.toml`),
not pip's dry-run report: pip evaluates environment markers with the
interpreter it runs on, not the --platform/--python-version it is given, so
from this x86_64 Python 3.11 box it drops vLLM's `setuptools<81;
python_version > "3.11"` and `six` for the Spark's Python 3.12 and picks a
setuptools vLLM does not accept. uv evaluates markers for the target, and its
pylock output lists per package only the files that install there, which is
what the lock keeps: each wheel that fits the target (sdist only where a
package ships no wheel). No wheel is downloaded.

Indexes: PyPI (uv's default; UV_INDEX_URL to change it). The CPU lock's
torch==2.13.0+cpu is not on PyPI: it comes from the PyTorch CPU page when
that answers, else from pip's find-links (PIP_FIND_LINKS or pip's config).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
import urllib.request
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from gptoss_spark.install.locks import CPU_UNWANTED, TARGETS, UNWANTED, LockTarget, read_pins  # noqa: E402

TORCH_CPU_PAGE = "https://download.pytorch.org/whl/cpu/torch/"
OMIT_WHY = {**{n: "CUDA builds that break the CPU torch" for n in CPU_UNWANTED},
            **{n: "a Python 3.3 backport the stdlib replaces" for n in UNWANTED}}


class LockError(Exception):
    """One line: what is wrong and what to do."""


@dataclass(frozen=True)
class Pin:
    name: str
    version: str
    hashes: tuple[str, ...]   # sha256 of each file that installs on the target
    size: int                 # bytes of the largest of them (0 if the index gives none)


def target_environment(t: LockTarget) -> dict[str, str]:
    """PEP 508 marker values of the target (for the markers uv keeps in its pylock)."""
    return {"python_version": t.python, "python_full_version": f"{t.python}.0", "os_name": "posix",
            "sys_platform": "linux", "platform_system": "Linux", "platform_machine": t.machine,
            "platform_python_implementation": "CPython", "implementation_name": "cpython",
            "implementation_version": f"{t.python}.0", "platform_release": "", "platform_version": ""}


def pins_from_pylock(text: str, t: LockTarget) -> list[Pin]:
    from packaging.markers import Marker

    env = target_environment(t)
    pins = []
    for p in tomllib.loads(text)["packages"]:
        if "marker" in p and not Marker(p["marker"]).evaluate(env):
            continue
        files = p.get("wheels") or ([p["sdist"]] if "sdist" in p else [])
        if not files:
            raise LockError(f"{p['name']} {p['version']} has no file for {t.uv_platform} in uv's resolution")
        pins.append(Pin(p["name"].lower(), p["version"], tuple(sorted(f["hashes"]["sha256"] for f in files)),
                        max(f.get("size", 0) for f in files)))
    return sorted(pins, key=lambda pin: pin.name)


def uv_exe() -> str:
    exe = shutil.which("uv", path=str(Path(sys.executable).parent)) or shutil.which("uv")
    if exe is None:
        raise LockError("uv is not installed: run ./scripts/dev-setup.sh (the test extra pins it)")
    return exe


def _reachable(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=10):
            return True
    except Exception:
        return False


def pip_find_links() -> list[str]:
    links = os.environ.get("PIP_FIND_LINKS", "").split()
    if not links:
        p = subprocess.run([sys.executable, "-m", "pip", "config", "get", "global.find-links"],
                           capture_output=True, text=True)
        links = p.stdout.split() if p.returncode == 0 else []
    return links


def torch_cpu_links() -> list[str]:
    if _reachable(TORCH_CPU_PAGE):
        return [TORCH_CPU_PAGE]
    links = pip_find_links()
    if not links:
        raise LockError(f"{TORCH_CPU_PAGE} is not reachable and pip has no find-links: torch==2.13.0+cpu "
                        "cannot be resolved; set PIP_FIND_LINKS to a directory holding its wheel")
    return links


def resolve(t: LockTarget, constraints: dict[str, str] | None = None, root: Path = REPO) -> list[Pin]:
    """uv's resolution of root/pyproject.toml[t.extras] for the target, as pins (nothing downloaded)."""
    with tempfile.TemporaryDirectory(prefix="gptoss-lock-") as tmp:
        out = Path(tmp) / "pylock.toml"
        cmd = [uv_exe(), "pip", "compile", str(root / "pyproject.toml"), "--quiet", "--no-header",
               "--python-version", t.python, "--python-platform", t.uv_platform, "--format", "pylock.toml",
               "-o", str(out)]
        for extra in t.extras:
            cmd += ["--extra", extra]
        for name in t.omit:
            cmd += ["--no-emit-package", name]
        if "cpu" in t.extras:
            for link in torch_cpu_links():
                cmd += ["--find-links", link]
        base = read_pins(root / TARGETS[t.base].path) if t.base else {}
        held = {**{n: v for n, (v, _) in base.items()}, **(constraints or {})}
        if held:
            c = Path(tmp) / "constraints.txt"
            c.write_text("".join(f"{n}=={v}\n" for n, v in sorted(held.items())))
            cmd += ["--constraint", str(c)]
        env = {**os.environ, "UV_PYTHON_DOWNLOADS": "never"}
        p = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=root)
        if p.returncode != 0:
            last = (p.stderr.strip().splitlines() or ["no output"])[-1]
            raise LockError(f"uv could not resolve {t.name}: {last}")
        pins = pins_from_pylock(out.read_text(), t)
    if t.base is not None:
        for pin in pins:
            if pin.name in base and base[pin.name][0] != pin.version:
                raise LockError(f"{t.name} resolved {pin.name} {pin.version}, {t.base} has {base[pin.name][0]}; "
                                f"refresh both: scripts/lock.sh refresh {t.base} {t.name}")
        pins = [pin for pin in pins if pin.name not in base]
    return pins


def render(t: LockTarget, pins: list[Pin]) -> str:
    total = sum(p.size for p in pins)
    on_top = f" on top of {TARGETS[t.base].path} (its pins are not repeated)" if t.base else ""
    lines = [
        f"# Lock: pyproject.toml [{','.join(t.extras)}] for CPython {t.python}, linux {t.machine}, "
        f"glibc >= {t.glibc[0]}.{t.glibc[1]}{on_top}.",
        f"# {len(pins)} packages, {total / 1e9:.2f} GB of files. Installed as is: pip install --no-deps "
        "--require-hashes -r THIS.",
        "# Made by scripts/lock.sh refresh; checked by scripts/lock.sh check (tests/unit/test_locks.py).",
    ]
    if t.omit:
        groups: dict[str, list[str]] = {}
        for n in t.omit:
            groups.setdefault(OMIT_WHY.get(n, "see gptoss_spark/install/locks.py"), []).append(n)
        lines.append("# Left out although required: " + "; ".join(f"{', '.join(ns)} ({why})" for why, ns in groups.items()) + ".")
    for p in pins:
        lines.append(f"{p.name}=={p.version} \\")
        lines += [f"    --hash=sha256:{h}" + (" \\" if i < len(p.hashes) - 1 else "") for i, h in enumerate(p.hashes)]
    return "\n".join(lines) + "\n"


def order(names: list[str]) -> list[LockTarget]:
    """Targets in an order where a base comes before what is resolved on top of it."""
    unknown = [n for n in names if n not in TARGETS]
    if unknown:
        raise LockError(f"unknown target {unknown[0]}; targets: {', '.join(TARGETS)}")
    chosen = [TARGETS[n] for n in (names or TARGETS)]
    return sorted(chosen, key=lambda t: t.base is not None)


def refresh(names: list[str], hold: bool = False) -> int:
    """Resolve and write each lock; with hold, every pin the lock has stays (only new needs come in)."""
    for t in order(names):
        t0 = time.monotonic()
        held = {n: v for n, (v, _) in read_pins(REPO / t.path).items()} if hold and (REPO / t.path).is_file() else None
        pins = resolve(t, held)
        (REPO / t.path).parent.mkdir(exist_ok=True)
        (REPO / t.path).write_text(render(t, pins))
        print(f"{t.path}: {len(pins)} packages, {sum(p.size for p in pins) / 1e9:.2f} GB "
              f"(resolved in {time.monotonic() - t0:.1f} s)")
    return 0


def differences(t: LockTarget, root: Path = REPO) -> list[str]:
    """What a resolution held to the lock's own pins gives that the lock does not say."""
    path = root / t.path
    if not path.is_file():
        return [f"{t.path} is missing"]
    locked = read_pins(path)
    pins = {p.name: (p.version, p.hashes) for p in resolve(t, {n: v for n, (v, _) in locked.items()}, root)}
    diff = [f"{n}: locked {locked[n][0]}, not in the resolution" for n in sorted(set(locked) - set(pins))]
    diff += [f"{n}: resolved {pins[n][0]}, not in the lock" for n in sorted(set(pins) - set(locked))]
    for n in sorted(set(pins) & set(locked)):
        if pins[n][0] != locked[n][0]:
            diff.append(f"{n}: locked {locked[n][0]}, resolved {pins[n][0]}")
        elif tuple(sorted(locked[n][1])) != pins[n][1]:
            diff.append(f"{n} {pins[n][0]}: the index's files differ from the locked hashes")
    return diff


def check(names: list[str]) -> int:
    bad = 0
    for t in order(names):
        t0 = time.monotonic()
        diff = differences(t)
        print(f"{t.path}: {'stale' if diff else 'up to date'} (resolved in {time.monotonic() - t0:.1f} s)")
        for d in diff[:20]:
            print(f"  {d}")
        bad += bool(diff)
    if bad:
        print("refresh: scripts/lock.sh refresh (then review and commit locks/)", file=sys.stderr)
    return 1 if bad else 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="scripts/lock.sh", description=__doc__.split("\n\n")[0])
    ap.add_argument("action", choices=("refresh", "add", "check"))
    ap.add_argument("targets", nargs="*", help=f"default: all ({', '.join(TARGETS)})")
    args = ap.parse_args(argv)
    try:
        if args.action == "check":
            return check(args.targets)
        return refresh(args.targets, hold=args.action == "add")
    except LockError as e:
        print(f"lock: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
