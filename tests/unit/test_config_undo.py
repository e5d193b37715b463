"""install/config_undo.py with place_config: a failed install leaves /etc/gptoss-spark as it was."""

from __future__ import annotations

from pathlib import Path

from gptoss_spark.install import config_undo
from gptoss_spark.install.layout import Layout
from gptoss_spark.install.placement import SHIPPED_FILE, place_config

REPO = Path(__file__).resolve().parents[2]


def source_with(tmp: Path, demo_extra: str) -> Path:
    """A copy of this source's etc/ whose demo profile ends with `demo_extra`."""
    src = tmp / "src"
    for p in (REPO / "etc").rglob("*"):
        if p.is_file():
            d = src / p.relative_to(REPO)
            d.parent.mkdir(parents=True, exist_ok=True)
            d.write_bytes(p.read_bytes())
    demo = src / "etc" / "profiles-cpu" / "demo.toml"
    demo.write_text(demo.read_text() + demo_extra)
    return src


def snapshot(etc: Path) -> dict[str, bytes]:
    return {str(p.relative_to(etc)): p.read_bytes() for p in sorted(etc.rglob("*")) if p.is_file()}


def test_an_upgrade_of_an_unedited_profile_is_undone(tmp_path):
    layout = Layout(root=tmp_path / "root")
    place_config(layout, source_with(tmp_path / "v1", ""), cpu=True)
    config_undo.keep(layout)
    before = snapshot(layout.etc_dir)
    placed = place_config(layout, source_with(tmp_path / "v2", "# v2\n"), cpu=True)
    assert any(p.action == "upgraded" and p.path.name == "demo.toml" for p in placed)  # never edited: updated
    assert (layout.profiles_dir / "demo.toml").read_text().endswith("# v2\n")
    restored = config_undo.restore(layout)
    assert layout.profiles_dir / "demo.toml" in restored and layout.etc_dir / SHIPPED_FILE in restored
    assert snapshot(layout.etc_dir) == before  # the profile and the shipped record, byte for byte
    assert config_undo.restore(layout) == []   # the record went with the undo


def test_a_first_install_undone_leaves_nothing_and_a_kept_one_stays(tmp_path):
    layout = Layout(root=tmp_path / "root")
    layout.etc_dir.mkdir(parents=True)
    src = source_with(tmp_path / "v1", "")
    place_config(layout, src, cpu=True)
    assert (layout.profiles_dir / "demo.toml").exists()
    config_undo.restore(layout)
    assert snapshot(layout.etc_dir) == {}
    place_config(layout, src, cpu=True)
    assert config_undo.keep(layout) is True
    assert config_undo.restore(layout) == [] and (layout.profiles_dir / "demo.toml").exists()


def test_an_edited_profile_keeps_its_text_and_loses_the_new_dist(tmp_path):
    layout = Layout(root=tmp_path / "root")
    place_config(layout, source_with(tmp_path / "v1", ""), cpu=True)
    config_undo.keep(layout)
    demo = layout.profiles_dir / "demo.toml"
    demo.write_text(demo.read_text() + "# mine\n")
    before = snapshot(layout.etc_dir)
    place_config(layout, source_with(tmp_path / "v2", "# v2\n"), cpu=True)
    assert demo.with_name("demo.toml.dist").exists()
    config_undo.restore(layout)
    assert snapshot(layout.etc_dir) == before


def test_a_killed_installers_record_is_put_back_by_the_next_config_step_a_live_ones_is_not(tmp_path):
    import subprocess
    import sys
    layout = Layout(root=tmp_path / "root")
    place_config(layout, source_with(tmp_path / "v1", ""), cpu=True)
    config_undo.keep(layout)
    before = snapshot(layout.etc_dir)
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    config_undo.record(layout, [layout.profiles_dir / "demo.toml"], owner=gone.pid)
    (layout.profiles_dir / "demo.toml").write_text("# a killed install's half\n")
    assert config_undo.restore(layout, only_if_abandoned=True) == [layout.profiles_dir / "demo.toml"]
    assert snapshot(layout.etc_dir) == before
    config_undo.record(layout, [layout.profiles_dir / "demo.toml"])  # owner: this test's parent, alive
    (layout.profiles_dir / "demo.toml").write_text("# still being installed\n")
    assert config_undo.restore(layout, only_if_abandoned=True) == []
    assert config_undo.restore(layout) == [layout.profiles_dir / "demo.toml"]
