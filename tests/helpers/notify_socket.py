"""A stand-in for systemd's NOTIFY_SOCKET: a datagram socket that records every sd_notify message."""

from __future__ import annotations

import socket
import threading
import time
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Notification:
    at: float            # time.monotonic() on arrival
    fields: dict[str, str]


class NotifySocket:
    def __init__(self, path: Path):
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(path))
        self.sock.settimeout(0.2)
        self.messages: list[Notification] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._recv, daemon=True)
        self._thread.start()

    def _recv(self) -> None:
        while not self._stop.is_set():
            try:
                data = self.sock.recv(65536)
            except socket.timeout:
                continue
            except OSError:
                return
            fields = dict(line.split("=", 1) for line in data.decode().splitlines() if "=" in line)
            self.messages.append(Notification(time.monotonic(), fields))

    def with_field(self, key: str, value: str | None = None) -> list[Notification]:
        return [m for m in self.messages if key in m.fields and (value is None or m.fields[key] == value)]

    def wait_for(self, key: str, value: str | None = None, *, after: float = 0.0, timeout: float = 120.0) -> Notification:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            for m in self.with_field(key, value):
                if m.at >= after:
                    return m
            time.sleep(0.05)
        raise AssertionError(f"no {key}={value} within {timeout} s; got {[m.fields for m in self.messages][-10:]}")

    def wait_status(self, fragment: str, timeout: float = 10.0) -> Notification:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            for m in self.with_field("STATUS"):
                if fragment in m.fields["STATUS"]:
                    return m
            time.sleep(0.05)
        raise AssertionError(f"no STATUS containing {fragment!r}; got {[m.fields for m in self.messages][-5:]}")

    def close(self) -> None:
        self._stop.set()
        self.sock.close()
        self._thread.join(2)
