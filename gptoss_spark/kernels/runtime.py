"""Small runtime facts the launchers need."""

from __future__ import annotations

import os


def interpreting() -> bool:
    """True under TRITON_INTERPRET=1 (CPU tests): kernels then avoid interpreter-only bugs."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def require_cuda(what: str) -> None:
    """One line instead of a traceback where a command needs a CUDA GPU and torch cannot see one."""
    from ..base.errors import RequirementError
    try:
        import torch
    except ImportError:
        raise RequirementError(f"{what} needs torch with CUDA; run it from the service's venv "
                               f"(/opt/gptoss-spark/current/bin/gptoss-spark)") from None
    if not torch.cuda.is_available():
        raise RequirementError(f"{what} needs a CUDA GPU and torch sees none (torch {torch.__version__}); "
                               f"check nvidia-smi")
