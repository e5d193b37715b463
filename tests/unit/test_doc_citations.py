"""Every Markdown file the repository's code and docs cite by name is in the repository: a
citation of a file that lives elsewhere (a workspace's notes, say) is a dead end for a reader."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CITED = re.compile(r"\b[A-Z][A-Z_]*\.md\b")


def tracked_text_files() -> list[Path]:
    out = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout
    return [REPO / f for f in out.splitlines()
            if not f.startswith(("benchmarks/kernels/results/", "locks/")) and not f.endswith(".json")]


def test_every_cited_markdown_file_exists_in_the_repository():
    present = {p.name for p in REPO.rglob("*.md") if ".venv" not in p.parts and ".git" not in p.parts}
    missing = {}
    for path in tracked_text_files():
        try:
            text = path.read_text()
        except (UnicodeDecodeError, FileNotFoundError):
            continue
        for name in set(CITED.findall(text)) - present:
            missing.setdefault(name, []).append(str(path.relative_to(REPO)))
    assert not missing, f"cited but not in the repository: {missing}"
