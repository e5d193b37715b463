"""The real engine on a GPU: `gptoss-spark serve` with a profile's own argv and environment, on the
real-shape checkpoint, with what the start did and what the engine answered recorded.

    python benchmarks/gpu_engine/run_engine.py --model DIR --profiles fast-hopper --warm --out OUT

DIR is a checkpoint from `gptoss-spark shaped-model` (gpt-oss-120b's shapes, a few layers, random
weights). The profiles are read from etc/profiles and benchmarks/gpu_engine/profiles (the Hopper
variants: plain's FlashInfer CUTLASS MoE runs on sm_12x/sm_100 only). For each profile, with empty
caches (--warm: then once more with the caches that start left):
  start    the supervisor's start record (phases adding up to ready, what compiled) and the engine
           log's lines that say which kernels it chose: the plugin's "experts repacked", the MoE and
           attention backends, the CUDA-graph capture sizes;
  answers  greedy completions twice (equal?), a greedy chat through harmony, a seeded sampled
           completion, and a JSON-schema structured completion (parses?);
  speed    `gptoss-spark bench` (single stream) and `gptoss-spark loadtest --users 32`, completions
           with ignore_eos. The checkpoint has 2 of 36 layers, so these are plumbing numbers, not a
           projection of the real model's.
Each profile's record goes to OUT/<profile>.json and the engine log's tail to OUT/<profile>.log.
The venv that runs this script is the one the engine runs from (it must hold CUDA vLLM 0.32.0,
patched, and this package).
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from benchmarks.serve_harness import Serve, free_port  # noqa: E402
from tests.helpers.demo_settings import demo_settings_toml  # noqa: E402

PROFILE_DIRS = [REPO / "etc" / "profiles", Path(__file__).resolve().parent / "profiles"]
# Engine log lines worth keeping in the record: what was chosen, built and captured.
LOG_FACTS = re.compile(
    r"experts repacked|gptoss-spark|MoE backend|moe backend|[Aa]ttention backend|Using .*backend|"
    r"[Cc]apturing CUDA graph|cudagraph_capture_sizes|Graph capturing finished|torch\.compile|"
    r"Compil|JIT|Marlin|marlin|Loading weights took|Model loading took|KV cache|Traceback|Error|error:")
LOG_TAIL_BYTES = 4_000_000


def write_config(tmp: Path, model: Path, profile: str, profile_dirs: list[Path]) -> tuple[Path, int, int, str]:
    token = "gpu-engine-" + "t" * 40
    (tmp / "admin.token").write_text(token + "\n")
    admin, engine = free_port(), free_port()
    cfg = tmp / "gs.toml"
    cfg.write_text(demo_settings_toml(
        model_dir=model, state_dir=tmp / "state", profile_dirs=profile_dirs, token_file=tmp / "admin.token",
        engine_port=engine, admin_port=admin, default_profile=profile,
        engine={"cpu_affinity": None},  # a GPU engine gets every core (torch.compile, Triton builds)
        timeouts={"load": 1800, "canary": 120, "probe_interval": None}))
    return cfg, admin, engine, token


def post(client: httpx.Client, path: str, body: dict) -> dict:
    r = client.post(path, json=body)
    out: dict = {"status": r.status_code}
    try:
        data = r.json()
    except ValueError:
        return out | {"body": r.text[:500]}
    if r.status_code != 200:
        return out | {"body": data}
    choice = data["choices"][0]
    text = choice.get("text") if "text" in choice else choice.get("message", {})
    return out | {"output": text, "finish_reason": choice.get("finish_reason"), "usage": data.get("usage")}


def answers(base: str) -> dict:
    """The requests a client sends, recorded as answered; the weights are random, so only the
    plumbing is judged: greedy is repeatable, structured output parses."""
    out = {}
    with httpx.Client(base_url=base, timeout=300) as c:
        greedy = {"model": "gptoss", "prompt": "The capital of France is", "max_tokens": 32, "temperature": 0}
        out["greedy"] = [post(c, "/completions", greedy) for _ in range(2)]
        out["greedy_repeatable"] = out["greedy"][0].get("output") == out["greedy"][1].get("output")
        out["chat_greedy"] = post(c, "/chat/completions", {
            "model": "gptoss", "messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 64,
            "temperature": 0})
        out["sampled"] = post(c, "/completions", {**greedy, "temperature": 1.0, "seed": 7})
        schema = {"type": "object", "properties": {"answer": {"enum": ["yes", "no"]}}, "required": ["answer"],
                  "additionalProperties": False}
        out["structured"] = post(c, "/completions", {
            "model": "gptoss", "prompt": "Answer yes or no in JSON:", "max_tokens": 64, "temperature": 0,
            # No free whitespace: a random model would otherwise fill the 64 tokens with it.
            "structured_outputs": {"json": schema, "disable_any_whitespace": True}})
        try:
            out["structured_parses"] = json.loads(out["structured"].get("output") or "").get("answer") in ("yes", "no")
        except (ValueError, AttributeError):
            out["structured_parses"] = False
    return out


def speed(base: str, admin: int, tmp: Path) -> dict:
    """The product's own benchmarks, against the engine at base."""
    out = {}
    common = ["--url", base, "--admin-url", f"http://127.0.0.1:{admin}", "--endpoint", "completions",
              "--ignore-eos", "--max-tokens", "256", "--no-progress", "--json"]
    for name, extra in (("single", ["bench", "--requests", "3"]), ("users32", ["loadtest", "--users", "32"])):
        res = tmp / f"{name}.json"
        p = subprocess.run([sys.executable, "-m", "gptoss_spark.cli", *extra, *common, "--out", str(res)],
                           capture_output=True, text=True, timeout=900)
        out[name] = json.loads(res.read_text()) if res.is_file() else {"rc": p.returncode, "stderr": p.stderr[-2000:]}
    return out


def log_facts(log: Path) -> list[str]:
    seen, facts = set(), []
    for line in log.read_text(errors="replace").splitlines():
        if LOG_FACTS.search(line):
            key = re.sub(r"^\S+\s+\S+\s+", "", line)[:300]
            if key not in seen:
                seen.add(key)
                facts.append(line[:400])
    return facts[:400]


def run_profile(model: Path, profile: str, warm: bool, out_dir: Path, profile_dirs: list[Path]) -> dict:
    record: dict = {"profile": profile, "starts": []}
    with tempfile.TemporaryDirectory(prefix="gpu-engine-", dir="/tmp") as d:
        tmp = Path(d)
        cfg, admin, engine, token = write_config(tmp, model, profile, profile_dirs)
        log = tmp / "serve.log"
        serve = Serve(cfg, admin, token, log)
        try:
            for what in ("cold", "warm") if warm else ("cold",):
                t0 = time.monotonic()
                try:
                    took = serve.start()
                except SystemExit as e:
                    record["starts"].append({"what": what, "failed": str(e), "after_s": round(time.monotonic() - t0, 1)})
                    break
                status = serve.status()
                record["starts"].append({"what": what, "seconds": round(took, 1), "start": status["start"]["last"],
                                         "active_profile": status.get("profile")})
                if what == "cold":
                    base = f"http://127.0.0.1:{engine}"
                    record["answers"] = answers(base + "/v1")
                    record["speed"] = speed(base, admin, tmp)
                serve.stop()
        finally:
            serve.stop()
            record["log_facts"] = log_facts(log) if log.exists() else []
            data = log.read_bytes() if log.exists() else b""
            (out_dir / f"{profile}.log").write_bytes(data[-LOG_TAIL_BYTES:])
    return record


def environment() -> dict:
    import torch

    env = {"python": sys.version.split()[0], "torch": torch.__version__, "cuda": torch.version.cuda}
    if torch.cuda.is_available():
        env["gpu"] = torch.cuda.get_device_name(0)
        env["capability"] = ".".join(map(str, torch.cuda.get_device_capability(0)))
    for mod in ("vllm", "triton", "flashinfer"):
        try:
            env[mod] = __import__(mod).__version__
        except Exception as e:  # noqa: BLE001 - recorded, not fatal: the start shows what it costs
            env[mod] = f"unavailable: {e}"
    env["driver"] = shutil.which("nvidia-smi") and subprocess.run(
        ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"], capture_output=True, text=True).stdout.strip()
    return env


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", type=Path, required=True, help="checkpoint directory (gptoss-spark shaped-model)")
    ap.add_argument("--profiles", default="fast-hopper,plain-hopper,plain-hopper-eager")
    ap.add_argument("--warm", action="store_true", help="start each profile a second time, caches warm")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--profile-dir", type=Path, action="append", dest="profile_dirs",
                    help="where the profiles are (default: etc/profiles and this folder's profiles/)")
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    env = environment()
    print(json.dumps(env), flush=True)
    for profile in a.profiles.split(","):
        t0 = time.monotonic()
        rec = run_profile(a.model.resolve(), profile, a.warm, a.out, a.profile_dirs or PROFILE_DIRS) | {
            "environment": env, "date": time.strftime("%Y-%m-%d"),
            "command": " ".join(["benchmarks/gpu_engine/run_engine.py", *sys.argv[1:]])}
        rec["wall_s"] = round(time.monotonic() - t0, 1)
        (a.out / f"{profile}.json").write_text(json.dumps(rec, indent=1) + "\n")
        starts = ", ".join(f"{s['what']} {s.get('seconds', 'FAILED')} s" for s in rec["starts"])
        print(f"{profile}: {starts}; answers: greedy repeatable={rec.get('answers', {}).get('greedy_repeatable')} "
              f"structured parses={rec.get('answers', {}).get('structured_parses')}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
