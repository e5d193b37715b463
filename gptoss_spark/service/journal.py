"""journald's native protocol: one datagram per entry, MESSAGE readable, the event's fields as journal fields.

Under systemd the supervisor's stderr is a journal stream: a JSON line there is one
opaque MESSAGE (250+ characters, non-ASCII as \\u escapes, always priority info).
Sent natively instead, `journalctl -u gptoss-spark` shows `state ready previous=loading
profile=plain ...`, `journalctl -u gptoss-spark STATE=failed` and `-o json` filter on
the fields, and PRIORITY follows the level (`journalctl -p warning`).

The protocol (systemd's "Native Journal Protocol" document): datagrams to
/run/systemd/journal/socket, each `FIELD=value\\n`, or for a value with a newline
`FIELD\\n` + its length as 64-bit little endian + the value + `\\n`. Field names:
A-Z, 0-9 and `_`, not starting with `_` (those are journald's own), at most 64 bytes.
A datagram too large for the socket is sent as a sealed memfd instead; entries here
are small, so a failed send falls back to the stream (stderr) instead.

Written out, not a library: systemd-python (235) is an sdist only (a compiler and
libsystemd-dev on every host) and the protocol is a dozen lines.
"""

from __future__ import annotations

import os
import re
import socket
import struct
import sys

SOCKET_PATH = "/run/systemd/journal/socket"

# Python logging level names -> syslog priorities (what journald's PRIORITY= means).
PRIORITIES = {"critical": 2, "error": 3, "warning": 4, "info": 6, "debug": 7}
_NOT_FIELD = re.compile(r"[^A-Z0-9_]")


def stream_is_journal(fd: int = 2) -> bool:
    """True if fd is the journal stream systemd connected (its dev:ino is in $JOURNAL_STREAM),
    the documented way to tell; a redirected stderr under the same unit is not."""
    value = os.environ.get("JOURNAL_STREAM", "")
    try:
        dev, ino = (int(x) for x in value.split(":"))
        st = os.fstat(fd)
    except (ValueError, OSError):
        return False
    return (st.st_dev, st.st_ino) == (dev, ino)


def field_name(key: str) -> str | None:
    """`previous` -> PREVIOUS, `from_profile` -> FROM_PROFILE; None if nothing valid is left."""
    name = _NOT_FIELD.sub("_", key.upper()).lstrip("_")[:64]
    return name or None


def encode(fields: dict[str, object]) -> bytes:
    out = bytearray()
    for key, value in fields.items():
        data = value if isinstance(value, bytes) else str(value).encode("utf-8", "replace")
        name = key.encode("ascii")
        if b"\n" in data:
            out += name + b"\n" + struct.pack("<Q", len(data)) + data + b"\n"
        else:
            out += name + b"=" + data + b"\n"
    return bytes(out)


class JournalSender:
    """Sends entries to journald; an entry that cannot be sent goes to `fallback` as text."""

    def __init__(self, path: str = SOCKET_PATH, fallback=None):
        self.path = path
        self.fallback = fallback
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)

    def send(self, fields: dict[str, object]) -> bool:
        try:
            self._sock.sendto(encode(fields), self.path)
            return True
        except OSError as e:
            out = self.fallback or sys.stderr
            print(f"{fields.get('MESSAGE', '')} (journal send failed: {e.strerror or e})", file=out, flush=True)
            return False

    def close(self) -> None:
        self._sock.close()
