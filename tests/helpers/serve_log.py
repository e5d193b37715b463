"""A `gptoss-spark serve` run as the harnesses see it: the JSON events it writes to its log file (off a
TTY, one JSON document a line; vLLM's own lines, which are not JSON, are passed over), and the kill
that leaves none of its engines behind."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

from gptoss_spark.service.engine import session_members


def log_events(path: Path, name: str | None = None) -> list[dict]:
    """Every event in the serve log at path, in order, or only those whose "event" is name; [] when
    serve has not written the file yet."""
    try:
        lines = path.read_text().splitlines()
    except FileNotFoundError:
        return []
    out = []
    for line in lines:
        try:
            e = json.loads(line)
        except ValueError:
            continue
        if isinstance(e, dict) and (name is None or e.get("event") == name):
            out.append(e)
    return out


def engine_pids(path: Path) -> list[int]:
    """The pid of each engine the serve run spawned, oldest first."""
    return [e["pid"] for e in log_events(path, "engine spawned")]


def kill_serve(proc: subprocess.Popen | None, log_path: Path) -> None:
    """SIGKILL the serve process if it still runs, then every engine session it spawned (from its log:
    only its own engines) that still has a live member."""
    if proc is not None and proc.poll() is None:
        proc.kill()
        proc.wait()
    for pid in engine_pids(log_path):
        if session_members(pid):
            os.killpg(pid, signal.SIGKILL)
