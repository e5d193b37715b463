"""SM121 MoE kernels for gpt-oss in Triton: fused MXFP4 experts and router for decode, a prefill path.

Modules (one job per file; docs/KERNELS.md has the design and the numbers):
  router_logits.py  router GEMM (K-split partials; M<=32 costs what M=1 costs)
  moe_gate_up.py    gate_up on MXFP4 + bias + SwiGLU, per distinct expert
  moe_down.py       down on MXFP4 + bias + routing-weighted combine
  moe_prefill.py    more than 16 tokens: pairs grouped by expert, gate_up and down per pair block
  prefill_routing.py  its router + top-k, the pairs' grouping into blocks, the sum over each token's k
  routing.py        top-k helpers (router kernel's last program, expert kernels)
  arrival.py        last-to-arrive among a kernel's programs (router top-k, down partial sums)
  mxfp4_layout.py   the one-time repack of the experts into the kernels' layout
  mxfp4_decode.py   MXFP4 tile -> bf16 tensor-core operand (inline PTX / portable)
  moe.py            the three launches of one layer
  ops.py            torch.library custom ops (import registers them); moe_block picks decode or prefill
  reference.py      torch reference of the gpt-oss MoE block (MXFP4 from gptoss_spark/mxfp4.py)
  vllm_plugin.py    vLLM general plugin, active when GPTOSS_SPARK_MOE=triton
  runtime.py        whether Triton's interpreter runs the kernels

The ahead-of-time build and the benchmark are tools, not run-time code: gptoss_spark/kernel_tools/.

Nothing here imports triton or torch at package import: the plugin's entry point and the CLI
(kernel_tools) must load on hosts without them and say what is missing.
"""
