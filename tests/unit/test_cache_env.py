"""Every cache variable the engine gets is one its reader actually reads (in the installed source),
and the ones that would do nothing are not set."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

from gptoss_spark.engine_hooks import cute_dsl_cache
from gptoss_spark.service.config import Settings

REPO = Path(__file__).resolve().parents[2]


def package_dir(name: str) -> Path:
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        pytest.skip(f"{name} is not installed in this venv")
    return Path(spec.submodule_search_locations[0])


def reads(package: str, var: str) -> list[str]:
    """Files of `package` that read environment variable `var` (getenv / environ.get / environ[...])."""
    # os.getenv / os.environ.get / os.environ[...] / vLLM's envs.X / Triton's knobs env_str*(...)
    pattern = re.compile(r"""(getenv\(|environ\.get\(|environ\[|\benvs\.|env_str\w*\()\s*["']?""" + re.escape(var))
    hits = []
    for f in package_dir(package).rglob("*.py"):
        text = f.read_text(errors="replace")
        if var in text and pattern.search(text):
            hits.append(str(f))
    return hits


# The reader of each variable cache_env() sets. HUMMING_CACHE_DIR's reader, humming-kernels
# (humming/utils/jit.py get_humming_cache_dir), is in the Spark venv only (locks/spark-*.txt).
READERS = {
    "VLLM_CACHE_ROOT": "vllm",
    "FLASHINFER_WORKSPACE_BASE": "flashinfer",
    "TRITON_CACHE_DIR": "triton",
    "XDG_CACHE_HOME": "vllm",
    "HUMMING_CACHE_DIR": "humming",
}


def settings(tmp_path: Path) -> Settings:
    return Settings.model_validate({"paths": {"state_dir": str(tmp_path)}})


@pytest.mark.parametrize("var", sorted(READERS))
def test_each_cache_variable_has_a_reader(tmp_path, var):
    assert var in settings(tmp_path).cache_env()
    if var == "HUMMING_CACHE_DIR":
        assert "humming-kernels==" in (REPO / "locks" / "spark-cp312-aarch64.txt").read_text()
        if importlib.util.find_spec("humming") is None:
            return
    assert reads(READERS[var], var), f"nothing in {READERS[var]} reads {var}: stop setting it, or name its reader"


def test_no_variable_without_a_known_reader(tmp_path):
    assert set(settings(tmp_path).cache_env()) == set(READERS) | {cute_dsl_cache.ENV_VAR}


def test_inductor_cache_dir_is_vllms_own_choice(tmp_path):
    # vLLM 0.32.0 sets TORCHINDUCTOR_CACHE_DIR itself, unconditionally, before every compile
    # (compilation/decorators.py, compilation/compiler_interface.py initialize_cache): a value of
    # ours would be overwritten. If vLLM stops doing so, this fails: then set it again.
    vllm = package_dir("vllm")
    for rel in ("compilation/decorators.py", "compilation/compiler_interface.py"):
        assert 'os.environ["TORCHINDUCTOR_CACHE_DIR"] = inductor_cache' in (vllm / rel).read_text(), rel
    assert "TORCHINDUCTOR_CACHE_DIR" not in settings(tmp_path).cache_env()


def test_cute_dsl_cache_dir_would_do_nothing(tmp_path):
    # cute.compile forces no_cache=True, so the DSL's file cache (CUTE_DSL_CACHE_DIR) is never read on
    # the path FlashInfer takes; our own cache replaces it.
    dsl = package_dir("nvidia_cutlass_dsl") / "dsl_packages" / "cutlass" / "base_dsl" / "compiler.py"
    if not dsl.exists():
        pytest.skip("nvidia-cutlass-dsl is not installed in this venv")
    assert 'kwargs["no_cache"] = True' in dsl.read_text()
    env = settings(tmp_path).cache_env()
    assert "CUTE_DSL_CACHE_DIR" not in env
    assert env[cute_dsl_cache.ENV_VAR] == str(tmp_path / "cache" / "cute-dsl")


def test_engine_environment_is_offline(tmp_path):
    from gptoss_spark.service.engine import build_env
    from gptoss_spark.service.profiles import load_profile_file

    prof = load_profile_file(REPO / "etc" / "profiles-cpu" / "demo.toml")
    env = build_env(settings(tmp_path), prof, tmp_path / "run", base={})
    assert env["HF_HUB_OFFLINE"] == "1"
    assert env[cute_dsl_cache.ENV_VAR].endswith("cache/cute-dsl")
