"""FlashInfer's JIT modules, built ahead of time for the profiles' engines.

flashinfer-python 0.7.0.post1 ships no prebuilt sm_12x kernels, so without
this the engine compiles them at its first start on the Spark, next to the
weights in unified memory and with unbounded parallelism. Here:

  modules.py  which modules each profile's engine loads (derived from vLLM's code path)
  build.py    the build (as the service user) and the venv links the engine loads them by
  cli.py      `gptoss-spark flashinfer build|link|status`

Where they live (keyed by FlashInfer + arch + toolkit) and how many jobs memory allows is
service/flashinfer_cache.py: the engine's environment needs it at every start, and service/
imports nothing above it.

Only the build imports FlashInfer, and only its jit submodules: `import
flashinfer` itself queries the GPU.
"""
