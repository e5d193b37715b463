"""The JSON events a `gptoss-spark serve` run writes to its log file (off a TTY, one JSON document a
line; vLLM's own lines, which are not JSON, are passed over)."""

from __future__ import annotations

import json
from pathlib import Path


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
