"""Installer steps against a scratch root: venv id, build with a fake runner,
atomic switch, rollback, config placement, token, unit, uninstall, dry runs."""

from __future__ import annotations

import os
import re
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from gptoss_spark.install import locks, placement, uninstall, validate, venvs, versions, why
from gptoss_spark.base import exit_codes as codes
from gptoss_spark.install.layout import InstallError, Layout

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def src(tmp_path) -> Path:
    s = tmp_path / "src"
    (s / "gptoss_spark").mkdir(parents=True)
    (s / "gptoss_spark" / "__init__.py").write_text('__version__ = "1.2.3"\n')
    (s / "gptoss_spark" / "mod.py").write_text("x = 1\n")
    (s / "pyproject.toml").write_text("[project]\nname='x'\n")
    (s / "README.md").write_text("readme\n")
    (s / "patches" / "vllm").mkdir(parents=True)
    (s / "patches" / "vllm" / "01-a.patch").write_text("p\n")
    (s / "etc" / "profiles").mkdir(parents=True)
    (s / "etc" / "profiles-cpu").mkdir(parents=True)
    (s / "etc" / "gptoss-spark.toml").write_text((REPO / "etc" / "gptoss-spark.toml").read_text())
    (s / "etc" / "profiles" / "plain.toml").write_text("[engine]\nargs = []\n")
    (s / "etc" / "profiles-cpu" / "demo.toml").write_text("[engine]\nargs = ['--x']\n")
    (s / "systemd").mkdir()
    (s / "systemd" / "gptoss-spark.service").write_text((REPO / "systemd" / "gptoss-spark.service").read_text())
    return s


@pytest.fixture
def lay(tmp_path) -> Layout:
    return Layout(root=tmp_path / "root")


def snapshot(root: Path) -> dict[str, tuple]:
    out = {}
    if not root.exists():
        return out
    for p in [root, *root.rglob("*")]:
        st = p.lstat()
        out[str(p)] = (st.st_mode, st.st_uid, st.st_gid,
                       os.readlink(p) if p.is_symlink() else (p.read_bytes() if p.is_file() else None))
    return out


# ---------------------------------------------------------------- venv id

def test_venv_id_is_stable_and_tracks_inputs(src):
    a = venvs.venv_id(src, mode="cpu", python_version="3.11.2")
    assert a == venvs.venv_id(src, mode="cpu", python_version="3.11.2")
    assert a.startswith("1.2.3-cpu-")
    assert venvs.venv_id(src, mode="spark", python_version="3.11.2") != a
    assert venvs.venv_id(src, mode="cpu", python_version="3.12.3") != a
    (src / "README.md").write_text("docs edit\n")
    (src / "gptoss_spark" / "__pycache__").mkdir()
    (src / "gptoss_spark" / "__pycache__" / "mod.cpython-311.pyc").write_bytes(b"junk")
    assert venvs.venv_id(src, mode="cpu", python_version="3.11.2") == a  # no reinstall for docs or bytecode
    (src / "patches" / "vllm" / "01-a.patch").write_text("changed\n")
    assert venvs.venv_id(src, mode="cpu", python_version="3.11.2") != a


def test_stage_source_copies_what_pip_needs(src, tmp_path):
    dest = venvs.stage_source(src, tmp_path / "stage")
    assert (dest / "pyproject.toml").is_file() and (dest / "README.md").is_file()
    assert (dest / "gptoss_spark" / "mod.py").is_file()
    assert not (dest / "etc").exists()


# ---------------------------------------------------------------- build

class FakeRunner:
    def __init__(self, fail_on: str | None = None):
        self.calls: list[list[str]] = []
        self.fail_on = fail_on

    def __call__(self, argv) -> int:
        argv = [str(a) for a in argv]
        self.calls.append(argv)
        if argv[1:3] == ["-m", "venv"]:
            Path(argv[3], "bin").mkdir(parents=True)
        if self.fail_on and self.fail_on in " ".join(argv):
            return 1
        return 0


def plan(lay, src, mode="cpu") -> venvs.BuildPlan:
    return venvs.BuildPlan(layout=lay, source=src, venv_id=venvs.venv_id(src, mode=mode, python_version="3.11.2"),
                           mode=mode, python="/usr/bin/python3")


def test_build_runs_the_steps_and_marks_complete(lay, src):
    run = FakeRunner()
    p = plan(lay, src)
    assert venvs.build_venv(p, run=run, log=lambda s: None) is True
    joined = [" ".join(c) for c in run.calls]
    assert any("pip install" in c and c.endswith("[cpu,bench]") for c in joined)
    # what the locks leave out, pip resolved in: removed again
    assert any("pip uninstall" in c and "torchvision" in c and c.endswith(" asyncio") for c in joined)
    pdir = f"--patches-dir {p.staged / 'patches' / 'vllm'}"
    assert any(c.endswith(f"patches apply --venv {p.venv} {pdir}") for c in joined)
    assert any(c.endswith(f"patches verify --venv {p.venv} {pdir}") for c in joined)
    assert not any("kernels build" in c for c in joined)  # --cpu: no kernels
    assert venvs.is_complete(p.venv)
    assert not p.staged.exists()
    # unchanged inputs: a re-run runs nothing
    run2 = FakeRunner()
    assert venvs.build_venv(p, run=run2, log=lambda s: None) is False
    assert run2.calls == []


def locked_plan(lay, src, name="cpu-cp311-x86_64") -> venvs.BuildPlan:
    t = locks.TARGETS[name]
    (src / t.path).parent.mkdir(exist_ok=True)
    (src / t.path).write_text("six==1.17.0 \\\n    --hash=sha256:" + "0" * 64 + "\n")
    p = plan(lay, src, t.mode)
    return venvs.BuildPlan(layout=p.layout, source=p.source, venv_id=p.venv_id, mode=p.mode, python=p.python,
                           lock=t)


def test_locked_build_installs_the_lock_as_is_then_the_package(lay, src):
    run = FakeRunner()
    p = locked_plan(lay, src)
    venvs.build_venv(p, run=run, log=lambda s: None)
    joined = [" ".join(c) for c in run.calls]
    installs = [c for c in joined if " -m pip install " in c]
    assert installs[0].endswith(f"--no-deps --require-hashes -r {p.staged / 'locks' / 'cpu-cp311-x86_64.txt'}")
    assert installs[1].endswith(f"--no-deps {p.staged}")  # the package alone, nothing resolved
    assert len(installs) == 2
    check = [c for c in joined if "gptoss_spark.install.depcheck" in c]
    assert check == [f"{p.venv}/bin/python -m gptoss_spark.install.depcheck --absent=torchvision "
                     "--absent=torchaudio --absent=torchcodec --absent=asyncio"]
    assert not any("pip uninstall" in c for c in joined)  # the lock never installs them
    assert venvs.is_complete(p.venv)


def test_locked_spark_build_has_only_the_asyncio_backport_absent(lay, src):
    run = FakeRunner()
    venvs.build_venv(locked_plan(lay, src, "spark-cp312-aarch64"), run=run, log=lambda s: None)
    joined = [" ".join(c) for c in run.calls]
    assert any(c.endswith("-m gptoss_spark.install.depcheck --absent=asyncio") for c in joined)
    assert any("kernels build" in c for c in joined)


@pytest.mark.parametrize("fail_on", ["--require-hashes", "--no-deps /", "depcheck"])
def test_failed_locked_step_removes_the_new_venv(lay, src, fail_on):
    p = locked_plan(lay, src)
    with pytest.raises(InstallError) as e:
        venvs.build_venv(p, run=FakeRunner(fail_on=fail_on), log=lambda s: None)
    assert e.value.exit_code == codes.EXIT_VENV and "\n" not in str(e.value)
    assert not p.venv.exists()


def test_a_lock_that_misses_a_requirement_advises_by_who_installs(lay, src):
    """A checkout (a developer) is told to refresh the lock; a release (no .git) that the lock is broken as
    shipped and what to do instead: someone installing a release cannot refresh a lock."""
    def refusal() -> str:
        with pytest.raises(InstallError) as e:
            venvs.build_venv(locked_plan(lay, src), run=FakeRunner(fail_on="depcheck"), log=lambda s: None)
        return str(e.value)
    release = refusal()
    assert "this release is broken as shipped" in release and "lock.sh" not in release
    (src / ".git").mkdir()
    assert "refresh it (scripts/lock.sh refresh)" in refusal()


def test_a_changed_lock_is_a_new_venv(src):
    (src / "locks").mkdir()
    (src / "locks" / "cpu-cp311-x86_64.txt").write_text("six==1.16.0\n")
    a = venvs.venv_id(src, mode="cpu", python_version="3.11.2")
    (src / "locks" / "cpu-cp311-x86_64.txt").write_text("six==1.17.0\n")
    assert venvs.venv_id(src, mode="cpu", python_version="3.11.2") != a


def test_spark_build_compiles_kernels_when_available(lay, src):
    run = FakeRunner()
    venvs.build_venv(plan(lay, src, "spark"), run=run, log=lambda s: None)
    joined = [" ".join(c) for c in run.calls]
    assert any(c.endswith("[spark,bench]") for c in joined)
    kernels = [c for c in joined if "kernels build --arch 12.1a" in c]
    # Built as the service user, so the engine can add to the cache it finds.
    assert len(kernels) == 1 and kernels[0].startswith("setpriv --reuid=gptoss-spark --regid=gptoss-spark")
    # only llama-benchy's asyncio backport comes out again; the CUDA torchvision & co. are the Spark's own
    assert [c.split("--quiet ")[-1] for c in joined if "pip uninstall" in c] == ["asyncio"]


@pytest.mark.parametrize("fail_on,code", [("pip install", codes.EXIT_VENV), ("patches apply", codes.EXIT_PATCHES),
                                          ("patches verify", codes.EXIT_PATCHES), ("kernels build", codes.EXIT_KERNELS)])
def test_failed_step_removes_the_new_venv_and_leaves_current(lay, src, fail_on, code):
    good = plan(lay, src, "spark")
    venvs.build_venv(good, run=FakeRunner(), log=lambda s: None)
    versions.switch_to(lay, good.venv_id)
    before = snapshot(lay.opt_dir)
    (src / "gptoss_spark" / "mod.py").write_text("x = 2\n")
    bad = plan(lay, src, "spark")
    with pytest.raises(InstallError) as e:
        venvs.build_venv(bad, run=FakeRunner(fail_on=fail_on), log=lambda s: None)
    assert e.value.exit_code == code
    assert not bad.venv.exists()
    assert snapshot(lay.opt_dir) == before


def test_unfinished_build_is_rebuilt(lay, src):
    p = plan(lay, src)
    (p.venv / "bin").mkdir(parents=True)  # a crash mid-build: no marker
    assert venvs.build_venv(p, run=FakeRunner(), log=lambda s: None) is True
    assert venvs.is_complete(p.venv)


# ---------------------------------------------------------------- warm-up (venvs.warm_up)

def warm_up_layout(lay: Layout) -> Path:
    """An installed old version serving through `current`, a config file, and a built new venv."""
    fake_venv(lay, "old")
    served(lay, "old")
    lay.config_file.parent.mkdir(parents=True, exist_ok=True)
    lay.config_file.write_text("")
    fake_venv(lay, "new")
    return lay.venvs_dir / "new"


@pytest.mark.parametrize("check_rc", [1, 0])
def test_warm_up_while_the_service_runs_only_checks(lay, check_rc):
    """The serving engine holds the memory: no second engine, only `warmup --check`, and when a
    profile is cold, the line that the new version's first start is its warm-up."""
    venv = warm_up_layout(lay)
    run, said = FakeRunner(fail_on="warmup --check" if check_rc else None), []
    venvs.warm_up(lay, venv, service_active=True, run=run, log=said.append)
    assert run.calls == [[str(venv / "bin" / "gptoss-spark"), "warmup", "--check", "--config", str(lay.config_file)]]
    said_first_start = any("the new version's first start is its warm-up" in line for line in said)
    assert said_first_start is bool(check_rc)


def test_warm_up_with_the_service_stopped_runs_warmup_as_the_service_user(lay):
    venv = warm_up_layout(lay)
    run = FakeRunner()
    venvs.warm_up(lay, venv, service_active=False, run=run, log=lambda s: None)
    assert run.calls == [[*venvs.AS_SERVICE, str(venv / "bin" / "gptoss-spark"), "warmup", "--if-cold", "--if-room",
                          "--config", str(lay.config_file)]]
    assert venvs.AS_SERVICE[:3] == ("setpriv", "--reuid=gptoss-spark", "--regid=gptoss-spark")


def test_a_failed_warm_up_is_exit_32_with_nothing_switched(lay):
    venv = warm_up_layout(lay)
    before = snapshot(lay.opt_dir)
    with pytest.raises(InstallError) as e:
        venvs.warm_up(lay, venv, service_active=False, run=FakeRunner(fail_on="warmup"), log=lambda s: None)
    assert e.value.exit_code == codes.EXIT_WARMUP == 32
    assert "the previous install is untouched" in str(e.value) and "\n" not in str(e.value)
    assert snapshot(lay.opt_dir) == before and os.readlink(lay.current) == "venvs/old"


def test_install_sh_warms_up_before_it_switches():
    """The step's contract is nothing switched on failure: install.sh (set -e) must run it first."""
    text = (REPO / "install.sh").read_text()
    lines = text.splitlines()

    def first(command: str) -> int:
        return next(i for i, line in enumerate(lines) if command in line and not line.lstrip().startswith("#"))

    assert "set -euo pipefail" in text
    assert first("step warmup ") < first("step served ") < first("step switch ")


# ---------------------------------------------------------------- switch / rollback / prune

def fake_venv(lay: Layout, vid: str) -> None:
    d = lay.venvs_dir / vid
    d.mkdir(parents=True)
    (d / venvs.COMPLETE_MARKER).write_text("{}")


def served(lay: Layout, vid: str) -> None:
    """Switch to vid and let it serve; the other fake venvs stay (built, waiting for their turn)."""
    assert versions.switch_to(lay, vid)[0] is True
    versions.mark_served(lay, keep=tuple(p.name for p in lay.venvs_dir.iterdir()))


def test_switch_is_atomic_and_keeps_previous(lay):
    fake_venv(lay, "a")
    fake_venv(lay, "b")
    assert versions.switch_to(lay, "a")[0] is True
    assert os.readlink(lay.current) == "venvs/a"
    assert versions.switch_to(lay, "a")[0] is False  # no-op
    versions.mark_served(lay, keep=("b",))          # b: built, about to be switched to
    assert versions.switch_to(lay, "b")[0] is True
    assert os.readlink(lay.current) == "venvs/b" and os.readlink(lay.previous) == "venvs/a"
    assert lay.current.resolve() == (lay.venvs_dir / "b").resolve()
    assert not list(lay.opt_dir.glob(".*tmp"))


def test_previous_is_only_a_version_that_served(lay):
    for v in "abc":
        fake_venv(lay, v)
    versions.switch_to(lay, "a")
    versions.mark_served(lay, keep=("b", "c"))
    versions.switch_to(lay, "b")          # b never becomes ready ...
    versions.switch_to(lay, "c")          # ... and an install of c follows
    assert os.readlink(lay.previous) == "venvs/a"


def test_switch_refuses_incomplete(lay):
    (lay.venvs_dir / "half").mkdir(parents=True)
    with pytest.raises(InstallError):
        versions.switch_to(lay, "half")


def test_switch_uses_rename(lay, monkeypatch):
    fake_venv(lay, "a")
    seen = []
    real = os.replace
    monkeypatch.setattr(venvs.os, "replace", lambda s, d: (seen.append((Path(s).name, Path(d).name)), real(s, d)))
    versions.switch_to(lay, "a")
    assert ("current" in [d for _, d in seen])


def test_rollback_goes_to_the_last_version_that_served(lay):
    fake_venv(lay, "a")
    served(lay, "a")
    with pytest.raises(InstallError) as e:
        versions.rollback(lay)
    assert e.value.exit_code == codes.EXIT_NO_PREVIOUS
    fake_venv(lay, "b")
    served(lay, "b")
    lines = []
    assert versions.rollback(lay, dry_run=True, log=lines.append) == "a"
    assert "-> a (last served " in lines[0]
    assert os.readlink(lay.current) == "venvs/b"
    assert versions.rollback(lay, log=lines.append) == "a"
    versions.mark_served(lay)
    assert os.readlink(lay.current) == "venvs/a" and os.readlink(lay.previous) == "venvs/b"
    versions.rollback(lay, log=lines.append)  # and back again
    assert os.readlink(lay.current) == "venvs/b"


def test_switch_back_restores_both_links_and_removes_the_failed_version(lay):
    for v in "abc":
        fake_venv(lay, v)
    served(lay, "a")
    served(lay, "b")                       # current b, previous a
    versions.switch_to(lay, "c")
    assert os.readlink(lay.previous) == "venvs/b" and (lay.venvs_dir / "a").is_dir()  # kept for the undo
    old, failed, _ = versions.switch_back(lay)
    assert (old, failed) == ("b", "c")
    assert os.readlink(lay.current) == "venvs/b" and os.readlink(lay.previous) == "venvs/a"
    assert (lay.venvs_dir / "c").exists()   # removed after the restart, not in the gap before it
    versions.mark_served(lay)
    assert not (lay.venvs_dir / "c").exists()
    assert versions.rollback_target(lay)[0] == "a"
    with pytest.raises(InstallError):
        versions.switch_back(lay)          # nothing left to undo


def test_a_failed_rollback_is_not_offered_again(lay):
    for v in "ab":
        fake_venv(lay, v)
    served(lay, "a")
    served(lay, "b")
    versions.rollback(lay, log=lambda _: None)   # to a, which now fails
    old, failed, _ = versions.switch_back(lay)
    assert (old, failed) == ("b", "a")
    assert os.readlink(lay.current) == "venvs/b" and not lay.previous.is_symlink()
    assert venvs.prune(lay) == ["a"]
    with pytest.raises(InstallError):
        versions.rollback(lay)


def test_switch_back_after_a_first_install_keeps_it(lay):
    fake_venv(lay, "a")
    versions.switch_to(lay, "a")
    assert versions.switch_back(lay)[0] is None
    assert os.readlink(lay.current) == "venvs/a"


def test_prune_waits_until_the_new_version_served(lay):
    for v in "abc":
        fake_venv(lay, v)
        versions.switch_to(lay, v)
        versions.mark_served(lay)
    (lay.venvs_dir / "half").mkdir()
    assert venvs.prune(lay, dry_run=True) == ["half"]  # a went when c served
    assert sorted(p.name for p in lay.venvs_dir.iterdir()) == ["b", "c", "half"]
    fake_venv(lay, "d")
    versions.switch_to(lay, "d")
    assert (lay.venvs_dir / "b").is_dir()        # still the way back
    assert versions.mark_served(lay) == ["b", "half"]
    assert sorted(p.name for p in lay.venvs_dir.iterdir()) == ["c", "d"]


# ---------------------------------------------------------------- the unit belongs to its version

def unit_src(tmp_path: Path, name: str, exec_extra: str, dropin: str | None = "x") -> Path:
    s = tmp_path / name
    (s / "systemd" / "gptoss-spark.service.d").mkdir(parents=True)
    unit = (REPO / "systemd" / "gptoss-spark.service").read_text().replace(
        "serve --config /etc/gptoss-spark/gptoss-spark.toml", f"serve --config /etc/gptoss-spark/gptoss-spark.toml{exec_extra}")
    (s / "systemd" / "gptoss-spark.service").write_text(unit)
    if dropin is not None:
        (s / "systemd" / "gptoss-spark.service.d" / f"20-{name}.conf").write_text(f"[Service]\n# {dropin}\n")
    return s


def test_switching_versions_switches_their_units(lay, tmp_path):
    old, new = unit_src(tmp_path, "old", ""), unit_src(tmp_path, "new", " --new-option")
    for vid, s in (("a", old), ("b", new)):
        fake_venv(lay, vid)
        versions.store_shipped(lay, s, vid)
    served(lay, "a")
    assert "--new-option" not in lay.unit_file.read_text()
    _, placed = versions.switch_to(lay, "b")
    assert "--new-option" in lay.unit_file.read_text()
    assert not any(p.saved_aside for p in placed)            # ours as written: no .old notice
    assert (lay.dropin_dir / "20-new.conf").is_file() and not (lay.dropin_dir / "20-old.conf").exists()
    versions.switch_back(lay)
    assert lay.unit_file.read_bytes() == (old / "systemd" / "gptoss-spark.service").read_bytes()
    assert (lay.dropin_dir / "20-old.conf").is_file() and not (lay.dropin_dir / "20-new.conf").exists()
    assert not Path(str(lay.unit_file) + ".old").exists()


def test_a_locally_edited_unit_is_saved_aside_on_switch(lay, tmp_path):
    old, new = unit_src(tmp_path, "old", ""), unit_src(tmp_path, "new", " --new-option")
    for vid, s in (("a", old), ("b", new)):
        fake_venv(lay, vid)
        versions.store_shipped(lay, s, vid)
    served(lay, "a")
    lay.unit_file.write_text("# local edit\n")
    _, placed = versions.switch_to(lay, "b")
    assert placed[0].saved_aside and Path(str(lay.unit_file) + ".old").read_text() == "# local edit\n"


def test_a_version_without_a_stored_unit_gets_the_one_it_ran_under(lay, tmp_path):
    old, new = unit_src(tmp_path, "old", " --old"), unit_src(tmp_path, "new", " --new-option")
    fake_venv(lay, "a")
    versions.switch_to(lay, "a")
    versions.mark_served(lay)
    lay.unit_file.parent.mkdir(parents=True, exist_ok=True)
    lay.unit_file.write_bytes((old / "systemd" / "gptoss-spark.service").read_bytes())  # an older installer's
    fake_venv(lay, "b")
    versions.store_shipped(lay, new, "b")
    versions.switch_to(lay, "b")
    versions.switch_back(lay)
    assert "--old" in lay.unit_file.read_text()


# ---------------------------------------------------------------- config, token, unit

def test_config_written_only_if_absent_with_dist_beside(lay, src):
    placed = placement.place_config(lay, src, cpu=False)
    assert [p.action for p in placed] == ["created", "created"]
    cfg = lay.config_file
    assert 'tiktoken_dir = "/var/lib/gptoss-spark/tiktoken"' in cfg.read_text()
    assert [p.action for p in placement.place_config(lay, src, cpu=False)] == ["unchanged", "unchanged"]
    cfg.write_text(cfg.read_text() + "\n# my edit\n")
    prof = lay.profiles_dir / "plain.toml"
    prof.write_text("# mine\n")
    mine_cfg, mine_prof = cfg.read_bytes(), prof.read_bytes()
    placed = placement.place_config(lay, src, cpu=False)
    assert [p.action for p in placed] == ["kept", "kept"]
    assert cfg.read_bytes() == mine_cfg and prof.read_bytes() == mine_prof
    assert Path(str(cfg) + ".dist").is_file() and Path(str(prof) + ".dist").read_text() == "[engine]\nargs = []\n"
    assert ".dist" in placed[0].line(lay)
    # A re-run with the edits still there: the .dist said so already, nothing is new, nothing changed.
    again = placement.place_config(lay, src, cpu=False)
    assert [p.action for p in again] == ["kept-again", "kept-again"]
    assert cfg.read_bytes() == mine_cfg and prof.read_bytes() == mine_prof
    assert "still beside it" in again[1].line(lay)


def test_a_rerun_with_an_edited_profile_says_the_configuration_is_unchanged(tmp_path):
    """The walk-through's 68.9 s no-op re-run: one edited profile made every re-run answer "changed"
    (so validate checked every profile again and the summary advised a reload)."""
    root, src = tmp_path / "root", tmp_path / "src"
    (src / "etc" / "profiles").mkdir(parents=True)
    (src / "etc" / "gptoss-spark.toml").write_bytes((REPO / "etc" / "gptoss-spark.toml").read_bytes())
    (src / "etc" / "profiles" / "plain.toml").write_text("[engine]\nargs = []\n")

    def config_step() -> str:
        r = subprocess.run([sys.executable, "-m", "gptoss_spark.install", "config", "--root", str(root),
                            "--source", str(src)], capture_output=True, text=True, cwd=REPO)
        assert r.returncode == 0, r.stderr
        return r.stdout.strip()

    assert config_step() == "changed"     # first install
    (root / "etc/gptoss-spark/profiles/plain.toml").write_text("# mine\n")
    assert config_step() == "changed"     # the new default goes beside it as .dist: said once
    assert config_step() == "unchanged"   # and not again


def test_a_dist_is_removed_only_when_the_file_equals_it_and_that_is_said(lay, src):
    placement.place_config(lay, src, cpu=False)
    dist = Path(str(lay.config_file) + ".dist")
    dist.write_text("an older default\n")
    placed = placement.place_config(lay, src, cpu=False)
    assert dist.exists() and not placed[0].dist_removed  # it says something the file does not: kept
    dist.write_bytes(lay.config_file.read_bytes())
    placed = placement.place_config(lay, src, cpu=False)
    assert not dist.exists() and "removed" in placed[0].line(lay) and ".dist" in placed[0].line(lay)


def test_an_earlier_default_nobody_edited_is_upgraded_an_edited_one_kept(lay, src):
    placement.place_config(lay, src, cpu=False)
    prof = lay.profiles_dir / "plain.toml"
    shipped_before = prof.read_bytes()
    (src / "etc" / "profiles" / "plain.toml").write_text("[engine]\nargs = [\"--max-num-seqs\", \"8\"]\n")
    placed = placement.place_config(lay, src, cpu=False)
    assert [p.action for p in placed] == ["unchanged", "upgraded"], placed
    assert b'"8"' in prof.read_bytes() and not Path(str(prof) + ".dist").exists()
    assert "never edited" in placed[1].line(lay)
    prof.write_text(prof.read_text() + "# mine\n")  # edited now: the next default goes beside it
    (src / "etc" / "profiles" / "plain.toml").write_bytes(shipped_before)
    placed = placement.place_config(lay, src, cpu=False)
    assert placed[1].action == "kept" and prof.read_text().endswith("# mine\n")
    assert Path(str(prof) + ".dist").read_bytes() == shipped_before


def test_an_upgrade_that_removes_a_dist_says_so(lay, src):
    """A .dist holding the new default beside an unedited earlier one: the upgrade makes the file
    equal to it, so the .dist goes, and the line says it went."""
    placement.place_config(lay, src, cpu=False)
    prof = lay.profiles_dir / "plain.toml"
    new_default = "[engine]\nargs = [\"--max-num-seqs\", \"8\"]\n"
    (src / "etc" / "profiles" / "plain.toml").write_text(new_default)
    dist = Path(str(prof) + ".dist")
    dist.write_text(new_default)
    placed = placement.place_config(lay, src, cpu=False)
    assert placed[1].action == "upgraded" and placed[1].dist_removed and not dist.exists()
    line = placed[1].line(lay)
    assert "never edited" in line and f"removed {lay.real(prof)}.dist" in line, line


def test_an_install_older_than_the_record_has_its_unedited_defaults_upgraded(lay, src):
    """No .shipped.json (an install made before it existed): a file equal to a version an earlier
    install wrote (earlier_shipped.py; this repository's own files stand for one here, as the next
    version will see them) is upgraded; one edited is kept, the new default beside it as .dist."""
    lay.profiles_dir.mkdir(parents=True)
    prof, cfg = lay.profiles_dir / "plain.toml", lay.config_file
    old_prof = (REPO / "etc" / "profiles" / "plain.toml").read_bytes()
    prof.write_bytes(old_prof)
    cfg.write_bytes(placement.render_config(lay, REPO, cpu=False))
    (src / "etc" / "gptoss-spark.toml").write_text((REPO / "etc" / "gptoss-spark.toml").read_text() + "# new\n")
    assert not (lay.etc_dir / placement.SHIPPED_FILE).exists()
    placed = placement.place_config(lay, src, cpu=False)
    assert [p.action for p in placed] == ["upgraded", "upgraded"], placed
    assert prof.read_text() == "[engine]\nargs = []\n" and cfg.read_text().endswith("# new\n")
    assert not Path(str(prof) + ".dist").exists() and not Path(str(cfg) + ".dist").exists()

    (lay.etc_dir / placement.SHIPPED_FILE).unlink()  # again with no record, the profile edited this time
    prof.write_bytes(old_prof + b"# mine\n")
    placed = placement.place_config(lay, src, cpu=False)
    assert placed[1].action == "kept" and prof.read_bytes() == old_prof + b"# mine\n"
    assert Path(str(prof) + ".dist").read_text() == "[engine]\nargs = []\n"


def test_the_record_of_earlier_defaults_holds_this_versions_files():
    """The next version recognises this one's files only if they are in earlier_shipped.py: a shipped
    config or profile changed without rerunning scripts/earlier_shipped.py fails here."""
    import hashlib

    from gptoss_spark.install.earlier_shipped import DIGESTS

    lay = Layout()
    missing = [f"gptoss-spark.toml (cpu={cpu})" for cpu in (False, True)
               if hashlib.sha256(placement.render_config(lay, REPO, cpu=cpu)).hexdigest()
               not in DIGESTS.get("gptoss-spark.toml", ())]
    for prof in sorted((REPO / "etc").glob("profiles*/*.toml")):
        if hashlib.sha256(prof.read_bytes()).hexdigest() not in DIGESTS.get(f"profiles/{prof.name}", ()):
            missing.append(str(prof.relative_to(REPO)))
    assert not missing, f"not in gptoss_spark/install/earlier_shipped.py: {missing}; run " \
                        "python scripts/earlier_shipped.py and commit the result"


def test_cpu_config_is_the_demo(lay, src):
    import tomllib
    placement.place_config(lay, src, cpu=True)
    text = lay.config_file.read_text()
    data = tomllib.loads(text)
    assert data["default_profile"] == "demo"
    assert data["model"]["dir"] == "/var/lib/gptoss-spark/demo-model"
    assert data["model"]["tiktoken_dir"] == "/var/lib/gptoss-spark/tiktoken"
    assert "DEMONSTRATION" in text and "NOT the DGX Spark configuration" in text
    assert "# Profile used when none has been chosen" in text  # shipped comments kept
    assert (lay.profiles_dir / "demo.toml").is_file() and (lay.profiles_dir / "plain.toml").is_file()


@pytest.mark.parametrize("text", ["", "[model]\n", "[model]\n# dir = \"/x\"\n[engine]\nport = 1\n",
                                  "default_profile = \"plain\"\n[model]\ndir = \"/x\" # c\n"])
def test_set_toml_keys(text):
    import tomllib
    out = placement.set_toml_keys(text, {(None, "default_profile"): "demo", ("model", "dir"): "/d"})
    d = tomllib.loads(out)
    assert d["default_profile"] == "demo" and d["model"]["dir"] == "/d"


def test_token_created_once_with_mode_0640(lay):
    p = placement.ensure_token(lay, gid=os.getgid(), make=lambda: "secret-1")
    assert p.action == "created"
    st = lay.token_file.stat()
    assert stat.S_IMODE(st.st_mode) == 0o640 and st.st_gid == os.getgid()
    assert lay.token_file.read_text() == "secret-1\n"
    assert placement.ensure_token(lay, gid=os.getgid(), make=lambda: "secret-2").action == "unchanged"
    assert lay.token_file.read_text() == "secret-1\n"
    os.chmod(lay.token_file, 0o644)
    placement.ensure_token(lay, gid=os.getgid())
    assert stat.S_IMODE(lay.token_file.stat().st_mode) == 0o640  # mode repaired


def test_token_default_is_random():
    import secrets  # noqa: F401  (placement uses secrets.token_urlsafe(32))
    lay1 = Layout(root=Path("/nonexistent"))
    assert placement.ensure_token(lay1, dry_run=True, gid=0).action == "would-create"


def test_unit_replaced_only_when_changed(lay, src):
    assert placement.install_unit(lay, src).action == "created"
    assert placement.install_unit(lay, src).action == "unchanged"
    lay.unit_file.write_text("# local edit\n")
    assert placement.install_unit(lay, src).action == "replaced"
    assert Path(str(lay.unit_file) + ".old").read_text() == "# local edit\n"


def test_dirs_modes(lay):
    placement.ensure_dirs(lay, owner=(os.getuid(), os.getgid()))
    assert stat.S_IMODE(lay.state_dir.stat().st_mode) == 0o750
    assert stat.S_IMODE(lay.opt_dir.stat().st_mode) == 0o755
    assert lay.user_profiles_dir.is_dir()


# ---------------------------------------------------------------- uninstall and dry runs

def installed(lay, src):
    placement.ensure_dirs(lay, owner=(os.getuid(), os.getgid()))
    placement.place_config(lay, src, cpu=True)
    placement.ensure_token(lay, gid=os.getgid())
    placement.install_unit(lay, src)
    fake_venv(lay, "a")
    versions.switch_to(lay, "a")
    (lay.state_dir / "state.json").write_text("{}")
    lay.dropin_dir.mkdir()
    (lay.dropin_dir / "override.conf").write_text("[Service]\n")


def test_uninstall_keeps_config_and_state(lay, src):
    installed(lay, src)
    uninstall.uninstall(lay, purge=False)
    assert not lay.unit_file.exists() and not lay.opt_dir.exists()
    assert lay.config_file.is_file() and lay.token_file.is_file() and (lay.state_dir / "state.json").is_file()
    assert (lay.dropin_dir / "override.conf").is_file()


def test_uninstall_purge_removes_everything(lay, src):
    installed(lay, src)
    lay.install_log.parent.mkdir(parents=True, exist_ok=True)
    lay.install_log.write_text("==== install.sh\n")  # what install.sh tees every install into
    lines = uninstall.uninstall(lay, purge=False, dry_run=True)
    assert f"  kept /var/log/gptoss-spark-install.log (--purge removes it)" in lines
    uninstall.uninstall(lay, purge=True)
    for p in (lay.unit_file, lay.opt_dir, lay.etc_dir, lay.state_dir, lay.dropin_dir, lay.install_log):
        assert not p.exists()
    assert lay.install_log.parent.is_dir()  # /var/log itself is not ours


def test_uninstall_dry_run_changes_nothing(lay, src):
    installed(lay, src)
    before = snapshot(lay.root)
    lines = uninstall.uninstall(lay, purge=True, dry_run=True)
    assert snapshot(lay.root) == before
    assert any("would remove" in ln for ln in lines)


def run_cli(lay, *args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gptoss_spark.install", *args, "--root", str(lay.root)],
                          capture_output=True, text=True, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})


def test_every_step_dry_run_changes_nothing(lay, src):
    installed(lay, src)
    (src / "gptoss_spark" / "mod.py").write_text("x = 3\n")       # a new version to "install"
    (src / "etc" / "profiles" / "plain.toml").write_text("new default\n")
    before = snapshot(lay.root)
    s = str(src)
    for args in (["dirs", "--dry-run"], ["build", "--source", s, "--cpu", "--dry-run"],
                 ["assets", "--venv-id", "x", "--cpu", "--dry-run"],
                 ["config", "--source", s, "--cpu", "--dry-run"], ["token", "--dry-run"],
                 ["flashinfer", "--venv-id", "x", "--dry-run"], ["flashinfer", "--venv-id", "x", "--cpu", "--dry-run"],
                 ["unit", "--source", s, "--venv-id", "x", "--dry-run"],
                 ["validate", "--source", s, "--venv-id", "x", "--dry-run"], ["switch", "zzz", "--dry-run"], ["link", "--dry-run"],
                 ["uninstall", "--purge", "--dry-run"]):
        r = run_cli(lay, *args)
        assert r.returncode == 0, (args, r.stderr)
    assert snapshot(lay.root) == before


def test_cli_answers_on_stdout(lay, src):
    fake_venv(lay, "a")
    fake_venv(lay, "b")
    r = run_cli(lay, "unit", "--source", str(src), "--venv-id", "a")
    assert r.returncode == 0 and r.stdout.strip() == "unchanged" and "go in with its switch" in r.stderr
    assert run_cli(lay, "switch", "a").stdout.strip() == "switched"
    assert lay.unit_file.is_file()          # with the switch
    r = run_cli(lay, "unit", "--source", str(src), "--venv-id", "a")
    assert r.returncode == 0 and r.stdout.strip() == "unchanged"
    (src / "systemd" / "gptoss-spark.service").write_text("[Service]\nExecStart=/bin/true\n")
    r = run_cli(lay, "unit", "--source", str(src), "--venv-id", "a")   # a unit-only change of the current version
    assert r.stdout.strip() == "changed" and ".old" not in r.stderr
    r = run_cli(lay, "rollback")
    assert r.returncode == codes.EXIT_NO_PREVIOUS and "no previous version that served" in r.stderr
    assert run_cli(lay, "served", "--keep", "b").returncode == 0
    run_cli(lay, "unit", "--source", str(src), "--venv-id", "b")
    assert run_cli(lay, "switch", "b").stdout.strip() == "switched"
    r = run_cli(lay, "switch-back")
    assert r.returncode == 0 and r.stdout.strip() == "a" and "venvs/b goes once that serves" in r.stderr
    assert run_cli(lay, "reclaim").returncode == 0 and not (lay.venvs_dir / "b").exists()


def test_validate_runs_imports_patches_and_every_profiles_arguments_before_the_switch(lay, src):
    fake_venv(lay, "a")
    venv = lay.venvs_dir / "a"
    calls = []
    validate.validate_version(lay, venv, src, run=lambda argv: calls.append([str(a) for a in argv]) or 0,
                              log=lambda _: None)
    assert calls[0][1:3] == ["-c", "import vllm, transformers, gptoss_spark"]
    assert calls[-1][:1] == ["setpriv"] and calls[-1][-5:-2] == ["check", "--all-profiles", "--config"] or \
        "--all-profiles" in calls[-1]
    assert calls[-1][-2:] == ["--engine-python", lay.real(venv / "bin" / "python")]
    assert any("verify" in c for c in calls)


def test_validate_refuses_with_its_exit_code(lay, src):
    fake_venv(lay, "a")
    with pytest.raises(InstallError) as e:
        validate.validate_version(lay, lay.venvs_dir / "a", src,
                                  run=lambda argv: 1 if "--all-profiles" in argv else 0, log=lambda _: None)
    assert e.value.exit_code == codes.EXIT_ARGS and "nothing was changed" in str(e.value)
    assert "fix that profile" in str(e.value)  # no shipped profiles recorded here: it may be the admin's


def test_validate_blames_the_new_version_when_only_its_own_unedited_profiles_are_installed(lay, src):
    fake_venv(lay, "a")
    placement.place_config(lay, src, cpu=False)  # profiles/ as shipped, recorded; profiles.d empty
    calls = []
    with pytest.raises(InstallError) as e:
        validate.validate_version(lay, lay.venvs_dir / "a", src, log=lambda _: None,
                                  run=lambda argv: calls.append(argv) or (1 if "--all-profiles" in argv else 0))
    assert "the new version is at fault" in str(e.value) and "fix that profile" not in str(e.value)
    assert "nothing was changed, the running version still serves" in str(e.value)
    assert sum("--all-profiles" in c for c in calls) == 1  # nothing edited: no second check


def _refusal(lay, src, *, shipped_refused: bool) -> tuple[str, list]:
    """Exit 29 with one profile edited: vLLM refuses it, and the shipped ones too or not."""
    calls = []

    def run(argv):
        calls.append(list(argv))
        if "--all-profiles" not in argv:
            return 0
        return 1 if shipped_refused or "--skip-profiles" not in argv else 0
    with pytest.raises(InstallError) as e:
        validate.validate_version(lay, lay.venvs_dir / "a", src, run=run, log=lambda _: None)
    assert e.value.exit_code == codes.EXIT_ARGS
    return str(e.value), calls


def test_exit_29_blames_the_new_version_when_its_unedited_profiles_fail_beside_an_edited_one(lay, src):
    """All profiles refused, all but one unedited: the version's own code is at fault, whatever the edit."""
    fake_venv(lay, "a")
    for name in ("fast", "long"):  # the real version ships nine
        (src / "etc" / "profiles" / f"{name}.toml").write_text("[engine]\nargs = []\n")
    placement.place_config(lay, src, cpu=False)
    edited = lay.profiles_dir / "plain.toml"
    edited.write_text(edited.read_text() + "\n# tuned here\n")
    message, calls = _refusal(lay, src, shipped_refused=True)
    assert "the new version is at fault" in message and "fix that profile" not in message, message
    assert "nothing was changed, the running version still serves" in message and "report it" in message
    assert calls[-1][calls[-1].index("--skip-profiles") + 1] == edited.stem  # the shipped ones alone


def test_exit_29_blames_the_edit_only_when_the_shipped_profiles_pass_alone(lay, src):
    fake_venv(lay, "a")
    placement.place_config(lay, src, cpu=False)
    lay.user_profiles_dir.mkdir(parents=True, exist_ok=True)
    (lay.user_profiles_dir / "mine.toml").write_text("[engine]\nargs = []\n")
    message, _ = _refusal(lay, src, shipped_refused=False)
    assert "fix that profile" in message and "(mine:" in message and "at fault" not in message, message
    assert "accepts every profile this version ships" in message


def test_a_changed_profile_under_the_current_venv_has_its_arguments_checked(lay, src, monkeypatch, capsys):
    """An install whose venv is already current but whose config step updated a profile (a shipped
    one nobody edited) checks every profile's arguments under the current venv; one that changed
    nothing checks nothing (a re-run stays fast)."""
    from gptoss_spark.install.__main__ import main

    installed(lay, src)
    r = run_cli(lay, "config", "--source", str(src), "--cpu")
    assert r.returncode == 0 and r.stdout.strip() == "unchanged", r.stderr
    (src / "etc" / "profiles-cpu" / "demo.toml").write_text("# a new shipped default\n[engine]\nargs = ['--y']\n")
    r = run_cli(lay, "config", "--source", str(src), "--cpu")
    assert r.returncode == 0 and r.stdout.strip() == "changed", r.stderr
    checked = []
    monkeypatch.setattr(validate, "check_profiles", lambda layout, venv, **kw: checked.append(venv))
    base = ["validate", "--source", str(src), "--venv-id", "a", "--root", str(lay.root)]
    assert main(base) == 0 and checked == []
    assert "no profile changed: nothing to check" in capsys.readouterr().err
    assert main([*base, "--config-changed"]) == 0 and checked == [lay.venvs_dir / "a"]


def test_checking_the_current_venvs_profiles_refuses_in_its_own_words(lay, src):
    fake_venv(lay, "a")
    calls = []
    with pytest.raises(InstallError) as e:
        validate.check_profiles(lay, lay.venvs_dir / "a", run=lambda argv: calls.append(argv) or 1, log=lambda _: None)
    assert e.value.exit_code == codes.EXIT_ARGS and "--all-profiles" in calls[0]
    assert str(e.value).startswith("vLLM rejects") and "the profile files are put back as they were, the running engine keeps its arguments" in str(e.value)


def test_validate_keeps_an_engine_python_of_the_admins_own(lay, src):
    lay.config_file.parent.mkdir(parents=True)
    lay.config_file.write_text('[engine]\npython = "/srv/other/bin/python"\n')
    assert validate.engine_python_override(lay, lay.venvs_dir / "a") == []
    lay.config_file.write_text('[engine]\npython = "/opt/gptoss-spark/current/bin/python"\n')
    assert validate.engine_python_override(lay, lay.venvs_dir / "a")[0] == "--engine-python"


def test_why_is_the_give_up_reason_not_the_usage_text():
    entries = [{"MESSAGE": "usage: api_server.py [-h] {CRITICAL,ERROR,WARNING}"},
               {"MESSAGE": "api_server.py: error: unrecognized arguments: --bogus"},
               {"EVENT": "state", "STATE": "stopping", "REASON": "engine exited with code 2 while loading: "
                "api_server.py: error: unrecognized arguments: --bogus", "MESSAGE": "state ..."},
               {"EVENT": "state", "STATE": "failed", "REASON": "gave up at once, the engine rejected its arguments "
                "(exit 2): engine exited with code 2 while loading: api_server.py: error: unrecognized arguments: "
                "--bogus", "MESSAGE": "state ..."}]
    assert why.reason_from(entries).startswith("gave up at once, the engine rejected its arguments (exit 2)")
    # The supervisor itself refused its arguments (an old `serve` under a new unit): no state entry.
    assert why.reason_from([{"MESSAGE": "usage: gptoss-spark serve [-h]"},
                            {"MESSAGE": "gptoss-spark serve: error: unrecognized arguments: --new"}]) == \
        "gptoss-spark serve: error: unrecognized arguments: --new"


def test_install_package_and_the_floor_are_stdlib_only():
    """install.sh runs them with the system interpreter before any venv exists: without site-packages
    (-S) they import, and nothing outside the standard library and gptoss_spark is loaded."""
    floor = sorted(f"gptoss_spark.base.{p.stem}" for p in (REPO / "gptoss_spark" / "base").glob("*.py"))
    assert len(floor) >= 6, floor
    code = ("import sys; import gptoss_spark.install.cli, gptoss_spark.install.__main__, " + ", ".join(floor) + "; "
            "bad = sorted(m for m in sys.modules if m.split('.')[0] not in sys.stdlib_module_names "
            "and m.split('.')[0] not in ('gptoss_spark', '__main__')); print(bad); sys.exit(1 if bad else 0)")
    r = subprocess.run([sys.executable, "-S", "-c", code], cwd=REPO, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def test_registered_in_main_cli():
    from gptoss_spark import cli
    from gptoss_spark.install import cli as install_cli
    assert install_cli in cli.COMMAND_MODULES
    args = cli.build_parser().parse_args(["install", "summary"])
    assert args.install_step == "summary"


# ---------------------------------------------------------------- the command on PATH

def test_cli_link_points_through_current_and_is_idempotent(lay):
    assert placement.link_cli(lay, dry_run=True).action == "would-create"
    assert not os.path.lexists(lay.cli_link)
    assert placement.link_cli(lay).action == "created"
    assert os.readlink(lay.cli_link) == str(lay.opt_dir / "current" / "bin" / "gptoss-spark")
    assert placement.link_cli(lay).action == "unchanged"
    fake_venv(lay, "a")
    (lay.venvs_dir / "a" / "bin").mkdir()
    (lay.venvs_dir / "a" / "bin" / "gptoss-spark").write_text("#!/bin/sh\n")
    versions.switch_to(lay, "a")
    assert lay.cli_link.resolve() == (lay.venvs_dir / "a" / "bin" / "gptoss-spark").resolve()
    assert lay.real(lay.cli_link) == "/usr/local/bin/gptoss-spark"


@pytest.mark.parametrize("foreign", ["file", "link"])
def test_cli_link_leaves_a_foreign_file_and_uninstall_keeps_it(lay, src, foreign):
    lay.cli_link.parent.mkdir(parents=True)
    if foreign == "file":
        lay.cli_link.write_text("#!/bin/sh\necho mine\n")
    else:
        os.symlink("/somewhere/else", lay.cli_link)
    before = snapshot(lay.cli_link.parent)
    p = placement.link_cli(lay)
    assert p.action == "foreign" and "WARNING" in p.line(lay) and "current/bin/gptoss-spark" in p.line(lay)
    assert snapshot(lay.cli_link.parent) == before
    installed(lay, src)
    uninstall.uninstall(lay, purge=True)
    assert snapshot(lay.cli_link.parent) == before


def test_uninstall_removes_our_cli_link(lay, src):
    installed(lay, src)
    placement.link_cli(lay)
    lines = uninstall.uninstall(lay, purge=False, dry_run=True)
    assert "  would remove /usr/local/bin/gptoss-spark" in lines and lay.cli_link.is_symlink()
    uninstall.uninstall(lay, purge=False)
    assert not os.path.lexists(lay.cli_link)


def test_summary_names_the_command(lay, src):
    installed(lay, src)
    assert "not on PATH" in run_cli(lay, "summary").stdout
    r = run_cli(lay, "link")
    assert r.returncode == 0 and "linked /usr/local/bin/gptoss-spark -> /opt/gptoss-spark/current/bin/gptoss-spark" in r.stderr
    out = run_cli(lay, "summary").stdout
    assert "/usr/local/bin/gptoss-spark -> /opt/gptoss-spark/current/bin/gptoss-spark" in out
    assert "gptoss-spark status" in out


@pytest.mark.skipif(os.geteuid() != 0, reason="chown to another user needs root")
def test_uninstall_hands_kept_files_to_root_before_the_user_goes(lay, src):
    installed(lay, src)
    svc = 64999  # a uid/gid that stands for the service user and group about to be deleted
    for top in (lay.etc_dir, lay.state_dir):
        for p in [top, *top.rglob("*")]:
            os.chown(p, svc if top == lay.state_dir else 0, svc)
    os.chmod(lay.token_file, 0o640)
    before = snapshot(lay.root)
    lines = uninstall.uninstall(lay, purge=False, dry_run=True)
    assert snapshot(lay.root) == before and any("would give" in ln for ln in lines)
    lines = uninstall.uninstall(lay, purge=False)
    assert any("root:root" in ln for ln in lines)
    for top in (lay.etc_dir, lay.state_dir, lay.dropin_dir):
        for p in [top, *top.rglob("*")]:
            st = p.lstat()
            assert (st.st_uid, st.st_gid) == (0, 0), p
    assert stat.S_IMODE(lay.token_file.stat().st_mode) == 0o600
    assert (lay.state_dir / "state.json").read_text() == "{}"  # kept, only the owner changed


def test_pips_temporary_files_live_under_the_build_dir_and_go_even_on_sighup(lay, src):
    """pip's TMPDIR is <opt>/build/tmp while it runs, not /tmp; a SIGHUP during pip ends the build
    with a line that names it, and leaves neither the half-built venv nor pip's files."""
    import os
    import signal

    seen = []

    class HangupDuringPip(FakeRunner):
        def __call__(self, argv) -> int:
            rc = super().__call__(argv)
            if "pip" in [str(a) for a in argv] and "install" in [str(a) for a in argv]:
                seen.append(os.environ["TMPDIR"])
                Path(os.environ["TMPDIR"], "pip-unpack-123").mkdir()
                os.kill(os.getpid(), signal.SIGHUP)
            return rc

    p = plan(lay, src)
    with pytest.raises(SystemExit, match="interrupted by SIGHUP.*Run install.sh again"):
        venvs.build_venv(p, run=HangupDuringPip(), log=lambda s: None)
    assert seen == [str(lay.build_dir / "tmp")]
    assert not (lay.build_dir / "tmp").exists() and not p.venv.exists()
    assert os.environ.get("TMPDIR") != seen[0] and signal.getsignal(signal.SIGHUP) is signal.SIG_DFL


def test_pip_output_goes_to_the_log_with_progress_and_errors_on_the_terminal(tmp_path):
    """run_pip: warnings only in the log; a progress line per PIP_PROGRESS_EVERY packages; pip's
    ERROR lines on stderr as they come; on failure its last lines and where the full log is."""
    import io

    script = ("import sys\n"
              "for i in range(30):\n    print(f'Collecting pkg{i}==1.0')\n"
              "    print('WARNING: Running pip as the root user can result in broken permissions')\n"
              "print('ERROR: Could not find a version that satisfies the requirement nope==9')\n"
              "print('ERROR: No matching distribution found for nope==9')\nsys.exit(1)\n")
    log = tmp_path / "install.log"
    out, err = io.StringIO(), io.StringIO()
    rc = venvs.run_pip([sys.executable, "-c", script], None, str(log), out=out, err=err)
    assert rc == 1
    assert out.getvalue() == "    pip: 25 packages so far\n"
    e = err.getvalue()
    assert "    ERROR: Could not find a version that satisfies the requirement nope==9\n" in e
    assert "WARNING" not in out.getvalue() + e and f"its full output: {log}" in e
    text = log.read_text()
    assert text.count("WARNING: Running pip as the root user") == 30 and text.count("Collecting pkg") == 30


def test_a_hangup_to_the_installers_process_group_is_reported_and_exits_129(tmp_path):
    """SIGHUP reaches the whole process group (an ssh session closing): the log's tee died first and
    the trap's message became a SIGPIPE, exit 141 in silence. install.sh's own trap and tee lines run
    here, in a process group of their own."""
    import os
    import re
    import signal
    import subprocess
    import time

    text = (Path(__file__).resolve().parents[2] / "install.sh").read_text()
    trap = re.search(r"^STEP_NOW=start\n.*?^trap 'interrupted HUP' HUP.*?\n", text, re.S | re.M).group(0)
    tee = re.search(r"^    exec > >\(.*?\n(?:        .*\n)?", text, re.M).group(0)
    log = tmp_path / "install.log"
    script = f'INSTALL_LOG={log}\n{trap}{tee}\nSTEP_NOW=build\necho started\nsleep 60 & wait\n'
    p = subprocess.Popen(["bash", "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         start_new_session=True)
    for _ in range(200):
        if log.exists() and "started" in log.read_text():
            break
        time.sleep(0.05)
    os.killpg(p.pid, signal.SIGHUP)
    out, err = p.communicate(timeout=30)
    assert p.returncode == 129, (p.returncode, err)
    assert "interrupted by SIGHUP during its 'build' step" in err
    assert "interrupted by SIGHUP" in log.read_text()


def test_pip_silent_while_it_installs_still_shows_a_heartbeat(tmp_path, monkeypatch):
    """pip prints nothing for minutes while it unpacks torch: the terminal had no line at all then."""
    import io

    monkeypatch.setattr(venvs, "PIP_HEARTBEAT_SECONDS", 0.05)
    script = ("import time\nprint('Collecting a==1', flush=True)\nprint('Collecting b==1', flush=True)\n"
              "print('Installing collected packages: a, b', flush=True)\ntime.sleep(1.5)\n"
              "print('Successfully installed a-1 b-1')\n")
    out = io.StringIO()
    assert venvs.run_pip([sys.executable, "-c", script], None, None, out=out, err=io.StringIO()) == 0
    lines = out.getvalue().splitlines()
    assert any(re.fullmatch(r"    pip: installing 2 packages, \d+ s so far", line) for line in lines), lines
    assert lines[-1] == "    pip: done, 2 packages"
