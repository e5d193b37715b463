#!/usr/bin/env bash
# The test command (README.md; .ci/run calls it): set up .venv, then run the
# whole suite — unit, integration (real vLLM on the CPU) and system (real
# systemd in a private namespace; needs root). Extra args go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/dev-setup.sh
exec .venv/bin/python -m pytest "$@"
