"""Cold start, warm start and reload of the CPU demo, side by side in one run, with each start's phases.

    .venv/bin/python benchmarks/start_time/cold_warm_reload.py --out benchmarks/start_time/results_cpu_demo.json

For each profile (the shipped `demo`, --enforce-eager, and `demo-compiled`, the same without it, so
torch.compile runs and has something to cache), with empty caches:
  cold    `gptoss-spark serve` started, time until /admin/health is 200 (the supervisor's process too)
  warm    serve stopped (SIGTERM) and started again: same caches, now warm
  reload  POST /admin/restart (what `systemctl reload` does), time until the operation succeeded
Each row also carries the supervisor's own breakdown of that start (/admin/status start.last).
The engine is pinned to one core (engine.cpu_affinity) as in the tests. A 2-core x86 box, not a Spark.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from benchmarks.serve_harness import Serve, free_port  # noqa: E402
from gptoss_spark.install.demo_model import make_demo_model  # noqa: E402
from tests.helpers.demo_settings import demo_settings_toml  # noqa: E402

DEMO = REPO / "etc" / "profiles-cpu" / "demo.toml"


def write_config(tmp: Path, model: Path, profile: str) -> tuple[Path, int, str]:
    pdir = tmp / "profiles"
    pdir.mkdir()
    text = DEMO.read_text()
    (pdir / "demo.toml").write_text(text)
    (pdir / "demo-compiled.toml").write_text(text.replace('  "--enforce-eager",\n', ""))
    token = "bench-" + "t" * 40
    (tmp / "admin.token").write_text(token + "\n")
    admin = free_port()
    cfg = tmp / "gs.toml"
    cfg.write_text(demo_settings_toml(
        model_dir=model, state_dir=tmp / "state", profile_dirs=[pdir], token_file=tmp / "admin.token",
        engine_port=free_port(), admin_port=admin, default_profile=profile,
        timeouts={"load": 1800, "canary": None, "probe_interval": None}))  # the service's canary and probe
    return cfg, admin, token


def run_profile(model: Path, profile: str) -> list[dict]:
    rows = []
    with tempfile.TemporaryDirectory(prefix="gsb-", dir="/tmp") as d:
        tmp = Path(d)
        cfg, admin, token = write_config(tmp, model, profile)
        serve = Serve(cfg, admin, token, tmp / "serve.log")
        for what in ("cold", "warm"):
            took = serve.start()
            rows.append({"profile": profile, "what": what, "seconds": round(took, 1), **serve.last_start()})
            if what == "cold":
                serve.stop()
        took = serve.reload()
        rows.append({"profile": profile, "what": "reload", "seconds": round(took, 1), **serve.last_start()})
        serve.stop()
    return rows


def table(rows: list[dict]) -> str:
    """seconds: the client's view (process spawned or reload asked -> ready); ready: the supervisor's own
    start record (its phases add up to it)."""
    out = [f"{'profile':<15}{'start':<8}{'seconds':>8}{'ready':>7}  phases / compiled"]
    for r in rows:
        phases = " ".join(f"{k}={v:.1f}" for k, v in r["phases"].items())
        out.append(f"{r['profile']:<15}{r['what']:<8}{r['seconds']:>8.1f}{r['ready_seconds']:>7.1f}  {phases}; "
                   f"compiled: {'; '.join(r['compiled']) or 'nothing'}")
    return "\n".join(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path)
    ap.add_argument("--profiles", default="demo,demo-compiled")
    ap.add_argument("--show", type=Path, help="print the table of a saved result, run nothing")
    a = ap.parse_args()
    if a.show:
        print(table(json.loads(a.show.read_text())["rows"]))
        return 0
    model = make_demo_model(REPO / ".test-artifacts" / "demo-model-bench", seed=0)
    rows = [r for p in a.profiles.split(",") for r in run_profile(model, p)]
    doc = {"host": f"{os.cpu_count()}-core {os.uname().machine}, not a Spark", "rows": rows,
           "command": "benchmarks/start_time/cold_warm_reload.py"}
    if a.out:
        a.out.write_text(json.dumps(doc, indent=1) + "\n")
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
