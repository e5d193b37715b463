"""Ahead-of-time build: compile every variant into the Triton cache the engine will use.

Two modes:
  warm (default, on the target GPU): launch each variant once on dummy tensors
      with TRITON_CACHE_DIR pointing at the service's cache. The JIT compiles
      exactly the binaries, under exactly the cache keys, that the engine will
      look up, so a first start compiles nothing.
  compile-only (--compile-only, no GPU needed): triton.compile() each kernel
      for the requested arch (e.g. sm_121a) and discard the result. Proves the
      sources build for that target; CI and the device run this.
"""

from __future__ import annotations

import importlib
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from ..base.errors import UserError
from ..base.exit_codes import EXIT_TOOLKIT
from .variants import MODEL_SHAPES, MoeShape, token_counts


class ToolchainError(UserError):
    exit_code = EXIT_TOOLKIT


def parse_arch(arch: str) -> tuple[int, int, bool]:
    """'12.1a' -> (12, 1, True); '9.0' -> (9, 0, False)."""
    a = arch.strip().lower()
    suffix = a.endswith("a")
    try:
        major, minor = a.rstrip("a").split(".")
        return int(major), int(minor), suffix
    except ValueError:
        raise UserError(f"--arch {arch!r}: expected MAJOR.MINOR[a], e.g. 12.1a") from None


def require_toolchain() -> None:
    """One-line error naming what is missing: the build needs torch and triton importable."""
    for mod in ("torch", "triton"):
        try:
            importlib.import_module(mod)
        except ImportError as e:
            raise ToolchainError(f"kernels build needs Python package '{mod}' ({e}); "
                                 "install the engine extra (pip install 'gptoss-spark[spark]')") from None


@dataclass
class BuildReport:
    mode: str
    target: str
    compiled: list[str]
    cache_dir: Path | None


def _dummy_inputs(shape: MoeShape, m: int, device):
    import torch
    e, h, i = shape.experts, shape.hidden, shape.intermediate
    g = torch.Generator(device="cpu").manual_seed(0)
    x = torch.randn(m, h, generator=g).to(device, torch.bfloat16)
    rw = torch.randn(e, h, generator=g).to(device, torch.bfloat16)
    rb = torch.randn(e, generator=g).to(device, torch.bfloat16) if shape.has_bias else None
    from ..kernels.mxfp4_layout import BLOCK_BYTES, SCALE_BLOCK_BYTES
    u8 = lambda *s: torch.randint(0, 256, s, dtype=torch.uint8, generator=g).to(device)
    sc = lambda *s: torch.randint(118, 125, s, dtype=torch.uint8, generator=g).to(device)
    # The kernels' layout (mxfp4_layout.py); the values need not be a real repack to compile.
    w13, s13 = u8(e, 2 * i // 64, h // 64, BLOCK_BYTES), sc(e, 2 * i // 64, h // 64, SCALE_BLOCK_BYTES)
    w2, s2 = u8(e, h // 64, i // 64, BLOCK_BYTES), sc(e, h // 64, i // 64, SCALE_BLOCK_BYTES)
    b13 = torch.zeros(e, 2 * i, device=device, dtype=torch.bfloat16) if shape.has_bias else None
    b2 = torch.zeros(e, h, device=device, dtype=torch.bfloat16) if shape.has_bias else None
    return x, rw, rb, w13, s13, b13, w2, s2, b2


def build_warm(arch: str, cache_dir: Path, shapes=MODEL_SHAPES) -> BuildReport:
    """Launch every variant on this GPU so the Triton cache at cache_dir holds them all."""
    require_toolchain()
    import torch
    if not torch.cuda.is_available():
        raise ToolchainError(f"kernels build --arch {arch} needs a CUDA GPU (torch sees none); "
                             "use --compile-only to only check that the kernels compile")
    major, minor, _ = parse_arch(arch)
    have = torch.cuda.get_device_capability()
    if have != (major, minor):
        raise ToolchainError(f"kernels build --arch {arch}: this GPU is sm_{have[0]}{have[1]}, not sm_{major}{minor}; "
                             "run it on the target machine or use --compile-only")
    cache_dir.mkdir(parents=True, exist_ok=True)
    # Triton reads its cache dir when the cache manager is first used: set it before any compile.
    os.environ["TRITON_CACHE_DIR"] = str(cache_dir)
    from ..kernels.device.moe_prefill import moe_prefill_block, prefill_configs
    from ..kernels.mxfp4_layout import SwizzledExperts, mma_layout_for
    from ..kernels.ops import DECODE_DISPATCH_TOKENS, moe_decode, router_logits
    mma = mma_layout_for("cuda")
    compiled = []
    for shape in shapes:
        for m in token_counts(shape, mma):
            args = _dummy_inputs(shape, m, "cuda")
            moe_decode(*args, shape.top_k)
            router_logits(args[0], args[1], args[2])
            compiled.append(f"{shape.name} {_plan_name(shape, m, mma)}")
        # Prefill: one binary per kernel and tile config serves every length (its pair count is not
        # specialized); prefill_config_for picks the config by token count.
        x, rw, rb, *experts = _dummy_inputs(shape, DECODE_DISPATCH_TOKENS + 1, "cuda")
        for cfg in prefill_configs(mma):
            moe_prefill_block(x, rw, rb, SwizzledExperts(*experts, mma=mma), shape.top_k, config=cfg)
            compiled.append(f"{shape.name} prefill block_m={cfg.block_m} C={cfg.gate_up_c}")
    torch.cuda.synchronize()
    return BuildReport("warm", f"sm_{major}{minor}", compiled, cache_dir)


def _signature(kernel, pointer_types: dict[str, str], constexprs: dict[str, object]) -> dict[str, str]:
    sig = {}
    missing = [p.name for p in kernel.params if p.is_constexpr and p.name not in constexprs]
    if missing:  # a constexpr left out would silently compile as an i32 argument
        raise ValueError(f"{kernel.fn.__name__}: constexprs {missing} not given")
    for name in kernel.arg_names:
        if name in constexprs:
            sig[name] = "constexpr"
        elif name.endswith("_ptr"):
            sig[name] = pointer_types.get(name, "*bf16")
        else:
            sig[name] = "i32"
    return sig


def _int_args(shape: MoeShape, split_k_len: int) -> dict[str, int]:
    """The integer arguments moe.py passes for this shape (strides of contiguous tensors)."""
    e, h = shape.experts, shape.hidden
    return {"E": e, "K": h, "K_PER_SPLIT": split_k_len, "stride_xm": h, "H": h, "stride_om": h,
            "router.stride_we": h, "prefill_router.stride_we": h}


def _attrs(kernel, prefix: str, ints: dict[str, int], constexprs) -> dict:
    """Divisibility-by-16 hints as the JIT derives them (pointers from 16-byte aligned allocations)."""
    attrs = {}
    for idx, p in enumerate(kernel.params):
        if p.name in constexprs or p.do_not_specialize:
            continue
        if p.name.endswith("_ptr"):
            attrs[(idx,)] = [["tt.divisibility", 16]]
        else:
            v = ints.get(f"{prefix}.{p.name}", ints.get(p.name))
            if v is not None and v % 16 == 0:
                attrs[(idx,)] = [["tt.divisibility", 16]]
    return attrs


def _plan_name(shape: MoeShape, m: int, mma: int, config=None) -> str:
    from ..kernels.moe import DEFAULT_CONFIG, launch_plan
    p = launch_plan(m, shape.top_k, config or DEFAULT_CONFIG, mma)
    return (f"M={m} (M_PAD={p.m_pad}, top-k rows {p.topk_rows} in {'gate_up' if p.topk_in_gate_up else 'router'}, "
            f"gate_up {'32' if p.gate_up_half_rows else '64'} features per program, down K shares {p.down_k_parts})")


def compile_variants(shape: MoeShape, m: int, target, config=None) -> list[tuple[str, object]]:
    """triton.compile() the three kernels as m tokens launch them (moe.launch_plan); returns (name, CompiledKernel)."""
    jobs, ints = variant_jobs(shape, m, target.arch // 10, config)
    return _compile_jobs(jobs, ints, target)


def variant_jobs(shape: MoeShape, m: int, major: int, config=None) -> tuple[list, dict[str, int]]:
    """The three kernels as m tokens launch them on a GPU of that major version: ([(kernel, pointer types,
    constexprs, options)], integer arguments).

    The constexprs and options are the launches' own (router_logits.launch_kwargs,
    moe.expert_launch_kwargs), so what compiles is what fused_moe_decode runs.
    """
    from ..kernels.moe import DEFAULT_CONFIG, expert_launch_kwargs, launch_plan, router_options
    from ..kernels.mxfp4_layout import mma_layout_for_capability
    from ..kernels.device.moe_down import moe_down_kernel
    from ..kernels.device.moe_gate_up import moe_gate_up_kernel
    from ..kernels.device.router_logits import k_split, launch_kwargs, router_logits_kernel
    cfg = config or DEFAULT_CONFIG
    mma = mma_layout_for_capability(major)
    plan = launch_plan(m, shape.top_k, cfg, mma)
    router = router_options(plan, cfg)
    k_per_split, n_split = k_split(shape.hidden, router.pop("split_k"), router["block_k"])
    router_kw = launch_kwargs(m, shape.experts, shape.has_bias, n_split, k_per_split, not plan.topk_in_gate_up,
                              shape.top_k, pdl=cfg.pdl, **router)
    gate_up_kw, down_kw = expert_launch_kwargs(plan, cfg, shape.hidden, shape.intermediate, shape.experts,
                                               shape.top_k, shape.has_bias, shape.has_bias, mma, cfg.decode, False,
                                               cfg.pdl, n_split)
    jobs = [
        (router_logits_kernel, {"x_ptr": "*bf16", "w_ptr": "*bf16", "b_ptr": "*bf16", "partial_ptr": "*fp32",
                                "ids_ptr": "*i32", "weights_ptr": "*fp32", "experts_ptr": "*i32",
                                "n_experts_ptr": "*i32", "counter_ptr": "*i32"}, router_kw),
        (moe_gate_up_kernel, {"x_ptr": "*bf16", "w_ptr": "*u8", "s_ptr": "*u8",
                              "b_ptr": "*bf16", "h_ptr": "*bf16", "ids_ptr": "*i32",
                              "experts_ptr": "*i32", "n_experts_ptr": "*i32", "logits_ptr": "*fp32",
                              "route_weights_ptr": "*fp32"}, gate_up_kw),
        (moe_down_kernel, {"h_ptr": "*bf16", "ids_ptr": "*i32", "weights_ptr": "*fp32", "experts_ptr": "*i32",
                           "n_experts_ptr": "*i32", "w_ptr": "*u8", "s_ptr": "*u8", "b_ptr": "*bf16",
                           "out_ptr": "*bf16", "partial_ptr": "*fp32", "counter_ptr": "*i32",
                           "sums_ptr": "*i64"}, down_kw),
    ]
    return [(k, ptrs, *_split_options(kw)) for k, ptrs, kw in jobs], _int_args(shape, k_per_split)


_OPTIONS = ("num_warps", "num_stages", "launch_pdl", "maxnreg")


def _split_options(kwargs: dict) -> tuple[dict, dict]:
    """A launch's keyword arguments -> (constexprs, compile options)."""
    return ({k: v for k, v in kwargs.items() if k not in _OPTIONS},
            {k: v for k, v in kwargs.items() if k in _OPTIONS})


def compile_prefill_variants(shape: MoeShape, target, config=None) -> list[tuple[str, object]]:
    """triton.compile() the prefill kernels (prefill_routing.py, moe_prefill.py) for shape: all of them,
    or for a config its align and expert kernels; returns (name, CompiledKernel)."""
    if config is None:
        jobs, ints = prefill_jobs(shape, target.arch // 10)
    else:
        from ..kernels.mxfp4_layout import mma_layout_for_capability
        mma = mma_layout_for_capability(target.arch // 10)
        jobs, ints = _prefill_config_jobs(shape, config, mma), _int_args(shape, 0)
    return _compile_jobs(jobs, ints, target)


def compile_prefill_routing(shape: MoeShape, target) -> list[tuple[str, object]]:
    """triton.compile() prefill_routing's router and combine kernels for shape."""
    return _compile_jobs(_prefill_routing_jobs(shape), _int_args(shape, 0), target)


def prefill_jobs(shape: MoeShape, major: int, config=None) -> tuple[list, dict[str, int]]:
    """The prefill kernels as moe_prefill_block launches them, in variant_jobs' form: the router and
    combine once, the align and the two expert kernels for config, or else for every config
    prefill_config_for can pick on this arch's layout."""
    from ..kernels.device.moe_prefill import prefill_configs
    from ..kernels.mxfp4_layout import mma_layout_for_capability
    mma = mma_layout_for_capability(major)
    jobs = _prefill_routing_jobs(shape)
    for cfg in [config] if config else prefill_configs(mma):
        jobs += _prefill_config_jobs(shape, cfg, mma)
    return jobs, _int_args(shape, 0)


def _prefill_routing_jobs(shape: MoeShape) -> list:
    """prefill_routing's router and combine kernels: one binary each per shape, whatever the tiles."""
    from ..kernels.device.prefill_routing import (combine_launch_kwargs, prefill_combine_kernel, prefill_router_kernel,
                                  router_launch_kwargs)
    return [
        (prefill_router_kernel, {"x_ptr": "*bf16", "w_ptr": "*bf16", "b_ptr": "*bf16", "ids_ptr": "*i32",
                                 "weights_ptr": "*fp32", "counts_ptr": "*i32"},
         *_split_options(router_launch_kwargs(shape.hidden, shape.experts, shape.top_k, shape.has_bias, False))),
        (prefill_combine_kernel, {"y_ptr": "*fp32", "out_ptr": "*bf16"},
         *_split_options(combine_launch_kwargs(shape.hidden, shape.top_k))),
    ]


def _prefill_config_jobs(shape: MoeShape, config, mma: int) -> list:
    from ..kernels.device.moe_prefill import launch_kwargs, moe_prefill_down_kernel, moe_prefill_gate_up_kernel
    gate_up_kw, down_kw = launch_kwargs(config, shape.hidden, shape.intermediate, shape.top_k,
                                        shape.has_bias, shape.has_bias, mma, 2, False)
    from ..kernels.device.prefill_routing import align_launch_kwargs, prefill_align_kernel
    return [
        (prefill_align_kernel, {"ids_ptr": "*i32", "counts_ptr": "*i32", "pairs_ptr": "*i32",
                                "block_expert_ptr": "*i32"},
         *_split_options(align_launch_kwargs(shape.experts, config.block_m))),
        (moe_prefill_gate_up_kernel, {"x_ptr": "*bf16", "w_ptr": "*u8", "s_ptr": "*u8", "b_ptr": "*bf16",
                                      "h_ptr": "*bf16", "pairs_ptr": "*i32", "block_expert_ptr": "*i32"},
         *_split_options(gate_up_kw)),
        (moe_prefill_down_kernel, {"h_ptr": "*bf16", "pairs_ptr": "*i32", "block_expert_ptr": "*i32",
                                   "route_weights_ptr": "*fp32", "w_ptr": "*u8", "s_ptr": "*u8", "b_ptr": "*bf16",
                                   "y_ptr": "*fp32"},
         *_split_options(down_kw)),
    ]


_PREFIXES = {"router_logits_kernel": "router", "moe_gate_up_kernel": "gate_up", "moe_down_kernel": "down",
             "moe_prefill_gate_up_kernel": "prefill_gate_up", "moe_prefill_down_kernel": "prefill_down",
             "prefill_router_kernel": "prefill_router", "prefill_align_kernel": "prefill_align",
             "prefill_combine_kernel": "prefill_combine"}


def _with_defaults(kernel, constexprs: dict[str, object]) -> dict[str, object]:
    """constexprs plus the defaults of those left out, as the JIT fills them in (a launch passes
    only the constexprs it sets; left out of the signature they would compile as i32 arguments)."""
    defaults = {p.name: p._param.default for p in kernel.params
                if p.is_constexpr and p.name not in constexprs and p._param.default is not p._param.empty}
    return {**defaults, **constexprs}


def source_args(kernel, pointer_types: dict[str, str], constexprs: dict[str, object]) -> tuple[dict, dict]:
    """(signature, constexprs) of a triton.compile() source for a launch that sets these constexprs."""
    constexprs = _with_defaults(kernel, constexprs)
    return _signature(kernel, pointer_types, constexprs), constexprs


def _compile_jobs(jobs, ints: dict[str, int], target) -> list[tuple[str, object]]:
    import triton
    out = []
    for kernel, ptrs, consts, opts in jobs:
        signature, consts = source_args(kernel, ptrs, consts)
        attrs = _attrs(kernel, _PREFIXES[kernel.fn.__name__], ints, consts)
        src = triton.compiler.ASTSource(fn=kernel, signature=signature, constexprs=consts, attrs=attrs)
        out.append((kernel.fn.__name__, triton.compile(src, target=target, options=opts)))
    return out


def build_compile_only(arch: str, shapes=MODEL_SHAPES) -> BuildReport:
    """Compile every variant for arch without a GPU; raises ToolchainError if the toolchain is missing."""
    require_toolchain()
    from triton.backends.compiler import GPUTarget
    from ..kernels.mxfp4_layout import mma_layout_for_capability
    major, minor, _ = parse_arch(arch)
    # Triton appends the 'a' suffix itself for capabilities that have one (sm_90a, sm_121a).
    target = GPUTarget("cuda", major * 10 + minor, 32)
    mma = mma_layout_for_capability(major)
    compiled = []
    for shape in shapes:
        builds = [(_plan_name(shape, m, mma), lambda m=m, shape=shape: compile_variants(shape, m, target))
                  for m in token_counts(shape, mma)]
        from ..kernels.device.moe_prefill import prefill_configs
        builds.append(("prefill routing", lambda shape=shape: compile_prefill_routing(shape, target)))
        builds += [(f"prefill block_m={cfg.block_m} C={cfg.gate_up_c}",
                    lambda shape=shape, cfg=cfg: compile_prefill_variants(shape, target, cfg))
                   for cfg in prefill_configs(mma)]
        for label, build in builds:
            try:
                kernels = build()
            except (FileNotFoundError, RuntimeError) as e:
                if "ptxas" in str(e):  # the NVIDIA backend's assembler is missing or too old for the arch
                    raise ToolchainError(f"kernels build for sm_{major}{minor} needs a ptxas that knows it: "
                                         f"{str(e).splitlines()[0]}") from None
                raise
            for name, ck in kernels:
                ptx = ck.asm.get("ptx", "")
                tgt = next((ln.split()[1] for ln in ptx.splitlines() if ln.startswith(".target")), "?")
                compiled.append(f"{shape.name} {label} {name} -> {tgt}")
    return BuildReport("compile-only", f"sm_{major}{minor}", compiled, None)


def clear(cache_dir: Path) -> None:
    shutil.rmtree(cache_dir, ignore_errors=True)
