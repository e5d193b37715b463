"""FlashInfer JIT prebuild, the logic without a compiler: the profiles' module lists, the parallelism
rule, the cache key and layout, build progress and failure, the venv links, doctor's listing, the
engine's environment and the install step. The real compile is tests/integration/test_flashinfer_build.py;
the check against vLLM's and FlashInfer's sources is tests/unit/test_flashinfer_modules.py."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from gptoss_spark.service.batch_shape import option_value
from gptoss_spark.service.config import Settings
from gptoss_spark.doctor import OK, WARN, check_flashinfer
from gptoss_spark.service.engine import build_env
from gptoss_spark.flashinfer_jit import build as fb
from gptoss_spark.service import flashinfer_cache as cache
from gptoss_spark.flashinfer_jit.modules import FP4_QUANT_120F, FP4_QUANT_121, FUSED_MOE, SAMPLING, derive
from gptoss_spark.install import venvs
from gptoss_spark.base.exit_codes import EXIT_FLASHINFER
from gptoss_spark.install.layout import InstallError, Layout
from gptoss_spark.service.profiles import load_profile_file

REPO = Path(__file__).resolve().parents[2]
GIB = 2**30
KEY = cache.CacheKey("0.7.0.post1", "13.0.88", "0.1.15.post2")


def shipped(name: str):
    return load_profile_file(REPO / "etc" / "profiles" / f"{name}.toml")


def settings(tmp: Path, profiles=("plain", "spec")) -> Settings:
    pdir = tmp / "profiles"
    pdir.mkdir(exist_ok=True)
    for p in profiles:
        (pdir / f"{p}.toml").write_text((REPO / "etc" / "profiles" / f"{p}.toml").read_text())
    return Settings.model_validate({"paths": {"state_dir": str(tmp / "state"), "profile_dirs": [str(pdir)]},
                                    "model": {"eagle3_dir": str(tmp / "eagle")}})


# ---------------------------------------------------------------- module lists

@pytest.mark.parametrize("name", ["plain", "spec"])
def test_shipped_profiles_need_the_cutlass_moe_the_fp4_scales_and_the_sampler(name):
    p = shipped(name)
    s = Settings()
    d = derive(p.name, p.engine_args(s), p.engine_env(s), torch_cuda="13.0")
    assert [m.name for m in d.modules] == ["fused_moe_120", "fp4_quantization_120f", "sampling"]
    assert d.arch_list == "12.1a"
    assert any("cute-dsl" in n.text and not n.gap for n in d.notes)
    # Both pin Triton attention: no FlashInfer attention module can be JIT-built, so no gap note.
    assert not any(n.gap for n in d.notes), [n.text for n in d.notes]


def test_a_profile_without_an_attention_pin_gets_a_gap_note_naming_the_fix():
    p = shipped("plain")
    s = Settings()
    args = list(p.engine_args(s))
    i = args.index("--attention-backend")
    del args[i:i + 2]
    d = derive(p.name, args, p.engine_env(s), torch_cuda="13.0")
    gaps = [n.text for n in d.notes if n.gap]
    assert len(gaps) == 1 and "TRITON_ATTN" in gaps[0], gaps


def test_fp4_module_follows_torch_cuda():
    args = ["--moe-backend", "flashinfer_cutlass", "--quantization-config", '{"moe": {"activation": "mxfp8"}}']
    assert FP4_QUANT_120F in derive("x", args, {}, torch_cuda="13.0").modules
    assert FP4_QUANT_120F in derive("x", args, {}, torch_cuda="12.9").modules
    assert FP4_QUANT_121 in derive("x", args, {}, torch_cuda="12.8").modules
    assert FP4_QUANT_121 in derive("x", args, {}, torch_cuda=None).modules   # a CPU torch


def test_flags_and_env_that_take_flashinfer_out():
    base = ["--moe-backend=flashinfer_cutlass", "--quantization-config", '{"moe": {"activation": "mxfp8"}}',
            "--attention-backend", "TRITON_ATTN"]
    assert [m.name for m in derive("x", base, {}, torch_cuda="13.0").modules] == [
        "fused_moe_120", "fp4_quantization_120f", "sampling"]
    # our own MoE kernels replace the MoE path; the sampler stays
    assert derive("x", base, {"GPTOSS_SPARK_MOE": "triton"}, torch_cuda="13.0").modules == (SAMPLING,)
    assert derive("x", base, {"VLLM_USE_FLASHINFER_SAMPLER": "0"}, torch_cuda="13.0").modules == (
        FUSED_MOE, FP4_QUANT_120F)
    assert SAMPLING not in derive("x", base + ["--logprobs-mode", "processed_logprobs"], {},
                                  torch_cuda="13.0").modules
    marlin = ["--moe-backend", "marlin", "--attention-backend", "TRITON_ATTN"]
    d = derive("x", marlin, {}, torch_cuda="13.0")
    assert d.modules == (SAMPLING,) and not any(n.gap for n in d.notes)
    # BF16 activations with the CUTLASS MoE, an unnamed backend, FlashInfer attention: said, not guessed
    for args in (["--moe-backend", "flashinfer_cutlass"], ["--attention-backend", "FLASHINFER"], []):
        d = derive("x", args + (["--attention-backend", "TRITON_ATTN"] if "--attention-backend" not in args
                                else []), {}, torch_cuda="13.0")
        assert FUSED_MOE not in d.modules and any(n.gap for n in d.notes), args


def test_flag_value_last_wins_in_both_spellings():
    assert option_value(["--a", "1", "--a=2"], "--a") == "2"
    assert option_value(["--a=2", "--a", "3"], "--a") == "3"
    assert option_value(["--ab", "1"], "--a") is None and option_value(["--a"], "--a") is None


# ---------------------------------------------------------------- parallelism, key, layout

@pytest.mark.parametrize("available_gib, cores, jobs", [
    (110, 20, 9),    # a Spark before the engine: floor((110 - 8) / 11) = 9 of 20 cores
    (35, 20, 2),     # the same Spark with a profile running (MemAvailable ~35 GiB)
    (300, 20, 20),   # cores bound
    (22, 2, 1),      # this dev box
    (10, 16, 1),     # less than one job's worth: still one
])
def test_jobs_rule(available_gib, cores, jobs):
    assert cache.jobs_for(int(available_gib * GIB), cores) == jobs


def test_engine_jobs_count_what_the_profile_leaves():
    # 119 GiB available before the engine starts, plain expects 84: floor((35 - 8) / 11) = 2
    assert cache.engine_jobs(119 * GIB, 20, 84) == 2
    assert cache.engine_jobs(119 * GIB, 20, 0) == 10


def test_nvcc_version_and_arch_dir():
    out = "nvcc: NVIDIA (R) Cuda compiler driver\nCuda compilation tools, release 13.0, V13.0.88\n"
    assert cache.parse_nvcc_version(out) == "13.0.88"
    assert cache.parse_nvcc_version("no version here") is None
    assert cache.arch_dir_name("12.1a") == "121a"
    assert cache.arch_dir_name("12.1a 12.0f") == "120f_121a"
    with pytest.raises(ValueError):
        cache.arch_dir_name("12.1")


def test_cache_key_names_flashinfer_arch_toolkit_and_tvm_ffi_not_the_venv(tmp_path):
    root = tmp_path / "cache" / "flashinfer"
    d = KEY.module_dir(root, "12.1a", "sampling")
    assert d == root / "cuda-13.0.88_tvm-ffi-0.1.15.post2/.cache/flashinfer/0.7.0.post1/121a/cached_ops/sampling"
    others = {cache.CacheKey("0.7.1", "13.0.88", "0.1.15.post2").module_dir(root, "12.1a", "sampling"),
              cache.CacheKey("0.7.0.post1", "13.1.0", "0.1.15.post2").module_dir(root, "12.1a", "sampling"),
              cache.CacheKey("0.7.0.post1", "13.0.88", "0.1.16").module_dir(root, "12.1a", "sampling"),
              KEY.module_dir(root, "12.0f", "sampling")}
    assert d not in others and len(others) == 4
    assert "venv" not in str(d) and sys.prefix not in str(d)


def test_current_key_reads_this_environment(tmp_path):
    k = cache.current_key(os.environ)
    assert k.flashinfer == "0.7.0.post1" and k.tvm_ffi and k.nvcc.count(".") == 2
    with pytest.raises(cache.NoCacheKey, match="no working nvcc at .*set CUDA_HOME"):
        cache.current_key({"CUDA_HOME": str(tmp_path)})


def test_torch_cuda_version_is_read_without_importing_torch():
    import subprocess
    r = subprocess.run([sys.executable, "-c", "import sys; from gptoss_spark.flashinfer_jit.build import "
                        "torch_cuda_version as v; print(repr(v()), 'torch' in sys.modules)"],
                       capture_output=True, text=True, cwd=REPO, timeout=60)
    import torch
    assert r.stdout.split() == [repr(torch.version.cuda), "False"], r.stderr


# ---------------------------------------------------------------- build: progress, failure, no-op

def _fake_worker(calls, rc=0):
    def run(need, env, log, prefix, say):
        calls.append((need.module.name, env))
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_text("[1/1] link\n")
        if rc == 0:
            mdir = KEY.workspace_base(Path(env["FLASHINFER_WORKSPACE_BASE"]).parent).joinpath(
                ".cache", "flashinfer", KEY.flashinfer, cache.arch_dir_name(env["FLASHINFER_CUDA_ARCH_LIST"]),
                "cached_ops", need.module.name)
            mdir.mkdir(parents=True, exist_ok=True)
            (mdir / f"{need.module.name}.so").write_bytes(b"\x7fELF")
        return rc, 3 * GIB, 12.5
    return run


@pytest.fixture
def fixed_key(monkeypatch):
    monkeypatch.setattr(cache, "current_key", lambda environ=os.environ: KEY)
    monkeypatch.setattr(fb, "torch_cuda_version", lambda: "13.0")


def test_build_progress_total_and_second_run_is_a_no_op(tmp_path, monkeypatch, fixed_key):
    s = settings(tmp_path)
    calls, lines = [], []
    monkeypatch.setattr(fb, "_run_worker", _fake_worker(calls))
    report = fb.build(s, jobs=2, say=lines.append)
    assert [c[0] for c in calls] == ["sampling", "fp4_quantization_120f", "fused_moe_120"]   # smallest first
    env = calls[0][1]
    assert env["MAX_JOBS"] == "2" and env["FLASHINFER_CUDA_ARCH_LIST"] == "12.1a"
    assert env["FLASHINFER_NVCC_THREADS"] == "1" and env["CUDA_HOME"]
    assert env["XDG_CACHE_HOME"] == s.cache_env()["XDG_CACHE_HOME"]
    assert env["FLASHINFER_WORKSPACE_BASE"] == str(KEY.workspace_base(s.cache_dir / "flashinfer"))
    assert env["PATH"].split(os.pathsep)[0] == str(Path(sys.executable).parent)   # ninja
    text = "\n".join(lines)
    assert "3 for 12.1a, 2 job(s) (--jobs)" in text
    assert "[3/3] fused_moe_120 (12.1a, for plain, spec): building; log " in text
    assert "[1/3] sampling: built in 12.5 s, peak 3.0 GiB in one process" in text
    assert lines[-1].startswith("FlashInfer: 3 module(s) ready (3 built, 0 already there) in ")
    assert all(r.state == "built" for r in report.results)
    marker = json.loads((KEY.module_dir(s.cache_dir / "flashinfer", "12.1a", "sampling")
                         / cache.BUILT_MARKER).read_text())
    assert marker["nvcc"] == "13.0.88" and marker["peak_rss_bytes"] == 3 * GIB and marker["jobs"] == 2

    calls.clear()
    lines.clear()
    fb.build(s, jobs=2, say=lines.append)
    assert calls == []
    assert "  [2/3] fp4_quantization_120f (12.1a): already built" in lines
    assert lines[-1].startswith("FlashInfer: 3 module(s) ready (0 built, 3 already there)")


def test_a_so_without_our_marker_is_built_again(tmp_path, monkeypatch, fixed_key):
    """A .so the engine JIT-built (or a build killed before the marker) is not trusted as finished."""
    s = settings(tmp_path, profiles=("spec",))
    mdir = KEY.module_dir(s.cache_dir / "flashinfer", "12.1a", "sampling")
    mdir.mkdir(parents=True)
    (mdir / "sampling.so").write_bytes(b"")
    calls = []
    monkeypatch.setattr(fb, "_run_worker", _fake_worker(calls))
    fb.build(s, modules=["sampling"], jobs=1, say=lambda _: None)
    assert [c[0] for c in calls] == ["sampling"]


def test_failed_module_is_one_line_with_the_module_and_its_log(tmp_path, monkeypatch, fixed_key):
    s = settings(tmp_path)
    calls = []
    monkeypatch.setattr(fb, "_run_worker", _fake_worker(calls, rc=1))
    with pytest.raises(fb.FlashInferBuildError) as e:
        fb.build(s, jobs=1, say=lambda _: None)
    msg = str(e.value)
    log = fb.log_path(s, KEY, fb.Needed("12.1a", SAMPLING))
    assert msg == f"FlashInfer module sampling did not build (exit 1); see {log}"
    assert e.value.exit_code == EXIT_FLASHINFER == 27
    assert [c[0] for c in calls] == ["sampling"]        # stopped at the first failure
    assert not (KEY.module_dir(s.cache_dir / "flashinfer", "12.1a", "sampling") / cache.BUILT_MARKER).exists()


def test_unknown_module_and_missing_profiles_are_one_line_errors(tmp_path, fixed_key):
    s = settings(tmp_path)
    with pytest.raises(fb.FlashInferBuildError, match=r"^module\(s\) nope are not needed by the installed profiles "
                       r"\(they need: fused_moe_120, fp4_quantization_120f, sampling\)$"):
        fb.build(s, modules=["nope"], say=lambda _: None)
    empty = Settings.model_validate({"paths": {"state_dir": str(tmp_path / "st"),
                                               "profile_dirs": [str(tmp_path / "none")]}})
    with pytest.raises(fb.FlashInferBuildError, match="no profiles found in .*install the configuration first"):
        fb.build(empty, say=lambda _: None)


def test_arch_list_without_suffix_is_a_one_line_error(tmp_path, fixed_key):
    s = settings(tmp_path, profiles=("spec",))
    p = tmp_path / "profiles" / "spec.toml"
    p.write_text(p.read_text().replace('FLASHINFER_CUDA_ARCH_LIST = "12.1a"', 'FLASHINFER_CUDA_ARCH_LIST = "12.1"'))
    with pytest.raises(fb.FlashInferBuildError, match=r"spec.toml: engine.env.FLASHINFER_CUDA_ARCH_LIST: .*'12.1'.*12.1a"):
        fb.build(s, say=lambda _: None)


def test_no_toolkit_is_a_one_line_error(tmp_path, monkeypatch):
    monkeypatch.setenv("CUDA_HOME", str(tmp_path))
    with pytest.raises(fb.FlashInferBuildError, match=r"^cannot build FlashInfer modules: no working nvcc at "):
        fb.build(settings(tmp_path), say=lambda _: None)


# ---------------------------------------------------------------- link and status

def _built(s: Settings, name: str) -> Path:
    mdir = KEY.module_dir(s.cache_dir / "flashinfer", "12.1a", name)
    mdir.mkdir(parents=True, exist_ok=True)
    (mdir / f"{name}.so").write_bytes(b"")
    (mdir / cache.BUILT_MARKER).write_text("{}")
    return mdir


def test_link_points_flashinfers_aot_dir_at_the_built_modules(tmp_path, fixed_key):
    s = settings(tmp_path)
    aot = tmp_path / "venv-aot"
    with pytest.raises(fb.FlashInferBuildError, match=r"module fused_moe_120 is not built at .*flashinfer build"):
        fb.link(s, target=aot, say=lambda _: None)
    dirs = {n: _built(s, n) for n in ("fused_moe_120", "fp4_quantization_120f", "sampling")}
    aot.mkdir(exist_ok=True)
    os.symlink(tmp_path, aot / "old_module")      # ours from an earlier profile set: removed
    (aot / "kept.txt").write_text("")             # not a link of ours: left alone
    fb.link(s, target=aot, say=lambda _: None)
    assert {p.name for p in aot.iterdir()} == {*dirs, "kept.txt"}
    for n, d in dirs.items():
        assert (aot / n).resolve() == d.resolve() and (aot / n / f"{n}.so").is_file()


def test_status_and_doctor_list_each_module_of_the_active_profile(tmp_path, monkeypatch, fixed_key):
    s = settings(tmp_path)
    aot = tmp_path / "venv-aot"
    monkeypatch.setattr(fb, "aot_dir", lambda: aot)
    _built(s, "fused_moe_120")
    _built(s, "sampling")
    aot.mkdir()
    os.symlink(KEY.module_dir(s.cache_dir / "flashinfer", "12.1a", "sampling"), aot / "sampling")
    plain = shipped("plain")
    findings = check_flashinfer(s, plain)
    lines = [(f.level, f.detail) for f in findings]
    assert (OK, "sampling for 12.1a: built, linked into this venv") in lines
    assert any(lvl == WARN and d.startswith("fused_moe_120 for 12.1a: built at ") and "not linked" in d
               for lvl, d in lines)
    assert any(lvl == WARN and d.startswith("fp4_quantization_120f for 12.1a: missing") for lvl, d in lines)
    assert not any(lvl == WARN and "plain: attention" in d for lvl, d in lines)    # plain pins TRITON_ATTN
    assert any(lvl == OK and "cute-dsl" in d for lvl, d in lines)
    rows, _ = fb.status(s)
    assert {(r.profile, r.name, r.built, r.linked) for r in rows} >= {("spec", "sampling", True, True),
                                                                     ("spec", "fp4_quantization_120f", False, False)}


def test_doctor_on_a_venv_without_flashinfer_says_so_once(tmp_path, monkeypatch):
    monkeypatch.setattr(cache, "dist_version", lambda name: None)
    findings = check_flashinfer(settings(tmp_path), shipped("plain"))
    assert [(f.level, f.detail) for f in findings] == [
        (OK, "flashinfer-python is not in this venv (the CPU engine uses none)")]


# ---------------------------------------------------------------- the engine's environment

def test_engine_env_bounds_jit_and_finds_the_toolkit_ninja_and_the_keyed_cache(tmp_path, monkeypatch):
    monkeypatch.setattr(cache, "current_key", lambda environ=os.environ: KEY)
    s = Settings.model_validate({"paths": {"state_dir": str(tmp_path / "st")}})
    env = build_env(s, shipped("plain"), tmp_path / "tmp", base={"PATH": "/usr/bin:/bin"})
    assert env["CUDA_HOME"] == "/usr/local/cuda"
    assert env["PATH"] == f"{Path(sys.executable).parent}{os.pathsep}/usr/bin:/bin"
    assert env["FLASHINFER_WORKSPACE_BASE"] == str(KEY.workspace_base(tmp_path / "st" / "cache" / "flashinfer"))
    assert env["FLASHINFER_NVCC_THREADS"] == "1" and int(env["MAX_JOBS"]) >= 1
    assert env["FLASHINFER_CUDA_ARCH_LIST"] == "12.1a"          # the profile's own
    env = build_env(s, shipped("plain"), tmp_path / "tmp", base={"PATH": "/bin", "CUDA_HOME": "/opt/cuda-13"})
    assert env["CUDA_HOME"] == "/opt/cuda-13"


def test_engine_env_without_flashinfer_keeps_the_plain_workspace(tmp_path, monkeypatch):
    def none(environ=os.environ):
        raise cache.NoCacheKey("flashinfer-python is not installed in this environment")
    monkeypatch.setattr(cache, "current_key", none)
    s = Settings.model_validate({"paths": {"state_dir": str(tmp_path / "st")}})
    env = build_env(s, shipped("plain"), tmp_path / "tmp", base={"PATH": "/bin"})
    assert env["FLASHINFER_WORKSPACE_BASE"] == str(tmp_path / "st" / "cache" / "flashinfer")


# ---------------------------------------------------------------- the install step

class Runner:
    def __init__(self, fail_on: str | None = None):
        self.calls: list[list[str]] = []
        self.fail_on = fail_on

    def __call__(self, argv):
        argv = [str(a) for a in argv]
        self.calls.append(argv)
        return 1 if self.fail_on and self.fail_on in argv else 0


def test_install_step_builds_as_the_service_user_then_links_as_root(tmp_path):
    layout = Layout(root=tmp_path)
    layout.config_file.parent.mkdir(parents=True)
    layout.config_file.write_text("")
    venv = layout.venvs_dir / "v1"
    run = Runner()
    venvs.prebuild_flashinfer(layout, venv, cpu=False, run=run, log=lambda _: None)
    gs = str(venv / "bin" / "gptoss-spark")
    cfg = ["--config", str(layout.config_file)]
    assert run.calls == [[*venvs.AS_SERVICE, gs, "flashinfer", "build", *cfg], [gs, "flashinfer", "link", *cfg]]
    assert venvs.AS_SERVICE[:2] == ("setpriv", "--reuid=gptoss-spark")


@pytest.mark.parametrize("fail_on", ["build", "link"])
def test_install_step_failure_exits_27_and_says_the_previous_install_is_untouched(tmp_path, fail_on):
    layout = Layout(root=tmp_path)
    with pytest.raises(InstallError) as e:
        venvs.prebuild_flashinfer(layout, layout.venvs_dir / "v1", cpu=False, run=Runner(fail_on),
                                  log=lambda _: None)
    assert e.value.exit_code == EXIT_FLASHINFER and "previous install is untouched" in str(e.value)
    assert "\n" not in str(e.value)


def test_install_step_cpu_and_dry_run_run_nothing(tmp_path):
    layout = Layout(root=tmp_path)
    run, lines = Runner(), []
    venvs.prebuild_flashinfer(layout, layout.venvs_dir / "v1", cpu=True, run=run, log=lines.append)
    venvs.prebuild_flashinfer(layout, layout.venvs_dir / "v1", cpu=False, run=run, log=lines.append, dry_run=True)
    assert run.calls == []
    assert "skipped" in lines[0] and lines[1].startswith("  would compile the profiles' FlashInfer JIT modules as "
                                                         "gptoss-spark into /var/lib/gptoss-spark/cache/flashinfer")
