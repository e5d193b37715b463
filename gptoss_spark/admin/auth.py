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

log = structlog.get_logger("gptoss_spark.admin")

# A token shorter than this is a mistake (an empty line, a placeholder), not a secret.
MIN_TOKEN_LENGTH = 16
MAX_TOKEN_FILE_BYTES = 4096


class TokenUnavailable(Exception):
    """The token file cannot be used; the message says why and how to fix it (no secret in it)."""


@dataclass(frozen=True)
class AuthResult:
    ok: bool
    status: int = 200       # 401 no credentials, 403 wrong ones, 503 no usable token file
    code: str = "ok"
    message: str = ""


def read_token(path: Path) -> str:
    """The admin token from its file, or TokenUnavailable with a one-line reason."""
    try:
        with path.open("rb") as f:
            raw = f.read(MAX_TOKEN_FILE_BYTES + 1)
    except FileNotFoundError:
        raise TokenUnavailable(f"admin token file {path} does not exist; the installer creates it "
                               "(or write a random line there: umask 027; openssl rand -hex 32 > FILE)") from None
    except PermissionError:
        raise TokenUnavailable(f"admin token file {path} is not readable by the service user; "
                               "make it 0640 root:gptoss-spark") from None
    except IsADirectoryError:
        raise TokenUnavailable(f"admin token file {path} is a directory; it must be a file holding one line") from None
    except OSError as e:
        raise TokenUnavailable(f"admin token file {path} cannot be read ({e.strerror})") from None
    if len(raw) > MAX_TOKEN_FILE_BYTES:
        raise TokenUnavailable(f"admin token file {path} is larger than {MAX_TOKEN_FILE_BYTES} bytes; "
                               "it must hold one line")
    try:
        token = raw.decode("ascii").strip()
    except UnicodeDecodeError:
        raise TokenUnavailable(f"admin token file {path} is not ASCII text") from None
    if len(token) < MIN_TOKEN_LENGTH or any(c.isspace() for c in token):
        raise TokenUnavailable(f"admin token file {path} must hold one token of at least {MIN_TOKEN_LENGTH} "
                               "characters without spaces")
    return token


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
