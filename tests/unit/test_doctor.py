from __future__ import annotations

import sys
from pathlib import Path

from gptoss_spark.service.config import Settings
from gptoss_spark.doctor import FAIL, OK, cmd_doctor, run_checks
from gptoss_spark.install.tiktoken_file import FILE_NAME, install_tiktoken_file


def settings(tmp: Path, **model) -> Settings:
    (tmp / "m").mkdir(exist_ok=True)
    (tmp / "m" / "config.json").write_text("{}")
    (tmp / "p").mkdir(exist_ok=True)
    (tmp / "p" / "plain.toml").write_text('description = "d"\n')
    return Settings.model_validate({"model": {"dir": str(tmp / "m"), **model},
                                    "admin": {"port": 1},  # nothing listens on port 1
                                    "paths": {"state_dir": str(tmp / "s"), "profile_dirs": [str(tmp / "p")]}})


def by_check(findings):
    return {f.check: f for f in findings}


def test_healthy_host_parts_are_ok_and_service_down_is_a_warning(tmp_path):
    install_tiktoken_file(tmp_path / "tk")
    f = by_check(run_checks(settings(tmp_path, tiktoken_dir=str(tmp_path / "tk")), Path(sys.prefix)))
    assert f["profiles"].level == OK and "active plain has what it needs" in f["profiles"].detail
    assert f["tiktoken"].level == OK
    assert f["service"].level == "warn" and "not answering" in f["service"].detail
    assert f["patches"].level in ("ok", "warn")          # this venv's vLLM is a real, known state


def test_corrupt_tokenizer_file_and_missing_checkpoint_fail(tmp_path):
    install_tiktoken_file(tmp_path / "tk")
    (tmp_path / "tk" / FILE_NAME).write_text("tampered\n")
    s = settings(tmp_path, tiktoken_dir=str(tmp_path / "tk"))
    (tmp_path / "m" / "config.json").unlink()
    f = by_check(run_checks(s, Path(sys.prefix)))
    assert f["tiktoken"].level == FAIL and "does not match o200k_base" in f["tiktoken"].detail
    assert f["profiles"].level == FAIL and "no checkpoint at" in f["profiles"].detail


def test_exit_code_and_output(tmp_path, capsys):
    cfg = tmp_path / "gs.toml"
    cfg.write_text("[engine]\nprot = 1\n")
    class A:
        config, venv, json = str(cfg), sys.prefix, False
    assert cmd_doctor(A) == 1
    out = capsys.readouterr().out
    assert out.startswith("fail  settings  ") and "engine.prot: unknown key" in out


def test_spec_profile_checks_the_eagle3_heads_aux_layers(tmp_path):
    """A profile drafting with the Eagle3 head gets the aux-layer check (draft/aux_layers.py) in doctor."""
    import json

    import pytest
    torch = pytest.importorskip("torch")
    from safetensors.torch import save_file

    s = settings(tmp_path, eagle3_dir=str(tmp_path / "eagle"))
    (tmp_path / "m" / "config.json").write_text(json.dumps({"num_hidden_layers": 36, "hidden_size": 16}))
    (tmp_path / "p" / "plain.toml").write_text(
        'description = "d"\n[engine]\nargs = ["--speculative-config", '
        '\'{"method": "eagle3", "model": "{eagle3_dir}", "num_speculative_tokens": 1}\']\n')
    head = tmp_path / "eagle"
    head.mkdir()
    (head / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLMEagle3"], "vocab_size": 32,
                                                  "hidden_size": 16, "eagle_aux_hidden_state_layer_ids": [2, 18]}))
    save_file({"fc.weight": torch.zeros(16, 48), "lm_head.weight": torch.zeros(32, 16)}, str(head / "model.safetensors"))
    f = by_check(run_checks(s, Path(sys.prefix)))
    assert f["draft"].level == FAIL and "fc takes 48 inputs, but 2 aux layers x target hidden 16 = 32" in f["draft"].detail
    cfg = json.loads((head / "config.json").read_text())
    cfg["eagle_aux_hidden_state_layer_ids"] = [2, 18, 33]
    (head / "config.json").write_text(json.dumps(cfg))
    f = by_check(run_checks(s, Path(sys.prefix)))
    assert f["draft"].level == OK and "[2, 18, 33]" in f["draft"].detail


def test_syscall_filter_finding_names_the_drop_in_and_the_way_out(tmp_path):
    from gptoss_spark.doctor import WARN, check_syscall_filter

    dropin = tmp_path / "20-syscall-filter.conf"
    assert "absent" in check_syscall_filter(dropin).detail
    dropin.write_text("[Service]\nSystemCallFilter=@system-service\n")
    on = check_syscall_filter(dropin)
    assert on.level == OK and str(dropin) in on.detail and "ln -sf /dev/null" in on.detail
    dropin.unlink()
    dropin.symlink_to("/dev/null")
    off = check_syscall_filter(dropin)
    assert off.level == WARN and "turned off" in off.detail and f"rm {dropin}" in off.detail


def test_doctor_lists_the_syscall_filter(tmp_path):
    install_tiktoken_file(tmp_path / "tk")
    f = by_check(run_checks(settings(tmp_path, tiktoken_dir=str(tmp_path / "tk")), Path(sys.prefix)))
    assert "seccomp" in f and "syscall filter" in f["seccomp"].detail


def test_host_off_loopback_without_the_lan_dropin_fails(tmp_path):
    from gptoss_spark.doctor import check_lan_dropin

    dropin = tmp_path / "30-lan.conf"
    assert check_lan_dropin(Settings(), dropin).level == OK
    lan = Settings.model_validate({"engine": {"host": "0.0.0.0", "api_key_file": str(tmp_path / "api.key")}})
    f = check_lan_dropin(lan, dropin)
    assert f.level == FAIL and "engine.host 0.0.0.0" in f.detail and "install.sh" in f.detail
    dropin.write_text("[Service]\nIPAddressAllow=192.168.1.0/24\n")
    assert check_lan_dropin(lan, dropin).level == OK


def test_warm_line_names_the_profiles_whose_next_start_compiles(tmp_path):
    from gptoss_spark.service.profiles import load_profiles
    from gptoss_spark.service.startup import StartupRecord
    from gptoss_spark.warmup import write_marker

    s = settings(tmp_path)
    f = by_check(run_checks(s, Path(sys.prefix)))
    assert f["warm"].level == "warn" and "plain (never warmed)" in f["warm"].detail
    assert "gptoss-spark warmup --if-cold" in f["warm"].detail
    rec = StartupRecord("plain", spawned_at=0.0)
    rec.mark("canary", now=5.0)
    write_marker(s, load_profiles(s)["plain"], rec)
    f = by_check(run_checks(s, Path(sys.prefix)))
    assert f["warm"].level == OK and "plain: a start compiles nothing" in f["warm"].detail
    # The profile's engine arguments change: what was compiled no longer fits.
    (tmp_path / "p" / "plain.toml").write_text('description = "d"\n[engine]\nargs = ["--max-num-seqs", "8"]\n')
    f = by_check(run_checks(s, Path(sys.prefix)))
    assert f["warm"].level == "warn" and "plain (warmed under other versions)" in f["warm"].detail


def test_a_profile_across_two_nodes_is_warmed_by_its_first_start_on_the_pair(tmp_path, monkeypatch):
    """`warmup` cannot start a cluster profile alone (warmup.py): doctor does not send the owner there."""
    from gptoss_spark.doctor import check_warm
    from gptoss_spark.service.config import load_settings

    monkeypatch.setattr("gptoss_spark.service.profiles.nvidia_gpu_count", lambda: 0)
    (tmp_path / "p").mkdir()
    (tmp_path / "p" / "pair.toml").write_text('description = "c"\n[engine]\nargs = []\n[requires]\ncluster = true\n')
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text("{}")
    cfg = tmp_path / "gs.toml"
    cfg.write_text(f'default_profile = "pair"\n[model]\ndir = "{tmp_path / "m"}"\n[paths]\nstate_dir = "{tmp_path / "s"}"\n'
                   f'profile_dirs = ["{tmp_path / "p"}"]\n[admin]\nhost = "10.0.0.1"\n'
                   '[cluster]\nrole = "head"\naddress = "10.0.0.1"\npeer = "10.0.0.2"\ninterface = "eth1"\n')
    f = check_warm(load_settings(cfg))
    assert f.level == "warn" and "pair (never warmed; its first start on the pair is its warm-up)" in f.detail
    assert "warmup --if-cold" not in f.detail
