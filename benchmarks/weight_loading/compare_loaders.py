"""Compare the weight loaders vLLM 0.32.0 offers, on a generated checkpoint of gpt-oss-120b's shapes.

Run on a CUDA machine (the lent H200; no vLLM needed there):

    python3 benchmarks/weight_loading/compare_loaders.py --dir /root/ckpt --out results.json

What it does:
1. Writes a safetensors checkpoint with gpt-oss-120b's tensor names, shapes and dtypes
   (MXFP4 expert blocks/scales as uint8, the rest bf16), random bytes, in ~4.6 GB shards
   like the published one, as many of the 36 layers as the disk holds (``--layers``).
2. For each loader, in a fresh child process with the page cache of the checkpoint dropped
   first (posix_fadvise DONTNEED per file, and /proc/sys/vm/drop_caches where writable),
   loads every tensor into a preallocated GPU parameter the way vLLM's DefaultModelLoader
   does (the iterator yields a tensor, ``param.copy_(tensor)``), and records wall time,
   the child's peak RSS and the peak of the page cache (``Cached`` in /proc/meminfo) and of
   host memory in use (``MemTotal - MemAvailable``) above the baseline, sampled every 50 ms.
3. Checks the loaded bytes: the sum of every loaded parameter (as bytes) against the sum
   computed from the files.

The loaders reproduce vLLM 0.32.0's iterators (vllm/model_executor/model_loader/weight_utils.py):
- ``safetensors``: ``safetensors_weights_iterator`` with no strategy (safe_open, get_tensor
  per name; the default for a local filesystem);
- ``prefetch``: the same after ``_prefetch_all_checkpoints`` (a background reader, 8 threads,
  16 MiB blocks), what ``--safetensors-load-strategy prefetch`` does;
- ``eager``: ``f.read()`` of each shard, ``safetensors.torch.load``;
- ``fastsafetensors``: ``fastsafetensors_weights_iterator`` (fastsafetensors' ParallelLoader,
  a single group, queue size 0), with the copier fastsafetensors picks for this GPU;
- ``fastsafetensors-unified``: the same with FASTSAFETENSORS_UNIFIED_MEM=1, which selects the
  copier a DGX Spark gets (mmap, pin, cudaMemcpyAsync; fastsafetensors/copier/unified.py).

On a discrete GPU the device copy lives in HBM; on a Spark it takes the same LPDDR5x as the
page cache and the process. So ``projected_unified_peak_gib`` = peak page cache + peak host memory
in use (both above the baseline) + the checkpoint's bytes: what the load would hold at once on
unified memory if the kernel reclaimed no page cache meanwhile (safetensors issue 758 reports that
it does not in time). A projection, not a measurement on a Spark.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

GIB = 1024**3
HIDDEN, VOCAB, EXPERTS, HEADS, KV_HEADS, HEAD_DIM, INTER = 2880, 201088, 128, 64, 8, 64, 2880
SHARD_BYTES = 4_600_000_000
LOADERS = ("safetensors", "prefetch", "eager", "fastsafetensors", "fastsafetensors-unified")


def layer_tensors(i: int) -> list[tuple[str, tuple[int, ...], str]]:
    p = f"model.layers.{i}"
    q, kv = HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM
    blocks = HIDDEN // 32
    return [
        (f"{p}.input_layernorm.weight", (HIDDEN,), "bf16"),
        (f"{p}.post_attention_layernorm.weight", (HIDDEN,), "bf16"),
        (f"{p}.self_attn.q_proj.weight", (q, HIDDEN), "bf16"), (f"{p}.self_attn.q_proj.bias", (q,), "bf16"),
        (f"{p}.self_attn.k_proj.weight", (kv, HIDDEN), "bf16"), (f"{p}.self_attn.k_proj.bias", (kv,), "bf16"),
        (f"{p}.self_attn.v_proj.weight", (kv, HIDDEN), "bf16"), (f"{p}.self_attn.v_proj.bias", (kv,), "bf16"),
        (f"{p}.self_attn.o_proj.weight", (HIDDEN, q), "bf16"), (f"{p}.self_attn.o_proj.bias", (HIDDEN,), "bf16"),
        (f"{p}.self_attn.sinks", (HEADS,), "bf16"),
        (f"{p}.mlp.router.weight", (EXPERTS, HIDDEN), "bf16"), (f"{p}.mlp.router.bias", (EXPERTS,), "bf16"),
        (f"{p}.mlp.experts.gate_up_proj_blocks", (EXPERTS, 2 * INTER, blocks, 16), "u8"),
        (f"{p}.mlp.experts.gate_up_proj_scales", (EXPERTS, 2 * INTER, blocks), "u8"),
        (f"{p}.mlp.experts.gate_up_proj_bias", (EXPERTS, 2 * INTER), "bf16"),
        (f"{p}.mlp.experts.down_proj_blocks", (EXPERTS, HIDDEN, INTER // 32, 16), "u8"),
        (f"{p}.mlp.experts.down_proj_scales", (EXPERTS, HIDDEN, INTER // 32), "u8"),
        (f"{p}.mlp.experts.down_proj_bias", (EXPERTS, HIDDEN), "bf16"),
    ]


def all_tensors(layers: int) -> list[tuple[str, tuple[int, ...], str]]:
    out = [("model.embed_tokens.weight", (VOCAB, HIDDEN), "bf16")]
    for i in range(layers):
        out += layer_tensors(i)
    return out + [("model.norm.weight", (HIDDEN,), "bf16"), ("lm_head.weight", (VOCAB, HIDDEN), "bf16")]


def nbytes(shape: tuple[int, ...], kind: str) -> int:
    n = 1
    for s in shape:
        n *= s
    return n * (2 if kind == "bf16" else 1)


def generate(ckpt: Path, layers: int) -> dict:
    import torch
    from safetensors.torch import save_file

    ckpt.mkdir(parents=True, exist_ok=True)
    tensors = all_tensors(layers)
    shards: list[list] = [[]]
    size = 0
    for t in tensors:
        b = nbytes(t[1], t[2])
        if size + b > SHARD_BYTES and shards[-1]:
            shards.append([])
            size = 0
        shards[-1].append(t)
        size += b
    dev = os.environ.get("BENCH_DEVICE", "cuda")
    gen = torch.Generator(device=dev).manual_seed(0)
    byte_sum = 0
    t0 = time.perf_counter()
    for k, shard in enumerate(shards):
        state = {}
        for name, shape, kind in shard:
            # Random bytes on the GPU (fast), every byte value; bf16 from random int16 bit patterns
            # with NaN/Inf patterns allowed: the loaders copy bytes and never look at them.
            raw = torch.randint(0, 256, (nbytes(shape, kind),), dtype=torch.uint8, device=dev, generator=gen)
            byte_sum += int(raw.sum(dtype=torch.int64))
            t = raw.view(torch.bfloat16).view(shape) if kind == "bf16" else raw.view(shape)
            state[name] = t.cpu()
        save_file(state, str(ckpt / f"model-{k:05d}-of-{len(shards):05d}.safetensors"))
        del state
    total = sum(p.stat().st_size for p in ckpt.glob("*.safetensors"))
    meta = {"layers": layers, "shards": len(shards), "bytes": total, "byte_sum": byte_sum,
            "generate_s": round(time.perf_counter() - t0, 1)}
    (ckpt / "bench_meta.json").write_text(json.dumps(meta))
    return meta


def drop_cache(ckpt: Path) -> bool:
    for p in ckpt.glob("*.safetensors"):
        fd = os.open(p, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
    try:
        os.sync()
        Path("/proc/sys/vm/drop_caches").write_text("1\n")
        return True
    except OSError:
        return False


def meminfo() -> dict[str, int]:
    out = {}
    for line in Path("/proc/meminfo").read_text().splitlines():
        k, v = line.split(":", 1)
        out[k] = int(v.split()[0]) * 1024
    return out


# ---------------------------------------------------------------- child: one loader

def _iter_safetensors(files: list[str], strategy: str | None):
    from safetensors import safe_open
    from safetensors.torch import load

    if strategy == "prefetch":
        _prefetch_all(files)
    for f in files:
        if strategy == "eager":
            with open(f, "rb") as fh:
                yield from load(fh.read()).items()
            continue
        with safe_open(f, framework="pt") as st:
            for name in st.keys():  # noqa: SIM118
                yield name, st.get_tensor(name)


def _prefetch_all(files: list[str], threads: int = 8, block: int = 16 * 1024 * 1024) -> None:
    # vLLM 0.32.0 _prefetch_all_checkpoints: a daemon thread running a thread pool that reads
    # each file in 16 MiB blocks, so the kernel caches its pages before get_tensor touches them.
    import concurrent.futures

    def one(path: str) -> None:
        with open(path, "rb") as fh:
            while fh.read(block):
                pass

    def run() -> None:
        with concurrent.futures.ThreadPoolExecutor(max_workers=threads) as ex:
            list(ex.map(one, files))

    threading.Thread(target=run, daemon=True).start()


def _iter_fastsafetensors(files: list[str]):
    from fastsafetensors import SingleGroup
    from fastsafetensors.parallel_loader import ParallelLoader

    pl = ParallelLoader(pg=SingleGroup(), hf_weights_files=files, queue_size=0, use_tqdm_on_load=False,
                        device="cuda:0", nogds=False)
    try:
        yield from pl.iterate_weights()
    finally:
        pl.close()


def child(loader: str, ckpt: Path) -> dict:
    import torch

    dev = os.environ.get("BENCH_DEVICE", "cuda")  # "cpu": a dry run of the script without a GPU
    sync = torch.cuda.synchronize if dev == "cuda" else (lambda: None)
    files = sorted(str(p) for p in ckpt.glob("*.safetensors"))
    from safetensors import safe_open
    # Preallocate the "parameters" on the GPU first, as vLLM builds the model before loading.
    params = {}
    for f in files:
        with safe_open(f, framework="pt") as st:
            for name in st.keys():  # noqa: SIM118
                sl = st.get_slice(name)
                dtype = {"BF16": torch.bfloat16, "U8": torch.uint8}[sl.get_dtype()]
                params[name] = torch.empty(sl.get_shape(), dtype=dtype, device=dev)
    sync()
    it = _iter_fastsafetensors(files) if loader.startswith("fastsafetensors") else \
        _iter_safetensors(files, {"safetensors": None, "prefetch": "prefetch", "eager": "eager"}[loader])
    t0 = time.perf_counter()
    n = 0
    for name, t in it:
        params[name].copy_(t)
        n += 1
    sync()
    load_s = time.perf_counter() - t0
    byte_sum = sum(int(p.view(torch.uint8).sum(dtype=torch.int64)) for p in params.values())
    import resource
    return {"load_s": load_s, "tensors": n, "byte_sum": byte_sum,
            "peak_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / GIB}


# ---------------------------------------------------------------- parent: run and sample

def projected_unified_peak(row: dict, checkpoint_bytes: int) -> float:
    return round(row["peak_page_cache_gib"] + row["peak_host_used_gib"] + checkpoint_bytes / GIB, 1)


def run_one(loader: str, ckpt: Path, timeout: float) -> dict:
    dropped = drop_cache(ckpt)
    base = meminfo()
    env = dict(os.environ)
    if loader == "fastsafetensors-unified":
        env["FASTSAFETENSORS_UNIFIED_MEM"] = "1"
    proc = subprocess.Popen([sys.executable, __file__, "--child", loader, "--dir", str(ckpt)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    peak_cached = peak_used = 0
    t0 = time.perf_counter()
    while proc.poll() is None:
        m = meminfo()
        peak_cached = max(peak_cached, m["Cached"] - base["Cached"])
        peak_used = max(peak_used, (m["MemTotal"] - m["MemAvailable"]) - (base["MemTotal"] - base["MemAvailable"]))
        if time.perf_counter() - t0 > timeout:
            proc.kill()
            break
        time.sleep(0.05)
    out, err = proc.communicate()
    row = {"loader": loader, "page_cache_dropped": dropped, "wall_s": round(time.perf_counter() - t0, 2),
           "peak_page_cache_gib": round(peak_cached / GIB, 2), "peak_host_used_gib": round(peak_used / GIB, 2)}
    if proc.returncode != 0:
        row["error"] = (err or "").strip().splitlines()[-3:] or [f"exit {proc.returncode}"]
        return row
    row.update({k: round(v, 2) if isinstance(v, float) else v for k, v in json.loads(out.strip().splitlines()[-1]).items()})
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dir", type=Path, required=True, help="checkpoint directory (generated if absent)")
    ap.add_argument("--layers", type=int, default=0, help="layers to generate (0: as many of 36 as the disk holds)")
    ap.add_argument("--loaders", default=",".join(LOADERS))
    ap.add_argument("--out", type=Path)
    ap.add_argument("--timeout", type=float, default=400)
    ap.add_argument("--child", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        print(json.dumps(child(a.child, a.dir)))
        return 0

    meta_path = a.dir / "bench_meta.json"
    if meta_path.exists():
        meta = json.loads(meta_path.read_text())
    else:
        per_layer = sum(nbytes(s, k) for _, s, k in layer_tensors(0))
        fixed = sum(nbytes(s, k) for _, s, k in all_tensors(0))
        layers = a.layers
        if not layers:
            a.dir.mkdir(parents=True, exist_ok=True)
            st = os.statvfs(a.dir)
            free = st.f_bavail * st.f_frsize - 6 * GIB
            layers = max(1, min(36, int((free - fixed) // per_layer)))
        meta = generate(a.dir, layers)
    meta["full_120b_bytes"] = sum(nbytes(s, k) for _, s, k in all_tensors(36))
    print(f"checkpoint: {meta['layers']} layers, {meta['bytes'] / GIB:.1f} GiB in {meta['shards']} shards "
          f"(gpt-oss-120b: {meta['full_120b_bytes'] / GIB:.1f} GiB)", flush=True)

    rows = []
    for loader in a.loaders.split(","):
        row = run_one(loader, a.dir, a.timeout)
        row["bytes_ok"] = row.get("byte_sum") == meta["byte_sum"]
        if "load_s" in row:
            row["gib_per_s"] = round(meta["bytes"] / GIB / row["load_s"], 2)
            row["projected_unified_peak_gib"] = projected_unified_peak(row, meta["bytes"])
        rows.append(row)
        print(json.dumps(row), flush=True)
    result = {"checkpoint": meta, "rows": rows,
              "note": "measured on the machine named in host; projected_unified_peak_gib is a projection"}
    result["host"] = {"gpu": subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                                            capture_output=True, text=True).stdout.strip(),
                      "mem_total_gib": round(meminfo()["MemTotal"] / GIB, 1), "cpus": os.cpu_count()}
    if a.out:
        a.out.write_text(json.dumps(result, indent=1))
    print(f"{'loader':<26}{'load s':>8}{'GiB/s':>7}{'cache GiB':>10}{'host GiB':>9}{'rss GiB':>8}{'bytes':>6}")
    for r in rows:
        print(f"{r['loader']:<26}{r.get('load_s', 'ERR'):>8}{r.get('gib_per_s', ''):>7}{r['peak_page_cache_gib']:>10}"
              f"{r['peak_host_used_gib']:>9}{r.get('peak_rss_gib', ''):>8}{str(r['bytes_ok']):>6}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
