"""`gptoss-spark warmup [PROFILE...]`: start each profile's engine once, as the service would, so later starts compile nothing.

Why: a first start compiles (torch.compile, Triton, FlashInfer's autotune, the CuTe-DSL quantizer),
and every fault recovery, switch, reload and upgrade is a start. The warm-up pays that once, at
install time or when the owner asks: it runs the engine with the service's argv, environment and
cache directories (service/engine.py), waits for /health and the canary, sends one request through
each path that compiles at its first request (greedy, sampled: FlashInfer's top-k/top-p sampler,
structured output: the grammar bitmask kernel), and stops it. Run it as the service user, so the
caches it fills are the service's (the installer does; so does `sudo -u gptoss-spark ...`).
The engine listens on a free port of 127.0.0.1, never on engine.port: beside a running service, or
before the unit starts on an upgrade, a client of the service must never reach the warm-up's engine
(nor its start collide with the service's). The port is in no cache's key (warm_key).

Each warm profile gets a marker, cache/warm/<profile>.json, holding the warm key: the versions of
everything whose change invalidates the compiled kernels (vLLM, torch and the CUDA it was built
with, Triton, FlashInfer, the CuTe DSL), the vLLM patch set applied to the engine's venv, the
digest of our code that runs inside the engine (ENGINE_CODE: the start-up hooks and the MoE
kernels' plugin), and the profile's engine arguments and environment. This package's own version
is not in it: an upgrade that changes none of those reuses the caches, and `doctor` and
`warmup --check` compare the key to say which profiles are warm.

A profile that runs across two nodes (requires.cluster) is not started: alone, its head would wait
for the worker's rank forever. Its first start on the pair is its warm-up.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from pathlib import Path

import httpx
import structlog

from .base.errors import UserError
from .base.exit_codes import EXIT_FAILED
from .base.net import free_loopback_port
from .service.api_access import read_api_key
from .service.config import Settings, load_settings, resolve_config_path
from .base.defaults import CONFIG_HELP
from .service import logs
from .service.engine import EngineProcess
from .service.memory import MemoryGuard, ProcMemorySource
from .service.probes import EngineProbe
from .service.profiles import Profile, load_profiles
from .service.startup import StartupRecord
from .service.warm_marker import (ENGINE_CODE, KEY_DISTRIBUTIONS, applied_patches, engine_code_digest,  # noqa: F401
                                   marker_path, torch_cuda_version, warm_key, warm_state, write_marker)

# A profile that runs across two nodes (requires.cluster) needs its peer's engine to get ready: one
# node cannot warm it up alone, so the pair's first start compiles instead (docs/CLUSTER.md).
PAIRED_FIRST_START = ("runs across the two nodes of [cluster] and cannot start alone: "
                      "its first start on the pair is its warm-up")


class WarmupError(UserError):
    """The engine did not get ready, or a warm-up request failed: the profile is not warm."""

    exit_code = EXIT_FAILED


def runnable(settings: Settings, profiles: dict[str, Profile]) -> tuple[list[Profile], dict[str, str]]:
    """The profiles this host can start, and why each other one cannot."""
    ok, skipped = [], {}
    for name in sorted(profiles):
        try:
            profiles[name].check_requirements(settings)
            ok.append(profiles[name])
        except UserError as e:
            skipped[name] = str(e)
    return ok, skipped


# ---------------------------------------------------------------- one engine, started and exercised

def warm_requests(served: str) -> list[tuple[str, str, dict]]:
    """(what, path, body): one request per path that compiles at its first request."""
    return [
        ("greedy", "/v1/completions", {"model": served, "prompt": "Hello", "max_tokens": 8, "temperature": 0}),
        # top_k/top_p: FlashInfer's sampler on CUDA (its JIT module is prebuilt; its first call warms it).
        ("sampled", "/v1/completions", {"model": served, "prompt": "Hello", "max_tokens": 8, "temperature": 1.0,
                                        "top_p": 0.9, "top_k": 40, "seed": 1}),
        # Structured output: xgrammar's bitmask kernel (Triton on CUDA).
        ("structured", "/v1/chat/completions", {
            "model": served, "max_tokens": 16, "temperature": 0,
            "messages": [{"role": "user", "content": "Reply with a JSON object."}],
            "response_format": {"type": "json_schema", "json_schema": {
                "name": "warmup", "schema": {"type": "object", "properties": {"ok": {"type": "boolean"}},
                                             "required": ["ok"]}}}}),
    ]


def private_listener(settings: Settings) -> Settings:
    """The settings the warm-up's engine runs under: the service's, listening on a free loopback port.
    Only engine.host/port differ; the caches (paths.state_dir) and the key are the service's own."""
    engine = settings.engine.model_copy(update={"host": "127.0.0.1", "port": free_loopback_port()})
    return settings.model_copy(update={"engine": engine})


async def warm_one(settings: Settings, profile: Profile, say=print) -> StartupRecord:
    settings = private_listener(settings)
    engine = EngineProcess(settings, profile)
    key = read_api_key(settings)
    probe = EngineProbe(engine.base_url, settings.model.served_name, key)
    await engine.start()
    rec = engine.startup
    shown = None
    try:
        deadline = time.monotonic() + settings.timeouts.load
        while True:
            if engine.returncode is not None:
                await engine.output_settled()
                raise WarmupError(f"warm-up of profile {profile.name}: the engine {engine.exit_reason(' while loading')}")
            if time.monotonic() > deadline:
                raise WarmupError(f"warm-up of profile {profile.name}: not ready within timeouts.load="
                                  f"{settings.timeouts.load:g} s (in phase {rec.current_phase()})")
            if rec.current_phase() != shown:  # one line per phase; the engine's own lines are in its log
                shown = rec.current_phase()
                say(f"  {profile.name}: {shown} (from {rec.phase_began():.0f} s after spawn)")
            if await probe.health(settings.timeouts.probe_timeout):
                rec.mark("health")
                error = await probe.canary(settings.timeouts.canary)
                if error is None:
                    rec.mark("canary")
                    break
            await asyncio.sleep(1.0)
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        async with httpx.AsyncClient(base_url=engine.base_url, headers=headers,
                                     timeout=settings.timeouts.canary) as client:
            for what, path, body in warm_requests(settings.model.served_name):
                r = await client.post(path, json=body)
                if r.status_code != 200:
                    raise WarmupError(f"warm-up of profile {profile.name}: the {what} request got HTTP "
                                      f"{r.status_code}: {r.text[:200]}")
        await engine.count_cache_additions()
        return rec
    finally:
        await engine.stop()


def describe(rec: StartupRecord) -> str:
    phases = ", ".join(f"{p} {v:.1f}" for p, v in rec.phases().items())
    compiled = "; ".join(rec.compiled_anything()) or "nothing"
    return f"ready in {rec.ready_seconds:.1f} s ({phases}); compiled {compiled}"


# ---------------------------------------------------------------- the command

def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("warmup", help="start each profile's engine once so that later starts compile nothing")
    p.add_argument("profiles", nargs="*", metavar="PROFILE", help="default: every profile this host can run")
    p.add_argument("--config", help=CONFIG_HELP)
    p.add_argument("--check", action="store_true", help="only say which profiles are warm (exit 1 if any is not)")
    p.add_argument("--if-cold", action="store_true", help="skip profiles that are already warm")
    p.add_argument("--if-room", action="store_true",
                   help="skip (not fail) a profile the memory guard would not start now: too little memory")
    p.set_defaults(func=cmd_warmup)


def cmd_warmup(args: argparse.Namespace) -> int:
    settings = load_settings(resolve_config_path(args.config))
    profiles = load_profiles(settings)
    unknown = [n for n in args.profiles if n not in profiles]
    if unknown:
        raise WarmupError(f"unknown profile(s) {', '.join(unknown)}; known: {', '.join(sorted(profiles))}")
    can, skipped = runnable(settings, profiles)
    chosen = [profiles[n] for n in args.profiles] if args.profiles else can
    if args.check:
        cold = 0
        for p in chosen:
            state = warm_state(settings, p)
            cold += state != "warm"
            why = (f" (cannot run here: {skipped[p.name]})" if p.name in skipped
                   else f" ({PAIRED_FIRST_START})" if p.needs_cluster and state != "warm" else "")
            print(f"{p.name:<12}{state}{why}")
        return 1 if cold else 0
    for name in sorted(set(skipped) - {p.name for p in chosen}):
        print(f"  {name}: skipped, cannot run on this host ({skipped[name]})")
    saved = structlog.get_config()
    try:
        return _warm_all(settings, chosen, skipped, args)
    finally:
        structlog.configure(**saved)  # the engine's log went to the file only for this command


def engine_log_path(settings: Settings) -> Path:
    """Where the warm-up engines' output goes (appended): the terminal gets one line per phase."""
    return settings.cache_dir / "warm" / "engine.log"


def _warm_all(settings: Settings, chosen: list[Profile], skipped: dict[str, str], args: argparse.Namespace) -> int:
    log_file = None
    t0 = time.monotonic()
    warmed = 0
    for p in chosen:
        if args.if_cold and warm_state(settings, p) == "warm":
            print(f"  {p.name}: already warm")
            continue
        if p.name in skipped:
            raise WarmupError(f"profile {p.name} cannot run on this host: {skipped[p.name]}")
        if p.needs_cluster:
            # Started alone, the head waits for a rank on the worker that never comes: not ready, exit 32.
            print(f"  {p.name}: skipped, {PAIRED_FIRST_START}", flush=True)
            continue
        refusal = MemoryGuard(settings.memory, ProcMemorySource()).start_refusal(p.memory_gib)
        if refusal:
            # Never start beside what runs without room: on unified memory that freezes the host.
            if args.if_room:
                print(f"  {p.name}: skipped, {refusal}; its first start will compile instead")
                continue
            raise WarmupError(f"warm-up of profile {p.name} refused by the memory guard: {refusal}")
        if log_file is None:
            path = engine_log_path(settings)
            path.parent.mkdir(parents=True, exist_ok=True)
            log_file = open(path, "a", encoding="utf-8", buffering=1)  # noqa: SIM115 (open for the run)
            logs.configure("info", json=False, use_journal=False, file=log_file, cache=False)
            print(f"the warm-up engine's log: {path}", flush=True)
        print(f"warming up profile {p.name} (its engine starts once, then stops)", flush=True)
        rec = asyncio.run(warm_one(settings, p, say=lambda line: print(line, flush=True)))
        write_marker(settings, p, rec)
        print(f"  {p.name}: {describe(rec)}", flush=True)
        warmed += 1
    print(f"warm-up done: {warmed} profile(s) in {time.monotonic() - t0:.0f} s")
    if log_file is not None:
        log_file.close()
    return 0


