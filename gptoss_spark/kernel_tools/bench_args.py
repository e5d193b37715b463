"""The arguments of `gptoss-spark kernels bench`, shared with `python -m gptoss_spark.kernel_tools.benchmark`
(which runs where only torch and Triton are installed, e.g. a lent GPU without the service's
dependencies). No torch import here: the CLI's help must work without it."""

from __future__ import annotations

import argparse
from pathlib import Path

DEFAULT_TOKENS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)


def token_list(text: str) -> tuple[int, ...]:
    try:
        tokens = tuple(int(t) for t in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected comma-separated token counts, e.g. 1,8,32") from None
    if not tokens or min(tokens) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: token counts must be >= 1")
    return tokens


def add_bench_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", type=Path, required=True, help="folder for kernels_bench.json and kernels_bench.md")
    p.add_argument("--peer", type=Path, default=None,
                   help="folder holding OpenAI's triton_kernels package (Triton's python/triton_kernels, "
                        "the release matching the installed Triton), to time it side by side")
    p.add_argument("--tokens", type=token_list, default=DEFAULT_TOKENS,
                   help="comma-separated token counts (default " + ",".join(map(str, DEFAULT_TOKENS)) + ")")
    p.add_argument("--layers", type=int, default=8,
                   help="layers of distinct weights per CUDA graph (default 8: more than L2 holds)")
