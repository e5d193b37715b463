"""install.sh --role: the flags, the [cluster] it writes into a scratch root, and the peer preflight
against real HTTP servers on 127.0.0.1 (the real admin app for the pairing, a silent socket)."""

from __future__ import annotations

import json
import os
import socket
import threading
import time
import tomllib
import urllib.request
from pathlib import Path

import pytest

from gptoss_spark.install import cluster, peer, placement
from gptoss_spark.install.__main__ import main
from gptoss_spark.install.checks import Check
from gptoss_spark.install.cluster import Cluster, RoleFlags
from gptoss_spark.base.exit_codes import EXIT_LAN, EXIT_PEER
from gptoss_spark.install.layout import InstallError, Layout

REPO = Path(__file__).resolve().parents[2]
# `ip -json addr` of a worker: loopback, the LAN, and the cluster link.
ADDRS = json.dumps([
    {"ifname": "lo", "addr_info": [{"local": "127.0.0.1", "prefixlen": 8}]},
    {"ifname": "enP7s7", "addr_info": [{"local": "192.168.1.20", "prefixlen": 24}]},
    {"ifname": "enp1s0f0np0", "addr_info": [{"local": "10.100.0.2", "prefixlen": 30}]},
])
WORKER = RoleFlags(role="worker", head="10.100.0.1")


@pytest.fixture
def src(tmp_path) -> Path:
    s = tmp_path / "src"
    (s / "etc" / "profiles").mkdir(parents=True)
    (s / "etc" / "gptoss-spark.toml").write_text((REPO / "etc" / "gptoss-spark.toml").read_text())
    return s


@pytest.fixture
def lay(tmp_path, src) -> Layout:
    lay = Layout(root=tmp_path / "root")
    placement.place_config(lay, src, cpu=False)  # what the config step wrote before
    return lay


def tree(root: Path) -> dict[str, bytes]:
    return {str(p): p.read_bytes() for p in root.rglob("*") if p.is_file()}


# ---------------------------------------------------------------- the flags

@pytest.mark.parametrize("flags, words", [
    (RoleFlags(role="worker"), ["--role worker needs --head"]),
    (RoleFlags(role="head"), ["--role head needs --worker"]),
    (RoleFlags(role="head", head="10.100.0.2"), ["--role head takes --worker", "not --head"]),
    (RoleFlags(role="worker", worker="10.100.0.1"), ["--role worker takes --head"]),
    (RoleFlags(head="10.100.0.1"), ["--head needs --role"]),
    (RoleFlags(address="10.100.0.2"), ["--address needs --role"]),
    (RoleFlags(role="boss", head="10.100.0.1"), ["--role 'boss'", "head, worker or single"]),
    (RoleFlags(role="worker", head="spark-1"), ["--head 'spark-1' is not an IP address"]),
    (RoleFlags(role="worker", head="127.0.0.1"), ["cannot be the head's address"]),
    (RoleFlags(role="worker", head="10.100.0.1", address="10.100.0.1"), ["both 10.100.0.1"]),
    (RoleFlags(role="worker", head="10.100.0.1", interface="a b"), ["--cluster-ifname 'a b'"]),
    (RoleFlags(role="worker", head="10.100.0.1", master_port="70000"), ["--master-port '70000'"]),
    (RoleFlags(role="single", worker="10.100.0.2"), ["--role single takes no --worker"]),
])
def test_bad_role_flags_are_one_line_exit_2_and_write_nothing(lay, src, flags, words):
    before = tree(lay.root)
    with pytest.raises(InstallError) as e:
        cluster.place(lay, src, flags, cpu=False, addr_json=ADDRS)
    msg = str(e.value)
    assert e.value.exit_code == 2 and "\n" not in msg and all(w in msg for w in words), msg
    assert tree(lay.root) == before


def test_this_nodes_address_and_interface_come_from_the_peers_network():
    c = cluster.resolve(WORKER, ADDRS)
    assert c == Cluster("worker", "10.100.0.2", "10.100.0.1", "enp1s0f0np0", 29501)
    given = cluster.resolve(RoleFlags(role="head", worker="10.100.0.9", address="192.168.1.20",
                                      interface="enP7s7", master_port="29600"), ADDRS)
    assert (given.address, given.interface, given.master_port) == ("192.168.1.20", "enP7s7", 29600)


@pytest.mark.parametrize("flags, words", [
    (RoleFlags(role="worker", head="10.200.0.1"), ["no address of this machine is on 10.200.0.1's network"]),
    (RoleFlags(role="worker", head="10.100.0.1", address="10.100.0.5"), ["--address 10.100.0.5 is not an address"]),
    (RoleFlags(role="worker", head="10.100.0.1", interface="eth9"), ["--cluster-ifname eth9", "no such interface"]),
])
def test_an_address_this_machine_lacks_is_exit_28(flags, words):
    with pytest.raises(InstallError) as e:
        cluster.resolve(flags, ADDRS)
    assert e.value.exit_code == EXIT_LAN and all(w in str(e.value) for w in words), str(e.value)


def test_a_master_port_that_is_a_service_port_is_refused(lay, src):
    with pytest.raises(InstallError, match="--master-port 8101 is engine.port or admin.port") as e:
        cluster.place(lay, src, RoleFlags(role="worker", head="10.100.0.1", master_port="8101"),
                      cpu=False, addr_json=ADDRS)
    assert e.value.exit_code == 2


# ---------------------------------------------------------------- the config it writes

def test_worker_setting_written_whole_rerun_is_a_no_op_single_takes_it_back(lay, src):
    from gptoss_spark.service.config import Settings

    original = lay.config_file.read_text()
    dry = cluster.place(lay, src, WORKER, cpu=False, addr_json=ADDRS, dry_run=True)
    assert dry.action == "would-replace" and lay.config_file.read_text() == original

    assert cluster.place(lay, src, WORKER, cpu=False, addr_json=ADDRS).action == "replaced"
    data = tomllib.loads(lay.config_file.read_text())
    assert data["cluster"] == {"role": "worker", "address": "10.100.0.2", "peer": "10.100.0.1",
                               "interface": "enp1s0f0np0", "master_port": 29501}
    assert data["admin"]["host"] == "10.100.0.2" and data["default_profile"] == "cluster"
    s = Settings.model_validate(data)  # the service takes what the installer wrote
    assert s.peer_admin_url == "http://10.100.0.1:8101" and s.cluster.master_addr == "10.100.0.1"
    assert (lay.config_file.parent / "gptoss-spark.toml.old").read_text() == original
    assert "# Profile used when none has been chosen yet" in lay.config_file.read_text()  # comments kept

    before = tree(lay.root)
    stat_before = lay.config_file.stat().st_mtime_ns
    assert cluster.place(lay, src, WORKER, cpu=False, addr_json=ADDRS).action == "unchanged"
    assert cluster.place(lay, src, RoleFlags(), cpu=False, addr_json=ADDRS) is None  # no role flag: kept
    assert tree(lay.root) == before and lay.config_file.stat().st_mtime_ns == stat_before
    assert cluster.installed(lay) == cluster.resolve(WORKER, ADDRS)

    assert cluster.place(lay, src, RoleFlags(role="single"), cpu=False).action == "replaced"
    back = tomllib.loads(lay.config_file.read_text())
    assert "cluster" not in back and back["admin"]["host"] == "127.0.0.1" and back["default_profile"] == "plain"
    assert back == tomllib.loads(original)
    assert cluster.place(lay, src, RoleFlags(role="single"), cpu=False).action == "unchanged"


def test_switching_role_rewrites_the_section_and_keeps_the_owners_other_keys(lay, src):
    cluster.place(lay, src, WORKER, cpu=False, addr_json=ADDRS)
    text = lay.config_file.read_text()
    alerts = text[text.index("[alerts]"):text.index("[cluster]")]  # [cluster] in the middle, as a person may put it
    lay.config_file.write_text(text.replace(alerts, "") + "peer_admin_port = 9101\n\n" + alerts)
    had = tomllib.loads(text)["alerts"]
    head_addrs = ADDRS.replace("10.100.0.2", "10.100.0.1")
    cluster.place(lay, src, RoleFlags(role="head", worker="10.100.0.2"), cpu=False, addr_json=head_addrs)
    data = tomllib.loads(lay.config_file.read_text())
    assert data["cluster"]["role"] == "head" and data["cluster"]["peer"] == "10.100.0.2"
    assert data["cluster"]["peer_admin_port"] == 9101 and data["alerts"] == had
    assert lay.config_file.read_text().count("[cluster]") == 1


def test_an_admin_api_on_a_wildcard_stays_there(lay, src):
    lay.config_file.write_text(lay.config_file.read_text().replace('[admin]\nhost = "127.0.0.1"', '[admin]\nhost = "0.0.0.0"'))
    cluster.place(lay, src, WORKER, cpu=False, addr_json=ADDRS)
    assert tomllib.loads(lay.config_file.read_text())["admin"]["host"] == "0.0.0.0"
    cluster.place(lay, src, RoleFlags(role="single"), cpu=False)
    assert tomllib.loads(lay.config_file.read_text())["admin"]["host"] == "0.0.0.0"


def test_cpu_install_uses_the_demo_cluster_profile_and_goes_back_to_demo(tmp_path, src):
    lay = Layout(root=tmp_path / "cpu")
    placement.place_config(lay, src, cpu=True)
    cluster.place(lay, src, WORKER, cpu=True, addr_json=ADDRS)
    assert tomllib.loads(lay.config_file.read_text())["default_profile"] == "demo-cluster"
    cluster.place(lay, src, RoleFlags(role="single"), cpu=True)
    assert tomllib.loads(lay.config_file.read_text())["default_profile"] == "demo"


def test_cluster_step_through_the_installers_entry(lay, src, monkeypatch, capsys):
    monkeypatch.setattr(cluster, "_addresses", lambda: ADDRS)
    root = ["--root", str(lay.root), "--source", str(src)]
    assert main(["cluster", "--check", *root, "--role", "head", "--head", "10.100.0.2"]) == 2
    assert "--role head takes --worker" in capsys.readouterr().err
    assert main(["cluster", *root, "--role", "worker", "--head", "10.100.0.1", "--dry-run"]) == 0
    assert capsys.readouterr().out == "changed\n" and cluster.installed(lay) is None
    assert main(["cluster", *root, "--role", "worker", "--head", "10.100.0.1"]) == 0
    assert main(["cluster", *root, "--role", "worker", "--head", "10.100.0.1"]) == 0
    assert capsys.readouterr().out == "changed\nunchanged\n"
    assert main(["cluster-role", "--root", str(lay.root)]) == 0
    assert capsys.readouterr().out == "worker\n"


# ---------------------------------------------------------------- the peer preflight

TOKEN = "t" * 32


@pytest.fixture
def admin_node(tmp_path):
    """The real admin app of a cluster worker's supervisor (no engine), on a free 127.0.0.1 port."""
    import uvicorn

    from gptoss_spark.admin import create_app
    from gptoss_spark.service.config import Settings
    from gptoss_spark.service.memory import GIB, MemoryReading
    from gptoss_spark.service.supervisor import Supervisor

    class Plenty:
        def read(self):
            return MemoryReading(available_bytes=100 * GIB, total_bytes=128 * GIB, psi_some_avg10=None)

    def serve(role: str | None):
        token_file = tmp_path / f"{role}.token"
        token_file.write_text(TOKEN + "\n")
        token_file.chmod(0o640)
        data = {"model": {"dir": str(tmp_path)}, "admin": {"host": "0.0.0.0", "token_file": str(token_file)},
                "paths": {"state_dir": str(tmp_path / f"state-{role}"), "profile_dirs": [str(REPO / "etc" / "profiles")]}}
        if role:
            data["cluster"] = {"role": role, "address": "10.100.0.2", "peer": "10.100.0.1", "interface": "eth1"}
        settings = Settings.model_validate(data)
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        server = uvicorn.Server(uvicorn.Config(create_app(Supervisor(settings, memory_source=Plenty()), settings),
                                               log_level="error", lifespan="off"))
        thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
        thread.start()
        while not server.started:
            time.sleep(0.01)
        started.append((server, thread))
        return f"http://127.0.0.1:{sock.getsockname()[1]}"

    started: list = []
    yield serve
    for server, thread in started:
        server.should_exit = True
        thread.join(10)


HEAD_NODE = Cluster("head", "10.100.0.1", "10.100.0.2", "eth1")
WORKER_NODE = Cluster("worker", "10.100.0.2", "10.100.0.1", "eth1")


def here_venv() -> str:
    from gptoss_spark.service.cluster import venv_name

    return venv_name()  # what the real supervisor reports


def check(c: Cluster, url: str, venv: str | None = None, token: str | None = TOKEN) -> Check:
    return peer.check_peer(c, url, venv_id=venv or here_venv(), token=token,
                           token_path="/etc/gptoss-spark/admin.token", timeout=2)


def test_the_head_pairs_with_a_worker_on_the_same_venv_and_token(admin_node):
    url = admin_node("worker")
    ok = check(HEAD_NODE, url)
    assert ok.ok and not ok.warning and "same venv" in ok.message, ok


def test_the_head_refuses_a_worker_on_another_venv(admin_node):
    c = check(HEAD_NODE, admin_node("worker"), venv="0.2.0-spark-111111111111")
    assert not c.ok and c.exit_code == EXIT_PEER
    assert f"runs venv {here_venv()}, this install builds 0.2.0-spark-111111111111" in c.message


@pytest.mark.parametrize("token, words", [
    ("w" * 32, ["does not take this node's admin token (HTTP 403)", "copy one node's"]),
    (None, ["this node has no admin token yet", "copy the worker's /etc/gptoss-spark/admin.token"]),
])
def test_the_head_refuses_a_worker_with_another_token(admin_node, token, words):
    c = check(HEAD_NODE, admin_node("worker"), token=token)
    assert not c.ok and c.exit_code == EXIT_PEER and all(w in c.message for w in words), c.message


def test_two_nodes_in_one_role_and_a_node_without_cluster(admin_node):
    head = admin_node("head")
    same = check(HEAD_NODE, head)
    assert not same.ok and "is a cluster head, like this node" in same.message
    single = admin_node(None)
    c = check(HEAD_NODE, single)
    assert not c.ok and "has no [cluster] setting" in c.message and "--role worker --head 10.100.0.1" in c.message
    w = check(WORKER_NODE, single)  # the head's own install comes next and sets it
    assert w.ok and w.warning


def test_the_worker_goes_first_so_a_head_on_another_venv_is_a_warning(admin_node):
    c = check(WORKER_NODE, admin_node("head"), venv="0.2.0-spark-111111111111")
    assert c.ok and c.warning and "upgrade the head next" in c.message


@pytest.fixture
def silent_port():
    """A port that takes connections and never answers (a hung peer)."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(8)
    yield s.getsockname()[1]
    s.close()


def test_a_peer_that_does_not_answer_fails_the_head_and_is_a_note_on_the_worker(silent_port):
    url = f"http://127.0.0.1:{silent_port}"
    h = peer.check_peer(HEAD_NODE, url, venv_id="v", token=TOKEN, token_path="/t", timeout=0.3)
    assert not h.ok and h.exit_code == EXIT_PEER
    assert "does not answer within 0.3 s" in h.message and "install the worker first" in h.message
    assert "sudo ./install.sh --role worker --head 10.100.0.1" in h.message
    w = peer.check_peer(WORKER_NODE, url, venv_id="v", token=None, token_path="/t", timeout=0.3)
    assert w.ok and w.warning and "install it next (sudo ./install.sh --role head --worker 10.100.0.2)" in w.message


def test_preflight_asks_no_peer_on_one_node_and_the_configured_one_on_a_cluster(lay, src, monkeypatch):
    import argparse

    from gptoss_spark.install import cli

    seen = []
    monkeypatch.setattr(cli, "_venv_id", lambda args: "0.1.0-cpu-aaaaaaaaaaaa")
    monkeypatch.setattr(peer, "check_peer", lambda c, url, **kw: seen.append((c, url, kw)) or Check("peer", True, ""))
    args = argparse.Namespace(root=str(lay.root), role=None, head=None, worker=None, address=None,
                              cluster_ifname=None, master_port=None)
    assert "no peer to ask" in cli._peer_check(args, lay).message and not seen
    cluster.place(lay, src, RoleFlags(role="head", worker="10.100.0.2"), cpu=False,
                  addr_json=ADDRS.replace("10.100.0.2", "10.100.0.1"))
    (lay.token_file).write_text(TOKEN + "\n")
    cli._peer_check(args, lay)
    c, url, kw = seen[0]
    assert c.role == "head" and url == "http://10.100.0.2:8101"
    assert kw["venv_id"] == "0.1.0-cpu-aaaaaaaaaaaa" and kw["token"] == TOKEN


def test_worker_up_waits_for_its_supervisor_and_stops_at_a_failed_unit():
    answers = iter(["ConnectionRefusedError: refused",
                    (200, json.dumps({"role": "worker", "state": "starting", "venv": "v1"}).encode())])
    ok, line = peer.wait_worker_up("http://10.100.0.2:8101", timeout=60, request=lambda r, t: next(answers),
                                   unit_state=lambda: "activating", sleep=lambda s: None)
    assert ok and "state starting (waits for the head's order to join), venv v1" in line
    ok, line = peer.wait_worker_up("http://10.100.0.2:8101", timeout=60, request=lambda r, t: "refused",
                                   unit_state=lambda: "failed", sleep=lambda s: None)
    assert not ok and line.startswith("gptoss-spark is failed")
    clock = iter(range(0, 1000, 30))
    ok, line = peer.wait_worker_up("http://x:1", timeout=60, request=lambda r, t: (404, b"{}"),
                                   unit_state=lambda: "activating", sleep=lambda s: None, clock=lambda: next(clock))
    assert not ok and "did not answer at http://x:1 within 60 s (http://x:1/admin/cluster answered HTTP 404)" in line


# ---------------------------------------------------------------- install.sh itself

@pytest.mark.parametrize("argv, words", [
    (["--role", "worker"], "--role worker needs --head"),
    (["--role", "head", "--head", "10.100.0.1"], "--role head takes --worker"),
    (["--role", "worker", "--head", "not-an-address"], "is not an IP address"),
    (["--role"], "--role needs a value"),
    (["--rollback", "--role", "single"], "--role goes with an install, not --rollback"),
])
def test_install_sh_refuses_bad_role_flags_before_anything(argv, words, tmp_path):
    import subprocess
    import sys

    env = {**os.environ, "GPTOSS_SPARK_PYTHON": sys.executable}
    r = subprocess.run(["bash", str(REPO / "install.sh"), *argv], capture_output=True, text=True, env=env,
                       cwd=tmp_path, timeout=60)
    assert r.returncode == 2 and words in r.stderr, (r.returncode, r.stderr)
    assert r.stdout == "" and len(r.stderr.strip().splitlines()) == 1
    assert not list(tmp_path.iterdir())
