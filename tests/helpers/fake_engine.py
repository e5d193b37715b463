"""Stand-in engine for faults a real vLLM cannot show on demand (docs/TESTING.md: only those).

Speaks just enough of vLLM's HTTP surface: /health, /metrics, /v1/completions.
Behaviour comes from FAKE_ENGINE_MODE (comma-separated):
  load=SECONDS        answer /health 503 for this long after start (slow load)
  crash_on_load       exit 1 while still loading (after load/2 seconds)
  vllm_init_failure   with crash_on_load: print what vLLM prints when its EngineCore cannot start
                      (its ValueError, then the API server's wrapper, whose list of failed processes
                      is `{}` on one start and `{'EngineCore': 1}` on the next: $FAKE_ENGINE_MARKER)
  crash_after=SECONDS exit 1 this long after the first completion (the supervisor's canary)
  crash_once          with crash_after: only if the file $FAKE_ENGINE_MARKER does not exist yet (creates it)
  wedge               /health 200 but completions never answer (and tokens never move)
  wedge_after=N       serve N completions normally, then wedge
  ignore_sigterm      ignore SIGTERM (the supervisor must SIGKILL the group)
  child               fork a child into the same session that ignores SIGTERM (tree sweep)
  stuck_running       /metrics always reports one running request (stall detection)
Args: --port P (everything else is ignored, so it can take a profile's vLLM args).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

MODES = dict((m.split("=", 1) + [""])[:2] for m in os.environ.get("FAKE_ENGINE_MODE", "").split(",") if m)
START = time.monotonic()
LOAD = float(MODES.get("load", "0.3") or 0.3)
state = {"completions": 0, "tokens": 0, "running": 0}


def healthy() -> bool:
    return time.monotonic() - START >= LOAD


def wedged() -> bool:
    if "wedge" in MODES:
        return True
    if "wedge_after" in MODES:
        return state["completions"] >= int(MODES["wedge_after"])
    return False


class Handler(BaseHTTPRequestHandler):
    def log_message(self, fmt, *args):  # quiet
        pass

    def _send(self, code: int, body: bytes, ctype: str = "application/json") -> None:
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        if self.path == "/health":
            self._send(200 if healthy() else 503, b"")
        elif self.path == "/metrics":
            running = 1 if "stuck_running" in MODES else state["running"]
            text = (f'vllm:num_requests_running{{model_name="gptoss"}} {running}\n'
                    f'vllm:num_requests_waiting{{model_name="gptoss"}} 0\n'
                    f'vllm:generation_tokens_total{{model_name="gptoss"}} {state["tokens"]}\n')
            self._send(200, text.encode(), "text/plain")
        else:
            self._send(404, b"{}")

    def do_POST(self):
        length = int(self.headers.get("Content-Length", 0))
        body = json.loads(self.rfile.read(length) or b"{}")
        if self.path != "/v1/completions":
            self._send(404, b"{}")
            return
        if wedged():
            time.sleep(3600)
        state["running"] += 1
        n = int(body.get("max_tokens", 1))
        time.sleep(0.01 * n)
        state["running"] -= 1
        state["completions"] += 1
        state["tokens"] += n
        self._send(200, json.dumps({"choices": [{"text": "x" * n}],
                                    "usage": {"completion_tokens": n, "prompt_tokens": 1}}).encode())


def print_vllm_init_failure() -> None:
    """vLLM 0.32.0's output for an engine that cannot start (v1/engine/core.py, v1/engine/utils.py)."""
    pid, marker = os.getpid(), os.environ.get("FAKE_ENGINE_MARKER", "")
    odd = not os.path.exists(marker)
    if odd:
        open(marker, "w").close()
    else:
        os.remove(marker)
    core = f"(EngineCore pid={pid + 1}) ERROR 12-07 14:02:11 [core.py:1510] "
    cause = ("ValueError: To serve at least one request with the model's max seq len (2048), (0.09 GiB KV cache "
             "is needed, which is larger than the available KV cache memory (0.04 GiB). Based on the available "
             "memory, the estimated maximum model length is 896.")
    lines = [core + "EngineCore failed to start.", core + "Traceback (most recent call last):",
             core + '  File "vllm/v1/core/kv_cache_utils.py", line 1030, in check_enough_kv_cache_memory',
             core + cause,
             f"(APIServer pid={pid}) Traceback (most recent call last):",
             f'(APIServer pid={pid})   File "vllm/v1/engine/utils.py", line 1431, in wait_for_engine_startup',
             f"(APIServer pid={pid}) RuntimeError: Engine core initialization failed. See root cause above. "
             "Failed core proc(s): " + ("{}" if odd else "{'EngineCore': 1}")]
    print("\n".join(lines), flush=True)


def main() -> None:
    port = int(sys.argv[sys.argv.index("--port") + 1])
    if "ignore_sigterm" in MODES:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if "child" in MODES and os.fork() == 0:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        while True:
            time.sleep(1)
    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    print(f"fake engine pid {os.getpid()} on {port} modes {MODES}", flush=True)

    def lifecycle() -> None:
        if "crash_on_load" in MODES:
            time.sleep(LOAD / 2)
            print("fake engine: crashing while loading", flush=True)
            if "vllm_init_failure" in MODES:
                print_vllm_init_failure()
            os._exit(1)
        if "crash_after" in MODES:
            marker = os.environ.get("FAKE_ENGINE_MARKER", "")
            if "crash_once" in MODES:
                if os.path.exists(marker):
                    return
                open(marker, "w").close()
            while state["completions"] == 0:
                time.sleep(0.05)
            time.sleep(float(MODES["crash_after"]))
            print("fake engine: crashing", flush=True)
            os._exit(1)

    threading.Thread(target=lifecycle, daemon=True).start()
    server.serve_forever()


if __name__ == "__main__":
    main()
