"""Inside an engine process: this package's log records go where vLLM's own go (its stdout, which
the supervisor passes to the journal and reads for start-up phases)."""

from __future__ import annotations

import logging


class ToVllmLogger(logging.Handler):
    """Hands a record to the "vllm" logger's handlers as they are at that moment (vLLM may configure
    its logging after the plugin loads)."""

    def emit(self, record: logging.LogRecord) -> None:
        logging.getLogger("vllm").handle(record)


def log_through_vllm() -> None:
    ours = logging.getLogger("gptoss_spark")
    if not any(isinstance(h, ToVllmLogger) for h in ours.handlers):
        ours.addHandler(ToVllmLogger())
    ours.setLevel(logging.INFO)
    ours.propagate = False
