"""The checkpoints this project serves, by the name `gptoss-spark model` and profiles (`model = ...`) use.

A checkpoint is recognised on disk by its config.json (num_hidden_layers, num_local_experts), so a
20b profile is never started on a 120b checkpoint by mistake. `ignore` leaves out what vLLM does not
load: the repositories also carry the original-format weights (`original/`) and a Metal build
(`metal/`), each as large as the checkpoint itself.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from ..base.fsutil import read_json


@dataclass(frozen=True)
class Checkpoint:
    name: str                      # `gptoss-spark model pull NAME`; a profile's `model = NAME`
    repo_id: str                   # on the Hugging Face Hub
    kind: Literal["model", "eagle3"]
    dir_name: str                  # default directory name, beside model.dir
    serves: str                    # the model it is (kind model) or drafts for (kind eagle3)
    default: bool = False          # the checkpoint model.dir / model.eagle3_dir mean unless named otherwise
    layers: int | None = None      # config.json's num_hidden_layers (kind model)
    experts: int | None = None     # config.json's num_local_experts (kind model)
    ignore: tuple[str, ...] = ()   # repository paths not fetched (fnmatch patterns)
    about: str = ""                # one line for `model list`


GPT_OSS_IGNORE = ("original/*", "metal/*")

CATALOG: dict[str, Checkpoint] = {c.name: c for c in (
    Checkpoint("gpt-oss-120b", "openai/gpt-oss-120b", "model", "gpt-oss-120b", "gpt-oss-120b", default=True,
               layers=36, experts=128, ignore=GPT_OSS_IGNORE, about="~65 GB; 36 layers, 128 experts, top-4"),
    Checkpoint("gpt-oss-20b", "openai/gpt-oss-20b", "model", "gpt-oss-20b", "gpt-oss-20b",
               layers=24, experts=32, ignore=GPT_OSS_IGNORE, about="~14 GB; 24 layers, 32 experts, top-4"),
    # NVIDIA's Eagle3 head for gpt-oss-120b, v3: the head the seed's spec figure (68.9 tok/s, K=1) was
    # measured with (docs/HARDWARE.md). Its card lists it as superseding -throughput, -short-context and
    # -long-context. The revision is not pinned: `model pull` records the commit it fetched in the manifest.
    Checkpoint("gpt-oss-120b-eagle3", "nvidia/gpt-oss-120b-Eagle3-v3", "eagle3", "gpt-oss-120b-Eagle3",
               "gpt-oss-120b", default=True, about="Eagle3 draft head for spec (K=1)"),
    # A public Eagle3 head for gpt-oss-20b in vLLM's Eagle3 format (CC BY 4.0), for spec-20b.
    Checkpoint("gpt-oss-20b-eagle3", "nebius/EAGLE3-gpt-oss-20b", "eagle3", "gpt-oss-20b-Eagle3", "gpt-oss-20b",
               about="Eagle3 draft head for spec-20b"),
)}


def checkpoint(name: str) -> Checkpoint:
    from ..base.errors import UserError

    if name not in CATALOG:
        raise UserError(f"unknown checkpoint {name!r} (known: {', '.join(CATALOG)}); `gptoss-spark model list` "
                        "shows them")
    return CATALOG[name]


def default_dir(entry: Checkpoint, model_dir: Path, eagle3_dir: Path, eagle3_20b_dir: Path | None = None) -> Path:
    """Where `model pull NAME` puts a checkpoint unless told: the configured directory for the
    checkpoint the settings mean (model.dir / model.eagle3_dir; the 20b's head has its own,
    model.eagle3_20b_dir), else beside it under its own name."""
    if entry.kind == "eagle3" and entry.serves == "gpt-oss-20b" and eagle3_20b_dir is not None:
        return eagle3_20b_dir
    configured = model_dir if entry.kind == "model" else eagle3_dir
    known_names = {c.dir_name for c in CATALOG.values()}
    if configured.name == entry.dir_name or (entry.default and configured.name not in known_names):
        return configured
    return configured.parent / entry.dir_name


def identify(model_dir: Path) -> Checkpoint | None:
    """The catalog model whose shape the config.json in model_dir has; None if unreadable or unknown."""
    try:
        cfg = read_json(model_dir / "config.json")
    except (OSError, ValueError):
        return None
    if not isinstance(cfg, dict):
        return None
    shape = (cfg.get("num_hidden_layers"), cfg.get("num_local_experts"))
    return next((c for c in CATALOG.values() if c.kind == "model" and (c.layers, c.experts) == shape), None)
