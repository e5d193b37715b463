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
    assert 'install_lock_take "$LOCK"' in text and "LOCK=/run/gptoss-spark-install.lock" in text
    assert "install_lock_remove" in uninstall
    assert uninstall.index("install_lock_remove") > uninstall.index("groupdel")  # the last thing it does


def test_what_a_killed_installer_left_holding_the_lock_is_ended_and_the_lock_taken(tmp_path):
    """kill -9 of install.sh leaves its steps (pip, a build) running with fd 9: the next installer
    names them, ends them by PID and takes the lock, instead of 'another install.sh is running'."""
    lock = tmp_path / "install.lock"
    # A shell that is not install.sh takes the lock, leaves a child holding fd 9, and exits.
    subprocess.run(["bash", "-c", f". {LIB}; install_lock {lock}; setsid sleep 300 >/dev/null 2>&1 & exit 0"],
                   timeout=30, check=True)
    r = bash(f"install_lock_take {lock} && echo took-it")
    assert r.returncode == 0 and r.stdout.strip() == "took-it", r.stderr
    assert "held by processes an interrupted install.sh left running, ending them: " in r.stderr
    assert "sleep 300" in r.stderr


def test_a_live_installer_is_named_not_ended(tmp_path):
    lock = tmp_path / "install.lock"
    script = tmp_path / "install.sh"
    script.write_text(f". {LIB}; install_lock {lock}; echo locked; sleep 30\n")
    holder = subprocess.Popen(["bash", str(script)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        r = bash(f"install_lock_take {lock} && echo took-it || echo refused")
        assert r.stdout.strip() == "refused", r.stderr
        assert f"held by: {holder.pid} bash {script}" in r.stderr and holder.poll() is None
    finally:
        holder.kill()
        holder.wait()
