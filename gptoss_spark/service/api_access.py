"""Who may reach the engine's OpenAI API: its bind address and its API key.

The engine (vLLM) listens on engine.host:engine.port. On loopback it is open to
this host's users only; on any other address it is open to the network, so the
settings then require engine.api_key_file (Settings refuses the file without
it). vLLM 0.32.0 checks the key on /v1 only (docs/CONFIGURATION.md); it gets it
as VLLM_API_KEY, never in argv (world-readable in /proc).
"""

from __future__ import annotations

import errno
import socket

from .config import Settings
from ..base.errors import ConfigError


def _where(settings: Settings) -> str:
    return str(settings.source or "gptoss-spark.toml")


def read_api_key(settings: Settings) -> str | None:
    """The key in engine.api_key_file (None if unset); a missing, unreadable or empty file is a ConfigError."""
    path = settings.engine.api_key_file
    if path is None:
        return None
    try:
        key = path.read_text().strip()
    except FileNotFoundError:
        raise ConfigError(_where(settings), "engine.api_key_file", f"{path} does not exist",
                          "run the installer's token step (sudo ./install.sh) or write a key into it") from None
    except PermissionError:
        raise ConfigError(_where(settings), "engine.api_key_file", f"{path} is not readable by this user",
                          "make it 0640 root:gptoss-spark (the installer does)") from None
    except (IsADirectoryError, UnicodeDecodeError):
        raise ConfigError(_where(settings), "engine.api_key_file", f"{path} is not a text file",
                          "point it at the key file, one line") from None
    if not key:
        raise ConfigError(_where(settings), "engine.api_key_file", f"{path} is empty",
                          "write a key into it (python3 -c 'import secrets; print(secrets.token_urlsafe(32))')")
    return key


def check_engine_address(settings: Settings) -> None:
    """One-line ConfigError unless engine.host is an address this host has (or a wildcard).

    Binds port 0 on it, so the check neither needs engine.port free nor takes it.
    """
    host = settings.engine.host
    try:
        infos = socket.getaddrinfo(host, 0, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror:
        raise _not_here(settings, "does not resolve") from None
    family, socktype, proto, _, addr = infos[0]
    with socket.socket(family, socktype, proto) as s:
        try:
            s.bind(addr)
        except OSError as e:
            if e.errno == errno.EADDRNOTAVAIL:
                raise _not_here(settings, "is not an address of this host") from None
            raise ConfigError(_where(settings), "engine.host", f"cannot bind {host!r}: {e.strerror or e}",
                              "use an address of this host") from None


def _not_here(settings: Settings, why: str) -> ConfigError:
    return ConfigError(_where(settings), "engine.host", f"{settings.engine.host!r} {why}",
                       "use one of this host's addresses (ip -brief address), 0.0.0.0 for all of them, "
                       "or 127.0.0.1")


def check_api_access(settings: Settings) -> None:
    """What `serve` and `check` verify before an engine starts: the bind address and the key file."""
    check_engine_address(settings)
    read_api_key(settings)
