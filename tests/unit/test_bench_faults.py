"""Faults a real engine cannot show on demand: HTTP 500, a stream cut mid-way, the
server going away mid-run. A tiny stand-in HTTP server (raw asyncio, loopback,
random port) plays the endpoint for these only; the happy paths run against the
real engine in tests/integration/test_bench_engine.py.
"""

import asyncio
import json
import threading

from gptoss_spark.cli import main

TOKENS = 8


def sse(obj) -> bytes:
    return b"data: " + (obj if isinstance(obj, bytes) else json.dumps(obj).encode()) + b"\n\n"


def http_chunk(data: bytes) -> bytes:
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


class StandIn:
    """Answers /v1/models, and completions according to `plan`: one mode per request, in order.

    modes: "ok" (a proper stream of TOKENS tokens), "http500", "cut" (3 tokens, then
    the connection closes mid-body), "down" (stop listening: this and later requests
    find no server).
    """

    def __init__(self, plan):
        self.plan = list(plan)
        self.loop = asyncio.new_event_loop()
        self.server = None
        self.port = None
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        self.server = asyncio.run_coroutine_threadsafe(
            asyncio.start_server(self.handle, "127.0.0.1", 0), self.loop).result(5)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    def __exit__(self, *exc):
        async def stop():
            self.server.close()
        asyncio.run_coroutine_threadsafe(stop(), self.loop).result(5)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)

    @property
    def url(self):
        return f"http://127.0.0.1:{self.port}"

    async def handle(self, reader, writer):
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode().split("\r\n")
                method, path, _ = lines[0].split(" ", 2)
                length = next((int(h.split(":")[1]) for h in lines[1:] if h.lower().startswith("content-length")), 0)
                await reader.readexactly(length)
                if method == "GET":
                    body = json.dumps({"object": "list", "data": [{"id": "gptoss", "max_model_len": 1024}]}).encode()
                    if path != "/v1/models":
                        writer.write(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n")
                    else:
                        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                                     + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
                    await writer.drain()
                    continue
                mode = self.plan.pop(0) if self.plan else "ok"
                if mode == "http500":
                    body = json.dumps({"error": {"message": "EngineCore died", "code": 500}}).encode()
                    writer.write(b"HTTP/1.1 500 Internal Server Error\r\nContent-Type: application/json\r\n"
                                 + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
                    await writer.drain()
                    continue
                if mode == "down":
                    self.server.close()  # no listener any more: later connects are refused
                    writer.close()
                    return
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
                n = 3 if mode == "cut" else TOKENS
                for i in range(n):
                    writer.write(http_chunk(sse({"choices": [{"index": 0, "text": f"t{i}", "finish_reason":
                                                              "length" if i == TOKENS - 1 else None}]})))
                    await writer.drain()
                    await asyncio.sleep(0.01)
                if mode == "cut":
                    writer.close()  # mid-body, no terminating chunk
                    return
                writer.write(http_chunk(sse({"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": TOKENS}})))
                writer.write(http_chunk(sse(b"[DONE]")) + b"0\r\n\r\n")
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()


def run_bench(url, capsys, *extra):
    rc = main(["bench", "--url", url, "--endpoint", "completions", "--warmup", "0", "--no-progress",
               "--admin-url", "http://127.0.0.1:9", "--timeout", "10", "--json", *extra])
    return rc, json.loads(capsys.readouterr().out)


def test_http_500_is_reported_per_request(capsys):
    with StandIn(["ok", "http500", "ok"]) as srv:
        rc, res = run_bench(srv.url, capsys, "--requests", "3")
    assert rc == 1
    assert res["summary"]["valid_requests"] == 2
    assert res["invalid"] == [{"index": 1, "reason": "HTTP 500: EngineCore died"}]
    assert res["requests"][0]["completion_tokens"] == TOKENS


def test_stream_cut_midway_is_reported(capsys):
    with StandIn(["cut", "ok"]) as srv:
        rc, res = run_bench(srv.url, capsys, "--requests", "2")
    assert rc == 1
    bad = res["requests"][0]
    assert not bad["valid"] and bad["invalid_reason"].startswith("stream cut after 3 output chunk(s)")
    assert res["requests"][1]["valid"]


def test_server_gone_mid_run_is_reported(capsys):
    with StandIn(["ok", "down"]) as srv:
        rc, res = run_bench(srv.url, capsys, "--requests", "3")
    assert rc == 1
    assert res["requests"][0]["valid"]
    reasons = [r["invalid_reason"] for r in res["requests"][1:]]
    assert all(reasons), reasons
    assert "cannot connect" in reasons[-1]


def test_loadtest_reports_faults_without_crashing(capsys):
    with StandIn(["ok", "http500", "cut", "ok"]) as srv:
        rc = main(["loadtest", "--url", srv.url, "--endpoint", "completions", "--users", "4", "--warmup", "0",
                   "--no-progress", "--admin-url", "http://127.0.0.1:9", "--json"])
        res = json.loads(capsys.readouterr().out)
    assert rc == 1
    s = res["summary"]
    assert s["valid_requests"] == 2 and s["invalid_requests"] == 2
    assert s["completion_tokens_total"] == 2 * TOKENS  # only the requests that completed with usage
    reasons = sorted(i["reason"].split(":")[0] for i in res["invalid"])
    assert reasons == ["HTTP 500", "stream cut after 3 output chunk(s)"]
