"""`python -m gptoss_spark.bench.benchy_main ARGS`: llama-benchy's own entry point, the API key from the environment.

llama-benchy reads the key only from `--api-key` on its command line, which
every local user can read in /proc/PID/cmdline while it runs. This adds the
key from $GPTOSS_SPARK_BENCHY_API_KEY to its arguments inside the process
(the kernel's copy of the command line stays without it), then runs
llama-benchy's `main()` unchanged.
"""

from __future__ import annotations

import os
import sys

API_KEY_ENV = "GPTOSS_SPARK_BENCHY_API_KEY"


def main() -> None:
    key = os.environ.pop(API_KEY_ENV, None)
    args = sys.argv[1:] + (["--api-key", key] if key else [])
    sys.argv = ["llama-benchy", *args]
    from llama_benchy.__main__ import main as benchy

    benchy()


if __name__ == "__main__":
    main()
