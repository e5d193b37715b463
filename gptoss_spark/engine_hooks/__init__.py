"""Code that runs inside the vLLM engine's processes to make its start-up cheaper.

Loaded by vLLM as a general plugin (pyproject.toml, `vllm.general_plugins`: `gptoss_spark_warm`),
in every engine process, before the model is built. Each hook does nothing unless the service's
environment turns it on (service/engine.py build_env).
"""

from __future__ import annotations


def register() -> None:
    """Entry point (vllm.general_plugins)."""
    from . import cute_dsl_cache, shm_busy_loop
    from .vllm_logging import log_through_vllm

    if shm_busy_loop.requested() is not None:
        log_through_vllm()  # first: its one line says what it changed
    shm_busy_loop.install()
    if cute_dsl_cache.install():
        log_through_vllm()
