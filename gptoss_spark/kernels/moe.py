"""Host side of the fused decode MoE: shapes, launch configs, and the three launches per layer.

  1. router_logits_kernel  x @ Wr^T as K-split partials; from 3 tokens its
                           last program does top-k + softmax and lists
                           the experts                                    (router_logits.py, routing.py)
  2. moe_gate_up_kernel    gate_up, bias, SwiGLU -> h; at 1 and 2 tokens
                           each program takes the top-k itself, and at one
                           token 32 features per program (half rows)     (moe_gate_up.py)
  3. moe_down_kernel       down, bias, routing-weighted sum -> y; with a
                           split, the programs' shares are added by
                           counted fixed-point atomics (one token) or by
                           each row block's last program                  (moe_down.py, counted_sum.py)
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton

from .device.counted_sum import MAX_ADDS
from .device.moe_down import moe_down_kernel
from .device.moe_gate_up import moe_gate_up_kernel
from .device.pdl import pdl_launch
from .device.router_logits import k_split, m_pad_for, router_logits_partial, topk_rows_for
from .mxfp4_layout import BLOCK_BYTES, SCALE_BLOCK_BYTES, SwizzledExperts, mma_layout_for
from .runtime import interpreting

MAX_DECODE_TOKENS = 32


@dataclass(frozen=True)
class MoeLaunchConfig:
    """Tile sizes and launch-plan switches. The defaults come from sweeps on an H200 (bench_moe.py
    --sweep / --variants; docs/KERNELS.md); the target is GB10, where they are still to be re-tuned
    (48 SMs, ~100 KB of shared memory per SM: docs/HARDWARE.md).

    The expert kernels always use 4 warps (one warpgroup: 64 weight rows per
    tensor-core tile, the layout of mxfp4_layout.py); *_c is how many 64-k
    blocks one loop iteration takes.
    """
    router_split_k: int = 15  # with the top-k in gate_up at <= 2 tokens, 0.5-0.9 us faster at one token than 9 (H200)
    router_topk_min_rows: int = 4  # router_logits.topk_rows_for
    # Token columns of the expert kernels' tensor-core tile up to 8 tokens on layout 2 (mma.sync,
    # GB10's): mma.sync's own n8 width. 16 (the wgmma minimum) cost 4.5 to 6 us at one token and
    # 11 to 30 us at 2 to 8 on the H200. Layout 3 (wgmma) always takes 16 (launch_plan).
    mma_sync_m_pad: int = 8
    # Fewest token columns of the router's tile (16 rows of experts: mma.sync on every GPU). 8 was
    # within noise of 16 at 1 to 8 tokens on both layouts (H200).
    router_m_pad: int = 16
    router_block_e: int = 16
    router_block_k: int = 64
    gate_up_c: int = 4
    gate_up_stages: int = 3
    down_c: int = 4
    down_stages: int = 3
    down_split: int = 8  # >1: work split over programs whose shares are summed (<= counted_sum.MAX_ADDS)
    # Few tokens select few experts: too few programs, each a long chain of dependent loads
    # (launch_plan). Up to this many tokens each gate_up program takes 32 gate and 32 up features
    # instead of 64 (twice the programs, moe_gate_up.py); 0: never. At 2 tokens it cost
    # 1.5 us (layout 2) and 4 us (layout 3) on the H200.
    gate_up_half_rows_max: int = 1
    # When fewer experts can be selected than the down split, its spare programs take shares of K.
    down_k_parts: bool = True
    # Up to this many tokens every gate_up program takes the top-k itself from the router's partial
    # logits, and the router ends without its last program's serial top-k (routing.py); 0: never.
    topk_in_gate_up_max: int = 2
    # At one token (with the top-k in gate_up) gate_up's slot s takes the token's pick s instead of
    # the s-th selected expert in index order: no used-expert list, scan or token match before the
    # loop (moe_gate_up.py): -1.4 us per layer at one token on layout 2, -0.9 on layout 3 (H200).
    slots_by_pick: bool = True
    # Programmatic dependent launch between the three kernels (pdl.py): each launches the next after
    # its loop and waits for the previous one before its first read of it: 1.2 to 1.7 us per layer
    # faster at M = 1, 2, 4 and 8 (H200).
    pdl: bool = True
    # mxfp4_decode.py: 1 portable (interpreter), 2 inline PTX (GPU only)
    decode: int = 2
    # Up to this many tokens down's programs sum their shares by counted fixed-point atomics
    # (counted_sum.py, one L2 round trip), above it by partials and a last-to-arrive sum (three);
    # 0: never. On the H200: -0.2 to -0.7 us per layer at one token on both layouts, none at 2,
    # and up to +8 % from 8 tokens on layout 2, where the atomics grow with the token columns.
    down_counted_max: int = 1
    # ptxas's register cap for down with counted sums on layout 3 (wgmma; the launch option
    # maxnreg), 0: none. 168 registers hold 3 programs of 4 warps in an SM's 65536. Triton 3.6 gave
    # the counted down 170 at one token (the partials' 168): 2 programs per SM, +4 us per layer.
    # Capped at 168 it spills 6 words, in the epilogue.
    down_counted_maxnreg_layout3: int = 168

    def __post_init__(self):
        if not 1 <= self.down_split <= MAX_ADDS:
            raise ValueError(f"down_split {self.down_split}: must be 1..{MAX_ADDS}, the adds one word of "
                             f"down's counted sums counts (counted_sum.COUNT_BITS)")


EXPERT_WARPS = 4

DEFAULT_CONFIG = MoeLaunchConfig()


@dataclass(frozen=True)
class LaunchPlan:
    """What a call with m tokens compiles and launches: each distinct plan is one set of kernel variants."""
    m_pad: int            # token columns of the expert kernels' tensor-core tile (8, 16 or 32)
    topk_rows: int        # rows of the router's top-k tile (router_logits.topk_rows_for)
    gate_up_half_rows: bool  # gate_up's programs take 32 features, not 64 (config.gate_up_half_rows_max)
    down_k_parts: int     # shares of K per expert among the down split's programs
    router_m_pad: int     # token columns of the router's tile (router_logits.m_pad_for: 8, 16 or 32)
    topk_in_gate_up: bool  # gate_up's programs take the top-k (config.topk_in_gate_up_max), not the router
    slots_by_pick: bool   # one token, top-k in gate_up: slot s is the token's pick s (config.slots_by_pick)
    down_counted: bool    # down sums its programs' shares by counted atomics (config.down_counted_max)


def launch_plan(m: int, top_k: int, config: MoeLaunchConfig = DEFAULT_CONFIG, mma: int = 3) -> LaunchPlan:
    """The variants m tokens run with, for experts repacked in layout mma (mxfp4_layout.mma_layout_for).

    m tokens select at most m * top_k experts; when that is below the down split,
    the split's spare programs would idle, so they share K instead (a power of two
    that divides the split); gate_up's programs take half rows instead
    (config.gate_up_half_rows_max). On layout 2
    (mma.sync) the expert kernels' tile has as few as config.mma_sync_m_pad token
    columns; on layout 3 at least 16: below that Triton gives up wgmma for
    mma.sync and moves the decoded tile through shared memory to its layout.
    """
    parts = 1
    if config.down_k_parts:
        while config.down_split % (2 * parts) == 0 and 2 * parts * m * top_k <= config.down_split:
            parts *= 2
    m_pad = m_pad_for(m, config.mma_sync_m_pad if mma == 2 else 16)
    topk_in_gate_up = m <= config.topk_in_gate_up_max
    return LaunchPlan(m_pad, topk_rows_for(m, config.router_topk_min_rows), m <= config.gate_up_half_rows_max,
                      parts, m_pad_for(m, config.router_m_pad), topk_in_gate_up,
                      m == 1 and topk_in_gate_up and config.slots_by_pick,
                      config.down_split > 1 and m <= config.down_counted_max)


def router_options(plan: LaunchPlan, config: MoeLaunchConfig) -> dict:
    """router_logits_partial's tile arguments for a plan (fused_moe_decode and aot.compile_variants)."""
    return dict(split_k=config.router_split_k, block_e=config.router_block_e, block_k=config.router_block_k,
                topk_rows=plan.topk_rows, m_pad=plan.router_m_pad)


def expert_launch_kwargs(plan: LaunchPlan, config: MoeLaunchConfig, h: int, i: int, e: int, top_k: int,
                         gate_up_bias: bool, down_bias: bool, mma: int, decode: int, interpret: bool, pdl: bool,
                         router_splits: int) -> tuple[dict, dict]:
    """The constexprs and launch options of (gate_up, down) for a plan.

    fused_moe_decode launches with them and aot.compile_variants compiles them, so the
    compile-only check builds exactly the binaries that run. router_splits: the router's
    programs along K (its partial logits that gate_up sums when it takes the top-k).
    """
    common = dict(H=h, I=i, TOPK=top_k, M_PAD=plan.m_pad, MMA=mma, DECODE=decode, INTERPRET=interpret,
                  num_warps=EXPERT_WARPS, **pdl_launch(pdl))
    gate_up = dict(common, HAS_BIAS=gate_up_bias, C=config.gate_up_c, HALF_ROWS=plan.gate_up_half_rows,
                   ROUTE=plan.topk_in_gate_up, N_SPLIT=router_splits, E_PAD=triton.next_power_of_2(e),
                   TOPK_ROWS=plan.topk_rows, SLOTS_BY_PICK=plan.slots_by_pick, num_stages=config.gate_up_stages)
    down = dict(common, HAS_BIAS=down_bias, C=config.down_c, SPLIT=config.down_split, K_PARTS=plan.down_k_parts,
                num_stages=config.down_stages)
    if plan.down_counted:
        down["COUNTED"] = True
        if mma == 3 and config.down_counted_maxnreg_layout3 and not interpret:  # a ptxas option
            down["maxnreg"] = config.down_counted_maxnreg_layout3
    return gate_up, down


def distinct_plans(top_k: int, config: MoeLaunchConfig = DEFAULT_CONFIG, mma: int = 3) -> dict[LaunchPlan, int]:
    """Every plan 1..MAX_DECODE_TOKENS tokens can take -> the fewest tokens that take it (the AOT build's list)."""
    plans: dict[LaunchPlan, int] = {}
    for m in range(1, MAX_DECODE_TOKENS + 1):
        plans.setdefault(launch_plan(m, top_k, config, mma), m)
    return plans


_COUNTERS: dict[torch.device, torch.Tensor] = {}
ROUTER_COUNTER = 0      # the router kernel's arrival counter
DOWN_COUNTERS = 1       # then one per down row block (H / 64 <= 127)
N_COUNTERS = 128
_SUMS: dict[tuple[torch.device, int], torch.Tensor] = {}


def _counters(device: torch.device) -> torch.Tensor:
    """The kernels' arrival counters: zero between calls (each last program resets its own).

    One buffer per device, allocated at the first (eager, warm-up) call so that
    CUDA graphs captured later use the same memory. Layers run one after another
    on one stream, so one set serves them all.
    """
    if device not in _COUNTERS:
        _COUNTERS[device] = torch.zeros((N_COUNTERS,), dtype=torch.int32, device=device)
    return _COUNTERS[device]


def _sums(device: torch.device, hidden: int) -> torch.Tensor:
    """down's counted fixed-point sums (counted_sum.py), [MAX_DECODE_TOKENS, hidden] int64.

    Zero between calls: each element's last add zeroes its word. Per device and hidden size,
    allocated at the first call, as _counters.
    """
    key = (device, hidden)
    if key not in _SUMS:
        _SUMS[key] = torch.zeros((MAX_DECODE_TOKENS, hidden), dtype=torch.int64, device=device)
    return _SUMS[key]


_LAYOUTS: dict[torch.device, int] = {}


def layout_version(device: torch.device) -> int:
    """The layout version the experts were repacked with on this device (fixed per process)."""
    if device not in _LAYOUTS:
        _LAYOUTS[device] = mma_layout_for(device)
    return _LAYOUTS[device]


def check_shapes(x, router_w, experts: SwizzledExperts, top_k: int) -> tuple[int, int, int, int]:
    """Shapes of the kernels' layout (mxfp4_layout.SwizzledExperts) -> (M, H, E, I)."""
    m, h = x.shape
    e = router_w.shape[0]
    if not 1 <= m <= MAX_DECODE_TOKENS:
        raise ValueError(f"fused decode MoE takes 1..{MAX_DECODE_TOKENS} tokens, got {m}")
    w13, s13, w2, s2 = experts.w13, experts.s13, experts.w2, experts.s2
    i = experts.intermediate
    if (w13.shape != (e, 2 * i // 64, h // 64, BLOCK_BYTES) or s13.shape != (e, 2 * i // 64, h // 64, SCALE_BLOCK_BYTES)
            or w2.shape != (e, h // 64, i // 64, BLOCK_BYTES) or s2.shape != (e, h // 64, i // 64, SCALE_BLOCK_BYTES)):
        raise ValueError(f"expert tensors {tuple(w13.shape)}/{tuple(s13.shape)}/{tuple(w2.shape)}/{tuple(s2.shape)} "
                         f"are not the kernels' layout for E={e} H={h} (repack with mxfp4_layout.SwizzledExperts)")
    if h // 64 > N_COUNTERS - DOWN_COUNTERS:
        raise ValueError(f"hidden {h}: more row blocks than the kernels' arrival counters cover (moe.N_COUNTERS)")
    if top_k not in (1, 2, 4, 8) or top_k > e:
        raise ValueError(f"top_k must be a power of two <= {e}, got {top_k}")
    return m, h, e, i


class DecodeLaunches:
    """One call of the decode MoE for 1..32 tokens as its three launches, run in order:
    router(), gate_up(), down() -> [M, H] bf16 (the module docstring says what each does).

    fused_moe_decode runs all three with DEFAULT_CONFIG. The benchmark composes them itself to
    time the stages (kernel_tools.benchmark.decode_stages) and to sweep launch configs; the tests
    pick the config and read the routing the kernels wrote, `ids` [M, top_k] int32 and `weights`
    [M, top_k] fp32, after the launch that writes it (the router's last program, or gate_up's
    programs when the plan puts the top-k there). The layout version is the experts' own
    (SwizzledExperts.mma: the interpreter has no device to ask).
    """

    def __init__(self, x: torch.Tensor, router_w: torch.Tensor, router_b: torch.Tensor | None,
                 experts: SwizzledExperts, top_k: int, config: MoeLaunchConfig = DEFAULT_CONFIG):
        self.m, self.h, self.e, self.i = m, h, e, i = check_shapes(x, router_w, experts, top_k)
        self.x = x = x.contiguous()
        self.router_w, self.router_b = router_w, router_b
        self.swizzled = experts
        self.top_k, self.config = top_k, config
        self.dev = dev = x.device
        interp = interpreting()
        decode = 1 if interp else config.decode  # no PTX in the interpreter
        self.mma = mma = experts.mma
        self.plan = plan = launch_plan(m, top_k, config, mma)
        self.pdl = config.pdl and not interp  # (griddepcontrol is PTX: not in the interpreter)
        # gate_up sums the router's partial logits: as many as router_logits_partial splits K into.
        router_splits = k_split(h, config.router_split_k, config.router_block_k)[1]
        self.gate_up_kw, self.down_kw = expert_launch_kwargs(plan, config, h, i, e, top_k, experts.b13 is not None,
                                                             experts.b2 is not None, mma, decode, interp, self.pdl,
                                                             router_splits)
        self.h_buf = torch.empty((m, top_k, i), dtype=torch.bfloat16, device=dev)
        self.ids = torch.empty((m, top_k), dtype=torch.int32, device=dev)
        self.weights = torch.empty((m, top_k), dtype=torch.float32, device=dev)
        # down reads its first slot early
        self.experts = torch.empty((max(e, config.down_split),), dtype=torch.int32, device=dev)
        self.n_experts = torch.empty((1,), dtype=torch.int32, device=dev)
        self.logits: torch.Tensor | None = None

    def router(self) -> None:
        """Launch 1: the router's partial logits; with the top-k in the router, also ids and weights."""
        routing = None if self.plan.topk_in_gate_up else (self.ids, self.weights, self.experts, self.n_experts,
                                                          _counters(self.dev)[ROUTER_COUNTER:])
        self.logits = router_logits_partial(self.x, self.router_w, self.router_b, routing=routing, top_k=self.top_k,
                                            pdl=self.pdl, **router_options(self.plan, self.config))

    def gate_up(self) -> None:
        """Launch 2: h = SwiGLU(x @ W13^T + b13) per selected expert (after router())."""
        x, sw = self.x, self.swizzled
        dummy = x  # stands in for absent biases and unused buffers; never read
        slots = min(self.e, self.m * self.top_k)
        moe_gate_up_kernel[(self.i // (32 if self.plan.gate_up_half_rows else 64), slots)](
            x, sw.w13, sw.s13, sw.b13 if sw.b13 is not None else dummy,
            self.h_buf, self.ids, self.experts, self.n_experts, self.logits, self.weights,
            self.m, x.stride(0), self.e, **self.gate_up_kw)

    def down(self) -> torch.Tensor:
        """Launch 3: y = sum over the picks of weight * (h @ W2^T + b2) -> [M, H] bf16 (after gate_up())."""
        m, h, dev, sw = self.m, self.h, self.dev, self.swizzled
        out = torch.empty((m, h), dtype=torch.bfloat16, device=dev)
        split = self.config.down_split
        # Unused buffers get stand-ins of their own dtype: a pointer's dtype is part of the compiled
        # variant, and the AOT build declares them so (aot.variant_jobs).
        if split == 1:
            partial_out = out
        elif self.plan.down_counted:
            partial_out = self.weights  # fp32, never touched by the counted sums
        else:
            partial_out = torch.empty((split, m, h), dtype=torch.float32, device=dev)
        moe_down_kernel[(h // 64, split)](
            self.h_buf, self.ids, self.weights, self.experts, self.n_experts,
            sw.w2, sw.s2, sw.b2 if sw.b2 is not None else self.x, out, partial_out, _counters(dev)[DOWN_COUNTERS:],
            _sums(dev, h), m, out.stride(0), **self.down_kw)
        return out

    def run(self) -> torch.Tensor:
        """All three launches: the block's output [M, H] bf16."""
        self.router()
        self.gate_up()
        return self.down()


def fused_moe_decode(x: torch.Tensor, router_w: torch.Tensor, router_b: torch.Tensor | None,
                     experts: SwizzledExperts, top_k: int) -> torch.Tensor:
    """gpt-oss MoE block for 1..32 decode tokens: x [M, H] bf16 -> [M, H] bf16 (see reference.moe_block_ref).

    Experts repacked for this device's layout version (SwizzledExperts.from_checkpoint, mma_layout_for).
    What the custom ops (ops.py), and so the vLLM plugin, call; DecodeLaunches has the stages one by one.
    """
    return DecodeLaunches(x, router_w, router_b, experts, top_k).run()
