"""Ask vLLM's own parser, in the engine's interpreter, whether it accepts an engine argv; start nothing.

A profile with an argument vLLM rejects would otherwise be found out only after the
serving engine was stopped for it (a full checkpoint reload on a Spark to get back).
The check runs as a subprocess of the engine's python (settings.engine.python: the
service's venv, or a new venv an upgrade is about to switch to), because the
supervisor may run from another interpreter and only that venv's vLLM counts.

What it checks: vLLM's serve parser (flags, types, choices), validate_parsed_serve_args
and AsyncEngineArgs.from_cli_args. Not create_engine_config: that reads the checkpoint
and probes the device, which a check next to a serving engine must not do.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .config import Settings
    from .profiles import Profile

ENTRY = "vllm.entrypoints.openai.api_server"
MARKER = "gptoss-spark-argcheck:"
DEFAULT_TIMEOUT = 180.0  # importing vLLM on a busy two-core box: ~7 s idle, far more under load

# Runs in the engine's interpreter: stdlib and vLLM only (that venv may lack gptoss_spark).
_CHILD = r"""
import contextlib, io, json, sys
MARKER = sys.argv[1]
argvs = json.loads(sys.argv[2])  # one or more argument lists: one vLLM import answers them all
def done(errors):
    print(MARKER + json.dumps({"errors": errors}), flush=True)
    sys.exit(0)
err = io.StringIO()
try:
    with contextlib.redirect_stderr(err):
        from vllm.entrypoints.launchers.cli_args import make_arg_parser, validate_parsed_serve_args
        from vllm.utils.argparse_utils import FlexibleArgumentParser
        from vllm.engine.arg_utils import AsyncEngineArgs
except Exception as e:
    done([f"cannot import vLLM's parser: {type(e).__name__}: {e}"] * len(argvs))
def check(args):
    parser = make_arg_parser(FlexibleArgumentParser(prog="vllm"))
    err.seek(0)
    err.truncate()
    try:
        with contextlib.redirect_stderr(err):
            ns = parser.parse_args(args)
    except SystemExit:
        # argparse printed its usage (hundreds of padded lines) and one "vllm: error: ..." line.
        lines = [l for l in err.getvalue().splitlines() if l.startswith("vllm: error:")]
        return lines[-1][len("vllm: error:"):].strip() if lines else err.getvalue().strip()[-300:]
    try:
        validate_parsed_serve_args(ns)
        AsyncEngineArgs.from_cli_args(ns)
    except Exception as e:
        return f"{type(e).__name__}: {e}"
    return None
done([check(a) for a in argvs])
"""


class ArgCheckUnavailable(Exception):
    """The check itself could not run to an answer (timed out, interpreter missing, crashed)."""


def split_engine_argv(argv: list[str]) -> tuple[str, list[str]]:
    """(python, vLLM's own arguments) of an argv as engine.build_argv makes it (perhaps under taskset)."""
    from .headless import LAUNCHER

    if LAUNCHER in argv:  # a cluster worker's rank 1: the same serve arguments, --headless among them
        i = argv.index(LAUNCHER)
        if i < 2 or argv[i - 1] != "-c":
            raise ValueError(f"not an engine argv (the headless launcher not run with -c): {argv}")
        return argv[i - 2], argv[i + 1:]
    if ENTRY not in argv:
        raise ValueError(f"not an engine argv ({ENTRY} not in it): {argv}")
    i = argv.index(ENTRY)
    if i < 2 or argv[i - 1] != "-m":
        raise ValueError(f"not an engine argv ({ENTRY} not run with -m): {argv}")
    return argv[i - 2], argv[i + 1:]


def one_line(text: str, limit: int = 400) -> str:
    """vLLM's messages carry newlines and runs of spaces; a refusal is one readable line."""
    text = re.sub(r"\s+", " ", text).strip()
    return text if len(text) <= limit else text[:limit - 3] + "..."


async def vllm_rejects(python: str, args: list[str], env: dict[str, str] | None = None,
                       timeout: float = DEFAULT_TIMEOUT) -> str | None:
    """None if `python`'s vLLM accepts `args` (vLLM's arguments, without the entry module);
    else vLLM's one meaningful error line. Raises ArgCheckUnavailable if no answer came."""
    return (await vllm_rejects_many(python, [args], env, timeout))[0]


async def vllm_rejects_many(python: str, argvs: list[list[str]], env: dict[str, str] | None = None,
                            timeout: float = DEFAULT_TIMEOUT) -> list[str | None]:
    """vllm_rejects for several argument lists, in one child (one vLLM import)."""
    try:
        proc = await asyncio.create_subprocess_exec(
            python, "-c", _CHILD, MARKER, json.dumps(argvs), env=dict(os.environ if env is None else env),
            stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    except OSError as e:
        raise ArgCheckUnavailable(f"cannot run {python}: {e}") from None
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout)
    except asyncio.TimeoutError:
        proc.kill()
        await proc.wait()
        raise ArgCheckUnavailable(f"vLLM's parser gave no answer within {timeout:g} s") from None
    except asyncio.CancelledError:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        raise
    for line in reversed(out.decode("utf-8", "replace").splitlines()):
        if line.startswith(MARKER):
            errors = json.loads(line[len(MARKER):])["errors"]
            return [None if e is None else one_line(e) for e in errors]
    tail = err.decode("utf-8", "replace").strip().splitlines()[-1:] or [f"exit status {proc.returncode}"]
    raise ArgCheckUnavailable(f"the parser check in {python} ended without an answer: {one_line(tail[0])}")


async def profile_rejects(settings: "Settings", profile: "Profile", timeout: float = DEFAULT_TIMEOUT) -> str | None:
    """vllm_rejects for the argv and environment the supervisor would start `profile` with."""
    from .engine import build_argv, build_env  # engine imports the heavier FlashInfer cache helpers

    python, args = split_engine_argv(build_argv(settings, profile))
    with tempfile.TemporaryDirectory(prefix="gptoss-spark-argcheck-") as tmp:
        env = build_env(settings, profile, Path(tmp))
        env.pop("VLLM_API_KEY", None)  # the parser has no use for it
        return await vllm_rejects(python or sys.executable, args, env, timeout)


async def profiles_rejected(settings: "Settings", profiles: "dict[str, Profile]", timeout: float = DEFAULT_TIMEOUT,
                            parallel: int = 2) -> dict[str, tuple[str, str | None]]:
    """Each profile's argv and environment as the supervisor would start it, asked of vLLM's parser:
    {name: ("ok" | "rejected" | "unchecked", vLLM's line or why it could not be checked)}.

    Profiles with the same interpreter and environment share one child (one vLLM import, about
    a core and 1 GiB for seconds); `parallel` children at a time. A child that gives no answer
    (its profile's environment stops vLLM's import on this machine) leaves its profiles unchecked."""
    from .engine import build_argv, build_env

    gate = asyncio.Semaphore(parallel)
    groups: dict[str, tuple[str, dict[str, str], list[tuple[str, list[str]]]]] = {}
    with tempfile.TemporaryDirectory(prefix="gptoss-spark-argcheck-") as tmp:
        for name in sorted(profiles):
            python, args = split_engine_argv(build_argv(settings, profiles[name]))
            env = build_env(settings, profiles[name], Path(tmp))
            env.pop("VLLM_API_KEY", None)
            key = json.dumps([python, sorted(env.items())])
            groups.setdefault(key, (python or sys.executable, env, []))[2].append((name, args))

        async def one(python: str, env: dict[str, str], items: list[tuple[str, list[str]]]):
            async with gate:
                try:
                    errors = await vllm_rejects_many(python, [a for _, a in items], env, timeout)
                except ArgCheckUnavailable as e:
                    return {n: ("unchecked", one_line(str(e))) for n, _ in items}
            return {n: (("rejected", e) if e else ("ok", None)) for (n, _), e in zip(items, errors)}

        results: dict[str, tuple[str, str | None]] = {}
        for part in await asyncio.gather(*(one(*g) for g in groups.values())):
            results.update(part)
    return dict(sorted(results.items()))
