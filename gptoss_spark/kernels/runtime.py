"""Small runtime facts the launchers need."""

from __future__ import annotations

import os


def interpreting() -> bool:
    """True under TRITON_INTERPRET=1 (CPU tests): kernels then avoid interpreter-only bugs."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
