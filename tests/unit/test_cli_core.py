"""`gptoss-spark check` and `serve` on bad input: one line on stderr, a distinct exit code, no traceback."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gptoss_spark.cli", *args], capture_output=True, text=True,
                          timeout=300)


def settings(tmp: Path, model_exists: bool = True, extra: str = "", profile: str = 'description = "p"\n') -> Path:
    model = tmp / "model"
    if model_exists:
        model.mkdir()
        (model / "config.json").write_text("{}")
    pdir = tmp / "profiles"
    pdir.mkdir()
    (pdir / "plain.toml").write_text(profile)
    cfg = tmp / "gs.toml"
    cfg.write_text(f'{extra}[model]\ndir = "{model}"\n[paths]\nstate_dir = "{tmp}/s"\nprofile_dirs = ["{pdir}"]\n')
    return cfg


def test_check_ok(tmp_path):
    r = cli("check", "--config", str(settings(tmp_path)))
    assert r.returncode == 0 and r.stdout.startswith("ok: ") and "profile plain can start" in r.stdout


def test_check_refuses_an_engine_argument_vllm_rejects_in_one_line(tmp_path):
    """vLLM's own parser, in the engine's interpreter, answers; its usage text (hundreds of padded
    lines) stays out: only its one error line, naming the file and the key."""
    pytest.importorskip("vllm")
    profile = 'description = "p"\n[engine]\nargs = ["--max-num-seqs", "4", "--no-such-engine-flag"]\n'
    r = cli("check", "--config", str(settings(tmp_path, profile=profile)))
    assert r.returncode == 2, r.stdout + r.stderr
    assert r.stdout == "" and r.stderr.count("\n") == 1, r.stderr
    assert r.stderr.startswith(f"gptoss-spark: error: {tmp_path}/profiles/plain.toml: engine.args: "
                               "vLLM rejects profile plain's engine arguments: unrecognized arguments: "
                               "--no-such-engine-flag; "), r.stderr
    assert "usage" not in r.stderr and "  " not in r.stderr


def test_check_covers_every_profile_not_only_the_active_one(tmp_path):
    """The default service's check (no --config; here its file named by the environment, as the unit's
    would be the default path): every installed profile, the broken one named by its file."""
    pytest.importorskip("vllm")
    cfg = settings(tmp_path)
    (tmp_path / "profiles" / "other.toml").write_text('description = "o"\n[engine]\nargs = ["--no-such-flag"]\n')
    r = subprocess.run([sys.executable, "-m", "gptoss_spark.cli", "check"], capture_output=True, text=True,
                       timeout=300, env={**os.environ, "GPTOSS_SPARK_CONFIG": str(cfg)})
    assert r.returncode == 2, r.stdout + r.stderr
    assert r.stderr.startswith(f"gptoss-spark: error: {tmp_path}/profiles/other.toml: engine.args: vLLM rejects "
                               "profile other's engine arguments: unrecognized arguments: --no-such-flag"), r.stderr
    assert cli("check", "--config", str(cfg), "--profile", "plain").returncode == 0  # one named: that one alone


def test_check_config_checks_the_profiles_that_file_serves(tmp_path):
    """`check --config FILE` (an instance's file beside the default's profiles.d): FILE's default_profile
    and active profile; a broken profile it does not serve is named as not checked, not a failure."""
    pytest.importorskip("vllm")
    cfg = settings(tmp_path)
    (tmp_path / "profiles" / "other.toml").write_text('description = "o"\n[engine]\nargs = ["--no-such-flag"]\n')
    r = cli("check", "--config", str(cfg))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "profile plain can start" in r.stdout
    assert f"  not checked: other (not served by {cfg}; --all-profiles checks every profile)" in r.stdout
    assert cli("check", "--config", str(cfg), "--all-profiles").returncode == 1  # asked for: found


def test_check_missing_checkpoint_exit_3(tmp_path):
    r = cli("check", "--config", str(settings(tmp_path, model_exists=False)))
    assert r.returncode == 3
    assert r.stderr.count("\n") == 1 and r.stderr.startswith("gptoss-spark: error: profile plain: no checkpoint")


def test_serve_bad_default_profile_exits_2_before_starting_anything(tmp_path):
    r = cli("serve", "--config", str(settings(tmp_path, extra='default_profile = "fast"\n')))
    assert r.returncode == 2
    err = [line for line in r.stderr.splitlines() if line.startswith("gptoss-spark: error:")]
    assert err == [f"gptoss-spark: error: {tmp_path}/gs.toml: default_profile: unknown profile 'fast' (known: plain); "
                   "set it to a known profile or add that profile's .toml file"]
    assert "Traceback" not in r.stderr
    assert not (tmp_path / "s").exists()   # nothing written


def test_serve_missing_config_file(tmp_path):
    r = cli("serve", "--config", str(tmp_path / "absent.toml"))
    assert r.returncode == 2 and "config file not found" in r.stderr and "Traceback" not in r.stderr


def test_serve_missing_checkpoint_exits_3(tmp_path):
    r = cli("serve", "--config", str(settings(tmp_path, model_exists=False)))
    assert r.returncode == 3 and "Traceback" not in r.stderr
    assert "no checkpoint at" in r.stderr


def test_a_reader_that_goes_away_ends_the_command_quietly(tmp_path):
    """`gptoss-spark status | head -3`: the reader closes the pipe before the command has written;
    the command ends with 141 (128 + SIGPIPE, as `cat` would) and no BrokenPipeError traceback."""
    p = subprocess.Popen([sys.executable, "-m", "gptoss_spark.cli", "warmup", "--check", "--config",
                          str(settings(tmp_path))], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    p.stdout.close()  # before the interpreter has even imported the package: every write hits a closed pipe
    err = p.stderr.read()
    assert p.wait(timeout=300) == 141, err
    assert "BrokenPipeError" not in err and "Traceback" not in err, err
