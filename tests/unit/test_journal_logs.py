"""Logs as journald expects them: native protocol datagrams with a readable MESSAGE, the event's
keys as fields, PRIORITY from the level (engine lines by the level vLLM logged them at).

The socket test binds a real AF_UNIX datagram socket (what /run/systemd/journal/socket is)
and decodes what arrives with the protocol as systemd documents it, written out here.
"""

from __future__ import annotations

import os
import socket
import struct

import pytest
import structlog

from gptoss_spark.service import journal, logs


def decode(datagram: bytes) -> dict[str, str]:
    """systemd's Native Journal Protocol: FIELD=value\\n, or FIELD\\n <u64 le length> value \\n."""
    fields, i = {}, 0
    while i < len(datagram):
        nl = datagram.index(b"\n", i)
        line = datagram[i:nl]
        if b"=" in line:
            k, v = line.split(b"=", 1)
            fields[k.decode()] = v.decode()
            i = nl + 1
        else:
            (n,) = struct.unpack("<Q", datagram[nl + 1:nl + 9])
            fields[line.decode()] = datagram[nl + 9:nl + 9 + n].decode()
            assert datagram[nl + 9 + n:nl + 10 + n] == b"\n"
            i = nl + 10 + n
    return fields


@pytest.fixture
def journal_socket(tmp_path):
    path = str(tmp_path / "journal.sock")
    server = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    server.bind(path)
    server.settimeout(5)
    sender = journal.JournalSender(path)
    logs.configure("info", journal_sender=sender)
    yield lambda: decode(server.recv(65536))
    sender.close()
    server.close()
    structlog.reset_defaults()


def test_a_supervisor_event_is_a_readable_message_with_journal_fields(journal_socket):
    structlog.get_logger("gptoss_spark.service.supervisor").info(
        "state", state="failed", previous="backoff", profile="spec", reason="gave up: exited with code 1", pid=None)
    e = journal_socket()
    assert e["MESSAGE"] == 'state state=failed previous=backoff profile=spec reason="gave up: exited with code 1"'
    assert (e["STATE"], e["PREVIOUS"], e["PROFILE"], e["REASON"]) == ("failed", "backoff", "spec",
                                                                      "gave up: exited with code 1")
    assert (e["PRIORITY"], e["SYSLOG_IDENTIFIER"], e["LOGGER"]) == ("6", "gptoss-spark", "gptoss_spark.service.supervisor")
    assert e["EVENT"] == "state"
    assert "PID" not in e and "TIMESTAMP" not in e  # None is left out; journald stamps entries itself


@pytest.mark.parametrize("method, priority", [("warning", "4"), ("error", "3"), ("critical", "2")])
def test_priority_follows_the_level(journal_socket, method, priority):
    getattr(structlog.get_logger("gptoss_spark.service.supervisor"), method)("memory guard tripped", available_gib=0.5)
    e = journal_socket()
    assert e["PRIORITY"] == priority and e["AVAILABLE_GIB"] == "0.5"


def test_an_engine_line_is_the_message_as_is_unicode_kept(journal_socket):
    line = "(APIServer pid=7) WARNING 12-02 01:00:00 [api_server.py:1] ▄▄ banner ▄▄"
    structlog.get_logger(logs.ENGINE_LOGGER).warning(line, pid=7, profile="demo")
    e = journal_socket()
    assert e["MESSAGE"] == line and "\\u2584" not in e["MESSAGE"]
    assert (e["PRIORITY"], e["LOGGER"], e["PID"], e["PROFILE"]) == ("4", "engine", "7", "demo")
    assert "EVENT" not in e


def test_a_value_with_a_newline_uses_the_length_form(journal_socket):
    try:
        raise ValueError("bad\nthing")
    except ValueError:
        structlog.get_logger("x").exception("failed")
    e = journal_socket()
    assert e["PRIORITY"] == "3" and e["EXCEPTION"].startswith("Traceback") and "\n" in e["EXCEPTION"]


def test_debug_is_filtered_by_the_configured_level(journal_socket):
    log = structlog.get_logger("x")
    log.debug("hidden")
    log.info("shown")
    assert journal_socket()["MESSAGE"] == "shown"


def test_a_failed_send_falls_back_to_text(tmp_path, capsys):
    sender = journal.JournalSender(str(tmp_path / "absent.sock"))
    assert sender.send({"MESSAGE": "hello"}) is False
    assert capsys.readouterr().err.startswith("hello (journal send failed: ")


@pytest.mark.parametrize("line, previous, level", [
    ("INFO 12-02 01:00:00 [api_server.py:1] Starting vLLM", "info", "info"),
    ("(EngineCore pid=12) WARNING 12-02 01:00:00 [x.py:3] low memory", "info", "warning"),
    ("(APIServer pid=7) ERROR 12-02 01:00:00 [x.py:3] engine died", "info", "error"),
    ("ERROR:    Exception in ASGI application", "info", "error"),
    ("Traceback (most recent call last):", "info", "error"),
    ('  File "x.py", line 3, in f', "error", "error"),  # a traceback's frame continues its entry
    ("▄▄▄ banner line", "info", "info"),
    # vLLM's usage text lists the level names: not a prefix, not a level.
    ("  [--uvicorn-log-level {critical,error,warning,info,debug,trace}]", "info", "info"),
])
def test_vllm_line_level(line, previous, level):
    assert logs.vllm_line_level(line, previous) == level


def test_field_names():
    assert journal.field_name("from_profile") == "FROM_PROFILE"
    assert journal.field_name("_private") == "PRIVATE"  # never one of journald's own _FIELDS
    assert journal.field_name("a-b.c") == "A_B_C"


def test_stream_is_journal_matches_dev_and_inode(tmp_path, monkeypatch):
    f = open(tmp_path / "stream", "w")
    st = os.fstat(f.fileno())
    monkeypatch.setenv("JOURNAL_STREAM", f"{st.st_dev}:{st.st_ino}")
    assert journal.stream_is_journal(f.fileno())
    other = open(tmp_path / "other", "w")
    assert not journal.stream_is_journal(other.fileno())  # stderr redirected under the same unit
    monkeypatch.delenv("JOURNAL_STREAM")
    assert not journal.stream_is_journal(f.fileno())


def test_json_lines_keep_unicode(capsys):
    logs.configure("info", json=True, use_journal=False)
    try:
        structlog.get_logger("engine").info("▄▄ banner")
    finally:
        structlog.reset_defaults()
    assert '"event": "▄▄ banner"' in capsys.readouterr().err


def test_progress_bar_redraws_keep_the_last_one_so_the_message_stays_text():
    from gptoss_spark.service.logs import ENGINE_LOGGER, journal_fields
    f = journal_fields(ENGINE_LOGGER, {"event": "\rLoading 10%\rLoading 100%\r", "level": "info"})
    assert f["MESSAGE"] == "Loading 100%"
