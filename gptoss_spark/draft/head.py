"""Read an Eagle3 draft head directory the way vLLM 0.32.0 does (see package docstring)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from ..base.errors import UserError
from ..base.fsutil import read_json

CONFIG_NAME = "config.json"
INDEX_NAME = "model.safetensors.index.json"


@dataclass
class HeadConfig:
    """The config keys the shrink touches, wherever the format keeps them."""

    raw: dict
    speculators: bool  # speculators format: vocab under transformer_layer_config

    @property
    def layer_config(self) -> dict:
        return self.raw.get("transformer_layer_config", {}) if self.speculators else self.raw

    @property
    def vocab_size(self) -> int | None:
        return self.layer_config.get("vocab_size")

    @property
    def hidden_size(self) -> int | None:
        return self.layer_config.get("hidden_size")

    @property
    def draft_vocab_size(self) -> int | None:
        """As vLLM reads it: absent or null means the full vocabulary."""
        value = self.raw.get("draft_vocab_size")
        return self.vocab_size if value is None else value

    def with_draft_vocab_size(self, k: int) -> dict:
        new = json.loads(json.dumps(self.raw))
        new["draft_vocab_size"] = k  # top level in both formats
        return new


@dataclass
class EagleHead:
    path: Path
    config: HeadConfig
    files: dict[str, Path] = field(default_factory=dict)  # tensor name -> safetensors file

    def tensor_names(self) -> list[str]:
        return sorted(self.files)

    def find(self, suffix: str) -> str | None:
        hits = [n for n in self.files if n == suffix or n.endswith("." + suffix)]
        if len(hits) > 1:
            raise UserError(f"{self.path}: several tensors named like {suffix!r}: {hits}; not an Eagle3 head?")
        return hits[0] if hits else None

    @property
    def lm_head_name(self) -> str:
        name = self.find("lm_head.weight")
        if name is None:
            raise UserError(f"{self.path}: no lm_head.weight tensor; an Eagle3 head with its own lm_head is needed")
        return name

    def load(self, name: str):
        from safetensors import safe_open

        with safe_open(str(self.files[name]), framework="pt") as f:
            return f.get_tensor(name)

    def shape(self, name: str) -> list[int]:
        from safetensors import safe_open

        with safe_open(str(self.files[name]), framework="pt") as f:
            return list(f.get_slice(name).get_shape())

    def draft_to_target(self):
        """int64 tensor [draft_vocab_size]: target token id of each lm_head row."""
        import torch

        k, v = self.config.draft_vocab_size, self.config.vocab_size
        d2t_name = self.find("d2t")
        if d2t_name is not None:
            return torch.arange(k, dtype=torch.long) + self.load(d2t_name).to(torch.long)
        if k != v:
            raise UserError(f"{self.path}: draft_vocab_size {k} != vocab_size {v} but there is no d2t tensor; "
                            "the head is incomplete (vLLM would load zeros)")
        return torch.arange(k, dtype=torch.long)


def read_config(path: Path) -> HeadConfig:
    cfg_path = path / CONFIG_NAME
    try:
        raw = read_json(cfg_path)
    except OSError as e:
        raise UserError(f"cannot read {cfg_path}: {e.strerror}; pass the directory of an Eagle3 head") from None
    except ValueError:
        raise UserError(f"{cfg_path} is not valid JSON") from None
    config = HeadConfig(raw=raw, speculators="speculators_model_type" in raw)
    if not isinstance(config.vocab_size, int) or config.vocab_size <= 0:
        where = "transformer_layer_config.vocab_size" if config.speculators else "vocab_size"
        raise UserError(f"{cfg_path}: {where} missing or not a positive integer; it must be the target's vocabulary size")
    dvs = config.draft_vocab_size
    if not isinstance(dvs, int) or not 0 < dvs <= config.vocab_size:
        raise UserError(f"{cfg_path}: draft_vocab_size {dvs!r} must be an integer in 1..vocab_size ({config.vocab_size})")
    return config


def open_head(path: str | Path) -> EagleHead:
    path = Path(path)
    if not path.is_dir():
        raise UserError(f"{path} is not a directory; pass the directory holding the head's config.json and *.safetensors")
    config = read_config(path)
    files: dict[str, Path] = {}
    index = path / INDEX_NAME
    if index.exists():
        try:
            weight_map = read_json(index)["weight_map"]
        except (OSError, ValueError, KeyError) as e:
            raise UserError(f"{index} is unreadable or has no weight_map ({e})") from None
        files = {name: path / fname for name, fname in weight_map.items()}
    else:
        shards = sorted(path.glob("*.safetensors"))
        if not shards:
            raise UserError(f"{path}: no *.safetensors files; pass the directory of an Eagle3 head")
        from safetensors import safe_open

        for shard in shards:
            with safe_open(str(shard), framework="pt") as f:
                for name in f.keys():
                    files[name] = shard
    return EagleHead(path=path, config=config, files=files)
