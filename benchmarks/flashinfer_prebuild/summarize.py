"""Per-file times of a FlashInfer module build from its .ninja_log, by file class.

    python3 benchmarks/flashinfer_prebuild/summarize.py MODULE_BUILD_DIR [--out FILE.json]

MODULE_BUILD_DIR is the module's ninja directory under the cache
(`<state_dir>/cache/flashinfer/<key>/.cache/flashinfer/<version>/121a/cached_ops/<module>`).
ninja records each finished edge's start and end; with one job (`--jobs 1`) they run one after
another, so their sum is the build's compile time. Files not built yet (a build still running, or
stopped) are projected from their class's mean. Also: the built marker (wall time, the largest
process's peak RSS), and the bytes of the objects and the .so.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from run import classify  # noqa: E402  (the file classes of fused_moe_120)


def ninja_targets(build_ninja: Path) -> list[str]:
    return [line.split(":")[0].split("build ", 1)[1].strip().rsplit("/", 1)[-1]
            for line in build_ninja.read_text().splitlines() if line.startswith("build ")]


def ninja_log(path: Path) -> dict[str, float]:
    """target name -> seconds of its latest build."""
    out = {}
    for line in path.read_text().splitlines()[1:]:
        start, end, _, target, _ = line.split("\t")
        out[target.rsplit("/", 1)[-1]] = (int(end) - int(start)) / 1000
    return out


def summarize(bdir: Path) -> dict:
    targets = ninja_targets(bdir / "build.ninja")
    done = ninja_log(bdir / ".ninja_log") if (bdir / ".ninja_log").is_file() else {}
    classes: dict[str, dict] = {}
    for t in targets:
        cls = "link" if not t.endswith(".o") else classify(t)
        c = classes.setdefault(cls, {"files": 0, "built": 0, "seconds": 0.0, "max_seconds": 0.0})
        c["files"] += 1
        if t in done:
            c["built"] += 1
            c["seconds"] += done[t]
            c["max_seconds"] = max(c["max_seconds"], done[t])
    measured = sum(c["seconds"] for c in classes.values())
    projected = measured + sum(c["seconds"] / c["built"] * (c["files"] - c["built"])
                               for c in classes.values() if c["built"])
    unprojected = [cls for cls, c in classes.items() if not c["built"]]
    sizes = {"objects_mib": round(sum(f.stat().st_size for f in bdir.glob("*.o")) / 2**20, 1),
             "so_mib": round(sum(f.stat().st_size for f in bdir.glob("*.so")) / 2**20, 1)}
    marker = next(bdir.parents[4].glob(f"121a/{bdir.name}/*.json"), None) if len(bdir.parents) > 4 else None
    for c in classes.values():
        c["seconds"] = round(c["seconds"], 1)
    return {"module": bdir.name, "targets": len(targets), "built": sum(c["built"] for c in classes.values()),
            "compile_seconds_measured": round(measured), "compile_seconds_projected_all": round(projected),
            "classes_not_sampled": unprojected, "classes": classes, **sizes,
            "marker": json.loads(marker.read_text()) if marker else None}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("build_dir", type=Path)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    res = summarize(args.build_dir)
    text = json.dumps(res, indent=1)
    if args.out:
        args.out.write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
