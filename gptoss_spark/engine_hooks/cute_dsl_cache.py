"""Keep FlashInfer's CuTe-DSL MXFP8 quantizer on disk, so an engine start compiles it once per install.

Why this exists (read from the locked wheels):
- The MXFP8 MoE path (`--quantization-config '{"moe": {"activation": "mxfp8"}}'`, plain, spec,
  cluster) quantizes activations with `flashinfer.mxfp8_quantize(..., backend="cute-dsl")`
  (vLLM 0.32.0 mxfp8_utils._mxfp8_e4m3_quantize_impl). flashinfer 0.7.0.post1 builds that kernel
  in quantization/kernels/mxfp8_quantize.py, `_get_compiled_kernel_mxfp8_linear` /
  `_get_compiled_kernel_mxfp8_swizzled`, with `cute.compile(...)`, memoized per process only
  (functools.cache).
- nvidia-cutlass-dsl 4.8.0's `cute.compile` sets `no_cache=True` (base_dsl/compiler.py,
  CompileCallable._compile), so the DSL's file cache, and CUTE_DSL_CACHE_DIR with it, is never
  consulted: every engine start compiled the kernel again.
- The DSL's own ahead-of-time path keeps it: a TVM-FFI compiled function's `export_to_c(path,
  function_name)` writes an object file with the host code and the embedded GPU binary, and
  `cutlass.cute.runtime.load_module(path, enable_tvm_ffi=True)` links it back in process (JITLink)
  as the same TVM-FFI function, with no compiler run.

So the two builder functions are wrapped: the first call with given arguments looks for an
exported object under GPTOSS_SPARK_CUTE_DSL_CACHE, keyed by the arguments and by everything the
binary depends on (FlashInfer and CUTLASS DSL versions, the CUDA version torch was built with, the
GPU's compute capability); on a miss it compiles as FlashInfer does, exports, and stores atomically.
A corrupt or unloadable entry is compiled again, never fatal. Each event is one log line the
supervisor reads (service/startup.py): "gptoss-spark cute-dsl cache hit ..." / "... compiled ...".

The builders are replaced when FlashInfer's module is first imported (an import hook), so an engine
process that never quantizes to MXFP8 never imports FlashInfer for this.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.abc
import importlib.metadata
import importlib.util
import json
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any, Callable

# The ground floor is stdlib only (json, os, tempfile) and ships in the same wheel as this plugin,
# so importing it inside vLLM's processes costs nothing the plugin does not already pay.
from ..base.fsutil import read_json, write_atomic

ENV_VAR = "GPTOSS_SPARK_CUTE_DSL_CACHE"
MODULE = "flashinfer.quantization.kernels.mxfp8_quantize"
BUILDERS = ("_get_compiled_kernel_mxfp8_linear", "_get_compiled_kernel_mxfp8_swizzled")
# What the supervisor matches (service/startup.py); keep the two in step.
HIT_MESSAGE = "gptoss-spark cute-dsl cache hit: %s %s"
COMPILED_MESSAGE = "gptoss-spark cute-dsl compiled: %s %s in %.2f s (stored)"

log = logging.getLogger("gptoss_spark.engine_hooks.cute_dsl_cache")


def _dist_version(*names: str) -> str:
    for name in names:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return "absent"


def binary_identity() -> dict[str, str]:
    """Everything an exported kernel binary depends on besides its arguments."""
    import torch

    major, minor = torch.cuda.get_device_capability() if torch.cuda.is_available() else (0, 0)
    return {
        "flashinfer": _dist_version("flashinfer-python"),
        "cutlass_dsl": _dist_version("nvidia-cutlass-dsl-libs-base", "nvidia-cutlass-dsl"),
        "torch_cuda": str(torch.version.cuda),
        "capability": f"{major}.{minor}",
    }


def entry_key(builder: str, args: tuple[Any, ...], identity: dict[str, str]) -> str:
    doc = json.dumps({"builder": builder, "args": [repr(a) for a in args], **identity}, sort_keys=True)
    return hashlib.sha256(doc.encode()).hexdigest()[:24]


def _export_name(builder: str) -> str:
    # A C identifier: the exported TVM-FFI symbol is "__tvm_ffi_" + this.
    return "gptoss_spark" + builder


def persistent(builder: str, original: Callable[..., tuple[Any, int]], cache_dir: Path,
               identity: Callable[[], dict[str, str]] = binary_identity,
               load: Callable[[str], Any] | None = None) -> Callable[..., tuple[Any, int]]:
    """Wrap one FlashInfer builder `(args) -> (compiled_function, int)` with the on-disk cache."""

    def load_module(path: str) -> Any:
        from cutlass.cute.runtime import load_module as dsl_load
        return dsl_load(path, enable_tvm_ffi=True)

    load = load or load_module

    @functools.cache
    def wrapper(*args: Any) -> tuple[Any, int]:
        key = entry_key(builder, args, identity())
        obj = cache_dir / f"{builder}-{key}.o"
        meta = obj.with_suffix(".json")
        if obj.is_file() and meta.is_file():
            try:
                extra = read_json(meta)["extra"]
                fn = getattr(load(str(obj)), _export_name(builder))
                log.info(HIT_MESSAGE, builder, key)
                return fn, extra
            except Exception as e:  # noqa: BLE001 - a bad entry costs one compile, never the start
                log.warning("gptoss-spark cute-dsl cache entry %s unusable (%s); compiling again", obj.name, e)
        t0 = time.perf_counter()
        compiled, extra = original(*args)
        took = time.perf_counter() - t0
        try:
            cache_dir.mkdir(parents=True, exist_ok=True)
            tmp = obj.with_name(f".{obj.name}.{os.getpid()}.o")
            compiled.export_to_c(str(tmp), function_name=_export_name(builder))
            write_atomic(meta, json.dumps({"builder": builder, "args": [repr(a) for a in args], "extra": extra,
                                           **identity()}).encode(), sync_dir=False)
            os.replace(tmp, obj)  # the object last: an entry is whole once its .o exists
        except Exception as e:  # noqa: BLE001 - not persisting costs the next start a compile, nothing else
            log.warning("gptoss-spark cute-dsl compile of %s not stored (%s)", builder, e)
        log.info(COMPILED_MESSAGE, builder, key, took)
        return compiled, extra

    return wrapper


def patch_module(module: Any, cache_dir: Path) -> None:
    for name in BUILDERS:
        original = getattr(module, name, None)
        if original is None or getattr(original, "_gptoss_spark_cached", False):
            continue
        wrapped = persistent(name, original, cache_dir)
        wrapped._gptoss_spark_cached = True  # type: ignore[attr-defined]
        setattr(module, name, wrapped)


class _PatchAfterImport(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Lets FlashInfer's module import as usual, then swaps its two builders."""

    def __init__(self, cache_dir: Path) -> None:
        self.cache_dir = cache_dir
        self._inner: importlib.abc.Loader | None = None

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname != MODULE:
            return None
        sys.meta_path.remove(self)  # one module, once: find it with the finders that follow
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None:
            return spec
        self._inner = spec.loader
        spec.loader = self
        return spec

    def create_module(self, spec: Any) -> Any:
        return self._inner.create_module(spec)  # type: ignore[union-attr]

    def exec_module(self, module: Any) -> None:
        self._inner.exec_module(module)  # type: ignore[union-attr]
        patch_module(module, self.cache_dir)


def install(environ: dict[str, str] | os._Environ = os.environ) -> bool:
    """Turn the cache on when the service asked for it (ENV_VAR names the directory)."""
    where = environ.get(ENV_VAR, "").strip()
    if not where:
        return False
    cache_dir = Path(where)
    if MODULE in sys.modules:
        patch_module(sys.modules[MODULE], cache_dir)
    elif not any(isinstance(f, _PatchAfterImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _PatchAfterImport(cache_dir))
    return True
