"""A real systemd, booted as PID 1 of a private namespace, for system tests.

Safety (docs/TESTING.md, "Real systemd in a namespace"), in the order the boot
script does it, all before systemd is exec'd:
- own PID, mount and cgroup namespaces; the cgroup namespace is rooted in a
  fresh child of the test's own cgroup in every hierarchy, so the inner
  systemd manages only that subtree (and stays under the test's memory limit);
- private tmpfs on /tmp, /var/tmp, /run (systemd-tmpfiles would empty the
  shared /tmp) and /var/log (journald, utmp);
- overlay mounts over /etc, /opt, /var/lib and /usr/local (the command's
  link in /usr/local/bin): useradd, the installer and
  systemd write there and nothing reaches the host, while the host's content
  (local wheels under /opt) stays readable. The upper layers live in a
  scratch directory the test owns (on disk, not in RAM: a venv is ~3 GiB and
  the failed-upgrade step builds a second one), removed by .kill();
- a tmpfs over /etc/systemd/system, so none of the host's own units boot,
  holding masks for every unit that touches global kernel or host state
  (sysctl, modules, udev, binfmt, clock, utmp, tmpfiles, gettys).
Only existing directories are mounted over: nothing is mkdir'ed on the host.
Stop = SIGKILL of the namespace's PID 1, by its PID.
"""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import subprocess
import time
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")

# Units that must not run in the namespace: they write kernel-global or host
# state, or are just noise. Everything else sysinit/basic pull in is harmless
# inside the private mounts.
MASKED = """
systemd-tmpfiles-setup.service systemd-tmpfiles-setup-dev.service systemd-tmpfiles-clean.service
systemd-tmpfiles-clean.timer systemd-sysctl.service systemd-modules-load.service kmod-static-nodes.service
systemd-udevd.service systemd-udevd-control.socket systemd-udevd-kernel.socket systemd-udev-trigger.service
systemd-udev-settle.service systemd-binfmt.service proc-sys-fs-binfmt_misc.automount
proc-sys-fs-binfmt_misc.mount systemd-timesyncd.service systemd-update-utmp.service
systemd-update-utmp-runlevel.service systemd-remount-fs.service systemd-fsck-root.service
systemd-random-seed.service systemd-pstore.service systemd-firstboot.service systemd-machine-id-commit.service
systemd-sysusers.service systemd-repart.service systemd-pcrphase.service systemd-pcrphase-sysinit.service
systemd-journal-flush.service systemd-hwdb-update.service systemd-journald-audit.socket ldconfig.service
dev-hugepages.mount dev-mqueue.mount sys-fs-fuse-connections.mount sys-kernel-config.mount
sys-kernel-debug.mount sys-kernel-tracing.mount systemd-ask-password-console.path
systemd-ask-password-wall.path getty.target getty-static.service getty@tty1.service console-getty.service
serial-getty@.service systemd-logind.service dbus.service dbus.socket systemd-user-sessions.service
systemd-initctl.socket cryptsetup.target veritysetup.target integritysetup.target swap.target
e2scrub_all.timer e2scrub_reap.service apt-daily.timer apt-daily-upgrade.timer man-db.timer
dpkg-db-backup.timer fstrim.timer systemd-networkd.service systemd-networkd-wait-online.service
systemd-resolved.service NetworkManager.service NetworkManager-wait-online.service
""".split()

TARGET = """[Unit]
Description=gptoss-spark system-test target
Wants=systemd-journald.service systemd-journald.socket systemd-journald-dev-log.socket
AllowIsolate=yes
"""


def _boot_script(tag: str, cgroup_table: str, scratch: Path) -> str:
    masks = " ".join(MASKED)
    return f"""
set -eu
mount --make-rprivate /
for d in /tmp /var/tmp /run /var/log; do mount -t tmpfs -o mode=1777 tmpfs "$d"; done
chmod 755 /run /var/log
# cgroup namespace: give systemd fresh cgroupfs mounts rooted at our subtree.
mount -t tmpfs -o mode=755 tmpfs /sys/fs/cgroup
while read -r name fstype opts; do
  mkdir -p "/sys/fs/cgroup/$name"
  if [ "$fstype" = cgroup2 ]; then mount -t cgroup2 cgroup2 "/sys/fs/cgroup/$name"
  else mount -t cgroup -o "$opts" cgroup "/sys/fs/cgroup/$name"; fi
done <<'EOF'
{cgroup_table}EOF
S={shlex.quote(str(scratch))}
for d in etc opt varlib usrlocal; do mkdir -p "$S/$d/up" "$S/$d/wk"; done
mount -t overlay overlay -o "lowerdir=/etc,upperdir=$S/etc/up,workdir=$S/etc/wk" /etc
mount -t overlay overlay -o "lowerdir=/opt,upperdir=$S/opt/up,workdir=$S/opt/wk" /opt
mount -t overlay overlay -o "lowerdir=/var/lib,upperdir=$S/varlib/up,workdir=$S/varlib/wk" /var/lib
mount -t overlay overlay -o "lowerdir=/usr/local,upperdir=$S/usrlocal/up,workdir=$S/usrlocal/wk" /usr/local
mount -t tmpfs -o mode=755 tmpfs /etc/systemd/system
for u in {masks}; do ln -s /dev/null "/etc/systemd/system/$u"; done
cat > /etc/systemd/system/systest.target <<'EOF'
{TARGET}EOF
exec /lib/systemd/systemd --system --unit=systest.target --log-target=console --log-level=warning
"""


def _cgroup_hierarchies() -> list[tuple[str, str, str, Path]]:
    """(dir name under /sys/fs/cgroup, fstype, mount options, our cgroup path in it)."""
    own = {}
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        hid, ctrls, path = line.split(":", 2)
        own[ctrls] = path
    out = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        left, right = line.split(" - ", 1)
        mnt = left.split()[4]
        fstype, _src, sopts = right.split()
        if not mnt.startswith(str(CGROUP_ROOT) + "/") or fstype not in ("cgroup", "cgroup2"):
            continue
        name = mnt[len(str(CGROUP_ROOT)) + 1:]
        if fstype == "cgroup2":
            key, opts = "", ""
        else:
            keep = [o for o in sopts.split(",") if o not in ("rw", "ro") and not o.startswith("release_agent")]
            opts = ",".join(keep)
            key = ",".join(o for o in keep if o not in ("clone_children", "xattr", "noprefix"))
        if key in own:
            out.append((name, fstype, opts or "none", Path(own[key].lstrip("/"))))
    return out


class NamespacedSystemd:
    """Boot with .boot(), run commands with .sh(), tear down with .kill()."""

    def __init__(self, log_path: Path, scratch_parent: Path, journal_path: Path | None = None):
        self.tag = f"systest-{os.getpid()}-{int(time.time())}"
        self.log_path = log_path
        self.journal_path = journal_path
        # Overlay upper layers (and anything else the test stages): a directory
        # of our own on a real filesystem (overlayfs cannot use overlay uppers).
        self.scratch = scratch_parent / self.tag
        self.pid1: int | None = None
        self.proc: subprocess.Popen | None = None
        self.journal: subprocess.Popen | None = None
        self.cgroups: list[Path] = []

    # -- cgroups: one fresh child of our own cgroup per hierarchy
    def _make_cgroups(self) -> str:
        lines = []
        for name, fstype, opts, own in _cgroup_hierarchies():
            cg = CGROUP_ROOT / name / own / self.tag
            cg.mkdir()
            if name == "cpuset":
                for f in ("cpuset.cpus", "cpuset.mems"):
                    (cg / f).write_text((cg.parent / f).read_text())
            self.cgroups.append(cg)
            lines.append(f"{name} {fstype} {opts}")
        return "\n".join(lines) + "\n"

    def _enter_cgroups(self) -> None:  # runs in the child between fork and exec
        for cg in self.cgroups:
            (cg / "cgroup.procs").write_text(str(os.getpid()))

    def boot(self, timeout: float = 60.0) -> None:
        self.scratch.mkdir(parents=True)
        table = self._make_cgroups()
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            ["unshare", "--fork", "--pid", "--mount", "--mount-proc", "--cgroup", "--propagation", "private",
             "/bin/bash", "-c", _boot_script(self.tag, table, self.scratch)],
            stdin=subprocess.DEVNULL, stdout=log, stderr=log, preexec_fn=self._enter_cgroups,
            start_new_session=True)
        deadline = time.monotonic() + timeout
        while self.pid1 is None:
            kids = Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children")
            if kids.exists() and kids.read_text().split():
                self.pid1 = int(kids.read_text().split()[0])
            elif self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"namespace did not start; see {self.log_path}")
            else:
                time.sleep(0.05)
        while True:
            r = self.sh("systemctl is-system-running", check=False, timeout=10)
            state = r.stdout.strip()
            if state in ("running", "degraded"):
                self._follow_journal()
                return
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise RuntimeError(f"systemd did not boot (state {state!r}); see {self.log_path}")
            time.sleep(0.3)

    def _follow_journal(self) -> None:
        """Stream the namespace's journal to a file on the host as it is written:
        it survives the SIGKILL that ends the namespace (and a PID 1 that died)."""
        if self.journal_path is None:
            return
        out = open(self.journal_path, "ab")
        self.journal = subprocess.Popen(
            ["nsenter", "-t", str(self.pid1), "-m", "-p", "-C", "--",
             "journalctl", "-f", "-n", "all", "-o", "short-monotonic", "--no-pager"],
            stdin=subprocess.DEVNULL, stdout=out, stderr=out, start_new_session=True)
        out.close()

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def sh(self, command: str, *, check: bool = True, timeout: float = 600,
           env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
        """Run a bash command inside the namespace (its mounts and PID 1)."""
        assert self.pid1
        full_env = {**os.environ, **(env or {})}
        p = subprocess.run(["nsenter", "-t", str(self.pid1), "-m", "-p", "-C", "--", "/bin/bash", "-c", command],
                           capture_output=True, text=True, timeout=timeout, env=full_env)
        if check and p.returncode != 0:
            dead = "" if self.alive() else (
                f"\nTHE NAMESPACE IS GONE: its systemd (PID {self.pid1} outside) exited; "
                f"see {self.log_path} and {self.journal_path}")
            raise AssertionError(f"`{command}` -> {p.returncode}{dead}\nstdout:\n{p.stdout[-4000:]}\n"
                                 f"stderr:\n{p.stderr[-4000:]}")
        return p

    def kill(self) -> None:
        """SIGKILL of the namespace's PID 1 (by its PID), then our cgroups and scratch. Idempotent."""
        if self.pid1 and self.alive():
            try:
                os.kill(self.pid1, signal.SIGKILL)  # takes the whole PID namespace with it
            except ProcessLookupError:
                pass
        self.pid1 = None
        for p in (self.proc, self.journal):
            if p:
                try:
                    p.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    pass
        for cg in self.cgroups:  # the inner systemd's cgroups, deepest first
            for _ in range(50):
                try:
                    for d in sorted((p for p in cg.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
                        d.rmdir()
                    cg.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.1)
        self.cgroups = []
        if self.scratch.exists():
            shutil.rmtree(self.scratch, ignore_errors=True)

    def __enter__(self) -> "NamespacedSystemd":
        self.boot()
        return self

    def __exit__(self, *exc) -> None:
        self.kill()


def quote(s: str) -> str:
    return shlex.quote(s)
