"""Two profile settings about the shape of a decode step: CUDA-graph capture sizes and dynamic speculation.

`cuda_graph_sizes` (profile key; "auto" unless set): the batch sizes, in requests,
whose decode steps replay a captured CUDA graph. A step of b requests runs the graph
of the smallest captured size >= b, padded: the padding is compute spent on nothing.
vLLM 0.32.0's default (config/vllm.py, _set_cudagraph_sizes) captures 1, 2, 4, then
every 8th, so 5 users run the graph for 8 and 10 run 16: the published +46 % / +54 %
at 5 / 10 users from adding those two sizes (docs/BENCHMARK.md). "auto" captures every
batch size up to 16, then steps of a quarter of the last power of two (20, 24, 28, 32,
40, ..., 256, 320, ...), so a step never pads by 20 % or more of its size, up to twice
--max-num-seqs (512 at most: vLLM's own ceiling on GPUs before Blackwell datacenter
parts) for mixed prefill+decode steps, as vLLM's default does. The argv gets
`--cudagraph-capture-sizes` in tokens: a speculating step of b requests verifies
b x (1 + K) tokens, so those sizes are captured too.

`speculation_max_batch` (profile key; unset = speculate at every batch size): above
this many requests in a step, vLLM drafts K = 0 tokens. It becomes vLLM's own dynamic
speculation schedule, `num_speculative_tokens_per_batch_size` in --speculative-config
([[1, T, K], [T + 1, max_num_seqs, 0]]; vllm/v1/spec_decode/dynamic/utils.py), which
the scheduler looks up every step (v1/core/sched/scheduler.py, dynamic_sd_lookup).
"""

from __future__ import annotations

import json

DENSE_UP_TO = 16  # every batch size up to this one is captured
GRAPH_CEILING_TOKENS = 512  # vLLM 0.32.0's default_max_graph_size off Blackwell datacenter GPUs


def auto_batch_sizes(max_num_seqs: int) -> list[int]:
    """Every size up to 16, then steps of a quarter of the last power of two, up to 2 x max_num_seqs (<= 512)."""
    top = max(max_num_seqs, min(2 * max_num_seqs, GRAPH_CEILING_TOKENS))
    sizes = list(range(1, min(DENSE_UP_TO, top) + 1))
    power = DENSE_UP_TO
    while sizes[-1] < top:
        step = power // 4
        nxt = sizes[-1] + step
        sizes.append(min(nxt, top))
        if nxt >= 2 * power:
            power *= 2
    return sizes


def max_padding_fraction(sizes: list[int], max_batch: int) -> float:
    """The largest share of a captured step that is padding, over every batch size 1..max_batch it covers."""
    worst = 0.0
    for b in range(1, min(max_batch, sizes[-1]) + 1):
        s = next(x for x in sizes if x >= b)
        worst = max(worst, (s - b) / s)
    return worst


def option_value(args: list[str] | tuple[str, ...], flag: str) -> str | None:
    """The value of `flag` in an argv (`--flag v` or `--flag=v`; the last one wins, as in argparse)."""
    value = None
    for i, a in enumerate(args):
        if a == flag and i + 1 < len(args):
            value = args[i + 1]
        elif a.startswith(flag + "="):
            value = a.split("=", 1)[1]
    return value


def speculative_tokens(args: list[str] | tuple[str, ...]) -> int:
    spec = option_value(args, "--speculative-config")
    return int(json.loads(spec).get("num_speculative_tokens", 0)) if spec else 0


def dynamic_schedule(num_speculative_tokens: int, max_batch: int, max_num_seqs: int) -> list[list[int]]:
    """vLLM's num_speculative_tokens_per_batch_size: K up to max_batch requests, 0 above."""
    if max_batch >= max_num_seqs:
        return [[1, max_num_seqs, num_speculative_tokens]]
    return [[1, max_batch, num_speculative_tokens], [max_batch + 1, max_num_seqs, 0]]


def with_dynamic_speculation(args: list[str], max_batch: int) -> list[str]:
    """args with the schedule written into --speculative-config (which must be there: profiles.py checks)."""
    max_num_seqs = int(option_value(args, "--max-num-seqs") or 0)
    out = list(args)
    for i, a in enumerate(out):
        if a == "--speculative-config":
            spec = json.loads(out[i + 1])
            spec["num_speculative_tokens_per_batch_size"] = dynamic_schedule(
                int(spec["num_speculative_tokens"]), max_batch, max_num_seqs)
            out[i + 1] = json.dumps(spec)
    return out


def capture_tokens(batch_sizes: list[int], num_speculative_tokens: int, speculation_max_batch: int | None) -> list[int]:
    """Token counts to capture: each batch size as plain steps, and as verifying steps where it drafts."""
    tokens = set(batch_sizes)
    for b in batch_sizes:
        if num_speculative_tokens and (speculation_max_batch is None or b <= speculation_max_batch):
            tokens.add(b * (1 + num_speculative_tokens))
    return sorted(tokens)


def graphs_apply(args: list[str] | tuple[str, ...]) -> bool:
    """False when the profile runs eager or names capture sizes itself (then its own choice stands)."""
    if "--enforce-eager" in args or option_value(args, "--cudagraph-capture-sizes") is not None:
        return False
    comp = option_value(args, "--compilation-config")
    return not (comp and "cudagraph_capture_sizes" in comp)


def with_capture_sizes(args: list[str], sizes: list[int] | str, speculation_max_batch: int | None) -> list[str]:
    """args plus --cudagraph-capture-sizes from the profile's cuda_graph_sizes ("auto" or batch sizes)."""
    if not graphs_apply(args):
        return list(args)
    max_num_seqs = option_value(args, "--max-num-seqs")
    if sizes == "auto":
        if max_num_seqs is None:  # nothing to size from: vLLM's own default stands
            return list(args)
        sizes = auto_batch_sizes(int(max_num_seqs))
    tokens = capture_tokens(list(sizes), speculative_tokens(args), speculation_max_batch)
    return [*args, "--cudagraph-capture-sizes", *(str(t) for t in tokens)]
