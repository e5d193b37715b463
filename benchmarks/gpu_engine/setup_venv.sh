#!/bin/bash
# Build the engine's venv on a Hopper test machine (no network) from wheels carried in pieces:
# CUDA vLLM 0.32.0 (its unused FlashAttention 2/3, DeepGEMM, FlashMLA and Rust frontend left out),
# torch 2.13.0, triton 3.7.1, nvidia-nccl-cu13 2.29.7, flashinfer-python 0.7.0.post1, torchvision
# 0.28.0, vLLM's pure-Python dependencies and this package's wheel; the machine's own site-packages
# (numpy, transformers, the CUDA 13 libraries) comes after the venv's own on sys.path.
# Then vLLM is patched (patches/vllm) and the real-shape checkpoint written.
#   STAGE=/root/stage SHA256=... bash benchmarks/gpu_engine/setup_venv.sh
set -euo pipefail
STAGE=${STAGE:-/root/stage}
VENV=${VENV:-/root/venv}
MODEL=${MODEL:-/root/model-120b-2l}
cat "$STAGE"/piece.* > /root/carry.tar
echo "${SHA256}  /root/carry.tar" | sha256sum -c --quiet
rm -rf /root/wheels && mkdir -p /root/wheels && tar xf /root/carry.tar -C /root/wheels && rm /root/carry.tar
rm -f "$STAGE"/piece.*
python3 -m venv --without-pip "$VENV"
SITE=$(echo "$VENV"/lib/python3*/site-packages)
python3 -c 'import site; print(site.getsitepackages()[0])' > "$SITE/zz-machine-site.pth"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$SITE" \
  /root/wheels/*.whl "$STAGE"/ours/*.whl
PY="$VENV/bin/python"
ls /proc/driver/nvidia/gpus
"$PY" -c 'import torch, vllm, triton; print("torch", torch.__version__, "vllm", vllm.__version__, "triton", triton.__version__, "cuda", torch.cuda.is_available())'
"$PY" -m gptoss_spark.cli patches apply --venv "$VENV" --patches-dir patches/vllm
"$PY" -m gptoss_spark.cli shaped-model "$MODEL" --shape gpt-oss-120b --layers 2
du -sh "$MODEL"
