"""CLI: `gptoss-spark bench [compare A B | ab P1 P2 ... | arena]` and `gptoss-spark loadtest`.

Exit codes: 0 every measured request valid (ab: and every profile and the baseline's second run measured,
the service switched back); 1 some request invalid or a profile not measured
(the result still prints, with each reason), or (ab) the admin API answered a
state or operation this version does not know; 2 bad input; 69 endpoint
unreachable or admin API not answering, 77 admin token unreadable (ab);
130 interrupted (ab: after switching back).
"""

from __future__ import annotations

import argparse
import json
import sys
from datetime import datetime, timezone
from pathlib import Path

from ..base.errors import ConfigError, UserError
from ..base.exit_codes import EXIT_INTERRUPTED
from ..base.defaults import CONFIG_HELP
from . import run
from .compare import compare, load_result
from .prompts import shipped_prompts_path
from .render import render_ab, render_arena, render_bench, render_compare, render_loadtest, render_sweep
from .request import ENDPOINTS
from .snapshot import DEFAULT_ADMIN_URL
from .target import DEFAULT_BASE_URL, api_key_for, resolve_target

BENCH_USAGE = """gptoss-spark bench [options]                      single stream (the seed's protocol)
       gptoss-spark bench compare A.json B.json [--json]  two results side by side
       gptoss-spark bench ab PROFILE PROFILE [PROFILE ...] [options]  profiles of the running service
       gptoss-spark bench arena [options]                the Spark Arena leaderboard's llama-benchy run"""


def _int_at_least(minimum: int):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum}, got {value}")
        return value
    return parse


def _add_common(p: argparse.ArgumentParser, max_tokens: int, *, from_settings: bool = False) -> None:
    if from_settings:  # bench ab: the service's own addresses come from its settings file
        p.add_argument("--config", help=f"{CONFIG_HELP}: admin API, token, engine port")
        p.add_argument("--url", help="OpenAI-compatible endpoint (default: the engine's address in the settings)")
    else:
        p.add_argument("--url", default=DEFAULT_BASE_URL, help=f"OpenAI-compatible endpoint (default {DEFAULT_BASE_URL})")
    p.add_argument("--api-key-file", type=Path,
                   help="file with the engine's API key (default: engine.api_key_file of the settings, "
                        "sent only to the engine address the settings name)")
    p.add_argument("--model", help="served model name (default: gptoss, or the only model served)")
    p.add_argument("--endpoint", choices=sorted(ENDPOINTS), default="chat",
                   help="chat = the seed protocol; completions = raw decode, no chat template (default chat)")
    p.add_argument("--max-tokens", type=_int_at_least(2), default=max_tokens, help=f"per request (default {max_tokens})")
    p.add_argument("--reasoning-effort", choices=["low", "medium", "high", "none"], default="low",
                   help="chat only; 'none' leaves it out of the request (default low, as the seed)")
    p.add_argument("--ignore-eos", action="store_true", help="generate exactly --max-tokens (vLLM extension)")
    p.add_argument("--prompts", type=Path, help=f"JSONL prompts file (default: shipped {shipped_prompts_path().name})")
    p.add_argument("--prompt", dest="prompt_ids", action="append", metavar="ID",
                   help="use only this prompt id (repeatable)")
    p.add_argument("--warmup", type=_int_at_least(0), default=1, help="unmeasured requests first (default 1)")
    p.add_argument("--timeout", type=float, default=300.0,
                   help="seconds to wait for the next chunk before a request counts as failed (default 300)")
    if not from_settings:
        p.add_argument("--admin-url", default=DEFAULT_ADMIN_URL, help="admin API, for the active profile in the snapshot")
    p.add_argument("--json", action="store_true", help="print the JSON result instead of the table")
    p.add_argument("--out", type=Path, help="also write the JSON result to this file (input for `bench compare`)")
    p.add_argument("--no-progress", action="store_true", help="no progress line even on a terminal")


def register(sub: argparse._SubParsersAction) -> None:
    bench = sub.add_parser("bench", help="single-stream benchmark (the seed's protocol); compare results; A/B profiles",
                           usage=BENCH_USAGE,
                           description="Streamed requests one at a time after warm-up; decode rate and TTFT. "
                                       "`bench compare A.json B.json` puts two results side by side; "
                                       "`bench ab plain fast` measures profiles of the running service in turn.")
    _add_common(bench, max_tokens=512)
    bench.add_argument("--requests", type=_int_at_least(1), default=4, help="measured requests (default 4, as the seed)")
    bench.set_defaults(func=cmd_bench)
    bench_sub = bench.add_subparsers(dest="bench_command", title="subcommands (optional)", metavar="{compare,ab,arena}",
                                     required=False)
    cmp = bench_sub.add_parser("compare", prog="gptoss-spark bench compare", help="two results side by side, with B/A ratios")
    cmp.add_argument("a", type=Path, help="result A (baseline)")
    cmp.add_argument("b", type=Path, help="result B")
    cmp.add_argument("--json", action="store_true", help="print the comparison as JSON")
    cmp.set_defaults(func=cmd_compare)

    ab = bench_sub.add_parser(
        "ab", prog="gptoss-spark bench ab", usage="%(prog)s PROFILE PROFILE [PROFILE ...] [options]",
        help="switch the running service to each profile, bench + loadtest each, switch back",
        description="Switches the service to each profile in turn through the admin API (needs the admin token: "
                    "root or the gptoss-spark group), runs the single-stream bench and the N-user load test on each, "
                    "switches back to the profile active at the start (also after a failure and on Ctrl-C) and "
                    "prints them side by side with one recommendation. The first profile is the baseline.")
    ab.add_argument("profiles", nargs="*", metavar="PROFILE", help="two or more profiles; the first is the baseline")
    _add_common(ab, max_tokens=512, from_settings=True)
    ab.add_argument("--requests", type=_int_at_least(1), default=4, help="single-stream measured requests (default 4)")
    ab.add_argument("--users", type=_int_at_least(1), default=30, help="concurrent users of the load test (default 30)")
    ab.add_argument("--requests-per-user", type=_int_at_least(1), default=1, help="(default 1)")
    _add_sweep(ab, "also run the sweep on each profile and recommend a profile per load range; ")
    ab.set_defaults(func=cmd_ab)
    _register_arena(bench_sub)

    load = sub.add_parser("loadtest", help="N concurrent users: aggregate tok/s, TTFT p50/p90",
                          description="All users start together; each sends its requests back to back.")
    _add_common(load, max_tokens=512)
    load.add_argument("--users", type=_int_at_least(1), default=30, help="concurrent users (default 30, as the seed)")
    load.add_argument("--requests-per-user", type=_int_at_least(1), default=1, help="(default 1)")
    _add_sweep(load, "instead of --users: ")
    load.set_defaults(func=cmd_loadtest)


def _add_sweep(p: argparse.ArgumentParser, what: str) -> None:
    from .sweep import DEFAULT_SECONDS, parse_concurrencies

    def concurrencies(text: str) -> list[int]:
        try:
            return parse_concurrencies(text)
        except UserError as e:
            raise argparse.ArgumentTypeError(str(e)) from None

    p.add_argument("--sweep", type=concurrencies, metavar="C1,C2,...",
                   help=what + "the load test at each concurrency in turn (e.g. 1,2,5,10,32,64,128,256), "
                        "writing JSON, CSV and a PNG named after --out (docs/BENCHMARK.md)")
    p.add_argument("--sweep-seconds", type=float, default=DEFAULT_SECONDS,
                   help=f"how long each concurrency sends new requests; those in flight then finish "
                        f"(default {DEFAULT_SECONDS:g})")


def _write_out(result: dict, path: Path | None) -> None:
    if path:
        try:
            path.write_text(json.dumps(result, indent=2) + "\n")
        except OSError as e:
            raise UserError(f"cannot write {path}: {e.strerror}; pass --out with a writable path") from None


def _emit(result: dict, args, human: str) -> None:
    _write_out(result, args.out)
    print(json.dumps(result, indent=2) if args.json else human, end="\n" if args.json else "")


def cmd_bench(args) -> int:
    prompts, source = run.prompts_for(args)
    target = resolve_target(args.url, args.model, api_key=api_key_for(args, args.url))
    result = run.single_stream(args, prompts, source, target)
    _emit(result, args, render_bench(result))
    return 0 if result["summary"]["invalid_requests"] == 0 else 1


def write_sweep_files(sweeps: dict[str, dict], out: Path) -> tuple[Path, Path]:
    """CSV and PNG beside the JSON at `out`; returns their paths."""
    from .sweep_plot import draw_png, plot_title, sibling_paths, write_csv

    _, csv_path, png_path = sibling_paths(out)
    write_csv(sweeps, csv_path)
    draw_png(sweeps, png_path, plot_title(sweeps))
    return csv_path, png_path


def cmd_loadtest(args) -> int:
    prompts, source = run.prompts_for(args)
    target = resolve_target(args.url, args.model, api_key=api_key_for(args, args.url))
    if args.sweep:
        from .sweep_plot import sibling_paths

        json_path = sibling_paths(args.out or Path("sweep.json"))[0]
        result = run.sweep(args, prompts, source, target)
        _write_out(result, json_path)
        csv_path, png_path = write_sweep_files({"served": result}, json_path)
        print(json.dumps(result, indent=2) if args.json else render_sweep(result, json_path, csv_path, png_path),
              end="\n" if args.json else "")
        return 0 if result["invalid_requests"] == 0 else 1
    result = run.load(args, prompts, source, target)
    _emit(result, args, render_loadtest(result))
    return 0 if result["summary"]["invalid_requests"] == 0 else 1


def cmd_compare(args) -> int:
    a, b = load_result(args.a), load_result(args.b)
    cmp = compare(a, b)
    if args.json:
        print(json.dumps(cmp, indent=2))
    else:
        sys.stdout.write(render_compare(cmp, str(args.a), str(args.b)))
    return 0


def _say(text: str) -> None:
    print(f"bench ab: {text}", file=sys.stderr, flush=True)


def cmd_ab(args) -> int:
    from ..admin.client import Client, admin_url, read_token_for_cli, state_of, switch_limit
    from ..base.net import local_url
    from ..service.states import State
    from ..service.config import load_settings, resolve_config_path
    from .ab import Service, ab_result, check_profile_names, run_ab, served_profile_problem

    names = args.profiles
    check_profile_names(names)  # count and repeats, before anything else
    settings = load_settings(resolve_config_path(args.config), must_exist=False)
    args.admin_url = admin_url(settings)
    url = args.url or local_url(settings.engine.host, settings.engine.port)
    api_key = api_key_for(args, url, settings)
    prompts, source = run.prompts_for(args)
    listing = Client(settings).json("GET", "/admin/profile")[1]
    check_profile_names(names, [p["name"] for p in listing.get("profiles") or []])
    original, state = listing.get("active"), state_of(listing)
    if state != State.READY or not original:
        raise UserError(f"the service is not ready (state {state.value}, profile {original or '-'}); "
                        "wait for it or fix it first (`gptoss-spark status`), then run bench ab again")
    service = Service(Client(settings, read_token_for_cli(settings)), switch_limit(settings), _say)

    def measure(name: str, result: dict) -> None:
        target = resolve_target(url, args.model, api_key=api_key)
        _say(f"{name}: single stream, {args.warmup} warm-up + {args.requests} requests")
        result["single"] = run.single_stream(args, prompts, source, target)
        _say(f"{name}: {args.users} users")
        result["load"] = run.load(args, prompts, source, target)
        result["error"] = served_profile_problem(name, result)
        if args.sweep:
            _say(f"{name}: sweep over {','.join(map(str, args.sweep))} users, {args.sweep_seconds:g} s each")
            result["sweep"] = run.sweep(args, prompts, source, target)

    def remeasure(name: str, result: dict) -> None:
        """The baseline's second run: the headline numbers only (the spread needs no second sweep)."""
        target = resolve_target(url, args.model, api_key=api_key)
        result["single"] = run.single_stream(args, prompts, source, target)
        result["load"] = run.load(args, prompts, source, target)
        result["error"] = served_profile_problem(name, result)

    started = datetime.now(timezone.utc)
    _say(f"active profile {original}; measuring {', '.join(names)} (baseline {names[0]}, measured again last)")
    outcome = run_ab(names, original, service.switch, measure, _say, remeasure)
    settings_used = {"url": url, "model": args.model, "endpoint": args.endpoint, "max_tokens": args.max_tokens,
                     "reasoning_effort": None if args.reasoning_effort == "none" else args.reasoning_effort,
                     "ignore_eos": args.ignore_eos, "prompts": source, "warmup": args.warmup,
                     "requests": args.requests, "users": args.users, "requests_per_user": args.requests_per_user,
                     "timeout": args.timeout, "sweep": args.sweep, "sweep_seconds": args.sweep_seconds}
    result = ab_result(names, original, outcome, settings_used, started)
    if args.sweep:
        from .sweep import recommend_by_range
        from .sweep_plot import sibling_paths

        sweeps = {n: result["runs"][n].get("sweep") for n in names}
        result["recommendation_by_load"] = recommend_by_range(sweeps)
        args.out = sibling_paths(args.out or Path("bench-ab.json"))[0]
        result["files"] = dict(zip(("csv", "png"), map(str, write_sweep_files(sweeps, args.out))))
    _emit(result, args, render_ab(result))
    if result["interrupted"]:
        return EXIT_INTERRUPTED
    complete = all(r["switch"] and r["switch"]["ok"] and r["error"] is None and r["single"] and r["load"]
                   and r["single"]["summary"]["invalid_requests"] == 0 and r["load"]["summary"]["invalid_requests"] == 0
                   and (not args.sweep or (r.get("sweep") and r["sweep"]["invalid_requests"] == 0))
                   for r in result["runs"].values()) and result["recommendation"]["noise"] is not None
    return 0 if complete and result["restored"]["ok"] else 1


def _register_arena(bench_sub) -> None:
    from . import arena

    p = bench_sub.add_parser(
        "arena", prog="gptoss-spark bench arena", help="the Spark Arena leaderboard's benchmark (llama-benchy), offline",
        description=f"Runs llama-benchy with the Spark Arena leaderboard's settings ({arena.PROFILE_NAME}: "
                    f"pp{arena.PP}, tg{arena.TG}, {arena.RUNS} runs, prefix caching, {len(arena.SCHEDULE)} "
                    "depth x concurrency points in the profile's order, one llama-benchy process each), offline: "
                    "the model directory's tokenizer and a corpus shipped with this package. Points that do not "
                    "fit the served max_model_len are reported, not sent. The whole profile takes long on a Spark; "
                    "--depth 0 --concurrency 1 measures only the leaderboard's headline point.")
    p.add_argument("--url", default=DEFAULT_BASE_URL, help=f"OpenAI-compatible endpoint (default {DEFAULT_BASE_URL})")
    p.add_argument("--config", help=f"{CONFIG_HELP}: model.dir for the tokenizer, the engine's API key")
    p.add_argument("--api-key-file", type=Path,
                   help="file with the engine's API key (default: engine.api_key_file of the settings, "
                        "sent only to the engine address the settings name)")
    p.add_argument("--model", help="served model name (default: gptoss, or the only model served)")
    p.add_argument("--tokenizer", type=Path,
                   help="tokenizer.json, or a model directory holding one (default: model.dir of the settings)")
    p.add_argument("--depth", type=_int_at_least(0), nargs="+", metavar="N",
                   help=f"context depths (default: the profile's {', '.join(map(str, arena.DEPTHS))})")
    p.add_argument("--concurrency", type=_int_at_least(1), nargs="+", metavar="N",
                   help=f"concurrent requests (default: the profile's {', '.join(map(str, arena.CONCURRENCY))})")
    p.add_argument("--pp", type=_int_at_least(1), default=arena.PP, help=f"prompt tokens (default {arena.PP})")
    p.add_argument("--tg", type=_int_at_least(2), default=arena.TG, help=f"generated tokens (default {arena.TG})")
    p.add_argument("--runs", type=_int_at_least(1), default=arena.RUNS, help=f"runs per point (default {arena.RUNS})")
    p.add_argument("--skip-coherence", action="store_true",
                   help="skip llama-benchy's coherence test (it asks for the capital of France; the leaderboard runs it)")
    p.add_argument("--timeout", type=float, default=3600.0,
                   help="seconds one point's llama-benchy may take before it counts as failed (default 3600)")
    p.add_argument("--admin-url", default=DEFAULT_ADMIN_URL, help="admin API, for the active profile in the snapshot")
    p.add_argument("--json", action="store_true", help="print the JSON result instead of the table")
    p.add_argument("--out", type=Path, help="also write the JSON result to this file (input for `bench compare`)")
    p.add_argument("--no-progress", action="store_true", help="no progress line even on a terminal")
    p.set_defaults(func=cmd_arena)


def arena_tokenizer(args) -> Path:
    """--tokenizer, else the settings' model.dir: a tokenizer.json file, checked before anything runs."""
    from ..service.config import load_settings, resolve_config_path

    given = args.tokenizer
    if given is None:
        try:
            given = load_settings(resolve_config_path(args.config), must_exist=False).model.dir
        except ConfigError as e:
            raise UserError(f"{e}; or pass --tokenizer with the model's tokenizer.json") from None
    path = given / "tokenizer.json" if given.is_dir() else given
    if not path.is_file():
        raise UserError(f"no tokenizer at {path}; pass --tokenizer with the model's tokenizer.json "
                        "(or the model directory holding it)")
    return path


def cmd_arena(args) -> int:
    from .benchy import PINNED_VERSION, installed_version

    if args.timeout <= 0:
        raise UserError(f"--timeout must be positive, got {args.timeout}")
    if installed_version() is None:
        raise UserError(f"llama-benchy is not installed in this venv ({sys.prefix}); install the pinned one: "
                        f"pip install --no-deps llama-benchy=={PINNED_VERSION} (docs/BENCHMARK.md)")
    tokenizer = arena_tokenizer(args)
    target = resolve_target(args.url, args.model, api_key=api_key_for(args, args.url))
    result = run.arena(args, target, tokenizer)
    _emit(result, args, render_arena(result))
    s = result["summary"]
    return 0 if s["invalid_figures"] == 0 and s["points_failed"] == 0 else 1
