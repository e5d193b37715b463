"""What the server at base_url serves, checked before any measured request."""

from __future__ import annotations

from dataclasses import dataclass, field

import httpx

from ..base.errors import ConfigError, UserError
from ..base.exit_codes import EXIT_UNAVAILABLE
from ..base.defaults import ENGINE_URL
from ..base.net import local_url

# The engine with the default settings; `bench ab` reads the settings file instead.
DEFAULT_BASE_URL = ENGINE_URL
DEFAULT_MODEL = "gptoss"


class ServerUnreachable(UserError):
    """The endpoint does not answer: the service is down or the URL is wrong."""

    exit_code = EXIT_UNAVAILABLE


@dataclass(frozen=True)
class Target:
    base_url: str
    model: str
    served_models: tuple[str, ...]
    max_model_len: int | None
    server_version: str | None
    # Sent as "Authorization: Bearer" on every request when the engine has a key (engine.api_key_file).
    api_key: str | None = field(default=None, repr=False)

    @property
    def headers(self) -> dict[str, str]:
        return auth_headers(self.api_key)


def auth_headers(api_key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def resolve_target(base_url: str, model: str | None, timeout: float = 10.0, api_key: str | None = None) -> Target:
    """Ask /v1/models which model to use; /version for vLLM's version (optional)."""
    base_url = base_url.rstrip("/")
    if not base_url.startswith(("http://", "https://")):
        raise UserError(f"--url {base_url!r} is not an http(s) URL; pass e.g. --url {DEFAULT_BASE_URL}")
    try:
        with httpx.Client(timeout=timeout, headers=auth_headers(api_key)) as client:
            resp = client.get(base_url + "/v1/models")
            version = None
            try:
                vr = client.get(base_url + "/version")
                if vr.status_code == 200:
                    version = vr.json().get("version")
            except (httpx.HTTPError, ValueError):
                pass
    except httpx.HTTPError as e:
        raise ServerUnreachable(
            f"cannot reach {base_url} ({type(e).__name__}: {e}); is the service running? "
            "check `systemctl status gptoss-spark` or pass --url"
        ) from None
    if resp.status_code == 401:
        raise UserError(f"{base_url}/v1/models answered HTTP 401: the engine wants an API key"
                        + (" and this one is not it" if api_key else "")
                        + "; pass --api-key-file with the file engine.api_key_file names")
    if resp.status_code != 200:
        raise ServerUnreachable(
            f"{base_url}/v1/models answered HTTP {resp.status_code}; the engine is not ready "
            "(check `gptoss-spark status` / the journal) or --url points elsewhere"
        )
    try:
        data = resp.json().get("data") or []
        served = {m["id"]: m for m in data}
    except (ValueError, AttributeError, KeyError, TypeError):
        raise ServerUnreachable(f"{base_url}/v1/models is not an OpenAI model list; pass --url of the vLLM endpoint") from None
    chosen = _choose_model(model, served, base_url)
    return Target(
        base_url=base_url,
        model=chosen,
        served_models=tuple(served),
        max_model_len=served[chosen].get("max_model_len"),
        server_version=version,
        api_key=api_key,
    )


def _choose_model(model: str | None, served: dict, base_url: str) -> str:
    if model is not None:
        if model not in served:
            raise UserError(f"{base_url} serves {sorted(served)}, not {model!r}; pass --model with one of those")
        return model
    if DEFAULT_MODEL in served:
        return DEFAULT_MODEL
    if len(served) == 1:
        return next(iter(served))
    raise UserError(f"{base_url} serves {sorted(served)} and none is {DEFAULT_MODEL!r}; pass --model NAME")


def api_key_for(args, url: str, settings=None) -> str | None:
    """The key to send to url: --api-key-file's, else the settings' key if url is the settings' engine.

    Never the service's key to another server: --url elsewhere needs --api-key-file.
    """
    from ..service.api_access import read_api_key
    from ..service.config import load_settings, resolve_config_path

    if args.api_key_file is not None:
        try:
            key = args.api_key_file.read_text().strip()
        except OSError as e:
            raise UserError(f"cannot read --api-key-file {args.api_key_file}: {e.strerror}; "
                            "pass a readable file (root or the gptoss-spark group for the service's)") from None
        if not key:
            raise UserError(f"--api-key-file {args.api_key_file} is empty; pass the file with the key")
        return key
    if settings is None:
        try:
            settings = load_settings(resolve_config_path(getattr(args, "config", None)), must_exist=False)
        except ConfigError:
            return None  # no usable settings, so no key of theirs; a 401 then says --api-key-file
    if url.rstrip("/") != local_url(settings.engine.host, settings.engine.port):
        return None
    return read_api_key(settings)
