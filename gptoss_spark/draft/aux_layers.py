"""Does an Eagle3 head's config tap the target layers its fc was trained on? As vLLM 0.32.0 reads it.

vLLM feeds the head's `fc` the hidden states of the target's auxiliary layers, concatenated:
fc in-features = target_hidden_size x the number of aux layers. It takes the layer ids from the
draft config's `eagle_aux_hidden_state_layer_ids` (top level, or under `eagle_config`) and, when
they are missing, silently falls back to the target's defaults (2, L/2, L-3)
(gpu_model_runner._get_eagle3_aux_layers_from_config, interfaces.get_eagle3_default_aux_hidden_state_layers);
the count comes from `num_aux_hidden_states`, else from the ids, else 3 (llama_eagle3.py). A head
whose config disagrees with its fc or the target drafts from the wrong layers: users of NVIDIA's
gpt-oss-120b Eagle3 head report ~1.1 accepted tokens per step that way, where speculation pays
only well above 1.
"""

from __future__ import annotations

from pathlib import Path

from ..base.fsutil import read_json
from .head import EagleHead


def default_layers(target_layers: int) -> list[int]:
    return [2, target_layers // 2, target_layers - 3]


def layer_ids_of(raw: dict) -> list[int] | None:
    ids = raw.get("eagle_aux_hidden_state_layer_ids") or (raw.get("eagle_config") or {}).get(
        "eagle_aux_hidden_state_layer_ids")
    return list(ids) if ids else None


def read_target(model_dir: Path) -> dict:
    """The target's layer count and hidden size from its config.json ({} if it has none)."""
    f = Path(model_dir) / "config.json"
    if not f.is_file():
        return {}
    cfg = read_json(f)
    return {"layers": cfg.get("num_hidden_layers"), "hidden_size": cfg.get("hidden_size")}


def check_aux_layers(head: EagleHead, target: dict | None = None) -> tuple[dict, list[str]]:
    """(report, problems) for the head's aux layers against its fc and, if given, the target."""
    raw, layer_cfg = head.config.raw, head.config.layer_config
    eagle_cfg = raw.get("eagle_config") or {}
    if not eagle_cfg.get("use_aux_hidden_state", True):
        return {"use_aux_hidden_state": False}, []
    target = target or {}
    ids = layer_ids_of(raw)
    count = layer_cfg.get("num_aux_hidden_states") or raw.get("num_aux_hidden_states") or (len(ids) if ids else 3)
    hidden = layer_cfg.get("target_hidden_size") or target.get("hidden_size") or head.config.hidden_size
    fc = head.find("fc.weight")
    fc_in = head.shape(fc)[1] if fc else None
    report = {"aux_layer_ids": ids, "aux_count": count, "target_hidden_size": hidden, "fc_in_features": fc_in,
              "target_layers": target.get("layers")}
    problems = []
    if ids is None:
        fallback = default_layers(target["layers"]) if target.get("layers") else "(2, L/2, L-3)"
        problems.append(f"config.json has no eagle_aux_hidden_state_layer_ids: vLLM 0.32.0 then silently taps the "
                        f"target's default layers {fallback}, which need not be the ones this head was trained on; "
                        f"set them (top level) from the head's model card")
    elif len(ids) != count:
        problems.append(f"num_aux_hidden_states {count} but {len(ids)} eagle_aux_hidden_state_layer_ids {ids}")
    if ids and target.get("layers"):
        outside = [i for i in ids if not 0 <= i < target["layers"]]
        if outside:
            problems.append(f"aux layer ids {outside} outside the target's layers 0..{target['layers'] - 1}")
    if fc_in is not None and hidden and count * hidden != fc_in:
        problems.append(f"fc takes {fc_in} inputs, but {count} aux layers x target hidden {hidden} = "
                        f"{count * hidden}: the config and the weights disagree on how many layers feed the head")
    return report, problems
