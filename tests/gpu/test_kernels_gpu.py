"""Fused MXFP4 MoE decode kernels on a CUDA GPU (device runs only; CI has no GPU and skips these).

Correctness at gpt-oss-120b and gpt-oss-20b shapes against the torch reference,
CUDA-graph capture and replay of the custom ops, torch.compile, the sm_121a
compile-only build, and that the AOT build leaves the JIT nothing to compile.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import triton
import triton.language as tl

from gptoss_spark.kernels.device.counted_sum import counted_add

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

REPO = Path(__file__).resolve().parents[2]
H = I = 2880


def make_block(e, m, top_k=4, bias=True, seed=0):
    from gptoss_spark import mxfp4
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(m, H, device="cuda", generator=g).bfloat16()
    rw = (torch.randn(e, H, device="cuda", generator=g) * 0.05).bfloat16()
    rb = (torch.randn(e, device="cuda", generator=g) * 0.5).bfloat16() if bias else None
    w13, s13 = mxfp4.random_mxfp4((e, 2 * I, H), device="cuda", generator=g, scale_exp=(118, 122))
    w2, s2 = mxfp4.random_mxfp4((e, H, I), device="cuda", generator=g, scale_exp=(118, 122))
    b13 = torch.randn(e, 2 * I, device="cuda", generator=g).bfloat16() if bias else None
    b2 = torch.randn(e, H, device="cuda", generator=g).bfloat16() if bias else None
    return x, rw, rb, w13, s13, b13, w2, s2, b2


def kernel_args(args):
    """Checkpoint-layout block (make_block) -> (x, rw, rb, experts repacked for the kernels on this GPU)."""
    from gptoss_spark.kernels.mxfp4_layout import SwizzledExperts
    x, rw, rb, w13, s13, b13, w2, s2, b2 = args
    return x, rw, rb, SwizzledExperts.from_checkpoint(w13, s13, b13, w2, s2, b2)


def op_args(args):
    """Checkpoint-layout block -> the custom ops' arguments: the repacked experts as six tensors."""
    x, rw, rb, sw = kernel_args(args)
    return (x, rw, rb, *sw.tensors())


def rel_err(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


@pytest.mark.parametrize("experts", [128, 32], ids=["120b", "20b"])
@pytest.mark.parametrize("m", [1, 2, 3, 4, 8, 16, 32])
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])
def test_moe_decode_matches_reference(experts, m, bias):
    from gptoss_spark.kernels import reference
    from gptoss_spark.kernels.moe import DecodeLaunches
    args = make_block(experts, m, bias=bias, seed=m + experts)
    call = DecodeLaunches(*kernel_args(args), 4)
    out, ids, weights = call.run(), call.ids, call.weights
    ref_ids, ref_w = reference.topk_softmax_ref(reference.router_logits_ref(args[0], args[1], args[2]), 4)
    assert torch.equal(ids, ref_ids)
    torch.testing.assert_close(weights, ref_w, rtol=1e-4, atol=1e-5)
    ref = reference.moe_block_ref(*args, 4)
    assert torch.isfinite(out).all()
    assert rel_err(out, ref) < 5e-3


@pytest.mark.parametrize("m", [1, 2, 4, 32])
def test_router_logits_op(m):
    import gptoss_spark.kernels.ops  # noqa: F401 - registers the ops
    from gptoss_spark.kernels import reference
    x, rw, rb, *_ = make_block(128, m)
    got = torch.ops.gptoss_spark.router_logits(x, rw, rb)
    torch.testing.assert_close(got, reference.router_logits_ref(x, rw, rb), rtol=1e-4, atol=1e-4)


def capture_graph(fn):
    """Warm fn up on a side stream (compiles, allocates), then capture it in a CUDA graph -> (graph, its output)."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = fn()
    return g, out


@pytest.mark.parametrize("m", [1, 4])  # 1: the few-token plan, whose arrival counters must reset per replay
def test_cuda_graph_capture_and_replay(m):
    import gptoss_spark.kernels.ops  # noqa: F401
    from gptoss_spark.kernels import reference
    ckpt = make_block(128, m)
    x, *rest = op_args(ckpt)
    static_x = x.clone()
    g, static_out = capture_graph(lambda: torch.ops.gptoss_spark.moe_decode(static_x, *rest, 4))
    router = rest[:2]
    for seed in (1, 2, 3):  # new inputs through the same graph: new routing, same launches
        static_x.copy_(torch.randn(x.shape, device="cuda", generator=torch.Generator("cuda").manual_seed(seed)))
        g.replay()
        torch.cuda.synchronize()
        ref = reference.moe_block_ref(static_x, *ckpt[1:], 4)
        assert rel_err(static_out, ref) < 5e-3
        assert router[0] is rest[0]


def test_torch_compile_fullgraph():
    import gptoss_spark.kernels.ops  # noqa: F401
    args = op_args(make_block(32, 2))

    def block(x, *w):
        return torch.ops.gptoss_spark.moe_decode(x * 1.0, *w, 4) + x

    eager = block(*args)
    compiled = torch.compile(block, fullgraph=True)(*args)
    torch.testing.assert_close(compiled, eager)


def test_compile_only_for_sm121a():
    from gptoss_spark.kernel_tools import aot
    from gptoss_spark.kernel_tools.variants import GPT_OSS_120B
    report = aot.build_compile_only("12.1a", shapes=(GPT_OSS_120B,))
    assert report.compiled and all(line.endswith("sm_121a") for line in report.compiled), report.compiled


def _serving_adds_no_cache_entry(tmp_path, build: str, serve: str) -> None:
    """Run build into a fresh Triton cache, then serve in a new process: serve must add no cache entry."""
    cache = tmp_path / "triton"
    env = {**os.environ, "TRITON_CACHE_DIR": str(cache), "PYTHONPATH": str(REPO)}
    subprocess.run([sys.executable, "-c", textwrap.dedent(build)], check=True, env=env)
    before = sorted(p.name for p in cache.iterdir())
    subprocess.run([sys.executable, "-c", textwrap.dedent(serve)], check=True, env=env)
    after = sorted(p.name for p in cache.iterdir())
    assert after == before, f"compiled at serve time: {set(after) - set(before)}"


# Prefill chunks: every pair block prefill_config_for picks on either layout; pair counts multiples of 16 and not.
SERVE_PREFILL = """
    for shape in MODEL_SHAPES:
        for m in (17, 37, 300, 500, 600, 1500):
            moe_block(*aot._dummy_inputs(shape, m, "cuda"), shape.top_k)
    torch.cuda.synchronize()
"""
SERVE_IMPORTS = """
    import torch
    from gptoss_spark.kernel_tools import aot
    from gptoss_spark.kernels.ops import moe_block, moe_decode, router_logits
    from gptoss_spark.kernel_tools.variants import MODEL_SHAPES
"""


def test_aot_build_leaves_nothing_to_compile(tmp_path):
    """Build into a fresh cache, then a new process serving both models' shapes adds no cache entry."""
    major, minor = torch.cuda.get_device_capability()
    build = f"""
        from pathlib import Path
        from gptoss_spark.kernel_tools import aot
        print(aot.build_warm("{major}.{minor}", Path({str(tmp_path / "triton")!r})).compiled)
    """
    serve = SERVE_IMPORTS + """
    for shape in MODEL_SHAPES:
        for m in (1, 2, 3, 7, 16, 17, 32):
            a = aot._dummy_inputs(shape, m, "cuda")
            moe_decode(*a, shape.top_k); router_logits(a[0], a[1], a[2])
""" + SERVE_PREFILL
    _serving_adds_no_cache_entry(tmp_path, build, serve)


def test_aot_prefill_launches_leave_nothing_to_compile(tmp_path):
    """The prefill part of the above in a minute: build_warm's prefill launches (each config once, at 17
    tokens), then prefill chunks of other lengths compile nothing (prefill_routing's kernels included)."""
    build = """
        import torch
        from gptoss_spark.kernel_tools import aot
        from gptoss_spark.kernels.device.moe_prefill import moe_prefill_block, prefill_configs
        from gptoss_spark.kernels.mxfp4_layout import SwizzledExperts, mma_layout_for
        from gptoss_spark.kernels.ops import DECODE_DISPATCH_TOKENS
        from gptoss_spark.kernel_tools.variants import MODEL_SHAPES
        mma = mma_layout_for("cuda")
        for shape in MODEL_SHAPES:
            x, rw, rb, *experts = aot._dummy_inputs(shape, DECODE_DISPATCH_TOKENS + 1, "cuda")
            for cfg in prefill_configs(mma):
                moe_prefill_block(x, rw, rb, SwizzledExperts(*experts, mma=mma), shape.top_k, config=cfg)
        torch.cuda.synchronize()
    """
    _serving_adds_no_cache_entry(tmp_path, build, SERVE_IMPORTS + SERVE_PREFILL)


@pytest.mark.parametrize("decode", [1, 2])
@pytest.mark.parametrize("m", [1, 4, 32])
def test_decode_variants_match_reference(decode, m):
    """Each MXFP4 decode variant (mxfp4_decode.py) at gpt-oss-120b shapes."""
    from dataclasses import replace

    from gptoss_spark.kernels import reference
    from gptoss_spark.kernels.moe import DEFAULT_CONFIG, DecodeLaunches
    args = make_block(128, m, seed=100 + m)
    out = DecodeLaunches(*kernel_args(args), 4, replace(DEFAULT_CONFIG, decode=decode)).run()
    assert rel_err(out, reference.moe_block_ref(*args, 4)) < 5e-3


@pytest.mark.parametrize("m,change", [(2, {"gate_up_half_rows_max": 2}), (1, {"gate_up_half_rows_max": 0}),
                                      (1, {"down_k_parts": False, "gate_up_half_rows_max": 0}),
                                      (1, {"pdl": False}), (8, {"pdl": False}),
                                      (1, {"topk_in_gate_up_max": 0}), (4, {"topk_in_gate_up_max": 4})])
def test_launch_plan_options_match_reference(m, change):
    """The launch plans the benchmark sweeps (moe.launch_plan), beyond the default's."""
    from dataclasses import replace

    from gptoss_spark.kernels import reference
    from gptoss_spark.kernels.moe import DEFAULT_CONFIG, DecodeLaunches
    args = make_block(128, m, seed=300 + m)
    out = DecodeLaunches(*kernel_args(args), 4, replace(DEFAULT_CONFIG, **change)).run()
    assert rel_err(out, reference.moe_block_ref(*args, 4)) < 5e-3


def test_mma_sync_layout_matches_reference():
    """Layout version 2 (mma.sync, what GB10 runs) on this GPU: Triton's wgmma disabled in a child process."""
    code = textwrap.dedent("""
        import torch
        from tests.gpu.test_kernels_gpu import kernel_args, make_block, rel_err
        from gptoss_spark.kernels import reference
        from gptoss_spark.kernels.moe import fused_moe_decode
        from gptoss_spark.kernels.mxfp4_layout import mma_layout_for
        assert mma_layout_for("cuda") == 2
        for m in (1, 3, 8, 9, 32):  # tiles of 8 token columns up to 8 tokens (moe.launch_plan), then 16, 32
            args = make_block(128, m, seed=200 + m)
            err = rel_err(fused_moe_decode(*kernel_args(args), 4), reference.moe_block_ref(*args, 4))
            assert err < 5e-3, (m, err)
        print("ok")
    """)
    env = {**os.environ, "DISABLE_MMA_V3": "1", "PYTHONPATH": str(REPO)}
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, cwd=REPO)
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stdout[-3000:] + r.stderr[-3000:]


def test_pdl_layers_chained_in_a_cuda_graph():
    """Programmatic dependent launch (pdl.py): each kernel's programs start during the previous
    kernel's tail and wait for its results. Two layers chained in one CUDA graph, the second
    reading the first's output, replayed on new inputs: right only if every wait is where the
    results are first read."""
    from dataclasses import replace

    from gptoss_spark.kernels import reference
    from gptoss_spark.kernels.moe import DEFAULT_CONFIG, DecodeLaunches
    cfg = replace(DEFAULT_CONFIG, pdl=True)
    blocks = [make_block(128, 1, seed=500 + i) for i in range(2)]
    weights = [kernel_args(b)[1:] for b in blocks]
    static_x = blocks[0][0].clone()

    def two_layers():
        return DecodeLaunches(DecodeLaunches(static_x, *weights[0], 4, cfg).run(), *weights[1], 4, cfg).run()

    g, static_out = capture_graph(two_layers)
    for seed in (1, 2, 3):
        static_x.copy_(torch.randn(static_x.shape, device="cuda", generator=torch.Generator("cuda").manual_seed(seed)))
        g.replay()
        torch.cuda.synchronize()
        mid = reference.moe_block_ref(static_x, *blocks[0][1:], 4)
        ref = reference.moe_block_ref(mid, *blocks[1][1:], 4)
        assert rel_err(static_out, ref) < 1e-2


@triton.jit
def counted_add_kernel(values_ptr, sums_ptr, last_ptr, total_ptr, E: tl.constexpr, N: tl.constexpr,
                       BLOCK: tl.constexpr):
    """A grid of N programs x E / BLOCK, program (p, b) adding block b of row p of values [N, E]
    (counted_sum.counted_add with its PTX add)."""
    p = tl.program_id(0)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    last, total = counted_add(sums_ptr + offs, tl.load(values_ptr + p * E + offs), offs < E, N, False)
    tl.store(last_ptr + p * E + offs, last.to(tl.int8))
    tl.store(total_ptr + p * E + offs, total)


def test_counted_sums_on_the_gpu():
    """down's sum across programs (counted_sum.py) with the programs' adds racing on a GPU: one last
    add per element, the exact fixed-point sum rounded once (the same bits every run, whichever
    program came last), NaN for NaN / infinite / out-of-range values, the words zero afterwards."""
    n, e, block = 15, 1 << 16, 1024
    g = torch.Generator(device="cuda").manual_seed(7)
    values = torch.randn(n, e, device="cuda", generator=g) * torch.logspace(-3, 7, e, device="cuda")
    values[3, 100], values[9, 200], values[0, 300] = float("nan"), float("inf"), -1e8
    exact = (torch.trunc(values.double() * 2 ** 24).long().sum(0).float() * 2 ** -24)
    bad = torch.zeros(e, dtype=torch.bool, device="cuda")
    bad[[100, 200, 300]] = True
    sums = torch.zeros(e, dtype=torch.int64, device="cuda")
    for _ in range(5):
        last = torch.zeros(n, e, dtype=torch.int8, device="cuda")
        total = torch.zeros(n, e, device="cuda")
        counted_add_kernel[(n, e // block)](values, sums, last, total, E=e, N=n, BLOCK=block)
        torch.cuda.synchronize()
        assert torch.equal(sums, torch.zeros_like(sums))
        assert torch.equal(last.sum(0), torch.ones(e, dtype=torch.int64, device="cuda"))
        got = total.gather(0, last.argmax(0, keepdim=True).long())[0]
        assert torch.equal(got[~bad], exact[~bad])
        assert got[bad].isnan().all()


@pytest.mark.parametrize("m", [1, 8])
def test_moe_decode_is_the_same_bits_every_run(m):
    """down's programs add their shares in whatever order they finish; the output must not depend on it."""
    from gptoss_spark.kernels.moe import fused_moe_decode
    args = kernel_args(make_block(128, m, seed=900 + m))
    first = fused_moe_decode(*args, 4)
    for _ in range(20):
        assert torch.equal(fused_moe_decode(*args, 4).view(torch.int16), first.view(torch.int16))


@pytest.mark.parametrize("experts", [128, 32], ids=["120b", "20b"])
@pytest.mark.parametrize("m", [17, 33, 300, 600, 1500])
def test_prefill_matches_reference(experts, m):
    """More than 16 tokens: the op takes the prefill kernels (moe_prefill.py, tokens grouped by expert),
    at token counts that get each pair block (prefill_config_for) on either layout."""
    import gptoss_spark.kernels.ops  # noqa: F401
    from gptoss_spark.kernels import reference
    args = make_block(experts, m, seed=700 + m + experts)
    out = torch.ops.gptoss_spark.moe_block(*op_args(args), 4)
    assert rel_err(out, reference.moe_block_ref(*args, 4)) < 5e-3


@pytest.mark.parametrize("experts", [128, 32], ids=["120b", "20b"])
@pytest.mark.parametrize("m", [17, 300, 1500])
def test_prefill_routing_matches_reference(experts, m):
    """prefill_routing at gpt-oss shapes: the reference's top-4 and weights (fp32 logits), its block tables."""
    from gptoss_spark.kernels import reference
    from gptoss_spark.kernels.device import prefill_routing
    from gptoss_spark.kernels.device.moe_prefill import prefill_config_for
    x, rw, rb, *_ = make_block(experts, m, seed=900 + m)
    ids, weights, counts = prefill_routing.route(x, rw, rb, 4)
    ref_ids, ref_w = reference.topk_softmax_ref(reference.router_logits_ref(x, rw, rb), 4)
    same = (ids == ref_ids).all(dim=1)
    assert same.float().mean() > 0.99  # a near tie may swap two picks under a different summation order
    torch.testing.assert_close(weights[same], ref_w[same], rtol=1e-4, atol=1e-5)
    assert torch.equal(counts, torch.bincount(ids.flatten().long(), minlength=experts).int())
    block_m = prefill_config_for(m, 2).block_m
    pairs, block_expert = prefill_routing.align(ids, counts, block_m)
    ref_pairs, ref_blocks = reference.align_pairs_ref(ids, experts, block_m)
    used = int((ref_blocks >= 0).sum()) * block_m
    assert torch.equal(block_expert, ref_blocks) and torch.equal(pairs[:used], ref_pairs[:used])


def test_prefill_in_a_cuda_graph():
    """vLLM captures batches past 16 tokens too: the prefill path (prefill_routing's router, align and
    combine, the two expert kernels) holds no host sync, so a captured graph replays right on new inputs."""
    import gptoss_spark.kernels.ops  # noqa: F401
    from gptoss_spark.kernels import reference
    ckpt = make_block(128, 64, seed=64)
    x, *rest = op_args(ckpt)
    static_x = x.clone()
    g, static_out = capture_graph(lambda: torch.ops.gptoss_spark.moe_block(static_x, *rest, 4))
    for seed in (1, 2):
        static_x.copy_(torch.randn(x.shape, device="cuda", generator=torch.Generator("cuda").manual_seed(seed)))
        g.replay()
        torch.cuda.synchronize()
        assert rel_err(static_out, reference.moe_block_ref(static_x, *ckpt[1:], 4)) < 5e-3
