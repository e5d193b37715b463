"""Whether each profile can run on this host, and if not, every reason why (for `gptoss-spark profile`).

A --cpu install lists the Spark profiles too; without this, nothing said that they
cannot start there. The reasons are the facts a start would trip over, all of them
at once: no NVIDIA GPU for a CUDA profile (requires.gpu), a cluster profile without [cluster]
(or the other way round), more memory than the host
has in all (memory_gib against MemTotal; what is free now is the memory guard's
question at switch time), no checkpoint or one of another model, a required path missing (the Eagle3 head).
"""

from __future__ import annotations

from .config import Settings
from .profiles import NVIDIA_GPUS_DIR, Profile, nvidia_gpu_count


def why_not(profile: Profile, settings: Settings, total_gib: float, gpus: int | None = None) -> list[str]:
    """Short reasons `profile` cannot run here; empty = it can (as far as can be told without starting it)."""
    reasons = []
    if profile.needs_gpu and (nvidia_gpu_count() if gpus is None else gpus) == 0:
        reasons.append(f"needs an NVIDIA GPU, none found ({NVIDIA_GPUS_DIR})")
    if profile.needs_cluster and settings.cluster is None:
        reasons.append("runs across two nodes; no [cluster] is set (docs/CLUSTER.md)")
    if not profile.needs_cluster and settings.cluster is not None:
        reasons.append("runs on one node; [cluster] is set")
    if profile.memory_gib > total_gib:
        reasons.append(f"needs {profile.memory_gib:g} GiB, the host has {total_gib:.1f} GiB in all")
    if not (settings.model.dir / "config.json").is_file():
        reasons.append(f"no checkpoint at {settings.model.dir}")
    elif mismatch := profile.checkpoint_mismatch(settings):
        reasons.append(mismatch)
    reasons += [f"missing {p}" for p in profile.missing_paths(settings)]
    return reasons
