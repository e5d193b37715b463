"""The prompts file: one JSON object per line.

    {"id": "en-chat-tides", "lang": "en", "kind": "chat",
     "messages": [{"role": "user", "content": "..."}]}

`messages` go to /v1/chat/completions as they are. /v1/completions gets
`prompt` when a line has one, else the messages' contents joined: raw decode
needs no chat template.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from ..base.errors import UserError

SHIPPED_PROMPTS = "prompts.jsonl"
_ROLES = {"system", "developer", "user", "assistant"}


@dataclass(frozen=True)
class Prompt:
    id: str
    messages: tuple[dict, ...]
    lang: str = ""
    kind: str = ""
    prompt: str | None = None

    def completion_text(self) -> str:
        if self.prompt is not None:
            return self.prompt
        return "\n\n".join(m["content"] for m in self.messages)


def shipped_prompts_path() -> Path:
    return Path(str(resources.files("gptoss_spark") / "data" / SHIPPED_PROMPTS))


def load_prompts(path: str | Path | None = None) -> list[Prompt]:
    """Read and validate a prompts file; None means the shipped one."""
    path = Path(path) if path is not None else shipped_prompts_path()
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise UserError(f"cannot read prompts file {path}: {e.strerror}; pass --prompts with a readable JSONL file") from None
    prompts: list[Prompt] = []
    seen: set[str] = set()
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        where = f"{path}:{lineno}"
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise UserError(f"{where}: not valid JSON ({e.msg}); each line must be one JSON object") from None
        prompts.append(_parse_prompt(obj, where, seen))
    if not prompts:
        raise UserError(f"{path}: no prompts in the file; add JSON lines with \"id\" and \"messages\"")
    return prompts


def _parse_prompt(obj: object, where: str, seen: set[str]) -> Prompt:
    if not isinstance(obj, dict):
        raise UserError(f"{where}: a line must be a JSON object with \"id\" and \"messages\"")
    pid = obj.get("id")
    if not isinstance(pid, str) or not pid:
        raise UserError(f"{where}: missing \"id\"; give each prompt a unique string id")
    if pid in seen:
        raise UserError(f"{where}: duplicate id {pid!r}; prompt ids must be unique")
    seen.add(pid)
    messages = obj.get("messages")
    if not isinstance(messages, list) or not messages:
        raise UserError(f"{where}: \"messages\" must be a non-empty list of {{\"role\", \"content\"}} objects")
    for m in messages:
        if not isinstance(m, dict) or m.get("role") not in _ROLES or not isinstance(m.get("content"), str):
            raise UserError(
                f"{where}: each message needs \"role\" (one of {sorted(_ROLES)}) and a string \"content\""
            )
    prompt = obj.get("prompt")
    if prompt is not None and not isinstance(prompt, str):
        raise UserError(f"{where}: \"prompt\" must be a string when given")
    return Prompt(
        id=pid,
        messages=tuple({"role": m["role"], "content": m["content"]} for m in messages),
        lang=str(obj.get("lang", "")),
        kind=str(obj.get("kind", "")),
        prompt=prompt,
    )
