"""`gptoss-spark model pull|verify|list`: the checkpoints the profiles serve, fetched and checked.

pull needs the network (the Hugging Face Hub, or HF_ENDPOINT / --endpoint); verify and list never
touch it: a pulled checkpoint is a plain directory plus its manifest.
"""

from __future__ import annotations

import argparse
import os
import pwd
import sys
from pathlib import Path

from .base.errors import UserError
from .base.exit_codes import EXIT_MODEL_CORRUPT
from .service.config import Settings, load_settings, resolve_config_path
from .base.defaults import CONFIG_HELP
from .models.catalog import CATALOG, Checkpoint, checkpoint, default_dir, identify
from .models.manifest import read_manifest, verify
from .models.pull import pull, size_text, staging_dir

SERVICE_USER = "gptoss-spark"


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("model", help="fetch (pull), check (verify) and list the checkpoints the profiles serve")
    msub = p.add_subparsers(dest="model_command", metavar="ACTION", required=True)

    q = msub.add_parser("pull", help="fetch a checkpoint from the Hugging Face Hub, every file hash-checked")
    q.add_argument("name", choices=list(CATALOG), metavar="NAME", help=f"one of: {', '.join(CATALOG)}")
    q.add_argument("--dir", type=Path, help="put it here (default: model.dir / model.eagle3_dir for the "
                                            "configured ones, else beside model.dir under its own name)")
    q.add_argument("--revision", default="main", help="branch, tag or commit on the hub (default: main)")
    q.add_argument("--endpoint", help="hub address (default: $HF_ENDPOINT or https://huggingface.co)")
    q.add_argument("--owner", help=f"user to own the result (default: {SERVICE_USER} when run as root and it "
                                   "exists, else the caller)")
    q.add_argument("--config", help=CONFIG_HELP)
    q.set_defaults(func=cmd_pull)

    q = msub.add_parser("verify", help="re-hash a pulled checkpoint against its manifest (offline)")
    q.add_argument("target", metavar="NAME|DIR", help="a checkpoint name or its directory")
    q.add_argument("--config", help=CONFIG_HELP)
    q.set_defaults(func=cmd_verify)

    q = msub.add_parser("list", help="which checkpoints are present, their size, which profiles use them")
    q.add_argument("--config", help=CONFIG_HELP)
    q.set_defaults(func=cmd_list)


def _settings(args) -> Settings:
    return load_settings(resolve_config_path(args.config), must_exist=args.config is not None)


def dir_for(entry: Checkpoint, settings: Settings) -> Path:
    return default_dir(entry, settings.model.dir, settings.model.eagle3_dir, settings.model.eagle3_20b_dir)


def _default_owner() -> str | None:
    if os.geteuid() != 0:
        return None
    try:
        pwd.getpwnam(SERVICE_USER)
    except KeyError:
        return None
    return SERVICE_USER


def cmd_pull(args) -> int:
    entry = checkpoint(args.name)
    dest = (args.dir or dir_for(entry, _settings(args))).absolute()
    pull(entry, dest, revision=args.revision, endpoint=args.endpoint,
         owner=args.owner if args.owner is not None else _default_owner(), out=_say)
    return 0


def _say(line: str) -> None:
    # Flushed: under the installer's tee or journald stdout is a pipe, and a block-buffered line of
    # a pull that runs for minutes would arrive only at its end.
    print(line, flush=True)


def cmd_verify(args) -> int:
    by_name = args.target in CATALOG
    directory = dir_for(CATALOG[args.target], _settings(args)) if by_name else Path(args.target)
    if not directory.is_dir():
        raise UserError(f"no checkpoint directory at {directory}; `gptoss-spark model list` shows where they are")
    manifest = read_manifest(directory)
    if manifest is None:
        raise UserError(f"{directory} has no manifest (it was not pulled by `gptoss-spark model pull`), so there "
                        "is nothing to verify against; pull it to get one")
    print(f"{directory}: {manifest.repo}@{manifest.revision[:12]}, {len(manifest.files)} files, "
          f"{size_text(manifest.total_bytes)}, pulled {manifest.pulled_at}")
    problems = verify(directory, manifest, progress=_verify_progress if sys.stdout.isatty() else None)
    for p in problems:
        print(f"  CORRUPT {p.line()}")
    if problems:
        # The manifest's own revision, so the repair fetches what it lists even after the hub moved on.
        where = "" if by_name else f" --dir {directory.absolute()}"
        print(f"{len(problems)} of {len(manifest.files)} files differ from the manifest; to fetch only those again "
              f"(the others are kept): gptoss-spark model pull {manifest.name}{where} --revision {manifest.revision}",
              file=sys.stderr)
        return EXIT_MODEL_CORRUPT
    print(f"ok: every file matches the manifest (sha256)")
    return 0


def _verify_progress(i: int, n: int, rel: str, size: int) -> None:
    print(f"  [{i}/{n}] {rel} ({size_text(size)})", flush=True)


def _profiles_using(entry: Checkpoint, settings: Settings) -> list[str]:
    from .service.profiles import load_profiles

    try:
        profiles = load_profiles(settings)
    except UserError:
        return []
    if entry.kind == "model":
        return sorted(n for n, p in profiles.items() if p.model == entry.name)
    placeholder = "{eagle3_20b_dir}" if entry.serves == "gpt-oss-20b" else "{eagle3_dir}"
    return sorted(n for n, p in profiles.items() if p.model == entry.serves
                  and any(placeholder in a for a in (*p.args, *p.required_paths)))


def cmd_list(args) -> int:
    settings = _settings(args)
    rows = [("NAME", "DIR", "STATE", "SIZE", "PROFILES")]
    for entry in CATALOG.values():
        d = dir_for(entry, settings)
        state, size = _state(entry, d)
        rows.append((entry.name, str(d), state, size, ",".join(_profiles_using(entry, settings)) or "-"))
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r[:4], widths)) + "  " + r[4])
    return 0


def _state(entry: Checkpoint, d: Path) -> tuple[str, str]:
    if not d.is_dir():
        partial = staging_dir(d)
        return ("partial pull (run pull again)" if partial.is_dir() else "absent"), "-"
    size = sum(p.stat().st_size for p in d.rglob("*") if p.is_file() and not p.is_symlink())
    manifest = read_manifest(d)
    if manifest is not None:
        state = f"pulled {manifest.pulled_at[:10]} @{manifest.revision[:12]}"
    elif (d / "config.json").is_file():
        state = "placed by hand (no manifest)"
    else:
        state = "no config.json"
    if entry.kind == "model" and (d / "config.json").is_file():
        found = identify(d)
        if found is not None and found.name != entry.name:
            state += f"; holds {found.name}!"
    return state, size_text(size)
