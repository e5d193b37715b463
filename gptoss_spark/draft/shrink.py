"""Cut an Eagle3 head's lm_head to the K target tokens emitted most; write what vLLM 0.32.0 reads.

The kept rows are copied bit for bit (no retraining): a draft row scores the
same token as before, the head just can no longer propose the tokens cut.
The seed cut NVIDIA's gpt-oss-120b Eagle3 head to 32,768 rows for +0.5 tok/s
(the seed's Spark figure, docs/HARDWARE.md): a smaller draft lm_head GEMV.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from ..base.errors import UserError
from .counts import TokenCounts
from .head import CONFIG_NAME, INDEX_NAME, open_head
from .verify import coverage, verify_head

WEIGHTS_NAME = "model.safetensors"
REPORT_NAME = "gptoss-spark-shrink.json"


def select_kept(candidates: list[int], counts: TokenCounts, k: int) -> list[int]:
    """The k candidates with the highest counts; ties (and never-seen tokens)
    by lower token id so the result is deterministic. Ascending target ids."""
    ranked = sorted(candidates, key=lambda tid: (-counts.counts.get(tid, 0), tid))
    return sorted(ranked[:k])


def shrink_head(src: str | Path, out: str | Path, k: int, counts: TokenCounts, force: bool = False) -> dict:
    import torch
    from safetensors.torch import save_file

    src, out = Path(src), Path(out)
    head = open_head(src)
    cfg = head.config
    v = cfg.vocab_size
    lm_name = head.lm_head_name
    if any("lm_head" in n and n != lm_name for n in head.files):
        raise UserError(f"{src}: lm_head is quantized (extra lm_head tensors); shrink the unquantized head "
                        "(the engine quantizes the drafter online)")
    source_targets = head.draft_to_target().tolist()
    if not 1 <= k <= len(source_targets):
        raise UserError(f"--keep {k} is out of range: the head has {len(source_targets)} lm_head rows; "
                        f"pick 1..{len(source_targets)}")
    if counts.vocab_size is not None and counts.vocab_size != v:
        raise UserError(f"counts are for a vocabulary of {counts.vocab_size}, the head's vocab_size is {v}")
    if max(counts.counts) >= v:
        raise UserError(f"counts hold token id {max(counts.counts)} >= the head's vocab_size {v}: "
                        "they come from another model's vocabulary")
    _prepare_out(src, out, force)

    kept = select_kept(source_targets, counts, k)
    row_of = {tid: row for row, tid in enumerate(source_targets)}
    rows = torch.tensor([row_of[t] for t in kept], dtype=torch.long)
    kept_t = torch.tensor(kept, dtype=torch.long)

    tensors = {name: head.load(name) for name in head.tensor_names()}
    source_lm = tensors[lm_name]
    tensors[lm_name] = source_lm.index_select(0, rows).contiguous()
    for name in (head.find("d2t"), head.find("t2d")):
        tensors.pop(name, None)
    if k < v:
        # vLLM: target_id = draft_id + d2t[draft_id]  (an offset, int64)
        tensors[head.find("d2t") or "d2t"] = kept_t - torch.arange(k, dtype=torch.long)
        t2d = torch.zeros(v, dtype=torch.bool)
        t2d[kept_t] = True
        tensors[head.find("t2d") or "t2d"] = t2d
    # k == v keeps no d2t: vLLM 0.32.0 has no draft_id_to_target_id parameter
    # then, and a d2t tensor would fail the load.

    for item in src.iterdir():
        if item.is_file() and item.suffix != ".safetensors" and item.name not in (INDEX_NAME, CONFIG_NAME, REPORT_NAME):
            shutil.copy2(item, out / item.name)
    (out / CONFIG_NAME).write_text(json.dumps(cfg.with_draft_vocab_size(k), indent=2) + "\n")
    save_file(tensors, str(out / WEIGHTS_NAME), metadata={"format": "pt"})

    report = {
        "source": str(src),
        "output": str(out),
        "vocab_size": v,
        "source_draft_vocab_size": len(source_targets),
        "draft_vocab_size": k,
        "counts_source": counts.source,
        "kept_without_counts": sum(1 for t in kept if counts.counts.get(t, 0) == 0),
        "coverage": coverage(counts, kept),
        "source_coverage": coverage(counts, source_targets),
    }
    check = verify_head(out, counts)
    check["problems"] += _compare_with_source(head, out, lm_name, rows)
    check["ok"] = not check["problems"]
    report["verify"] = check
    (out / REPORT_NAME).write_text(json.dumps(report, indent=2) + "\n")
    return report


def _prepare_out(src: Path, out: Path, force: bool) -> None:
    if out.resolve() == src.resolve():
        raise UserError(f"output {out} is the source head; write the cut head to a new directory")
    if out.exists() and any(out.iterdir()):
        if not force:
            raise UserError(f"{out} exists and is not empty; pass a new directory or --force to overwrite")
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)


def _compare_with_source(head, out: Path, lm_name: str, rows) -> list[str]:
    """Re-read the written head: kept lm_head rows and every other tensor must equal the source's."""
    import torch
    from safetensors import safe_open

    problems = []
    with safe_open(str(out / WEIGHTS_NAME), framework="pt") as f:
        written = set(f.keys())
        for name in head.tensor_names():
            if name in (head.find("d2t"), head.find("t2d")):
                continue
            if name not in written:
                problems.append(f"tensor {name} missing from the output")
                continue
            expected = head.load(name)
            if name == lm_name:
                expected = expected.index_select(0, rows)
            got = f.get_tensor(name)
            if got.dtype != expected.dtype or not torch.equal(got, expected):
                problems.append(f"tensor {name} differs from the source" + (" rows" if name == lm_name else ""))
    return problems
