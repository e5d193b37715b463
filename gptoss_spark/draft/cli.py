"""CLI: `gptoss-spark draft counts|shrink|verify`.

Exit codes: 0 ok; 1 the written/checked head has problems (listed); 2 bad input.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from ..bench.prompts import load_prompts, shipped_prompts_path
from ..bench.render import Progress
from ..bench.target import DEFAULT_BASE_URL, api_key_for, resolve_target
from .counts import gather_counts, load_counts, save_counts

SEED_KEEP = 32768  # the seed's cut (docs/HARDWARE.md, the seed)
COUNTS_NAME = "token-counts.json"


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _add_gather_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--url", default=DEFAULT_BASE_URL, help=f"served target (default {DEFAULT_BASE_URL})")
    p.add_argument("--model", help="served model name (default: gptoss, or the only model served)")
    p.add_argument("--api-key-file", type=Path,
                   help="file with the engine's API key (default: engine.api_key_file of the settings, "
                        "sent only to the engine address the settings name)")
    p.add_argument("--prompts", type=Path,
                   help=f"JSONL prompts to run through the target (default: shipped {shipped_prompts_path().name}; "
                        "use many prompts like your real traffic for a good cut)")
    p.add_argument("--max-tokens", type=_positive_int, default=1024, help="per prompt (default 1024)")
    p.add_argument("--temperature", type=float, default=0.0, help="(default 0)")
    p.add_argument("--concurrency", type=_positive_int, default=4, help="requests in flight (default 4)")


def register(sub: argparse._SubParsersAction) -> None:
    draft = sub.add_parser("draft", help="Eagle3 draft head tools (vocabulary shrink)",
                           description="Cut an Eagle3 head's lm_head to the tokens the target emits most.")
    dsub = draft.add_subparsers(dest="draft_command", metavar="COMMAND", required=True)

    counts = dsub.add_parser("counts", help="count the tokens the served target emits for a prompt set")
    _add_gather_args(counts)
    counts.add_argument("--out", type=Path, required=True, help="counts file to write (JSON)")
    counts.set_defaults(func=cmd_counts)

    shrink = dsub.add_parser("shrink", help="keep the K most emitted tokens in the draft lm_head; write d2t",
                             description="Counts come from --counts FILE, or else from running --prompts "
                                         "through the served target at --url.")
    shrink.add_argument("source", type=Path, help="Eagle3 head directory (config.json + *.safetensors)")
    shrink.add_argument("output", type=Path, help="new directory for the cut head")
    shrink.add_argument("--keep", type=_positive_int, default=SEED_KEEP,
                        help=f"lm_head rows to keep (default {SEED_KEEP}, the seed's cut)")
    shrink.add_argument("--counts", type=Path, help="token counts file (from `draft counts`); skips gathering")
    _add_gather_args(shrink)
    shrink.add_argument("--force", action="store_true", help="replace a non-empty output directory")
    shrink.add_argument("--json", action="store_true", help="print the report as JSON")
    shrink.set_defaults(func=cmd_shrink)

    verify = dsub.add_parser("verify", help="check a head's config, shapes and d2t as vLLM 0.32.0 reads them")
    verify.add_argument("head", type=Path, help="Eagle3 head directory")
    verify.add_argument("--counts", type=Path, help="also report the coverage of these counts")
    verify.add_argument("--target", type=Path, help="the target model's directory: check the aux layer ids "
                                                    "against its layers")
    verify.add_argument("--json", action="store_true", help="print the report as JSON")
    verify.set_defaults(func=cmd_verify)


def _gather(args):
    prompts = load_prompts(args.prompts)
    target = resolve_target(args.url, args.model, api_key=api_key_for(args, args.url))
    progress = Progress()
    try:
        return gather_counts(target.base_url, target.model, prompts, args.max_tokens, args.temperature,
                             args.concurrency, progress=progress, headers=target.headers)
    finally:
        progress.close()


def cmd_counts(args) -> int:
    counts = _gather(args)
    save_counts(counts, args.out)
    print(f"{counts.total} tokens ({len(counts.counts)} distinct) counted; written to {args.out}")
    return 0


def cmd_shrink(args) -> int:
    from .shrink import shrink_head

    gathered = args.counts is None
    counts = load_counts(args.counts) if args.counts else _gather(args)
    report = shrink_head(args.source, args.output, args.keep, counts, force=args.force)
    if gathered:
        save_counts(counts, args.output / COUNTS_NAME)
        report["counts_file"] = str(args.output / COUNTS_NAME)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        cov, src_cov = report["coverage"], report["source_coverage"]
        print(f"cut {report['source_draft_vocab_size']} -> {report['draft_vocab_size']} lm_head rows "
              f"(target vocab {report['vocab_size']}); written to {report['output']}")
        print(f"coverage of the counted tokens: {_pct(cov['coverage'])} kept "
              f"({cov['covered_tokens']}/{cov['counted_tokens']}; source head {_pct(src_cov['coverage'])}); "
              f"{cov['distinct_covered']}/{cov['distinct_counted']} distinct tokens")
        if report["kept_without_counts"]:
            print(f"note: {report['kept_without_counts']} kept rows were never seen in the counts "
                  "(filled by lowest token id); more prompts give a better cut")
        _print_verify(report["verify"])
    return 0 if report["verify"]["ok"] else 1


def cmd_verify(args) -> int:
    from .verify import verify_head

    counts = load_counts(args.counts) if args.counts else None
    report = verify_head(args.head, counts, target_dir=args.target)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print(f"{report['path']}: draft_vocab_size {report['draft_vocab_size']}, vocab_size {report['vocab_size']}, "
              f"lm_head {report['lm_head_shape']}")
        if "coverage" in report:
            c = report["coverage"]
            print(f"coverage of the counted tokens: {_pct(c['coverage'])} ({c['covered_tokens']}/{c['counted_tokens']})")
        _print_verify(report)
    return 0 if report["ok"] else 1


def _print_verify(check: dict) -> None:
    if check["ok"]:
        print("verify: ok (config, safetensors shapes, d2t/t2d, aux layers consistent as vLLM 0.32.0 reads them)")
    else:
        for problem in check["problems"]:
            print(f"verify: PROBLEM: {problem}")


def _pct(x) -> str:
    return "-" if x is None else f"{100 * x:.2f} %"
