"""The service's default addresses and settings path: the one place they are written.

config.py's pydantic defaults are these values, and so are the defaults of
everything that runs without validated settings: the installer (install/ is
stdlib only, it runs with the system interpreter before any venv exists, so it
cannot import config.py), and the bench's --url/--admin-url. Stdlib only for
the same reason. etc/gptoss-spark.toml shows the same values; unit tests hold
all of them equal and fail on a port or this path written anywhere else.
"""

from __future__ import annotations

from pathlib import Path

# Loopback by default: vLLM's OpenAI API has no auth unless engine.api_key_file is set.
LOOPBACK = "127.0.0.1"
ENGINE_PORT = 8100
ADMIN_PORT = 8101

DEFAULT_CONFIG_PATH = Path("/etc/gptoss-spark/gptoss-spark.toml")
# The default service's state dir (the unit's StateDirectory=); gptoss-spark@NAME's is STATE_DIR/NAME.
STATE_DIR = Path("/var/lib/gptoss-spark")
# Where every installed service (the default and each gptoss-spark@NAME) writes its memory claim, so
# that out of the box each sees the others' (service/budget.py). Inside STATE_DIR: writable to all
# of them under the unit's sandbox, which keeps the shared parent writable for instances too.
CLAIMS_DIR = STATE_DIR / "claims"
CONFIG_ENV_VAR = "GPTOSS_SPARK_CONFIG"
# What every command's --config says.
CONFIG_HELP = f"settings file (default: ${CONFIG_ENV_VAR} or {DEFAULT_CONFIG_PATH})"

# Where the engine and the admin API answer on this host with the default settings.
ENGINE_URL = f"http://{LOOPBACK}:{ENGINE_PORT}"
ADMIN_URL = f"http://{LOOPBACK}:{ADMIN_PORT}"
