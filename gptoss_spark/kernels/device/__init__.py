"""The device side of the MoE kernels: the @triton.jit modules, each with the launch arguments of its kernels.

  router_logits.py    decode's router GEMM (K-split partials; M<=32 costs what M=1 costs), and its launch
  moe_gate_up.py      decode's gate_up on MXFP4 + bias + SwiGLU, per distinct expert
  moe_down.py         decode's down on MXFP4 + bias + routing-weighted combine
  moe_prefill.py      more than 16 tokens: pairs grouped by expert, gate_up and down per pair block;
                      its tiles by token count and its launches
  prefill_routing.py  prefill's router + top-k, the pairs' grouping into blocks, the sum over each token's k
  routing.py          top-k helpers (router kernel's last program, expert kernels)
  arrival.py          last-to-arrive among a kernel's programs (router top-k, down partial sums)
  counted_sum.py      down's sum across programs by counted fixed-point atomics
  mxfp4_decode.py     MXFP4 tile -> bf16 tensor-core operand (inline PTX / portable)
  pdl.py              programmatic dependent launch between the decode kernels

What composes them is the package above: moe.py (decode's launch plan and its three launches),
ops.py (the custom ops, decode or prefill by token count), mxfp4_layout.py (the weight layout
they read).
"""
