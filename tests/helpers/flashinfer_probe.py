"""Ask the installed FlashInfer what it would load and build, without a GPU and without compiling.

Run as a script (its own process: FlashInfer reads its environment once, at import, and
writes its workspace then): `python flashinfer_probe.py WORKSPACE_BASE AOT_DIR`, with
FLASHINFER_CUDA_ARCH_LIST set. Prints one JSON object; tests/unit/test_flashinfer_modules.py
asserts on it.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def main(workspace: str, aot: str) -> dict:
    from gptoss_spark.flashinfer_jit import modules
    from gptoss_spark.flashinfer_jit.worker import enter_flashinfer_jit, generator

    enter_flashinfer_jit()
    import torch

    import flashinfer.fused_moe.core as moe_core
    import flashinfer.quantization.fp4_quantization as fp4
    import flashinfer.sampling as sampling
    from flashinfer.jit import core, cpp_ext
    from flashinfer.jit import env as jit_env

    out: dict = {"jit_dir": str(jit_env.FLASHINFER_JIT_DIR), "aot_dir": str(jit_env.FLASHINFER_AOT_DIR),
                 "global_gencode": core.current_compilation_context.get_nvcc_flags_list(), "generators": {}}

    # Each generator named in modules.py: the module it produces and the -gencode its nvcc lines get.
    for m in (modules.FUSED_MOE, modules.FP4_QUANT_120F, modules.FP4_QUANT_121, modules.SAMPLING):
        spec = generator(m.generator)()
        flags = cpp_ext.build_cuda_cflags([], spec.extra_cuda_cflags)
        out["generators"][m.generator] = {
            "name": spec.name, "library": str(spec.jit_library_path),
            "gencode": [f for f in flags if f.startswith("-gencode=")],
            "cu_sources": sum(1 for s in spec.sources if s.suffix == ".cu"), "sources": len(spec.sources)}

    # The getters vLLM's calls reach, run for a GB10 (device arch "121"), with the build replaced by a recorder.
    asked: list[str] = []

    class Loaded:
        def __getattr__(self, _name):
            return lambda *a, **k: None

    real_build_and_load = core.JitSpecNvcc.build_and_load
    core.JitSpecNvcc.build_and_load = lambda self: (asked.append(self.name), Loaded())[1]
    getters = {}
    asked.clear()
    moe_core.get_cutlass_fused_moe_module.__wrapped__("121")
    getters["get_cutlass_fused_moe_module('121')"] = list(asked)
    for cuda in ("13.0", "12.8"):
        asked.clear()
        torch.version.cuda = cuda
        fp4.get_fp4_quantization_module.__wrapped__("121")
        getters[f"get_fp4_quantization_module('121') cuda {cuda}"] = list(asked)
    torch.version.cuda = None
    asked.clear()
    sampling.get_sampling_module.__wrapped__()
    getters["get_sampling_module()"] = list(asked)
    out["getters"] = getters
    core.JitSpecNvcc.build_and_load = real_build_and_load

    # vLLM passes top_k as a tensor: FlashInfer's radix top-k fast path (another module) is not taken.
    logits = torch.zeros(2, 201088)
    out["topk_fast_path_for_tensor_k"] = sampling._top_k_first_fast_path_applicable(
        logits, torch.tensor([5, 5]), None)
    out["topk_fast_path_for_int_k"] = sampling._top_k_first_fast_path_applicable(logits, 5, None)

    # A prebuilt module in the AOT directory is loaded without building.
    jit_env.FLASHINFER_AOT_DIR = Path(aot)
    (Path(aot) / "sampling").mkdir(parents=True, exist_ok=True)
    (Path(aot) / "sampling" / "sampling.so").write_bytes(b"")
    core.JitSpecNvcc.load = lambda self, so_path=None: ("loaded", str(so_path))

    def no_build(self, *a, **k):
        raise AssertionError("built although a prebuilt module was there")
    core.JitSpecNvcc.build = no_build
    spec = generator(modules.SAMPLING.generator)()
    out["aot_load"] = list(spec.build_and_load())

    # Why ninja cannot be trusted across venvs: FlashInfer's build.ninja names this venv's paths.
    ninja = cpp_ext.generate_ninja_build_for_op(spec.name, spec.sources, spec.extra_cflags, spec.extra_cuda_cflags,
                                                spec.extra_ldflags, spec.extra_include_dirs)
    out["ninja_names_venv"] = str(Path(jit_env.FLASHINFER_CSRC_DIR).resolve()) in ninja
    out["csrc_dir"] = str(Path(jit_env.FLASHINFER_CSRC_DIR).resolve())
    return out


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], sys.argv[2])))
