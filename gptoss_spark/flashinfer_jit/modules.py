"""Which FlashInfer JIT modules a profile's engine loads on a DGX Spark (sm_121), and why.

The one place for that mapping. Each rule reads the profile's vLLM flags and
environment and names the FlashInfer generator whose module vLLM 0.32.0 loads
for them, with the call path that gets there. tests/unit/test_flashinfer_modules.py
holds the rules to the installed sources: the vLLM call sites still exist and
still call the same FlashInfer function with the same arguments, and each
FlashInfer getter, run for sm_121, still asks for the module named here.

Paths that compile without a FlashInfer nvcc module, or that are not derived
here, come back as notes (shown by `gptoss-spark flashinfer status` and doctor).

Pure logic: no FlashInfer, torch or vLLM import.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Mapping, Sequence

from ..kernels.vllm_plugin import PluginError, selected_mode
from ..service.batch_shape import option_value

DEFAULT_ARCH_LIST = "12.1a"     # what the shipped profiles set in FLASHINFER_CUDA_ARCH_LIST
DEVICE_ARCH = "121"             # FlashInfer's get_compute_capability on a GB10: (12, 1) -> "121"


@dataclass(frozen=True)
class JitModule:
    name: str          # FlashInfer's JitSpec.name: its directory under cached_ops/ and its .so
    generator: str     # "python.module:function" returning the JitSpec (called with no arguments)
    sass: str          # SASS its .so carries for FLASHINFER_CUDA_ARCH_LIST=12.1a, as cuobjdump --list-elf names it
    why: str           # the vLLM path that loads it
    sources: int       # how many files FlashInfer compiles for it: the build goes smallest first


@dataclass(frozen=True)
class Note:
    text: str
    gap: bool = False   # True: a FlashInfer JIT this list does not cover (the engine compiles it at first use)


@dataclass(frozen=True)
class Derivation:
    profile: str
    arch_list: str                    # FLASHINFER_CUDA_ARCH_LIST the engine builds and loads for
    modules: tuple[JitModule, ...]
    notes: tuple[Note, ...]


# vLLM: FlashInferExperts.apply (model_executor/layers/fused_moe/experts/flashinfer_cutlass_moe.py)
#   -> vllm.utils.flashinfer.flashinfer_cutlass_fused_moe (lazy "flashinfer.fused_moe", "cutlass_fused_moe")
#   -> flashinfer.fused_moe.core.cutlass_fused_moe -> get_cutlass_fused_moe_module("121")
#   -> gen_cutlass_fused_moe_sm120_module(False). Arch flags from FLASHINFER_CUDA_ARCH_LIST (majors [12]).
FUSED_MOE = JitModule(
    "fused_moe_120", "flashinfer.jit.fused_moe:gen_cutlass_fused_moe_sm120_module", "sm_121a",
    "--moe-backend flashinfer_cutlass: FlashInferExperts.apply -> flashinfer.fused_moe.cutlass_fused_moe", 96)

# vLLM: convert_gpt_oss_weight_to_mxfp4_moe_kernel_format (model_executor/layers/fused_moe/oracle/mxfp4.py),
#   branch FLASHINFER_CUTLASS_MXFP4_MXFP8 -> `from flashinfer import block_scale_interleave` on w13/w2 scales
#   -> flashinfer.quantization.fp4_quantization.get_fp4_quantization_module("121"), which takes the
#   sm120f variant when torch's CUDA is >= 12.9 (the aarch64 torch 2.13.0 wheel is CUDA 13.0). That
#   variant carries its own -gencode (compute_120f, family code that runs on sm_121; cuobjdump lists
#   it as sm_120), whatever FLASHINFER_CUDA_ARCH_LIST says.
FP4_QUANT_120F = JitModule(
    "fp4_quantization_120f", "flashinfer.jit.fp4_quantization:gen_fp4_quantization_sm120f_module", "sm_120",
    "MXFP4 x MXFP8 CUTLASS MoE: weight scales interleaved at load by flashinfer.block_scale_interleave", 7)
FP4_QUANT_121 = JitModule(
    "fp4_quantization_121", "flashinfer.jit.fp4_quantization:gen_fp4_quantization_sm121_module", "sm_121a",
    "MXFP4 x MXFP8 CUTLASS MoE: weight scales interleaved at load by flashinfer.block_scale_interleave", 7)

# vLLM: TopKTopPSampler (v1/sample/ops/topk_topp_sampler.py, also v1/worker/gpu/sample/sampler.py) uses
#   flashinfer_sample when flashinfer_sampler_supported() (CUDA, VLLM_USE_FLASHINFER_SAMPLER unset or 1,
#   compute capability 8.0-12.1, more than 16 SMs: GB10 has 48) -> flashinfer.sampling.top_k_mask_logits /
#   top_p_sampling_from_probs / top_k_sampling_from_probs -> get_sampling_module() -> gen_sampling_module().
#   vLLM passes top_k as a tensor, so FlashInfer's radix top-k fast path (int k only) is not taken.
SAMPLING = JitModule(
    "sampling", "flashinfer.jit.sampling:gen_sampling_module", "sm_121a",
    "FlashInfer top-k/top-p sampler (vLLM's default on CUDA; any request with top_k or top_p)", 3)

# Not an nvcc module: MoEPrepareAndFinalizeNoDPEPModular.prepare -> moe_kernel_quantize_input("mxfp8")
# -> mxfp8_utils._mxfp8_e4m3_quantize_impl -> flashinfer.mxfp8_quantize(..., backend="cute-dsl").
NOTE_MXFP8_CUTE_DSL = Note("MXFP8 activation quantization runs FlashInfer's CuTe-DSL kernel "
                       "(flashinfer.mxfp8_quantize backend='cute-dsl'): compiled in the engine process (no nvcc) "
                       "by the install's warm-up or the first start, exported to <state_dir>/cache/cute-dsl and "
                       "loaded from there by every later start (gptoss_spark/engine_hooks/cute_dsl_cache.py); "
                       "nothing to prebuild here")

ATTENTION_WITHOUT_FLASHINFER = {"TRITON_ATTN", "FLASH_ATTN", "FLEX_ATTENTION", "TRITON_MLA"}
FLASHINFER_MOE_BACKENDS = ("flashinfer_cutlass",)
PROCESSED_LOGPROBS_MODES = ("processed_logits", "processed_logprobs")


def _moe_activation(args: Sequence[str]) -> str | None:
    raw = option_value(args, "--quantization-config")
    if raw is None:
        return None
    try:
        moe = json.loads(raw).get("moe") or {}
    except (ValueError, AttributeError):
        return None
    return moe.get("activation") if isinstance(moe, dict) else None


def _cuda_at_least(version: str | None, base: tuple[int, int]) -> bool:
    if not version:
        return False
    try:
        major, minor = (int(p) for p in version.split(".")[:2])
    except ValueError:
        return False
    return (major, minor) >= base


def fp4_quantization_module(torch_cuda: str | None) -> JitModule:
    """get_fp4_quantization_module("121"): sm120f when torch's CUDA >= 12.9, else the sm121 one."""
    return FP4_QUANT_120F if _cuda_at_least(torch_cuda, (12, 9)) else FP4_QUANT_121


def derive(profile: str, args: Sequence[str], env: Mapping[str, str], *, torch_cuda: str | None) -> Derivation:
    """The FlashInfer JIT modules vLLM 0.32.0 loads on sm_121 for these engine args and env."""
    modules: list[JitModule] = []
    notes: list[Note] = []

    # MoE. Our Triton plugin (GPTOSS_SPARK_MOE=triton) replaces gpt-oss's MoE blocks whatever the backend.
    try:
        own_moe = selected_mode(env) is not None
    except PluginError:
        own_moe = False  # the engine refuses to start; nothing to add for it
    backend = option_value(args, "--moe-backend")
    if own_moe:
        notes.append(Note("MoE: GPTOSS_SPARK_MOE=triton runs this package's Triton kernels; no FlashInfer MoE module"))
    elif backend in FLASHINFER_MOE_BACKENDS and _moe_activation(args) == "mxfp8":
        modules += [FUSED_MOE, fp4_quantization_module(torch_cuda)]
        notes.append(NOTE_MXFP8_CUTE_DSL)
    elif backend in FLASHINFER_MOE_BACKENDS:
        # FLASHINFER_CUTLASS_MXFP4_BF16: FlashInferExperts supports (kMxfp4Static, None) on sm_90 only.
        notes.append(Note("MoE: flashinfer_cutlass with BF16 activations is an sm_90-only scheme in vLLM 0.32.0; "
                          'set "moe": {"activation": "mxfp8"} in --quantization-config', gap=True))
    elif backend is None or backend == "auto" or backend.startswith("flashinfer"):
        notes.append(Note(f"MoE: --moe-backend {backend or '(not set)'}: its FlashInfer modules on sm_121 are not "
                          "derived here (name flashinfer_cutlass with MXFP8 activations, or a non-FlashInfer backend)",
                          gap=True))

    # Sampling: off with VLLM_USE_FLASHINFER_SAMPLER=0, or a logprobs mode FlashInfer cannot return.
    sampler_off = env.get("VLLM_USE_FLASHINFER_SAMPLER", "").strip() == "0"
    if not sampler_off and option_value(args, "--logprobs-mode") not in PROCESSED_LOGPROBS_MODES:
        modules.append(SAMPLING)

    # Attention.
    attention = option_value(args, "--attention-backend")
    if attention is None:
        notes.append(Note("attention: --attention-backend not set; on sm_121 vLLM prefers FLASH_ATTN, then "
                          "FLASHINFER (JIT modules not derived here), then TRITON_ATTN: pin --attention-backend "
                          "TRITON_ATTN", gap=True))
    elif attention.upper() not in ATTENTION_WITHOUT_FLASHINFER:
        notes.append(Note(f"attention: --attention-backend {attention} builds FlashInfer attention modules at "
                          "first use; they are not derived here", gap=True))

    seen: dict[str, JitModule] = {}
    for m in modules:
        seen.setdefault(m.name, m)
    return Derivation(profile, env.get("FLASHINFER_CUDA_ARCH_LIST", DEFAULT_ARCH_LIST).strip(),
                      tuple(seen.values()), tuple(notes))
