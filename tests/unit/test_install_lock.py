"""install.sh's lock (scripts/install-lock.sh): one installer at a time, and --uninstall
leaves no lock file behind, unlinked while still held."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
LIB = REPO / "scripts" / "install-lock.sh"

pytestmark = pytest.mark.skipif(shutil.which("flock") is None, reason="flock(1) (util-linux) is not installed")


def bash(script: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-euc", f". {LIB}\n{script}"], capture_output=True, text=True, timeout=30)


def test_a_second_installer_is_refused_while_the_first_holds_it(tmp_path):
    lock = tmp_path / "install.lock"
    r = bash(f"install_lock {lock}\n"
             f"bash -c '. {LIB}; install_lock {lock}' && echo second-got-it || echo second-refused")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "second-refused"


def test_remove_deletes_only_the_lock_and_releases_it(tmp_path):
    lock = tmp_path / "install.lock"
    beside = tmp_path / "other"
    beside.write_text("x")
    r = bash(f"install_lock {lock}\ninstall_lock_remove\n"
             f"test ! -e {lock} && echo gone\n"
             # released too: fd 9 is closed, so a new installer gets the lock at once
             f"bash -c '. {LIB}; install_lock {lock}' && echo next-got-it\n"
             f"[ -e /proc/$$/fd/9 ] && echo fd-open || echo fd-closed")
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["gone", "next-got-it", "fd-closed"]
    assert beside.read_text() == "x" and sorted(p.name for p in tmp_path.iterdir()) == ["install.lock", "other"]


def test_remove_without_a_lock_does_nothing(tmp_path):
    r = bash(f"cd {tmp_path}\ninstall_lock_remove\necho ok")
    assert r.returncode == 0 and r.stdout.strip() == "ok"


def test_install_sh_uses_it_and_uninstall_removes_the_lock():
    text = (REPO / "install.sh").read_text()
    uninstall = text[text.index('if [ "$ACTION" = uninstall ]'):text.index("# ---------------------------------------------------------------- install")]
    assert 'install_lock "$LOCK"' in text and "LOCK=/run/gptoss-spark-install.lock" in text
    assert "install_lock_remove" in uninstall
    assert uninstall.index("install_lock_remove") > uninstall.index("groupdel")  # the last thing it does
