"""SM121 MoE kernels for gpt-oss in Triton: fused MXFP4 experts and router for decode, a prefill path.

The public face here; the @triton.jit modules in device/ (its __init__.py lists them):
  ops.py            torch.library custom ops (import registers them); moe_block picks decode or prefill
  vllm_plugin.py    vLLM general plugin, active when GPTOSS_SPARK_MOE=triton
  moe.py            decode's launch plan (MoeLaunchConfig, launch_plan) and the three launches of one layer
  mxfp4_layout.py   the one-time repack of the experts into the kernels' layout (SwizzledExperts)
  reference.py      torch reference of the gpt-oss MoE block (MXFP4 from gptoss_spark/mxfp4.py)
  runtime.py        whether Triton's interpreter runs the kernels
docs/KERNELS.md has the design and the numbers.

The ahead-of-time build and the benchmark are tools, not run-time code: gptoss_spark/kernel_tools/.

Nothing here imports triton or torch at package import: the plugin's entry point and the CLI
(kernel_tools) must load on hosts without them and say what is missing.
"""
