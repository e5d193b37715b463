"""Refuse admin request bodies over a limit before anything parses them."""

from __future__ import annotations

from typing import Awaitable, Callable

import structlog

from .refusal import error

log = structlog.get_logger("gptoss_spark.admin")

# Bodies here are one short JSON object; anything larger is refused unread.
MAX_BODY_BYTES = 4096


class BodyLimitMiddleware:
    """Refuse request bodies over max_bytes with 413, by Content-Length or while streaming.

    The body is buffered (it is at most max_bytes) and replayed to the app, so
    an oversized chunked body never reaches the JSON parser.
    """

    def __init__(self, app: Callable[..., Awaitable[None]], max_bytes: int = MAX_BODY_BYTES):
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http" or scope["method"] in ("GET", "HEAD", "OPTIONS"):
            await self.app(scope, receive, send)
            return
        too_large = error(413, "body_too_large", f"request body over {self.max_bytes} bytes")
        client = scope.get("client")
        peer = f"{client[0]}:{client[1]}" if client else "unknown"
        for k, v in scope.get("headers", []):
            if k == b"content-length":
                try:
                    length = int(v)
                except ValueError:
                    await error(400, "bad_request", "invalid Content-Length")(scope, receive, send)
                    return
                if length > self.max_bytes:
                    log.warning("admin request refused", peer=peer, path=scope["path"], outcome="body too large")
                    await too_large(scope, receive, send)
                    return
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            body = message.get("body", b"")
            size += len(body)
            if size > self.max_bytes:
                log.warning("admin request refused", peer=peer, path=scope["path"], outcome="body too large")
                await too_large(scope, receive, send)
                return
            chunks.append(body)
            if not message.get("more_body", False):
                break
        replayed = False

        async def replay() -> dict:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": b"".join(chunks), "more_body": False}
            return await receive()

        await self.app(scope, replay, send)
