"""Every kernel variant the service can launch: the list the AOT build compiles.

A Triton kernel is compiled once per set of constexprs and argument
specializations. The decode kernels fix M out of the specialization
(do_not_specialize); what M changes is the launch plan (moe.launch_plan):
the M_PAD bucket (8 on mma.sync, 16 or 32) and, at the fewest tokens, how gate_up and down
divide their work. The variants are the model shapes x the distinct plans.
Both gpt-oss models are listed: a profile may point at either, and compiling
both takes seconds.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class MoeShape:
    name: str
    experts: int
    hidden: int
    intermediate: int
    top_k: int
    has_bias: bool = True  # gpt-oss has router and expert biases


GPT_OSS_120B = MoeShape("gpt-oss-120b", experts=128, hidden=2880, intermediate=2880, top_k=4)
GPT_OSS_20B = MoeShape("gpt-oss-20b", experts=32, hidden=2880, intermediate=2880, top_k=4)
MODEL_SHAPES = (GPT_OSS_120B, GPT_OSS_20B)


def token_counts(shape: MoeShape, mma: int) -> list[int]:
    """One token count per distinct launch plan for experts in layout mma: launching each compiles every
    variant the shape needs."""
    from ..kernels.moe import distinct_plans  # torch-free callers (the CLI's argument parsing) import this module
    return sorted(distinct_plans(shape.top_k, mma=mma).values())
