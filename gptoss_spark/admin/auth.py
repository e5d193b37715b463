"""Bearer-token check for the mutating endpoints.

The token lives in a file the installer creates (0640 root:gptoss-spark). It is
read on every mutating request, so rotating it needs no restart, and it is
compared in constant time. Nothing here ever logs or returns the token.
"""

from __future__ import annotations

import hmac
import os
import stat
from dataclasses import dataclass
from pathlib import Path

import structlog

from ..base.token import TokenUnavailable, read_token

log = structlog.get_logger("gptoss_spark.admin")


@dataclass(frozen=True)
class AuthResult:
    ok: bool
    status: int = 200       # 401 no credentials, 403 wrong ones, 503 no usable token file
    code: str = "ok"
    message: str = ""


def check_token_file_mode(path: Path) -> str | None:
    """A warning if the token file is readable by everyone, else None."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    if st.st_mode & (stat.S_IROTH | stat.S_IWOTH):
        return f"admin token file {path} is accessible to all users; chmod 0640 it (owner root, group gptoss-spark)"
    return None


def authorize(header: str | None, token_file: Path) -> AuthResult:
    """Check an Authorization header against the token file."""
    try:
        expected = read_token(token_file)
    except TokenUnavailable as e:
        return AuthResult(False, 503, "token_unavailable",
                          f"mutations are disabled: {e}")
    if not header:
        return AuthResult(False, 401, "unauthorized", "missing 'Authorization: Bearer <token>' header")
    scheme, _, given = header.strip().partition(" ")
    if scheme.lower() != "bearer" or not given.strip():
        return AuthResult(False, 401, "unauthorized", "expected 'Authorization: Bearer <token>'")
    # Bytes, so a non-ASCII header cannot raise inside compare_digest.
    if not hmac.compare_digest(given.strip().encode("utf-8", "surrogateescape"), expected.encode("ascii")):
        return AuthResult(False, 403, "forbidden", "wrong token")
    return AuthResult(True)
