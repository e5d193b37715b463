"""`gptoss-spark model pull|verify|list` against a Hub stand-in on 127.0.0.1 (tests/helpers/fake_hub.py).

huggingface_hub is pointed at it with its endpoint setting (endpoint= / --endpoint); the repository
holds a tiny generated checkpoint in the Hub's layout: config.json of gpt-oss-20b's shape, two real
safetensors shards stored as LFS files, a small tokenizer file stored in git, and an `original/`
directory the pull must leave out.
"""

from __future__ import annotations

import io
import json
import os
import re
import pwd
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("huggingface_hub")

from gptoss_spark.cli import main  # noqa: E402
from gptoss_spark.base.exit_codes import EXIT_MODEL_CORRUPT, EXIT_MODEL_FETCH, EXIT_MODEL_SPACE  # noqa: E402
from gptoss_spark.models.catalog import CATALOG, identify  # noqa: E402
from gptoss_spark.models.manifest import MANIFEST_NAME, read_manifest  # noqa: E402
from gptoss_spark.models.pull import CorruptError, FetchError, SpaceError, pull, staging_dir  # noqa: E402
from tests.helpers.fake_hub import FakeHub  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
ENTRY = CATALOG["gpt-oss-20b"]
SHARDS = ("model-00000-of-00002.safetensors", "model-00001-of-00002.safetensors")


def tiny_checkpoint() -> dict[str, bytes]:
    from safetensors.numpy import save

    rng = np.random.default_rng(0)
    cfg = {"architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss", "num_hidden_layers": 24,
           "num_local_experts": 32, "experts_per_token": 4, "hidden_size": 2880}
    return {
        "config.json": json.dumps(cfg).encode(),
        "tokenizer_config.json": b'{"model_max_length": 131072}',
        SHARDS[0]: save({"a": rng.standard_normal((256, 256)).astype(np.float32)}),
        # Over huggingface_hub's 10 MiB read size, so a dropped connection resumes past its first chunk.
        SHARDS[1]: save({"b": rng.standard_normal((3300, 1000)).astype(np.float32)}),
        "original/model.safetensors": save({"c": np.zeros(8, dtype=np.float32)}),
        ".gitattributes": b"*.safetensors filter=lfs diff=lfs merge=lfs -text\n",
    }


@pytest.fixture
def hub():
    with FakeHub() as h:
        h.add_repo(ENTRY.repo_id, tiny_checkpoint())
        yield h


def quiet(_line: str) -> None:
    pass


def test_pull_verifies_every_file_and_puts_the_checkpoint_in_place_whole(hub, tmp_path):
    dest = tmp_path / "models" / "gpt-oss-20b"
    result = pull(ENTRY, dest, endpoint=hub.url, out=quiet)
    files = {p.relative_to(dest).as_posix() for p in dest.rglob("*") if p.is_file()}
    assert files == {"config.json", "tokenizer_config.json", *SHARDS, ".gitattributes", MANIFEST_NAME}
    assert not staging_dir(dest).exists()  # staged, then renamed: nothing left beside it
    manifest = read_manifest(dest)
    assert manifest.revision == hub.commit and manifest.repo == ENTRY.repo_id
    served = hub.repos[ENTRY.repo_id]
    for shard in SHARDS:  # LFS files: the hub's sha256; small files: their git sha1, then sha256 recorded
        assert manifest.files[shard] == {"size": len(served[shard].data), "sha256": served[shard].sha256,
                                         "hub": f"sha256:{served[shard].sha256}"}
    assert manifest.files["config.json"]["hub"] == f"git-sha1:{served['config.json'].blob_id}"
    assert identify(dest) is ENTRY
    assert set(result.fetched) == set(manifest.files)
    # A second pull of the same revision fetches nothing.
    before = len(hub.gets(SHARDS[0]))
    assert pull(ENTRY, dest, endpoint=hub.url, out=quiet).already
    assert len(hub.gets(SHARDS[0])) == before


@pytest.mark.skipif(os.geteuid() != 0, reason="chown to another user needs root")
def test_the_result_is_owned_by_the_service_user(hub, tmp_path):
    dest = tmp_path / "gpt-oss-20b"
    pull(ENTRY, dest, endpoint=hub.url, out=quiet, owner="nobody")
    uid = pwd.getpwnam("nobody").pw_uid
    assert {p.stat().st_uid for p in (dest, *dest.rglob("*"))} == {uid}


def test_a_connection_dropped_mid_file_resumes_with_a_range_request(hub, tmp_path):
    hub.faults[(ENTRY.repo_id, SHARDS[1])] = "drop_once"
    dest = tmp_path / "gpt-oss-20b"
    pull(ENTRY, dest, endpoint=hub.url, out=quiet)
    # http_get resumes from the last whole read it wrote (constants.DOWNLOAD_CHUNK_SIZE, 10 MiB).
    from huggingface_hub.constants import DOWNLOAD_CHUNK_SIZE

    assert hub.gets(SHARDS[1]) == [None, f"bytes={DOWNLOAD_CHUNK_SIZE}-"]
    assert read_manifest(dest).files[SHARDS[1]]["sha256"] == hub.repos[ENTRY.repo_id][SHARDS[1]].sha256


def test_a_killed_pull_resumes_and_fetches_only_what_was_not_verified(hub, tmp_path):
    hub.faults[(ENTRY.repo_id, SHARDS[1])] = "hang"
    dest = tmp_path / "gpt-oss-20b"
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_DISABLE_PROGRESS_BARS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "gptoss_spark.cli", "model", "pull", "gpt-oss-20b",
                             "--dir", str(dest), "--endpoint", hub.url], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while not hub.gets(SHARDS[1]) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert hub.gets(SHARDS[1]), "the pull never reached the second shard"
        time.sleep(0.3)  # half of it written
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    assert not dest.exists()  # nothing half-written in place
    assert (staging_dir(dest) / SHARDS[0]).is_file()
    hub.faults.clear()
    hub.release()
    result = pull(ENTRY, dest, endpoint=hub.url, out=quiet)
    assert SHARDS[0] not in result.fetched and SHARDS[1] in result.fetched
    assert len(hub.gets(SHARDS[0])) == 1  # fetched once, by the killed run
    assert main(["model", "verify", str(dest)]) == 0


def test_a_corrupted_file_is_refused_and_nothing_is_put_in_place(hub, tmp_path):
    hub.faults[(ENTRY.repo_id, SHARDS[0])] = "corrupt"
    dest = tmp_path / "gpt-oss-20b"
    with pytest.raises(CorruptError, match=rf"^gpt-oss-20b: {SHARDS[0]} arrived with sha256 [0-9a-f]{{64}}, "
                                           rf"the hub lists sha256 {hub.repos[ENTRY.repo_id][SHARDS[0]].sha256}"):
        pull(ENTRY, dest, endpoint=hub.url, out=quiet)
    assert CorruptError.exit_code == EXIT_MODEL_CORRUPT
    assert not dest.exists()
    assert not (staging_dir(dest) / SHARDS[0]).exists()
    hub.faults.clear()  # the next run fetches it again and completes
    assert SHARDS[0] in pull(ENTRY, dest, endpoint=hub.url, out=quiet).fetched


def test_not_enough_disk_is_refused_before_anything_is_fetched(hub, tmp_path):
    dest = tmp_path / "gpt-oss-20b"
    with pytest.raises(SpaceError, match=r"^gpt-oss-20b: needs .* more at .*, 1000 B is free; free some space"):
        pull(ENTRY, dest, endpoint=hub.url, out=quiet, free_bytes=lambda _p: 1000)
    assert SpaceError.exit_code == EXIT_MODEL_SPACE
    assert [p for _m, p, _r in hub.requests if "/resolve/" in p] == []  # only the listing was asked for
    assert not dest.exists() and not staging_dir(dest).exists()


def flip_a_byte(path: Path) -> None:
    """One bit of one byte a third of the way in: the file's size stays, its sha256 does not."""
    data = bytearray(path.read_bytes())
    data[len(data) // 3] ^= 0x01
    path.write_bytes(bytes(data))


def test_verify_names_a_flipped_byte_without_the_network(hub, tmp_path, capsys):
    dest = tmp_path / "gpt-oss-20b"
    pull(ENTRY, dest, endpoint=hub.url, out=quiet)
    hub.__exit__(None, None, None)  # the hub is gone: verify needs none
    assert main(["model", "verify", str(dest)]) == 0
    flip_a_byte(dest / SHARDS[1])
    capsys.readouterr()
    assert main(["model", "verify", str(dest)]) == EXIT_MODEL_CORRUPT
    out = capsys.readouterr()
    assert f"CORRUPT sha256  {SHARDS[1]}: " in out.out and SHARDS[0] not in out.out
    assert "1 of 5 files differ from the manifest" in out.err


def test_pull_repairs_exactly_the_corrupt_file_in_place(hub, tmp_path, capsys):
    """verify names the flipped byte and the command that repairs it; that pull re-hashes what is there,
    fetches only the bad shard again and renames it over the bad one: the others keep bytes and mtimes."""
    dest = tmp_path / "gpt-oss-20b"
    pull(ENTRY, dest, endpoint=hub.url, out=quiet)
    others = {p: ((dest / p).read_bytes(), (dest / p).stat().st_mtime_ns)
              for p in ("config.json", "tokenizer_config.json", ".gitattributes", SHARDS[0], MANIFEST_NAME)}
    flip_a_byte(dest / SHARDS[1])
    capsys.readouterr()
    assert main(["model", "verify", str(dest)]) == EXIT_MODEL_CORRUPT
    advice = capsys.readouterr().err.strip().splitlines()[-1]
    repair = f"gptoss-spark model pull gpt-oss-20b --dir {dest} --revision {hub.commit}"
    assert advice.endswith(repair), advice
    gets = {p: len(hub.gets(p)) for p in (*SHARDS, "config.json")}
    lines: list[str] = []
    assert main(repair.split()[1:] + ["--endpoint", hub.url]) == 0
    result = pull(ENTRY, dest, endpoint=hub.url, out=lines.append)  # and the next pull finds nothing to do
    assert result.already and result.fetched == () and "every file matches the manifest" in lines[-1]
    assert len(hub.gets(SHARDS[1])) == gets[SHARDS[1]] + 1  # fetched again once
    assert len(hub.gets(SHARDS[0])) == gets[SHARDS[0]] and len(hub.gets("config.json")) == gets["config.json"]
    assert (dest / SHARDS[1]).read_bytes() == hub.repos[ENTRY.repo_id][SHARDS[1]].data
    assert {p: ((dest / p).read_bytes(), (dest / p).stat().st_mtime_ns) for p in others} == others
    assert not staging_dir(dest).exists()
    assert main(["model", "verify", str(dest)]) == 0


def test_a_repair_reports_what_it_replaced(hub, tmp_path):
    dest = tmp_path / "gpt-oss-20b"
    pull(ENTRY, dest, endpoint=hub.url, out=quiet)
    (dest / "config.json").unlink()          # gone
    (dest / SHARDS[0]).write_bytes(b"x")     # truncated
    lines: list[str] = []
    result = pull(ENTRY, dest, endpoint=hub.url, out=lines.append)
    assert set(result.repaired) == {"config.json", SHARDS[0]} and not result.already
    assert any(ln.startswith("gpt-oss-20b: 2 of 5 files differ; fetching them again") for ln in lines), lines
    assert main(["model", "verify", str(dest)]) == 0


class _Log(io.StringIO):
    """A stream that is not a terminal: the installer's tee, journald."""

    def isatty(self) -> bool:
        return False


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_off_a_terminal_the_bytes_of_a_file_arrive_as_lines(hub, tmp_path, monkeypatch):
    """tqdm (huggingface_hub's bars) draws nothing when stderr is not a terminal: the pull writes lines
    (every chunk here, interval 0; LINE_INTERVAL_S seconds apart in use) with bytes, percent and rate."""
    from gptoss_spark.models.pull_progress import progress_for
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_DISABLE_PROGRESS_BARS", None)
    lines: list[str] = []
    pull(ENTRY, tmp_path / "m", endpoint=hub.url, out=lines.append,
         bars=progress_for(_Log(), out=lines.append, interval=0))
    mine = [ln for ln in lines if ln.startswith(f"  {SHARDS[1]}: ")]
    assert len(mine) >= 2, lines  # huggingface_hub reads 10 MiB at a time: the 13.2 MB shard is two reads
    assert all(re.fullmatch(r"  \S+: [\d.]+ (MB|GB) of 13\.2 MB \(\d+ %\), [\d.]+ (B|MB|GB)/s(, ~\d+ s left)?", ln)
               for ln in mine), mine
    assert " of 13.2 MB (100 %), " in mine[-1]
    assert progress_for(_Terminal(), out=lines.append)(SHARDS[1]) is None  # a terminal: huggingface_hub's own bars


def test_progress_lines_are_bounded_in_rate():
    from gptoss_spark.models.pull_progress import lines_for

    now = [0.0]
    lines: list[str] = []
    bar = lines_for("f", lines.append, interval=5, clock=lambda: now[0])(total=50e6, initial=0, desc="x", unit="B")
    for _ in range(100):  # 0.5 MB every 1/8 s (exact in binary): 12.5 s in all
        now[0] += 0.125
        bar.update(0.5e6)
    bar.close()
    assert lines == ["  f: 20.0 MB of 50.0 MB (40 %), 4.0 MB/s, ~8 s left",
                     "  f: 40.0 MB of 50.0 MB (80 %), 4.0 MB/s, ~2 s left",
                     "  f: 50.0 MB of 50.0 MB (100 %), 4.0 MB/s"]  # at the end: the file's average rate


def test_an_unknown_repository_is_one_line_and_fetches_nothing(hub, tmp_path, capsys):
    missing = CATALOG["gpt-oss-120b"]  # not on this hub
    with pytest.raises(FetchError, match=r"^could not list openai/gpt-oss-120b@main on http://127\.0\.0\.1:\d+: "
                                         r"RepositoryNotFoundError"):
        pull(missing, tmp_path / "x", endpoint=hub.url, out=quiet)
    assert main(["model", "pull", "gpt-oss-120b", "--dir", str(tmp_path / "x"), "--endpoint", hub.url]) \
        == EXIT_MODEL_FETCH
    assert len(capsys.readouterr().err.strip().splitlines()) == 1


def test_a_directory_placed_by_hand_is_never_overwritten(hub, tmp_path):
    dest = tmp_path / "gpt-oss-20b"
    dest.mkdir()
    (dest / "config.json").write_text("{}")
    with pytest.raises(Exception, match="exists and was not pulled by gptoss-spark"):
        pull(ENTRY, dest, endpoint=hub.url, out=quiet)
    assert [p.name for p in dest.iterdir()] == ["config.json"]


def test_list_shows_what_is_present_and_which_profiles_use_it(hub, tmp_path, capsys):
    root = tmp_path / "models"
    cfg = tmp_path / "gptoss-spark.toml"
    cfg.write_text(f'[model]\ndir = "{root}/gpt-oss-120b"\neagle3_dir = "{root}/gpt-oss-120b-Eagle3"\n'
                   f'[paths]\nprofile_dirs = ["{REPO}/etc/profiles"]\n')
    assert main(["model", "pull", "gpt-oss-20b", "--config", str(cfg), "--endpoint", hub.url]) == 0
    assert (root / "gpt-oss-20b" / MANIFEST_NAME).is_file()  # beside model.dir, under its own name
    capsys.readouterr()
    assert main(["model", "list", "--config", str(cfg)]) == 0
    rows = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()[1:]}
    assert "absent" in rows["gpt-oss-120b"] and rows["gpt-oss-120b"].split()[-1] == "auto,cluster,fast,plain,spec,throughput"
    assert f"pulled " in rows["gpt-oss-20b"] and f"@{hub.commit[:12]}" in rows["gpt-oss-20b"]
    assert rows["gpt-oss-20b"].split()[-1] == "fast-20b,plain-20b,spec-20b"
    assert rows["gpt-oss-120b-eagle3"].split()[-1] == "auto,spec"


def test_the_installer_step_says_whether_the_checkpoint_is_there(tmp_path, capsys):
    """install.sh offers the pull when `install checkpoint` exits 1 (gptoss_spark/install/cli.py)."""
    model = tmp_path / "m"
    cfg = tmp_path / "root" / "etc" / "gptoss-spark" / "gptoss-spark.toml"
    cfg.parent.mkdir(parents=True)
    cfg.write_text(f'[model]\ndir = "{model}"\n')
    step = ["install", "checkpoint", "--root", str(tmp_path / "root"), "--source", str(REPO)]
    assert main(step) == 1 and capsys.readouterr().out.strip() == str(model)
    model.mkdir()
    (model / "config.json").write_text("{}")
    (model / "model-00000-of-00001.safetensors").write_bytes(b"x")
    assert main(step) == 0


def test_the_git_blob_hash_is_gits_own(tmp_path):
    """What the hub's blobId is for a small file: checked against `git hash-object`."""
    from gptoss_spark.models.hashing import digests

    f = tmp_path / "config.json"
    f.write_bytes(tiny_checkpoint()["config.json"])
    git = subprocess.run(["git", "hash-object", str(f)], capture_output=True, text=True, check=True).stdout.strip()
    assert digests(f).git_sha1 == git
    assert digests(f, git_sha1=False).git_sha1 is None
