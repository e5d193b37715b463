"""`extends`: a profile built on another (fast = plain + our kernels), and its one-line errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gptoss_spark.service.config import load_settings
from gptoss_spark.base.errors import ConfigError
from gptoss_spark.service.profiles import load_profile_file, load_profiles

REPO = Path(__file__).resolve().parents[2]


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def settings(tmp_path: Path, *dirs: Path):
    listed = ", ".join(f'"{d}"' for d in dirs)
    return load_settings(write(tmp_path / "gs.toml", f"[paths]\nprofile_dirs = [{listed}]\n"))


def one_line(err: Exception) -> str:
    msg = str(err)
    assert "\n" not in msg
    return msg


BASE = '''description = "base"
memory_gib = 10
[engine]
args = ["--max-num-seqs", "32", "--enable-prefix-caching", "--quantization-config", '{"moe": {"a": 1}}',
        "--moe-backend", "x", "--kv-cache-dtype=fp8"]
env = { A = "1", B = "2" }
[requires]
paths = ["{eagle3_dir}/config.json"]
'''


def test_shipped_fast_is_plain_plus_the_kernels(tmp_path):
    profiles = load_profiles(settings(tmp_path, REPO / "etc" / "profiles"))
    plain, fast = profiles["plain"], profiles["fast"]
    assert profiles["plain"] is not None and fast.extends == "plain"
    # Built from plain's options, whatever they are now: only the MoE ones change.
    expected: list[str] = []
    it = iter(plain.args)
    for a in it:
        if a == "--moe-backend":
            next(it)  # vLLM's MoE kernel choice: unused once the plugin runs the MoE
            continue
        expected.append(a)
        if a == "--quantization-config":
            qc = json.loads(next(it))
            qc.pop("moe")  # the MXFP8 activation override only narrows that unused choice
            expected.append(json.dumps(qc))
    assert list(fast.args) == expected
    assert "--moe-backend" in plain.args and "--moe-backend" not in fast.args
    assert fast.env == {**plain.env, "GPTOSS_SPARK_MOE": "triton"}
    assert "GPTOSS_SPARK_MOE" not in plain.env  # plain stays on vLLM's MoE
    assert (fast.memory_gib, fast.required_paths) == (plain.memory_gib, plain.required_paths)
    assert "NOT yet measured on a Spark" in fast.description


def test_shipped_plain_stays_the_default():
    assert load_settings(REPO / "etc" / "gptoss-spark.toml").default_profile == "plain"


def test_own_args_replace_in_place_new_ones_append_env_merges(tmp_path):
    d = tmp_path / "p"
    write(d / "base.toml", BASE)
    write(d / "child.toml", '''extends = "base"
description = "child"
[engine]
remove_args = ["--moe-backend"]
args = ["--quantization-config", '{}', "--kv-cache-dtype", "auto", "--max-model-len", "1024"]
env = { B = "3", C = "4" }
[requires]
paths = ["{model_dir}/x"]
''')
    child = load_profiles(settings(tmp_path, d))["child"]
    assert child.args == ("--max-num-seqs", "32", "--enable-prefix-caching", "--quantization-config", "{}",
                          "--kv-cache-dtype", "auto", "--max-model-len", "1024")
    assert child.env == {"A": "1", "B": "3", "C": "4"}
    assert child.memory_gib == 10  # inherited unless set
    assert child.required_paths == ("{eagle3_dir}/config.json", "{model_dir}/x")
    assert child.description == "child" and child.extends == "base"


def test_chains_resolve_and_a_later_directory_base_is_the_one_extended(tmp_path):
    shipped, user = tmp_path / "shipped", tmp_path / "user"
    write(shipped / "base.toml", BASE)
    write(shipped / "mid.toml", 'extends = "base"\ndescription = "m"\nmemory_gib = 5\n[engine]\nargs = ["--max-num-seqs", "8"]\n')
    write(shipped / "top.toml", 'extends = "mid"\ndescription = "t"\n[engine]\nenv = { Z = "9" }\n')
    write(user / "base.toml", 'description = "mine"\n[engine]\nargs = ["--max-num-seqs", "2", "--enforce-eager"]\n')
    top = load_profiles(settings(tmp_path, shipped, user))["top"]
    assert top.args == ("--max-num-seqs", "8", "--enforce-eager")
    assert top.env == {"Z": "9"} and top.memory_gib == 5


def test_without_a_base_memory_defaults_to_zero(tmp_path):
    p = write(tmp_path / "solo.toml", 'description = "s"\n')
    assert load_profile_file(p).memory_gib == 0.0


@pytest.mark.parametrize("files, bad, key, fragment", [
    ({"a.toml": 'extends = "nosuch"\ndescription = "a"\n'}, "a", "extends",
     "unknown base profile 'nosuch' (known: base); name a loaded profile or add nosuch.toml"),
    ({"a.toml": 'extends = "b"\ndescription = "a"\n', "b.toml": 'extends = "a"\ndescription = "b"\n'}, "b", "extends",
     "profiles extend each other in a cycle (a -> b -> a); remove extends from one of them"),
    ({"a.toml": 'extends = "a"\ndescription = "a"\n'}, "a", "extends", "cycle (a -> a)"),
    ({"a.toml": 'extends = "base"\ndescription = "a"\n[engine]\nremove_args = ["--enforce-eager"]\n'}, "a",
     "engine.remove_args", "--enforce-eager is not in the args of base"),
    ({"a.toml": 'extends = "base"\ndescription = "a"\n[engine]\nremove_args = ["--moe-backend"]\n'
                'args = ["--moe-backend", "y"]\n'}, "a", "engine.remove_args", "both removed and set"),
    ({"a.toml": 'description = "a"\n[engine]\nremove_args = ["--moe-backend"]\n'}, "a", "engine.remove_args",
     "only a profile that extends another can remove arguments"),
    ({"a.toml": 'extends = "base"\ndescription = "a"\n[engine]\nremove_args = ["--moe-backend=x"]\n'}, "a",
     "engine.remove_args", "is not a flag"),
    ({"a.toml": 'extends = "../base"\ndescription = "a"\n'}, "a", "extends", "should match pattern"),
    ({"a.toml": 'extends = "base"\n'}, "a", "description", "required key is missing"),
])
def test_bad_extends_is_one_line_naming_file_and_key(tmp_path, files, bad, key, fragment):
    d = tmp_path / "p"
    write(d / "base.toml", BASE)
    for name, text in files.items():
        write(d / name, text)
    with pytest.raises(ConfigError) as e:
        load_profiles(settings(tmp_path, d))
    msg = one_line(e.value)
    assert msg.startswith(f"{d / (bad + '.toml')}: {key}: ") and fragment in msg, msg


def test_a_profile_that_extends_cannot_be_loaded_alone(tmp_path):
    p = write(tmp_path / "a.toml", 'extends = "base"\ndescription = "a"\n')
    with pytest.raises(ConfigError) as e:
        load_profile_file(p)
    assert one_line(e.value).startswith(f"{p}: extends: extends 'base', which is not loaded here")
