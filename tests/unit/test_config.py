"""Config and profile validation: every bad input ends in one line naming file, key and fix."""

from __future__ import annotations

from pathlib import Path

import pytest

from gptoss_spark.service.config import load_settings
from gptoss_spark.service import profiles as profiles_mod
from gptoss_spark.base.errors import ConfigError, RequirementError
from gptoss_spark.service.profiles import get_profile, load_profile_file, load_profiles

REPO = Path(__file__).resolve().parents[2]


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


@pytest.fixture
def setup(tmp_path):
    """A valid settings file with one profile dir and a fake checkpoint."""
    model = tmp_path / "model"
    write(model / "config.json", "{}")
    pdir = tmp_path / "profiles"
    write(pdir / "plain.toml", 'description = "p"\n[engine]\nargs = ["--max-num-seqs", "4"]\n')
    cfg = write(tmp_path / "gs.toml", f'[model]\ndir = "{model}"\neagle3_dir = "{tmp_path}/eagle"\n'
                f'[paths]\nstate_dir = "{tmp_path}/state"\nprofile_dirs = ["{pdir}"]\n')
    return tmp_path, cfg, pdir


def one_line(err: Exception) -> str:
    msg = str(err)
    assert "\n" not in msg
    return msg


def test_valid_settings_and_defaults(setup):
    tmp, cfg, _ = setup
    s = load_settings(cfg)
    assert s.engine.port == 8100 and s.admin.port == 8101 and s.admin.host == "127.0.0.1"
    assert s.source == cfg
    env = s.cache_env()
    assert env["TRITON_CACHE_DIR"] == f"{tmp}/state/cache/triton"
    assert env["GPTOSS_SPARK_CUTE_DSL_CACHE"] == f"{tmp}/state/cache/cute-dsl"  # not the per-engine TMPDIR
    assert env["VLLM_CACHE_ROOT"].startswith(f"{tmp}/state/cache")


def test_shipped_settings_file_is_valid():
    s = load_settings(REPO / "etc" / "gptoss-spark.toml")
    assert s.default_profile == "plain"


def test_missing_file(tmp_path):
    with pytest.raises(ConfigError) as e:
        load_settings(tmp_path / "nope.toml")
    assert one_line(e.value).startswith(f"{tmp_path}/nope.toml: config file not found;")
    assert "--config" in str(e.value)


def test_missing_file_allowed_when_optional(tmp_path):
    assert load_settings(tmp_path / "nope.toml", must_exist=False).engine.port == 8100


def test_bad_toml(tmp_path):
    cfg = write(tmp_path / "gs.toml", "[engine\nport = 1\n")
    with pytest.raises(ConfigError) as e:
        load_settings(cfg)
    assert "not valid TOML" in one_line(e.value) and "line 1" in str(e.value)


def test_unknown_key(tmp_path):
    cfg = write(tmp_path / "gs.toml", "[engine]\nprot = 8100\n")
    with pytest.raises(ConfigError) as e:
        load_settings(cfg)
    assert one_line(e.value) == (f"{cfg}: engine.prot: unknown key; remove it or check its spelling "
                                 "(see docs/CONFIGURATION.md)")


def test_unknown_section(tmp_path):
    cfg = write(tmp_path / "gs.toml", "[engien]\nport = 8100\n")
    with pytest.raises(ConfigError) as e:
        load_settings(cfg)
    assert f"{cfg}: engien: unknown key" in one_line(e.value)


@pytest.mark.parametrize("text,key,fragment", [
    ('[engine]\nport = "eighty"\n', "engine.port", "valid integer"),
    ("[engine]\nport = 70000\n", "engine.port", "less than or equal to 65535"),
    ("[timeouts]\nload = -1\n", "timeouts.load", "greater than 0"),
    ('[restart]\non_give_up = "sometimes"\n', "restart.on_give_up", "'stay' or 'exit'"),
    ('[model]\nserved_name = "a b"\n', "model.served_name", "pattern"),
    ("[admin]\nport = 8100\n", None, "engine.port and admin.port must differ"),
    ('[alerts]\nwebhook_url = "hooks.example/x"\n', "alerts.webhook_url", "pattern"),
    ('[alerts]\ncommand = "page-me"\n', "alerts.command", "valid list"),
    ("[alerts]\ntimeout = 0\n", "alerts.timeout", "greater than 0"),
    ('[gpu]\nalerts = ["thermal", "clock_low"]\n', "gpu.alerts.1",
     "Input should be 'thermal', 'power', 'hw_slowdown' or 'low_clock' (got 'clock_low')"),
    ('[gpu]\nalerts = "thermal"\n', "gpu.alerts", "valid list"),
    ("[gpu]\npower_clock_fraction = 1.5\n", "gpu.power_clock_fraction", "less than or equal to 1"),
    ("[gpu]\npower_clock_fraction = 0\n", "gpu.power_clock_fraction", "greater than 0"),
])
def test_wrong_types_and_values(tmp_path, text, key, fragment):
    cfg = write(tmp_path / "gs.toml", text)
    with pytest.raises(ConfigError) as e:
        load_settings(cfg)
    msg = one_line(e.value)
    assert fragment in msg
    if key:
        assert msg.startswith(f"{cfg}: {key}: ")
    assert msg.endswith("correct the value")


def test_unknown_profile(setup):
    _, cfg, _ = setup
    s = load_settings(cfg)
    with pytest.raises(ConfigError) as e:
        get_profile(load_profiles(s), "fast", s)
    assert "unknown profile 'fast' (known: plain)" in one_line(e.value)
    assert "add fast.toml" in str(e.value)


def test_unknown_profiles_one_wording():
    """Every place a profile name comes in words it the same (profiles.unknown_profiles)."""
    from gptoss_spark.service.profiles import unknown_profiles
    assert unknown_profiles(["fast"], {"spec": 1, "plain": 2}) == "unknown profile 'fast' (known: plain, spec)"
    assert unknown_profiles(["a", "b"], []) == "unknown profiles 'a', 'b' (known: none)"


def test_missing_model_dir(setup, tmp_path):
    _, cfg, _ = setup
    cfg.write_text(cfg.read_text().replace(f'dir = "{tmp_path}/model"', f'dir = "{tmp_path}/none"'))
    s = load_settings(cfg)
    with pytest.raises(RequirementError) as e:
        load_profiles(s)["plain"].check_requirements(s)
    assert one_line(e.value) == (f"profile plain: no checkpoint at {tmp_path}/none (config.json missing); "
                                 f"run `sudo gptoss-spark model pull gpt-oss-120b` or set model.dir in {cfg}")


def test_unmet_requirement_names_path_and_file(setup):
    tmp, cfg, pdir = setup
    spec = write(pdir / "spec.toml", 'description = "s"\n[requires]\npaths = ["{eagle3_dir}/config.json"]\n')
    s = load_settings(cfg)
    with pytest.raises(RequirementError) as e:
        load_profiles(s)["spec"].check_requirements(s)
    msg = one_line(e.value)
    assert f"required path {tmp}/eagle/config.json does not exist ({spec}: requires.paths)" in msg
    write(tmp / "eagle" / "config.json", "{}")
    load_profiles(s)["spec"].check_requirements(s)  # met now: no error


@pytest.mark.parametrize("body,key,fragment", [
    ('[engine]\nargs = ["--port", "9000"]\n', "engine.args", "--port is set by the service; set engine.port"),
    ('[engine]\nargs = ["--model=/x"]\n', "engine.args", "--model is set by the service"),
    # engine.engine_shutdown_timeout derives it from shutdown_grace, not from the drain timeout
    ('[engine]\nargs = ["--shutdown-timeout", "5"]\n', "engine.args", "set timeouts.shutdown_grace in"),
    ('[engine]\nargs = "--max-num-seqs 4"\n', "engine.args", "valid list"),
    ('[engine]\nenv = { NOTIFY_SOCKET = "/x" }\n', "engine.env", "NOTIFY_SOCKET is managed by the supervisor"),
    ('[engine]\nenv = { "A-B" = "1" }\n', "engine.env", "not a valid environment variable name"),
    ('[engine]\nargz = []\n', "engine.argz", "unknown key"),
    ('memory_gib = "lots"\n', "memory_gib", "valid number"),
])
def test_bad_profile_files(tmp_path, body, key, fragment):
    p = write(tmp_path / "bad.toml", 'description = "d"\n' + body)
    with pytest.raises(ConfigError) as e:
        load_profile_file(p)
    msg = one_line(e.value)
    assert msg.startswith(f"{p}: {key}: ") and fragment in msg


def test_profile_without_description(tmp_path):
    p = write(tmp_path / "x.toml", "[engine]\nargs = []\n")
    with pytest.raises(ConfigError) as e:
        load_profile_file(p)
    assert one_line(e.value).startswith(f"{p}: description: required key is missing; add it")


def test_bad_profile_name(tmp_path):
    p = write(tmp_path / "My Profile.toml", 'description = "d"\n')
    with pytest.raises(ConfigError) as e:
        load_profile_file(p)
    assert "profile name 'My Profile' is not allowed" in one_line(e.value)


def test_unknown_placeholder_is_an_error_json_braces_are_not(setup):
    _, cfg, pdir = setup
    s = load_settings(cfg)
    p = write(pdir / "x.toml", 'description = "d"\n[engine]\nargs = [\'{"model": "{eagle_dir}"}\']\n')
    with pytest.raises(ConfigError) as e:
        load_profile_file(p).engine_args(s)
    assert "unknown placeholder {eagle_dir}" in one_line(e.value)
    p.write_text('description = "d"\n[engine]\nargs = [\'{"model": "{eagle3_dir}", "k": 1}\']\n')
    assert load_profile_file(p).engine_args(s) == [f'{{"model": "{s.model.eagle3_dir}", "k": 1}}']


def test_later_profile_dir_overrides(setup, tmp_path):
    _, cfg, pdir = setup
    user = write(tmp_path / "user" / "plain.toml", 'description = "mine"\n')
    cfg.write_text(cfg.read_text().replace(f'profile_dirs = ["{pdir}"]', f'profile_dirs = ["{pdir}", "{user.parent}"]'))
    s = load_settings(cfg)
    assert load_profiles(s)["plain"].description == "mine"


def test_shipped_profiles_load_and_spec_requires_eagle3(tmp_path, monkeypatch):
    cfg = write(tmp_path / "gs.toml", f'[model]\ndir = "{tmp_path}"\neagle3_dir = "{tmp_path}/e"\n'
                f'[paths]\nprofile_dirs = ["{REPO}/etc/profiles", "{REPO}/etc/profiles-cpu"]\n')
    write(tmp_path / "config.json", "{}")
    s = load_settings(cfg)
    profiles = load_profiles(s)
    assert set(profiles) == {"plain", "spec", "fast", "throughput", "auto", "cluster", "demo", "demo-cluster",
                             "plain-20b", "fast-20b", "spec-20b"}
    assert "--max-num-seqs" in profiles["plain"].args
    assert profiles["plain"].args[profiles["plain"].args.index("--max-num-seqs") + 1] == "32"
    spec_args = profiles["spec"].engine_args(s)
    assert spec_args[spec_args.index("--max-num-seqs") + 1] == "2"
    assert f'"model": "{tmp_path}/e"' in spec_args[spec_args.index("--speculative-config") + 1]
    assert '"num_speculative_tokens": 1' in spec_args[spec_args.index("--speculative-config") + 1]
    (tmp_path / "gpus" / "0000:01:00.0").mkdir(parents=True)  # as the driver lists a Spark's GPU
    monkeypatch.setattr(profiles_mod, "NVIDIA_GPUS_DIR", tmp_path / "gpus")
    profiles["plain"].check_requirements(s)
    with pytest.raises(RequirementError, match="Eagle3|e/config.json"):
        profiles["spec"].check_requirements(s)


def test_gpu_alerts_default_to_every_throttle_kind_and_may_be_narrowed(tmp_path):
    from gptoss_spark.service.alert_kinds import GpuAlertKind

    assert tuple(load_settings(tmp_path / "none.toml", must_exist=False).gpu.alerts) == tuple(GpuAlertKind)
    cfg = write(tmp_path / "gs.toml", '[gpu]\nalerts = ["thermal", "hw_slowdown"]\npower_clock_fraction = 1\n')
    gpu = load_settings(cfg).gpu
    assert gpu.alerts == ["thermal", "hw_slowdown"] and gpu.power_clock_fraction == 1.0
    assert load_settings(write(tmp_path / "none.toml", "[gpu]\nalerts = []\n")).gpu.alerts == []
