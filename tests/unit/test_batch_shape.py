"""CUDA-graph capture sizes and the dynamic speculation schedule, as profiles write them (service/batch_shape.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gptoss_spark.base.errors import ConfigError
from gptoss_spark.service import batch_shape
from gptoss_spark.service.config import load_settings
from gptoss_spark.service.profiles import load_profiles

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("slots", [1, 2, 4, 16, 32, 100, 256, 300])
def test_auto_sizes_capture_every_small_batch_and_bound_the_padding(slots):
    sizes = batch_shape.auto_batch_sizes(slots)
    assert sizes == sorted(set(sizes))
    assert sizes[:min(16, slots)] == list(range(1, min(16, slots) + 1))
    assert sizes[-1] == max(slots, min(2 * slots, 512))
    assert batch_shape.max_padding_fraction(sizes, sizes[-1]) < 0.20


def test_vllms_default_pads_5_and_10_users_far_more():
    vllm_default_32 = [1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64]  # config/vllm.py at max_num_seqs 32, no speculation
    assert batch_shape.max_padding_fraction(vllm_default_32, 64) > 0.35  # 5 users run the graph of 8
    assert 5 in batch_shape.auto_batch_sizes(32) and 10 in batch_shape.auto_batch_sizes(32)


def test_schedule_and_tokens():
    assert batch_shape.dynamic_schedule(1, 16, 32) == [[1, 16, 1], [17, 32, 0]]
    assert batch_shape.dynamic_schedule(1, 64, 32) == [[1, 32, 1]]  # threshold above the slots: always on
    assert batch_shape.capture_tokens([1, 2, 3], 1, 2) == [1, 2, 3, 4]  # 3 requests do not draft
    assert batch_shape.capture_tokens([1, 2, 3], 0, None) == [1, 2, 3]


def write(dir: Path, name: str, text: str) -> None:
    (dir / f"{name}.toml").write_text(text)


@pytest.fixture
def profiles_dir(tmp_path):
    d = tmp_path / "profiles"
    d.mkdir()
    write(d, "base", 'description = "b"\n[engine]\nargs = ["--max-num-seqs", "8", '
                     '"--speculative-config", \'{"method": "eagle3", "model": "{eagle3_dir}", '
                     '"num_speculative_tokens": 1}\']\n[requires]\ngpu = true\n')
    return d


def settings(d: Path):
    s = load_settings(REPO / "etc" / "gptoss-spark.toml")
    return s.model_copy(update={"paths": s.paths.model_copy(update={"profile_dirs": [d]})})


def test_a_profile_sets_both_and_an_extension_inherits_them(profiles_dir):
    write(profiles_dir, "dyn", 'extends = "base"\ndescription = "d"\nspeculation_max_batch = 2\n'
                               'cuda_graph_sizes = [1, 2, 4, 8]\n')
    write(profiles_dir, "child", 'extends = "dyn"\ndescription = "c"\n')
    s = settings(profiles_dir)
    loaded = load_profiles(s)
    for name in ("dyn", "child"):
        args = loaded[name].engine_args(s)
        spec = json.loads(args[args.index("--speculative-config") + 1])
        assert spec["num_speculative_tokens_per_batch_size"] == [[1, 2, 1], [3, 8, 0]]
        i = args.index("--cudagraph-capture-sizes")
        assert args[i + 1:] == ["1", "2", "4", "8"]  # 1 and 2 requests verify 2 and 4 tokens: already listed
    base = loaded["base"].engine_args(s)  # default "auto", static K=1: every size and its verifying step
    i = base.index("--cudagraph-capture-sizes")
    assert [int(x) for x in base[i + 1:]] == sorted(set(range(1, 17)) | {2 * b for b in range(1, 17)})


def captured(args: list[str]) -> list[int]:
    return [int(x) for x in args[args.index("--cudagraph-capture-sizes") + 1:]]


def test_shipped_capture_sizes_as_docs_configuration_tables_them():
    """docs/CONFIGURATION.md's table, and its line that the 20b profiles capture what their 120b ones do."""
    s = settings(REPO / "etc" / "profiles")
    loaded = load_profiles(s)
    got = {name: captured(loaded[name].engine_args(s)) for name in
           ("plain", "fast", "cluster", "plain-20b", "fast-20b", "spec", "spec-20b", "auto")}
    plain = list(range(1, 17)) + [20, 24, 28, 32, 40, 48, 56, 64]
    assert got["plain"] == got["fast"] == got["cluster"] == got["plain-20b"] == got["fast-20b"] == plain
    assert got["spec"] == got["spec-20b"] == [1, 2, 3, 4, 6, 8]
    assert got["auto"] == sorted(plain + [18, 22, 26, 30])


def test_eager_profiles_get_no_capture_sizes():
    s = settings(REPO / "etc" / "profiles-cpu")
    args = load_profiles(s)["demo"].engine_args(s)
    assert "--cudagraph-capture-sizes" not in args


def test_cpu_profiles_get_no_capture_sizes(profiles_dir):
    # Compiled, slots named, but no GPU: a CPU engine captures no CUDA graph.
    write(profiles_dir, "cpu", 'description = "c"\n[engine]\nargs = ["--max-num-seqs", "4"]\n')
    s = settings(profiles_dir)
    assert load_profiles(s)["cpu"].engine_args(s) == ["--max-num-seqs", "4"]


@pytest.mark.parametrize("text, match", [
    ('description = "x"\nspeculation_max_batch = 4\n[engine]\nargs = ["--max-num-seqs", "8"]\n',
     "no --speculative-config"),
    ('description = "x"\nspeculation_max_batch = 0\n', "greater than or equal to 1"),
    ('description = "x"\ncuda_graph_sizes = [4, 2]\n', "ascending"),
    ('description = "x"\ncuda_graph_sizes = "some"\n', "auto"),
])
def test_bad_settings_are_one_line_errors(tmp_path, text, match):
    write(tmp_path, "bad", text)
    with pytest.raises(ConfigError, match=match) as e:
        load_profiles(settings(tmp_path))
    assert "\n" not in str(e.value)
