"""Two-node settings: [cluster] validation, each role's engine argv/env, cluster profiles, the worker checks."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from gptoss_spark.service import cluster
from gptoss_spark.service.config import Settings, load_settings
from gptoss_spark.service.engine import build_argv, build_env
from gptoss_spark.base.errors import ConfigError, RequirementError
from gptoss_spark.service.headless import JOIN_RE, LAUNCHER
from gptoss_spark.service.profiles import load_profiles

REPO = Path(__file__).resolve().parents[2]
HEAD = {"role": "head", "address": "10.0.0.1", "peer": "10.0.0.2", "interface": "enp1s0f0np0"}
WORKER = {**HEAD, "role": "worker", "address": "10.0.0.2", "peer": "10.0.0.1"}


def settings(tmp_path: Path, c: dict | None, admin_host: str = "0.0.0.0", **top) -> Settings:
    (tmp_path / "config.json").write_text("{}")
    data = {"model": {"dir": str(tmp_path)}, "admin": {"host": admin_host},
            "paths": {"state_dir": str(tmp_path / "state"),
                      "profile_dirs": [str(REPO / "etc" / "profiles"), str(REPO / "etc" / "profiles-cpu")]},
            **top}
    if c is not None:
        data["cluster"] = c
    return Settings.model_validate(data)


def load(tmp_path: Path, text: str) -> Settings:
    path = tmp_path / "gs.toml"
    path.write_text(text)
    return load_settings(path)


@pytest.mark.parametrize("body, words", [
    ('role = "boss"\naddress = "10.0.0.1"\npeer = "10.0.0.2"\ninterface = "eth1"', ["cluster.role", "head", "worker"]),
    ('role = "head"\naddress = "10.0.0.1"\npeer = "10.0.0.1"\ninterface = "eth1"', ["both 10.0.0.1"]),
    ('role = "head"\naddress = "ten"\npeer = "10.0.0.2"\ninterface = "eth1"', ["cluster.address"]),
    ('role = "head"\naddress = "10.0.0.1"\npeer = "10.0.0.2"\ninterface = "eth1"\nnodes = 3', ["cluster.nodes", "unknown key"]),
    ('role = "head"\naddress = "10.0.0.1"\npeer = "10.0.0.2"', ["cluster.interface", "missing"]),
    ('role = "head"\naddress = "10.0.0.1"\npeer = "10.0.0.2"\ninterface = "eth1"\nmaster_port = 8101', ["master_port"]),
])
def test_bad_cluster_settings_end_in_one_line(tmp_path, body, words):
    with pytest.raises(ConfigError) as e:
        load(tmp_path, f'[admin]\nhost = "0.0.0.0"\n[cluster]\n{body}\n')
    msg = str(e.value)
    assert "\n" not in msg and all(w in msg for w in words), msg


def test_the_peer_must_reach_the_admin_api(tmp_path):
    with pytest.raises(ConfigError) as e:
        load(tmp_path, '[cluster]\nrole = "head"\naddress = "10.0.0.1"\npeer = "10.0.0.2"\ninterface = "eth1"\n')
    assert "admin.host" in str(e.value) and "10.0.0.1" in str(e.value)


def test_head_argv_is_rank_0_with_the_api_server(tmp_path):
    s = settings(tmp_path, HEAD)
    argv = build_argv(s, load_profiles(s)["cluster"])
    assert argv[1:3] == ["-m", "vllm.entrypoints.openai.api_server"] and "--port" in argv
    tail = argv[argv.index("--nnodes"):]
    assert tail == ["--nnodes", "2", "--node-rank", "0", "--master-addr", "10.0.0.1", "--master-port", "29501"]
    assert argv[argv.index("--tensor-parallel-size") + 1] == "2"
    env = build_env(s, load_profiles(s)["cluster"], tmp_path, base={})
    assert env["GLOO_SOCKET_IFNAME"] == env["NCCL_SOCKET_IFNAME"] == "enp1s0f0np0"
    assert env["VLLM_HOST_IP"] == "10.0.0.1"


def test_worker_argv_is_rank_1_headless_with_the_heads_master_address(tmp_path):
    s = settings(tmp_path, {**WORKER, "master_port": 29600})
    argv = build_argv(s, load_profiles(s)["demo-cluster"])
    assert argv[1:3] == ["-c", LAUNCHER]
    assert "--host" not in argv and "--port" not in argv  # no API server on the worker
    tail = argv[argv.index("--nnodes"):]
    assert tail == ["--nnodes", "2", "--node-rank", "1", "--master-addr", "10.0.0.1", "--master-port", "29600",
                    "--headless"]
    assert build_env(s, load_profiles(s)["demo-cluster"], tmp_path, base={})["VLLM_HOST_IP"] == "10.0.0.2"


def test_single_node_argv_has_no_cluster_flags(tmp_path):
    s = settings(tmp_path, None, admin_host="127.0.0.1")
    argv = build_argv(s, load_profiles(s)["demo"])
    assert "--nnodes" not in argv and "--headless" not in argv
    assert "GLOO_SOCKET_IFNAME" not in build_env(s, load_profiles(s)["demo"], tmp_path, base={})


def test_profiles_run_either_on_one_node_or_on_the_cluster(tmp_path):
    one = settings(tmp_path, None, admin_host="127.0.0.1")
    two = settings(tmp_path, HEAD)
    profiles = load_profiles(two)
    assert profiles["cluster"].needs_cluster and profiles["demo-cluster"].needs_cluster
    assert not profiles["plain"].needs_cluster
    with pytest.raises(RequirementError, match=r"no \[cluster\] section"):
        profiles["demo-cluster"].check_requirements(one)
    with pytest.raises(RequirementError, match=r"runs on one node .* sets \[cluster\]"):
        profiles["demo"].check_requirements(two)
    profiles["demo-cluster"].check_requirements(two)


def test_the_cluster_profile_is_plain_at_tensor_parallel_2_with_half_the_weights(tmp_path):
    p = load_profiles(settings(tmp_path, HEAD))
    cluster_args, plain_args = list(p["cluster"].args), list(p["plain"].args)
    assert p["cluster"].extends == "plain"
    assert cluster_args[cluster_args.index("--tensor-parallel-size") + 1] == "2"
    assert cluster_args[cluster_args.index("--distributed-executor-backend") + 1] == "mp"
    assert cluster_args[cluster_args.index("--moe-backend") + 1] == plain_args[plain_args.index("--moe-backend") + 1]
    assert p["cluster"].memory_gib < p["plain"].memory_gib


def test_a_profile_may_not_set_the_cluster_flags(tmp_path):
    d = tmp_path / "p"
    d.mkdir()
    (d / "x.toml").write_text('description = "x"\n[engine]\nargs = ["--node-rank", "1"]\n')
    s = Settings.model_validate({"paths": {"profile_dirs": [str(d)]}})
    with pytest.raises(ConfigError, match="cluster.role"):
        load_profiles(s)


def test_join_line_is_what_the_pinned_vllm_logs():
    # JOIN_RE is the worker's readiness: if vLLM rewords the line, this fails before a cluster hangs.
    spec = importlib.util.find_spec("vllm")
    if spec is None or spec.origin is None:
        pytest.skip("vLLM is not installed here")
    source = (Path(spec.origin).parent / "distributed" / "parallel_state.py").read_text()
    assert '"rank %s in world size %s is assigned as "' in source
    assert JOIN_RE.search("(Worker pid=1) INFO [parallel_state.py:2350] rank 1 in world size 2 is assigned as DP rank 0")


def test_worker_faults_as_the_head_reads_them():
    view = {"role": "worker", "generation": "a" * 12, "joined": True, "error": None}
    assert cluster.worker_fault(view, "a" * 12, loading=False) is None
    assert cluster.worker_joined(view, "a" * 12)
    # An older generation: not yet ordered while loading, a lost worker once serving.
    assert cluster.worker_fault(view, "b" * 12, loading=True) is None
    assert "not bbbb" in cluster.worker_fault(view, "b" * 12, loading=False)
    assert not cluster.worker_joined(view, "b" * 12)
    assert "exited" in cluster.worker_fault({**view, "error": "engine exited 1"}, "a" * 12, loading=True)
    assert cluster.worker_fault("worker admin API does not answer", "a" * 12, loading=True).startswith("worker")


def test_a_saved_profile_that_no_longer_fits_the_cluster_setting_gives_way_to_the_default(tmp_path):
    from gptoss_spark.service.store import PersistedState, StateStore
    from gptoss_spark.service.supervisor import Rejected, Supervisor

    one = settings(tmp_path, None, admin_host="127.0.0.1", default_profile="demo")
    StateStore(one.state_file).save(PersistedState(active_profile="demo-cluster", last_good_profile="demo-cluster"))
    assert Supervisor(one).initial_profile() == "demo"  # back to one node: not the saved cluster profile
    two = settings(tmp_path, WORKER, default_profile="demo-cluster")
    StateStore(two.state_file).save(PersistedState(active_profile="demo", last_good_profile="demo"))
    worker = Supervisor(two)
    assert worker.initial_profile() == "demo-cluster"
    StateStore(two.state_file).save(PersistedState(active_profile="demo-cluster", last_good_profile="demo-cluster"))
    assert worker.initial_profile() == "demo-cluster"
    with pytest.raises(Rejected) as e:  # the worker's admin API is read-only: the head drives both
        worker.request_switch("demo-cluster")
    assert e.value.code == "worker" and "http://10.0.0.1:8101" in str(e.value)


def test_head_faults_as_the_worker_reads_them():
    head = {"role": "head", "generation": "a" * 12}
    assert cluster.head_fault(head, "a" * 12) is None
    assert "runs generation aaaa" in cluster.head_fault(head, "b" * 12)
    assert cluster.head_fault("head admin API does not answer", "a" * 12) == "head admin API does not answer"


@pytest.fixture
def peer_server():
    """A stand-in for the other node's admin API: GET /admin/cluster answers `view` (set by the test)."""
    import json
    import threading
    from http.server import BaseHTTPRequestHandler, HTTPServer

    state = {"view": {}}

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            body = json.dumps(state["view"]).encode()
            self.send_response(200 if self.path == "/admin/cluster" else 404)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_address[1], state
    server.shutdown()


def test_check_finds_the_peer_in_its_role_on_the_same_venv(tmp_path, peer_server):
    import asyncio

    port, state = peer_server
    s = settings(tmp_path, {**HEAD, "peer": "127.0.0.1", "peer_admin_port": port})
    state["view"] = {"role": "worker", "venv": cluster.venv_name(), "state": "starting"}
    assert "same venv" in asyncio.run(cluster.check_peer(s))
    state["view"] = {"role": "worker", "venv": "0.1.0-spark-000000000000", "state": "ready"}
    with pytest.raises(RequirementError, match="runs venv 0.1.0-spark-000000000000.*same version"):
        asyncio.run(cluster.check_peer(s))
    state["view"] = {"role": "head", "venv": cluster.venv_name()}
    with pytest.raises(RequirementError, match='role = \\\\"worker\\\\"|role = "worker"'):
        asyncio.run(cluster.check_peer(s))
    gone = settings(tmp_path, {**HEAD, "peer": "127.0.0.1", "peer_admin_port": 1})
    assert asyncio.run(cluster.check_peer(gone, timeout=2)).startswith("note: worker admin API")


def test_vllms_parser_takes_each_roles_argv(tmp_path):
    # What `gptoss-spark check` runs on each node: vLLM's own parser on the argv the engine would get.
    import asyncio

    from gptoss_spark.service.argcheck import split_engine_argv, vllm_rejects

    if importlib.util.find_spec("vllm") is None:
        pytest.skip("vLLM is not installed here")
    for c in (HEAD, WORKER):
        s = settings(tmp_path, c)
        python, args = split_engine_argv(build_argv(s, load_profiles(s)["demo-cluster"]))
        assert ("--headless" in args) == (c["role"] == "worker")
        assert asyncio.run(vllm_rejects(python, args)) is None
