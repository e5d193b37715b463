"""Where an install puts things, and the exit codes install.sh passes on.

Stdlib only: install.sh runs this subpackage with the system interpreter
(`python3 -m gptoss_spark.install`) before any venv exists.

Every path hangs off `root` ("/" for a real install) so tests and --dry-run
can point the whole layout at a scratch directory.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from ..base.errors import UserError
from ..base.defaults import DEFAULT_CONFIG_PATH

SERVICE = "gptoss-spark"
UNIT_NAME = "gptoss-spark.service"
TEMPLATE_NAME = "gptoss-spark@.service"


class InstallError(UserError):
    """A failed install step: one line saying what and how to fix, and its own exit code."""

    def __init__(self, message: str, exit_code: int):
        super().__init__(message)
        self.exit_code = exit_code


@dataclass(frozen=True)
class Layout:
    root: Path = Path("/")
    user: str = SERVICE
    group: str = SERVICE

    def _p(self, absolute: str) -> Path:
        return self.root / absolute.lstrip("/")

    # /opt/gptoss-spark: code only, root-owned, read-only to the service.
    @property
    def opt_dir(self) -> Path:
        return self._p("/opt/gptoss-spark")

    @property
    def venvs_dir(self) -> Path:
        return self.opt_dir / "venvs"

    @property
    def current(self) -> Path:
        return self.opt_dir / "current"

    @property
    def previous(self) -> Path:
        return self.opt_dir / "previous"

    @property
    def build_dir(self) -> Path:
        # Staged source and pip's scratch: on disk, not in a tmpfs /tmp.
        return self.opt_dir / "build"

    @property
    def current_cli(self) -> Path:
        # Through `current`, so an upgrade or rollback moves the command with it.
        return self.current / "bin" / "gptoss-spark"

    # The command on PATH: a symlink to current_cli.
    @property
    def cli_link(self) -> Path:
        return self._p("/usr/local/bin/gptoss-spark")

    # /etc/gptoss-spark: the admin's files; an edited one is never overwritten (placement.py).
    @property
    def etc_dir(self) -> Path:
        return self._p("/etc/gptoss-spark")

    @property
    def config_file(self) -> Path:
        return self._p(str(DEFAULT_CONFIG_PATH))

    @property
    def profiles_dir(self) -> Path:
        return self.etc_dir / "profiles"

    @property
    def user_profiles_dir(self) -> Path:
        return self.etc_dir / "profiles.d"

    @property
    def token_file(self) -> Path:
        return self.etc_dir / "admin.token"

    @property
    def api_key_file(self) -> Path:
        return self.etc_dir / "api.key"

    # /var/lib/gptoss-spark: the service's own (caches, state, demo model).
    @property
    def state_dir(self) -> Path:
        return self._p("/var/lib/gptoss-spark")

    @property
    def tiktoken_dir(self) -> Path:
        return self.state_dir / "tiktoken"

    @property
    def demo_model_dir(self) -> Path:
        return self.state_dir / "demo-model"

    # install.sh's own log (the full output of every install, pip's included): the admin's to read,
    # kept by --uninstall like the config, removed by --purge.
    @property
    def install_log(self) -> Path:
        return self._p("/var/log/gptoss-spark-install.log")

    # systemd
    @property
    def unit_dir(self) -> Path:
        return self._p("/etc/systemd/system")

    @property
    def unit_file(self) -> Path:
        return self.unit_dir / UNIT_NAME

    @property
    def dropin_dir(self) -> Path:
        return self.unit_dir / (UNIT_NAME + ".d")

    # gptoss-spark@NAME (instances.py): generated from the unit, installed and removed with it.
    @property
    def template_file(self) -> Path:
        return self.unit_dir / TEMPLATE_NAME

    @property
    def template_dropin_dir(self) -> Path:
        return self.unit_dir / (TEMPLATE_NAME + ".d")

    def real(self, p: Path) -> str:
        """The path as the running system will see it (strip the test root)."""
        return "/" + str(p.relative_to(self.root)).lstrip("/") if self.root != Path("/") else str(p)


def layout_from_env(root: str | os.PathLike[str] | None = None) -> Layout:
    return Layout(root=Path(root)) if root else Layout()
