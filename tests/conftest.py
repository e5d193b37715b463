"""Shared fixtures.

demo_model_dir (session): the tiny random-weight gpt-oss checkpoint
    (gptoss_spark.install.demo_model), built once under <repo>/.test-artifacts/demo-model
    (gitignored) and reused across runs while its marker matches (version, seed).
    It also holds o200k_base.tiktoken, so TIKTOKEN_ENCODINGS_BASE=<demo_model_dir>
    works offline.
demo_model_mxfp4_dir, demo_model_mxfp4_as_bf16_dir (session): the same model with its
    experts in MXFP4 as the published checkpoints store them, and those expert values
    dequantized to bf16 (demo_model's experts="mxfp4" / "mxfp4-as-bf16"), under
    .test-artifacts/demo-model-mxfp4[-as-bf16]; the kernels' engine test serves both.
demo_vllm_server (session): one real vLLM engine serving demo_model_dir, started
    on first use (tens of seconds; see tests/helpers/vllm_server.py for the
    VllmServer API) and shared by every test that asks for it. Tests that change
    the engine's flags or kill it start their own with run_vllm_server().
"""

from __future__ import annotations

from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
ARTIFACTS = REPO_ROOT / ".test-artifacts"
DEMO_MODEL_SEED = 0


@pytest.fixture(scope="session")
def demo_model_dir() -> Path:
    from gptoss_spark.install.demo_model import make_demo_model

    return make_demo_model(ARTIFACTS / "demo-model", seed=DEMO_MODEL_SEED)


@pytest.fixture(scope="session")
def demo_model_mxfp4_dir() -> Path:
    from gptoss_spark.install.demo_model import make_demo_model

    return make_demo_model(ARTIFACTS / "demo-model-mxfp4", seed=DEMO_MODEL_SEED, experts="mxfp4")


@pytest.fixture(scope="session")
def demo_model_mxfp4_as_bf16_dir() -> Path:
    from gptoss_spark.install.demo_model import make_demo_model

    return make_demo_model(ARTIFACTS / "demo-model-mxfp4-as-bf16", seed=DEMO_MODEL_SEED, experts="mxfp4-as-bf16")


@pytest.fixture(scope="session")
def demo_vllm_server(demo_model_dir):
    from tests.helpers.vllm_server import run_vllm_server

    with run_vllm_server(demo_model_dir) as srv:
        yield srv
