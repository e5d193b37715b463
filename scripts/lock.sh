#!/usr/bin/env bash
# Make or check the lock files in locks/ (docs/INSTALL.md, "Lock files"):
#   scripts/lock.sh refresh [TARGET...]   resolve afresh and rewrite the locks
#   scripts/lock.sh add [TARGET...]       rewrite them holding every existing pin (a new dependency only)
#   scripts/lock.sh check [TARGET...]     fail if a lock no longer matches pyproject.toml
# Needs the dev venv (uv is in the test extra) and the package index.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/uv ] || ./scripts/dev-setup.sh
exec .venv/bin/python scripts/lock.py "$@"
