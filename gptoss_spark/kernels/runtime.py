"""The one run-time fact the launchers need: whether Triton's interpreter runs them."""

from __future__ import annotations

import os


def interpreting() -> bool:
    """True under TRITON_INTERPRET=1 (CPU tests): kernels then avoid interpreter-only bugs."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
