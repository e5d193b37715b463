"""The one line that says why the service did not become ready, from its journal.

The supervisor logs every state change with its reason; the reason of a give-up
carries the engine's own error line (exit_reason.py), so that is the line to show,
not the last 30 journal lines (mostly vLLM's usage text after an argument error).
When the supervisor itself failed (its own arguments, its config) there is no such
entry: the last error line of the unit's output stands in.
"""

from __future__ import annotations

import json
import re
import subprocess
from typing import Iterable

from ..service.exit_reason import telling_lines
from .layout import SERVICE

LIMIT = 400


def _one_line(text: str) -> str:
    text = re.sub(r"\s+", " ", text).strip()
    return text if len(text) <= LIMIT else text[:LIMIT - 3] + "..."


def reason_from(entries: Iterable[dict]) -> str | None:
    """The reason of the last give-up (else of the last stop) among journal entries (journalctl -o json)."""
    failed = stopping = None
    messages = []
    for e in entries:
        msg = e.get("MESSAGE")
        if isinstance(msg, str):
            messages.append(msg)
        if e.get("EVENT") == "state" and isinstance(e.get("REASON"), str):
            if e.get("STATE") == "failed":
                failed = e["REASON"]
            elif e.get("STATE") == "stopping":
                stopping = e["REASON"]
    if failed or stopping:
        return _one_line(failed or stopping)
    shown = telling_lines(messages, n=1)
    return _one_line(shown[0]) if shown else None


def failure_reason(since_epoch: float, unit: str = SERVICE) -> str:
    p = subprocess.run(["journalctl", "-u", unit, "--since", f"@{int(since_epoch)}", "-o", "json", "--no-pager"],
                       capture_output=True, text=True)
    entries = []
    for line in p.stdout.splitlines():
        try:
            entries.append(json.loads(line))
        except ValueError:
            continue
    return reason_from(entries) or "no reason in the journal"
