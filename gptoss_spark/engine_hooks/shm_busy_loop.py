"""vLLM's shared-memory message queue, with its readers' busy-wait bounded where a profile asks.

vLLM 0.32.0's `SpinCondition` (vllm/distributed/device_communicators/shm_broadcast.py:133-147) keeps
a reader spinning on `sched_yield()` for `busy_loop_s` after each read before it sleeps on its zmq
socket. That is 1 s, a constructor default that neither caller (`MessageQueue.__init__`, lines 539
and 652) nor any environment variable overrides. With tensor parallelism every step is a read, so a
reader never sleeps while decoding: at TP=2 across two Sparks this is reported to hold 3-4 Grace cores
at 100 % and drive the SoC to 95 C, against a forced shutdown at 104.8 C
(MiaAI-Lab/DeepSeek-v4-Flash-DSpark-2x-DGX-Spark#79, which bounded it at 0.002 s).

With GPTOSS_SPARK_SHM_BUSY_LOOP_S set (the cluster profiles set it), the default becomes that many
seconds, in every engine process: vLLM loads its general plugins in the engine core before it makes
the executor (v1/engine/core.py:127) and in each worker before its queues (worker_base.py:274,
multiproc_executor.py:671 before :619). Unset, nothing changes.
"""

from __future__ import annotations

import inspect
import logging
import os

ENV = "GPTOSS_SPARK_SHM_BUSY_LOOP_S"
VLLM_DEFAULT = 1  # vLLM 0.32.0's; another one means another vLLM: leave it alone and say so

log = logging.getLogger("gptoss_spark.engine_hooks.shm_busy_loop")


def requested() -> float | None:
    """The busy-wait the environment asks for, or None. ValueError names a bad value."""
    raw = os.environ.get(ENV, "").strip()
    if not raw:
        return None
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"{ENV}={raw!r} is not a number of seconds (e.g. 0.002)") from None
    if not 0 <= value <= 10:
        raise ValueError(f"{ENV}={raw!r} is outside 0-10 seconds")
    return value


def install() -> bool:
    """Make `value` SpinCondition's busy_loop_s default. True if it did."""
    value = requested()
    if value is None:
        return False
    from vllm.distributed.device_communicators import shm_broadcast

    init = shm_broadcast.SpinCondition.__init__
    param = inspect.signature(init).parameters.get("busy_loop_s")
    if param is None or param.default != VLLM_DEFAULT or init.__defaults__ != (VLLM_DEFAULT,):
        log.warning("%s ignored: this vLLM's SpinCondition is not 0.32.0's (busy_loop_s default %s)",
                    ENV, None if param is None else param.default)
        return False
    init.__defaults__ = (value,)
    log.info("shared-memory queue readers busy-wait %g s after a read (vLLM's default: %g s)", value,
             VLLM_DEFAULT)
    return True
