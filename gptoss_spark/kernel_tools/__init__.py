"""Build and benchmark tools of our MoE kernels (gptoss_spark/kernels/): nothing the engine imports.

  cli.py         `gptoss-spark kernels build` and `gptoss-spark kernels bench`
  variants.py    every kernel variant the service can launch (model shapes x launch plans)
  aot.py         the ahead-of-time build of those variants (warm on the GPU, or compile-only)
  benchmark.py   `kernels bench`: one MoE layer beside the peer, cuBLAS and the roofline
                 (also `python -m gptoss_spark.kernel_tools.benchmark`, where only torch and Triton are)
  bench_args.py  the benchmark's arguments (no torch: the CLI's help works without it)
  peer.py        OpenAI's triton_kernels, driven as vLLM drives it, as the benchmark's peer

Why a package of its own: the kernels' package is what the vLLM plugin loads into every engine
process; the installer's build, the benchmark and its peer are run by a person or install.sh,
never by the engine. Nothing here imports torch or Triton at package import: the CLI must load on
hosts without them and say what is missing.
"""
