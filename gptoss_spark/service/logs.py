"""structlog setup: journald entries under systemd, JSON lines elsewhere off a TTY, readable on a TTY.

Under systemd (stderr is the journal stream, journal.stream_is_journal) each event is
sent natively (journal.py): a readable MESSAGE, the event's keys as journal fields,
PRIORITY from the level. Elsewhere off a TTY (a test's log file, a pipe) one JSON
object per line; on a TTY structlog's console lines.

The engine's output arrives here line by line (engine.py); vllm_line_level gives each
line the level vLLM logged it at, so an engine ERROR is an error in the journal too.
"""

from __future__ import annotations

import json as jsonlib
import logging
import re
import sys
from typing import Any

import structlog

from . import journal

ENGINE_LOGGER = "engine"
IDENTIFIER = "gptoss-spark"
_DROP = ("level", "timestamp", "event")

# vLLM's log prefix: `INFO 12-01 10:00:00 [file.py:12] ...`, perhaps after `(EngineCore pid=N) `;
# uvicorn's: `INFO:     ...`, `ERROR:    ...`.
_VLLM_LEVEL = re.compile(r"^(?:\([^)]*\)\s*)?(DEBUG|INFO|WARNING|ERROR|CRITICAL)(?:\s+\d\d-\d\d\s|:\s)")
_TRACEBACK = re.compile(r"^(?:\([^)]*\)\s*)?Traceback \(most recent call last\)")


# Engine lines with nothing for an owner, kept at debug (out of the journal at the default level) and
# out of the engine's tail (the exit reason's source): vLLM's listing of every HTTP route at each start
# (~35 lines), and nanobind's report of objects still alive at interpreter exit (~80 lines at each stop;
# its "leaked" objects are the process's last moments, not a leak of the service).
_NOISE = re.compile(r"^(?:\([^)]*\)\s*)?(?:(?:INFO|DEBUG)\s+\d\d-\d\d\s\S+\s\[[^]]*\]\s+Route: "
                    r"|nanobind: | - leaked (?:instance|type|function|keep_alive)| - \.\.\. skipped remainder)")


def engine_noise(line: str) -> bool:
    """True for an engine line kept out of the journal at info (see _NOISE)."""
    return _NOISE.match(line) is not None


def vllm_line_level(line: str, previous: str = "info") -> str:
    """The level of one line of engine output. A line with no level of its own (a traceback's
    frames, a multi-line message) continues the entry before it, so it keeps `previous`."""
    m = _VLLM_LEVEL.match(line)
    if m:
        return m.group(1).lower()
    if _TRACEBACK.match(line):
        return "error"
    return previous


def _text(value: object) -> str:
    s = value if isinstance(value, str) else jsonlib.dumps(value, ensure_ascii=False, default=str)
    return jsonlib.dumps(s, ensure_ascii=False) if (not s or any(c in s for c in ' "=')) else s


def journal_fields(logger_name: str, event: dict[str, Any]) -> dict[str, object]:
    """The journal entry of one structlog event: MESSAGE (the event, then key=value; an engine
    line as it is), PRIORITY, SYSLOG_IDENTIFIER, LOGGER, EVENT (not for engine lines), and each
    key as an upper-case field."""
    level = str(event.get("level", "info"))
    extra = {k: v for k, v in event.items() if k not in _DROP and v is not None}
    message = str(event.get("event", ""))
    if "\r" in message:
        # A progress bar's redraws (tqdm): journald stores a MESSAGE with control characters as bytes,
        # which `journalctl -o json` shows as a number array; keep what a terminal would show last.
        message = next((seg for seg in reversed(message.split("\r")) if seg.strip()), "")
    if logger_name != ENGINE_LOGGER and extra:
        message += " " + " ".join(f"{k}={_text(v)}" for k, v in extra.items())
    fields: dict[str, object] = {"MESSAGE": message, "PRIORITY": journal.PRIORITIES.get(level, 6),
                                 "SYSLOG_IDENTIFIER": IDENTIFIER, "LOGGER": logger_name or IDENTIFIER}
    if logger_name != ENGINE_LOGGER:
        fields["EVENT"] = event.get("event", "")  # journalctl EVENT=state
    for k, v in extra.items():
        name = journal.field_name(k)
        if name and name not in fields:
            fields[name] = v if isinstance(v, str) else jsonlib.dumps(v, ensure_ascii=False, default=str)
    return fields


class JournalLogger:
    """structlog's logger: the last processor hands it the event dict as keyword arguments."""

    def __init__(self, sender: journal.JournalSender, name: str):
        self.sender = sender
        self.name = name

    def msg(self, **event: Any) -> None:
        self.sender.send(journal_fields(self.name, event))

    debug = info = warning = warn = error = critical = exception = fatal = log = msg


class JournalLoggerFactory:
    def __init__(self, sender: journal.JournalSender | None = None):
        self.sender = sender or journal.JournalSender()

    def __call__(self, *args: Any) -> JournalLogger:
        return JournalLogger(self.sender, str(args[0]) if args else IDENTIFIER)


def _as_kwargs(logger: Any, method: str, event: dict[str, Any]) -> dict[str, Any]:
    return event  # a dict from the last processor becomes the logger method's **kwargs


def configure(level: str = "info", *, json: bool | None = None, journal_sender: journal.JournalSender | None = None,
              use_journal: bool | None = None, file: Any = None, cache: bool = True) -> None:
    """file: write the lines there instead of stderr (the warm-up's engine log); cache=False for a
    configuration that is put back afterwards (a cached logger would keep writing to the file)."""
    if use_journal is None:
        use_journal = journal_sender is not None or journal.stream_is_journal(sys.stderr.fileno())
    common = [structlog.contextvars.merge_contextvars, structlog.processors.add_log_level]
    if use_journal:
        processors = [*common, structlog.processors.format_exc_info, _as_kwargs]
        factory: Any = JournalLoggerFactory(journal_sender)
    else:
        out = sys.stderr if file is None else file
        if json is None:
            json = not out.isatty()
        renderer = (structlog.processors.JSONRenderer(ensure_ascii=False) if json
                    else structlog.dev.ConsoleRenderer(colors=False))
        processors = [*common, structlog.processors.TimeStamper(fmt="iso", utc=True),
                      structlog.processors.format_exc_info, renderer]
        factory = structlog.PrintLoggerFactory(file=out)
    structlog.configure(
        processors=processors,
        wrapper_class=structlog.make_filtering_bound_logger(getattr(logging, level.upper())),
        logger_factory=factory,
        cache_logger_on_first_use=cache,
    )
