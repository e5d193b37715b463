"""Reading the admin token file: the admin API checks requests against it, the admin CLI and the
cluster's head send it. One reader, so all three accept and refuse the same files.

Nothing here ever logs or returns the token except read_token's return value.
"""

from __future__ import annotations

from pathlib import Path

# A token shorter than this is a mistake (an empty line, a placeholder), not a secret.
MIN_TOKEN_LENGTH = 16
MAX_TOKEN_FILE_BYTES = 4096


class TokenUnavailable(Exception):
    """The token file cannot be used; the message says why and how to fix it (no secret in it)."""


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
