"""Check a new version as far as it can be without loading a model, before the running one is touched.

Run by install.sh after the new venv is built and before the switch: everything here
runs beside the serving engine and changes nothing. A failure ends the install with
its exit code and the old version serving, without a gap:
- the venv imports vllm, transformers and gptoss_spark;
- its vLLM patches verify (against this source's patch set);
- each installed profile's full engine argv, built by the new version's code, parses
  with the new vLLM's own parser (`gptoss-spark check --all-profiles`: the same check
  the supervisor makes before a profile switch, argcheck.py), as the service user.
A profile the check cannot answer for (its engine does not run on this machine, such
as a Spark profile beside a --cpu demonstration) is named and does not refuse.

Also a warm-up: the new vLLM's files are read from disk here, not after the stop.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from ..base.exit_codes import EXIT_ARGS, EXIT_PATCHES, EXIT_VENV
from .layout import InstallError, Layout
from .placement import Shipped, read_config
from .venvs import AS_SERVICE, Runner, config_args, default_runner


def _step(ok: bool, message: str, code: int) -> None:
    if not ok:
        raise InstallError(message, code)


def engine_python_override(layout: Layout, venv: Path) -> list[str]:
    """--engine-python for the check: the new venv's python, unless the settings name an
    interpreter of their own (outside /opt/gptoss-spark/current), which the upgrade does not change."""
    named = read_config(layout.config_file).get("engine", {}).get("python", "")
    current = layout.real(layout.current)
    if named and not named.startswith(current + "/"):
        return []
    return ["--engine-python", layout.real(venv / "bin" / "python")]


def validate_version(layout: Layout, venv: Path, source: Path, *, run: Runner = default_runner,
                     log: Callable[[str], None] = print) -> None:
    py, gs = str(venv / "bin" / "python"), str(venv / "bin" / "gptoss-spark")
    kept = "; nothing was changed, the running version still serves"
    log(f"  checking {layout.real(venv)} before the running service is touched")
    _step(run([py, "-c", "import vllm, transformers, gptoss_spark"]) == 0,
          "the new environment cannot import vllm/transformers/gptoss_spark (see the error above)" + kept, EXIT_VENV)
    pdir = source / "patches" / "vllm"
    if pdir.is_dir():
        _step(run([gs, "patches", "verify", "--venv", str(venv), "--patches-dir", str(pdir)]) == 0,
              "the new version's vLLM patches do not verify (see above)" + kept, EXIT_PATCHES)
    check_profiles(layout, venv, run=run, kept=kept)


def check_profiles(layout: Layout, venv: Path, *, run: Runner = default_runner, log: Callable[[str], None] = print,
                   kept: str | None = None) -> None:
    """Every installed profile's engine arguments under `venv`'s vLLM, as the service user (exit 29).
    Without `kept`: the venv is already current and the install changed a profile file (a shipped
    profile updated), so only the arguments are new."""
    gs = str(venv / "bin" / "gptoss-spark")
    if kept is None:
        log(f"  the profiles changed: checking their engine arguments under {layout.real(venv)}")
    whose = "the new version's vLLM" if kept is not None else "vLLM"
    fix = ("this version ships them so (no profile here was edited, profiles.d is empty): the new version "
           "is at fault; keep the running one and report it, or install a fixed version"
           if only_shipped_profiles(layout) else "fix that profile or wait for a fixed version")
    _step(run([*AS_SERVICE, gs, "check", "--all-profiles", *config_args(layout),
               *engine_python_override(layout, venv)]) == 0,
          f"{whose} rejects an installed profile's engine arguments (the line above names the profile and "
          f"vLLM's reason); {fix}" + (kept or "; the profile files are put back as they were, the running engine keeps its arguments"),
          EXIT_ARGS)


def only_shipped_profiles(layout: Layout) -> bool:
    """True if every profile the service runs is one an install wrote and nobody edited since
    (.shipped.json), and profiles.d holds none of the admin's own."""
    shipped = Shipped(layout)
    ours = sorted(layout.profiles_dir.glob("*.toml")) if layout.profiles_dir.is_dir() else []
    theirs = sorted(layout.user_profiles_dir.glob("*.toml")) if layout.user_profiles_dir.is_dir() else []
    return bool(ours) and not theirs and all(shipped.unedited(p, p.read_bytes()) for p in ours)
