"""A Hugging Face Hub stand-in on 127.0.0.1 that answers the routes huggingface_hub 2.4.0 calls to
fetch a model, with the headers it reads (read from its source: hf_api.model_info, file_download.
get_hf_file_metadata and http_get):

    GET  /api/models/{repo}/revision/{rev}?blobs=true   the listing: commit ("sha"), and per file
                                                       rfilename, size, blobId, lfs {sha256, size, pointerSize}
    HEAD /{repo}/resolve/{rev}/{path}                  X-Repo-Commit, ETag (git blob sha1), and for an LFS
                                                       file X-Linked-Etag (sha256) and X-Linked-Size
    GET  /{repo}/resolve/{rev}/{path}                  the bytes; honours "Range: bytes=N-" (206)

An LFS file's blobId is the git sha1 of its pointer file, as on the Hub. Faults, per file, to show
what a real hub does on a bad day: "corrupt" (one byte flipped, the listing unchanged), "drop_once"
(the first GET closes the connection 7/8 of the way), "hang" (every GET stops there until release()).
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
from dataclasses import dataclass, field
from fnmatch import fnmatch
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlsplit

LFS_PATTERNS = ("*.safetensors", "*.bin")


def git_blob_sha1(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


@dataclass
class HubFile:
    data: bytes
    lfs: bool

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.data).hexdigest()

    @property
    def pointer(self) -> bytes:
        return f"version https://git-lfs.github.com/spec/v1\noid sha256:{self.sha256}\nsize {len(self.data)}\n".encode()

    @property
    def blob_id(self) -> str:
        return git_blob_sha1(self.pointer if self.lfs else self.data)


@dataclass
class FakeHub:
    repos: dict[str, dict[str, HubFile]] = field(default_factory=dict)
    commit: str = "0123456789abcdef0123456789abcdef01234567"
    faults: dict[tuple[str, str], str] = field(default_factory=dict)
    requests: list[tuple[str, str, str | None]] = field(default_factory=list)  # (method, path, Range)
    url: str = ""

    def add_repo(self, repo: str, files: dict[str, bytes]) -> None:
        self.repos[repo] = {p: HubFile(d, any(fnmatch(p, pat) for pat in LFS_PATTERNS)) for p, d in files.items()}

    def gets(self, path_suffix: str) -> list[str | None]:
        """The Range header of each GET of a file whose URL ends in path_suffix."""
        return [r for m, p, r in self.requests if m == "GET" and p.endswith("/" + path_suffix)]

    def release(self) -> None:
        self._release.set()

    def __enter__(self) -> FakeHub:
        self._release = threading.Event()
        self._dropped: set[tuple[str, str]] = set()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._release.set()
        self._server.shutdown()
        self._server.server_close()

    def listing(self, repo: str) -> dict:
        siblings = []
        for path, f in sorted(self.repos[repo].items()):
            s = {"rfilename": path, "size": len(f.data), "blobId": f.blob_id}
            if f.lfs:
                s["lfs"] = {"sha256": f.sha256, "size": len(f.data), "pointerSize": len(f.pointer)}
            siblings.append(s)
        return {"_id": "x", "id": repo, "modelId": repo, "sha": self.commit, "private": False, "siblings": siblings}


_LISTING = re.compile(r"^/api/models/(?P<repo>[^/]+/[^/]+)/revision/(?P<rev>[^/]+)$")
_RESOLVE = re.compile(r"^/(?P<repo>[^/]+/[^/]+)/resolve/(?P<rev>[^/]+)/(?P<path>.+)$")


def _handler(hub: FakeHub):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args) -> None:
            pass

        def _send(self, code: int, body: bytes = b"", headers: dict[str, str] | None = None, head: bool = False):
            self.send_response(code)
            for k, v in (headers or {}).items():
                self.send_header(k, v)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if not head:
                self.wfile.write(body)

        def _not_found(self, what: str, head: bool = False):
            self._send(404, json.dumps({"error": what}).encode(),
                       {"X-Error-Code": "RepoNotFound", "X-Error-Message": what, "Content-Type": "application/json"},
                       head=head)

        def do_GET(self):
            self._serve(head=False)

        def do_HEAD(self):
            self._serve(head=True)

        def _serve(self, head: bool):
            path = unquote(urlsplit(self.path).path)
            hub.requests.append((self.command, path, self.headers.get("Range")))
            if m := _LISTING.match(path):
                if m["repo"] not in hub.repos:
                    return self._not_found(f"Repository {m['repo']} not found", head)
                return self._send(200, json.dumps(hub.listing(m["repo"])).encode(),
                                  {"Content-Type": "application/json"}, head)
            m = _RESOLVE.match(path)
            if not m or m["repo"] not in hub.repos or m["path"] not in hub.repos[m["repo"]]:
                return self._not_found(f"{path} not found", head)
            if m["rev"] not in ("main", hub.commit):
                return self._not_found(f"revision {m['rev']} not found", head)
            f = hub.repos[m["repo"]][m["path"]]
            headers = {"X-Repo-Commit": hub.commit, "ETag": f'"{f.blob_id}"', "Accept-Ranges": "bytes",
                       "Content-Type": "application/octet-stream"}
            if f.lfs:
                headers |= {"X-Linked-Etag": f'"{f.sha256}"', "X-Linked-Size": str(len(f.data))}
            if head:
                self.send_response(200)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(f.data)))
                return self.end_headers()
            data = f.data
            fault = hub.faults.get((m["repo"], m["path"]))
            if fault == "corrupt":
                data = data[:len(data) // 2] + bytes([data[len(data) // 2] ^ 0xFF]) + data[len(data) // 2 + 1:]
            start, code = 0, 200
            if r := re.fullmatch(r"bytes=(\d+)-", self.headers.get("Range") or ""):
                start, code = int(r[1]), 206
                headers["Content-Range"] = f"bytes {start}-{len(data) - 1}/{len(data)}"
            body = data[start:]
            key = (m["repo"], m["path"])
            cut = fault == "hang" or (fault == "drop_once" and key not in hub._dropped)
            self.send_response(code)
            for k, v in headers.items():
                self.send_header(k, v)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if not cut:
                self.wfile.write(body)
                return
            hub._dropped.add(key)
            self.wfile.write(body[:len(body) * 7 // 8])
            self.wfile.flush()
            if fault == "hang":
                hub._release.wait()
            self.close_connection = True
            self.connection.shutdown(2)

    return Handler
