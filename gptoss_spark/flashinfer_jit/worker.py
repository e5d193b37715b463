"""Build one FlashInfer JIT module, in its own process (build.py starts it, output to the module's log).

    python -m gptoss_spark.flashinfer_jit.worker MODULE_NAME GENERATOR

GENERATOR is "python.module:function" (modules.py). The environment carries
everything FlashInfer reads at import: FLASHINFER_WORKSPACE_BASE,
FLASHINFER_CUDA_ARCH_LIST, MAX_JOBS, FLASHINFER_NVCC_THREADS, CUDA_HOME.

FlashInfer is entered through its jit submodules only: `import flashinfer`
runs the package's __init__, which queries the GPU (gdn_kernels calls
torch.cuda.get_device_properties at import) and so fails on a build host
without one; on a Spark it would also open a CUDA context the build does not need.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import time


def enter_flashinfer_jit() -> None:
    """Make `flashinfer.jit.*` importable without executing flashinfer/__init__.py."""
    if "flashinfer" in sys.modules:
        return
    spec = importlib.util.find_spec("flashinfer")
    if spec is None:
        raise SystemExit("flashinfer-python is not installed in this environment")
    sys.modules["flashinfer"] = importlib.util.module_from_spec(spec)  # package path set, body not run


def generator(qualified: str):
    module, _, func = qualified.partition(":")
    return getattr(importlib.import_module(module), func)


def main(argv: list[str]) -> int:
    name, qualified = argv
    enter_flashinfer_jit()
    spec = generator(qualified)()
    if spec.name != name:
        print(f"{qualified}() produced module {spec.name!r}, expected {name!r}: "
              "FlashInfer changed; update gptoss_spark/flashinfer_jit/modules.py", file=sys.stderr)
        return 3
    print(f"building {spec.name}: {len(spec.sources)} sources into {spec.build_dir}", flush=True)
    t0 = time.monotonic()
    spec.build(verbose=True, need_lock=True)  # ninja's output goes to our stdout: the module's log
    if not spec.jit_library_path.is_file():
        print(f"ninja finished but {spec.jit_library_path} is missing", file=sys.stderr)
        return 4
    print(f"built {spec.jit_library_path} in {time.monotonic() - t0:.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
