"""The engine's exit reason: signals named, access-log noise dropped, errors preferred."""

from __future__ import annotations

from gptoss_spark.service.exit_reason import describe_exit, telling_lines

PROBES = [
    '(APIServer pid=41) INFO:     127.0.0.1:51234 - "GET /metrics HTTP/1.1" 200 OK',
    '(APIServer pid=41) INFO:     127.0.0.1:51236 - "GET /health HTTP/1.1" 200 OK',
    'INFO:     127.0.0.1:51240 - "POST /v1/completions HTTP/1.1" 200 OK',
]


def test_sigkill_is_named_with_the_oom_hint_and_no_probe_noise():
    r = describe_exit(-9, ["INFO 12-01 engine started", *PROBES])
    assert r.startswith("engine killed by SIGKILL (signal 9)")
    assert "journalctl -k" in r and "OOM" in r
    assert "HTTP/1.1" not in r
    # The engine's last ordinary lines do not explain a signal from outside: not shown.
    assert r.endswith("for the kernel's OOM killer"), r


def test_a_signal_keeps_only_the_error_lines_that_explain_it():
    out = ["INFO 12-01 10:00:00 [api_server.py:1] Starting vLLM API server on http://127.0.0.1:8100",
           "INFO 12-01 10:00:10 [loggers.py:1] Engine 000: Avg prompt throughput: 12.0 tokens/s, " + "x" * 300,
           "ERROR 12-01 10:00:11 [core.py:1] EngineCore hit an exception: " + "y" * 400]
    r = describe_exit(-6, out)
    assert r.startswith("engine killed by SIGABRT (signal 6): ERROR 12-01 10:00:11 [core.py:1] EngineCore hit")
    assert "throughput" not in r and "Starting vLLM" not in r
    assert len(r) < 260 and r.endswith("..."), r  # one line, cut


def test_other_signals_are_named_without_the_oom_hint():
    r = describe_exit(-11, PROBES, when=" while loading")
    assert r == "engine killed by SIGSEGV (signal 11) while loading"


def test_unknown_signal_number():
    assert describe_exit(-200).startswith("engine killed by signal 200 (signal 200)")


def test_exit_code_keeps_its_wording_and_prefers_error_lines():
    out = ["INFO loading weights", "Traceback (most recent call last):", '  File "x.py", line 1, in <module>',
           "RuntimeError: CUDA error: out of memory", *PROBES, "INFO shutting down"]
    r = describe_exit(1, out)
    assert r == "engine exited with code 1: Traceback (most recent call last): | RuntimeError: CUDA error: out of memory"


def test_logged_error_lines_are_preferred():
    out = ["(EngineCore pid=7) ERROR 12-01 [core.py:1] EngineCore failed to start.", "INFO bye", *PROBES]
    assert telling_lines(out) == ["(EngineCore pid=7) ERROR 12-01 [core.py:1] EngineCore failed to start."]


def test_only_noise_gives_the_bare_reason():
    assert describe_exit(0, PROBES) == "engine exited with code 0"
    assert telling_lines(["a", "b", "c", "d"]) == ["b", "c", "d"]


def test_argparse_error_beats_the_usage_text_that_names_log_levels():
    # What vLLM prints for an unknown flag, shortened: usage lines, one listing ERROR as a choice.
    out = ["usage: api_server.py [-h] [--host HOST]",
           "                     [--log-level {CRITICAL,ERROR,WARNING,INFO,DEBUG,NOTSET}]",
           "                     [model_tag]",
           "api_server.py: error: unrecognized arguments: --no-such-engine-flag"]
    assert describe_exit(2, out[:2] + out[2:], " while loading") == (
        "engine exited with code 2 while loading: api_server.py: error: unrecognized arguments: --no-such-engine-flag")
    assert telling_lines(out[:3]) == out[:3]  # no error line: the last lines as they are


def test_prefixed_exception_line_of_an_engine_process():
    out = ["(EngineCore pid=7) INFO loading", "(EngineCore pid=7) torch.OutOfMemoryError: CUDA out of memory", "INFO bye"]
    assert telling_lines(out) == ["(EngineCore pid=7) torch.OutOfMemoryError: CUDA out of memory"]


def test_failure_signature_blanks_numbers_only():
    from gptoss_spark.service.exit_reason import failure_signature
    a = "engine exited with code 1 while loading: (EngineCore pid=4980) ERROR 12-02 01:27:18 [core.py:1512] boom"
    b = "engine exited with code 1 while loading: (EngineCore pid=5123) ERROR 12-02 01:29:40 [core.py:1512] boom"
    assert failure_signature(a) == failure_signature(b)
    assert failure_signature(a) != failure_signature(a.replace("boom", "bang"))


def test_sigsys_names_the_syscall_filter_and_how_to_turn_it_off():
    r = describe_exit(-31, ["INFO 12-01 loading"])
    assert r.startswith("engine killed by SIGSYS (signal 31)")
    assert "SystemCallFilter" in r and "/etc/systemd/system/gptoss-spark.service.d/20-syscall-filter.conf" in r
    assert "sudo ln -sf /dev/null" in r and "type=1326" in r
    assert "OOM" not in r


def test_pydantic_value_error_line_is_kept():
    """vLLM's config classes fail with pydantic's ValidationError: the class on one line, what is
    wrong on the next (indented). The reason must carry the second."""
    out = ["Traceback (most recent call last):", '  File "x.py", line 1, in <module>',
           "pydantic_core._pydantic_core.ValidationError: 1 validation error for ModelConfig",
           "  Value error, User-specified max_model_len (99999999) is greater than the derived max_model_len"]
    r = describe_exit(1, out, " while loading")
    assert r.endswith("| " + out[-1]), r
