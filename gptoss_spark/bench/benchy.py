"""Run llama-benchy (PyPI, pinned; not a copy) for one (depth, concurrency) point, offline.

llama-benchy 0.4.0 takes a local tokenizer (`--tokenizer PATH`: a tokenizer.json
or a directory holding one, read with `tokenizers`), but no local corpus: its
text comes from `--book-url`, fetched with `requests` unless
`~/.cache/llama-benchy/<md5 of the URL>.txt` exists, which it then reads as is.
So each run gets a private HOME whose cache already holds the shipped corpus
under the name of a `file://` URL of that corpus: llama-benchy finds it and
never fetches (requests cannot fetch file:// URLs either, so nothing falls back
to the network). Its output is checked for both: the text loaded from that
cache, and no fallback to the gpt2 tokenizer.

The API key goes through the environment to benchy_main, which hands it to
llama-benchy in-process; llama-benchy itself only takes it on its command line.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from importlib import metadata
from importlib.resources import files
from pathlib import Path

from ..base.fsutil import read_json
from .benchy_main import API_KEY_ENV

CORPUS_NAME = "sherlock-holmes-i-ii.txt"
PINNED_VERSION = "0.4.0"
LOG_TAIL_LINES = 25


def shipped_corpus() -> Path:
    return Path(str(files("gptoss_spark") / "data" / CORPUS_NAME))


def installed_version() -> str | None:
    try:
        return metadata.version("llama-benchy")
    except metadata.PackageNotFoundError:
        return None


@dataclass(frozen=True)
class Settings:
    base_url: str          # the engine, without /v1
    model: str             # served model name
    tokenizer: Path        # tokenizer.json
    corpus: Path
    pp: int
    tg: int
    runs: int
    skip_coherence: bool
    timeout: float         # seconds for one point's llama-benchy process
    api_key: str | None = None

    @property
    def book_url(self) -> str:
        return self.corpus.resolve().as_uri()


def argv(s: Settings, depth: int, concurrency: int, result_file: Path) -> list[str]:
    """llama-benchy's arguments for one point: the leaderboard's flags (sparkrun's), our endpoint and files."""
    args = ["--base-url", s.base_url.rstrip("/") + "/v1", "--model", s.model, "--served-model-name", s.model,
            "--tokenizer", str(s.tokenizer), "--book-url", s.book_url,
            "--pp", str(s.pp), "--tg", str(s.tg), "--depth", str(depth), "--concurrency", str(concurrency),
            "--runs", str(s.runs), "--enable-prefix-caching", "--exit-on-first-fail",
            "--format", "json", "--save-result", str(result_file)]
    if s.skip_coherence:
        args.append("--skip-coherence")
    return args


def seed_cache(home: Path, s: Settings) -> Path:
    """Put the corpus where llama-benchy looks before it downloads (module docstring)."""
    cache = home / ".cache" / "llama-benchy"
    cache.mkdir(parents=True)
    target = cache / (hashlib.md5(s.book_url.encode()).hexdigest() + ".txt")
    target.write_text(s.corpus.read_text(encoding="utf-8"), encoding="utf-8")
    return target


def environment(home: Path, s: Settings) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != API_KEY_ENV}
    # Private HOME: the seeded cache, no ~/.netrc for aiohttp's trust_env, no user HF cache.
    env.update({"HOME": str(home), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONUNBUFFERED": "1"})
    if s.api_key:
        env[API_KEY_ENV] = s.api_key
    return env


def offline_problem(output: str, cache_file: Path) -> str | None:
    """Why this run did not use the shipped corpus and the model's tokenizer, or None."""
    if f"Loading text from cache: {cache_file}" not in output:
        return f"llama-benchy did not read the shipped corpus from {cache_file}"
    if "Falling back to 'gpt2' tokenizer" in output:
        return "llama-benchy could not load the model's tokenizer and fell back to gpt2's"
    return None


def run_point(s: Settings, depth: int, concurrency: int) -> dict:
    """One llama-benchy process. Returns {ran, exit_code, error, raw (its JSON or None), log_tail, argv}."""
    with tempfile.TemporaryDirectory(prefix="gptoss-benchy-") as tmp:
        home, result_file = Path(tmp) / "home", Path(tmp) / "result.json"
        cache_file = seed_cache(home, s)
        args = argv(s, depth, concurrency, result_file)
        cmd = [sys.executable, "-m", "gptoss_spark.bench.benchy_main", *args]
        try:
            p = subprocess.run(cmd, env=environment(home, s), capture_output=True, text=True, timeout=s.timeout,
                               stdin=subprocess.DEVNULL)
            output, code = p.stdout + p.stderr, p.returncode
        except subprocess.TimeoutExpired as e:
            out = e.stdout or ""
            output, code = out.decode(errors="replace") if isinstance(out, bytes) else out, None
        raw = None
        if result_file.is_file():
            try:
                raw = read_json(result_file)
            except ValueError:
                raw = None
    error = None
    if code is None:
        error = f"llama-benchy did not finish within {s.timeout:g} s (--timeout)"
    elif code != 0:
        error = f"llama-benchy exited {code}: {_last_line(output)}"
    elif raw is None:
        error = f"llama-benchy wrote no JSON result: {_last_line(output)}"
    else:
        error = offline_problem(output, cache_file)
    return {"ran": True, "exit_code": code, "error": error, "raw": raw,
            "log_tail": output.splitlines()[-LOG_TAIL_LINES:], "argv": args}


def _last_line(output: str) -> str:
    lines = [ln.strip() for ln in output.splitlines() if ln.strip()]
    return lines[-1][:300] if lines else "no output"
