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
    check = [*AS_SERVICE, gs, "check", "--all-profiles", *config_args(layout), *engine_python_override(layout, venv)]
    if kept is None:
        log(f"  the profiles changed: checking their engine arguments under {layout.real(venv)}")
    if run(check) == 0:
        return
    edited, shipped = admins_profiles(layout), shipped_profiles(layout)
    # Whose fault: with only this version's own, unedited profiles installed, the version's; with
    # edits beside them, the shipped ones are checked alone (a second vLLM run, on this failure only).
    at_fault = bool(shipped) and not edited
    if shipped and edited:
        log(f"  checking the profiles as this version ships them, without {', '.join(edited)} (edited here)")
        at_fault = run([*check, "--skip-profiles", ",".join(edited)]) != 0
    whose = "the new version's vLLM" if kept is not None else "vLLM"
    after = kept or "; the profile files are put back as they were, the running engine keeps its arguments"
    if at_fault:
        # Its own defaults are refused: telling the owner to fix their profile would send them the wrong way.
        raise InstallError(
            f"{whose} rejects the engine arguments of profiles this version ships, unedited (the lines above "
            f"name them and vLLM's reason): the new version is at fault, not this machine's settings{after}; "
            "report it with the lines above and install a fixed version when there is one"
            + ("" if kept else "; `sudo ./install.sh --rollback` switches back to the version before"), EXIT_ARGS)
    if shipped:
        raise InstallError(
            f"{whose} rejects the engine arguments of a profile edited here ({', '.join(edited)}: the line above "
            f"names which and vLLM's reason) and accepts every profile this version ships: fix that profile "
            f"(`gptoss-spark check` says what is wrong) or wait for a fixed version{after}", EXIT_ARGS)
    raise InstallError(
        f"{whose} rejects an installed profile's engine arguments (the line above names the profile and vLLM's "
        f"reason); fix that profile or wait for a fixed version{after}", EXIT_ARGS)


def admins_profiles(layout: Layout) -> list[str]:
    """Names of the profiles that are the admin's: in profiles.d, or shipped and edited since an
    install wrote them (.shipped.json)."""
    shipped = Shipped(layout)
    ours = sorted(layout.profiles_dir.glob("*.toml")) if layout.profiles_dir.is_dir() else []
    theirs = sorted(layout.user_profiles_dir.glob("*.toml")) if layout.user_profiles_dir.is_dir() else []
    return sorted({p.stem for p in theirs} | {p.stem for p in ours if not shipped.unedited(p, p.read_bytes())})


def shipped_profiles(layout: Layout) -> list[str]:
    """Names of the profiles an install wrote that nobody edited since (and profiles.d does not replace)."""
    mine = set(admins_profiles(layout))
    ours = sorted(layout.profiles_dir.glob("*.toml")) if layout.profiles_dir.is_dir() else []
    return [p.stem for p in ours if p.stem not in mine]
