"""`gptoss-spark kernels ...`: ahead-of-time build of the Triton MoE kernels, and their benchmark.

  gptoss-spark kernels build --arch 12.1a [--cache-dir DIR] [--config FILE] [--compile-only]
  gptoss-spark kernels bench --out DIR [--peer PATH] [--tokens 1,2,4,...] [--layers 8]

Without --cache-dir the cache is the one the engine uses: TRITON_CACHE_DIR from
Settings.cache_env() of the settings file (missing file = defaults). install.sh
runs the plain form on the Spark; CI and the device run --compile-only.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from ..base.defaults import CONFIG_HELP
from ..base.errors import RequirementError
from ..service.config import load_settings, resolve_config_path

DEFAULT_ARCH = "12.1a"


def register(sub: argparse._SubParsersAction) -> None:
    kernels = sub.add_parser("kernels", help="SM121 MoE kernels: ahead-of-time build")
    ksub = kernels.add_subparsers(dest="kernels_command", metavar="ACTION", required=True)
    build = ksub.add_parser("build", help="compile every kernel variant into the engine's Triton cache")
    build.add_argument("--arch", default=DEFAULT_ARCH, help="target compute capability, e.g. 12.1a (default)")
    build.add_argument("--cache-dir", type=Path, default=None,
                       help="Triton cache to fill (default: the engine's, from the settings file)")
    build.add_argument("--config", default=None, help=CONFIG_HELP)
    build.add_argument("--compile-only", action="store_true",
                       help="only check that every variant compiles for --arch (no GPU needed, nothing cached)")
    build.set_defaults(func=run_build)
    bench = ksub.add_parser("bench", help="time one MoE layer on this GPU: ours beside the peer, cuBLAS and the "
                                          "roofline (docs/KERNELS.md)")
    from .bench_args import add_bench_arguments
    add_bench_arguments(bench)
    bench.set_defaults(func=run_bench)


def engine_triton_cache(config: str | None) -> Path:
    settings = load_settings(resolve_config_path(config), must_exist=False)
    return Path(settings.cache_env()["TRITON_CACHE_DIR"])


def require_cuda(what: str) -> None:
    """One line instead of a traceback where a command needs a CUDA GPU and torch cannot see one."""
    try:
        import torch
    except ImportError:
        raise RequirementError(f"{what} needs torch with CUDA; run it from the service's venv "
                               f"(/opt/gptoss-spark/current/bin/gptoss-spark)") from None
    if not torch.cuda.is_available():
        raise RequirementError(f"{what} needs a CUDA GPU and torch sees none (torch {torch.__version__}); "
                               f"check nvidia-smi")


def run_build(args: argparse.Namespace) -> int:
    from . import aot  # imports torch/triton lazily: the error for a missing one is aot's one line
    aot.parse_arch(args.arch)
    if args.compile_only:
        report = aot.build_compile_only(args.arch)
    else:
        cache_dir = args.cache_dir or engine_triton_cache(args.config)
        report = aot.build_warm(args.arch, cache_dir)
    where = f" into {report.cache_dir}" if report.cache_dir else ""
    print(f"kernels {report.mode} for {report.target}: {len(report.compiled)} variants{where}")
    for line in report.compiled:
        print(f"  {line}")
    return 0


def run_bench(args: argparse.Namespace) -> int:
    require_cuda("kernels bench")
    from . import benchmark
    return benchmark.run(args)
