"""Check a head directory is consistent the way vLLM 0.32.0 loads it; list every problem found."""

from __future__ import annotations

from pathlib import Path

from .aux_layers import check_aux_layers, read_target
from .counts import TokenCounts
from .head import open_head


def coverage(counts: TokenCounts, kept_target_ids) -> dict:
    """Share of the counted target tokens that the kept set can propose."""
    kept = {int(t) for t in kept_target_ids}
    total = counts.total
    covered = sum(n for tid, n in counts.counts.items() if tid in kept)
    return {
        "kept_tokens": len(kept),
        "counted_tokens": total,
        "covered_tokens": covered,
        "coverage": covered / total if total else None,
        "distinct_counted": len(counts.counts),
        "distinct_covered": sum(1 for tid in counts.counts if tid in kept),
    }


def verify_head(path: str | Path, counts: TokenCounts | None = None, target_dir: str | Path | None = None) -> dict:
    """Every problem vLLM 0.32.0 would meet loading the head at path; target_dir (the target model's
    directory) also checks the aux layer ids against the target's layers."""
    import torch

    head = open_head(path)
    cfg = head.config
    k, v, hidden = cfg.draft_vocab_size, cfg.vocab_size, cfg.hidden_size
    problems: list[str] = []
    report: dict = {"path": str(head.path), "vocab_size": v, "draft_vocab_size": k, "hidden_size": hidden,
                    "format": "speculators" if cfg.speculators else "hf"}

    lm_name = head.lm_head_name
    extra_lm = [n for n in head.files if "lm_head" in n and n != lm_name]
    if extra_lm:
        problems.append(f"lm_head has extra tensors {extra_lm} (quantized?); this tool handles unquantized lm_head only")
    lm_shape = head.shape(lm_name)
    report["lm_head_shape"] = lm_shape
    if len(lm_shape) != 2 or lm_shape[0] != k:
        problems.append(f"{lm_name} shape {lm_shape}: rows must equal draft_vocab_size {k}")
    if hidden is not None and len(lm_shape) == 2 and lm_shape[1] != hidden:
        problems.append(f"{lm_name} shape {lm_shape}: columns must equal hidden_size {hidden}")

    targets = None
    d2t_name = head.find("d2t")
    if d2t_name is None:
        if k != v:
            problems.append(f"draft_vocab_size {k} != vocab_size {v} but no d2t tensor: vLLM would map every row to token 0")
        else:
            targets = torch.arange(k)
    else:
        d2t = head.load(d2t_name)
        report["d2t"] = {"shape": list(d2t.shape), "dtype": str(d2t.dtype).replace("torch.", "")}
        # vLLM copies d2t into an int64 parameter (copy_ casts), so int32 heads
        # (some published ones) load fine; a float d2t would round silently.
        if d2t.dtype not in (torch.int64, torch.int32):
            problems.append(f"d2t dtype {d2t.dtype}: must be an integer tensor (int64, as vLLM 0.32.0 holds it)")
        if list(d2t.shape) != [k]:
            problems.append(f"d2t shape {list(d2t.shape)}: must be [draft_vocab_size] = [{k}]")
        else:
            targets = torch.arange(k, dtype=torch.long) + d2t.to(torch.long)
            if int(targets.min()) < 0 or int(targets.max()) >= v:
                problems.append(f"d2t maps rows outside the target vocabulary 0..{v - 1} (range {int(targets.min())}..{int(targets.max())})")
            if torch.unique(targets).numel() != k:
                problems.append("d2t maps two draft rows to the same target token")
            if k == v:
                problems.append("draft_vocab_size == vocab_size, yet a d2t tensor is present: vLLM 0.32.0 then "
                                "has no draft_id_to_target_id parameter to load it into; drop d2t")

    t2d_name = head.find("t2d")
    if t2d_name is not None:
        t2d = head.load(t2d_name)
        report["t2d"] = {"shape": list(t2d.shape), "dtype": str(t2d.dtype).replace("torch.", "")}
        if list(t2d.shape) != [v]:
            problems.append(f"t2d shape {list(t2d.shape)}: must be [vocab_size] = [{v}]")
        elif int(t2d.to(torch.bool).sum()) != k:
            problems.append(f"t2d marks {int(t2d.to(torch.bool).sum())} tokens, draft_vocab_size is {k}")
        elif targets is not None and not bool(t2d.to(torch.bool)[targets.clamp(0, v - 1)].all()):
            problems.append("t2d and d2t disagree on the kept tokens")

    aux, aux_problems = check_aux_layers(head, read_target(Path(target_dir)) if target_dir else None)
    report["aux_layers"] = aux
    problems += aux_problems

    if counts is not None and targets is not None:
        if counts.counts and max(counts.counts) >= v:
            problems.append(f"counts hold token id {max(counts.counts)} >= vocab_size {v}: counts from another vocabulary")
        report["coverage"] = coverage(counts, targets.tolist())
    report["problems"] = problems
    report["ok"] = not problems
    return report
