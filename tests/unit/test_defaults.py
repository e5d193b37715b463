"""The default ports and the settings path are written once, in base/defaults.py.

config.py's pydantic defaults, the installer (stdlib only), the bench's --url and
--admin-url, every --config help and the shipped etc/gptoss-spark.toml must all say
the same; a port or the path typed anywhere else in the package would drift.
"""

from __future__ import annotations

import argparse
import ast
import re
import socket
import tomllib
from pathlib import Path

import pytest

from gptoss_spark import cli
from gptoss_spark.admin.client import admin_url
from gptoss_spark.base.net import local_url
from gptoss_spark.install import placement
from gptoss_spark.install.layout import Layout
from gptoss_spark.base import defaults
from gptoss_spark.service.config import Settings, load_settings

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "gptoss_spark"
SOURCE = PACKAGE / "base" / "defaults.py"
PORT = re.compile(r"(?<![\w.])(?:%d|%d)(?![\w.])" % (defaults.ENGINE_PORT, defaults.ADMIN_PORT))
CONFIG_PATH = str(defaults.DEFAULT_CONFIG_PATH)
# Left on purpose, each with its reason; the test fails when one is fixed, so the entry goes too.
KNOWN: set[tuple[str, str]] = set()


def repeated_facts(path: Path, root: Path = REPO) -> set[tuple[str, str]]:
    """(file, what) for every default port or settings path in a module: its text (comments
    included) and its string constants (adjacent literals joined, as Python joins them)."""
    text = path.read_text()
    found = {m.group(0) for m in PORT.finditer(text)}
    strings = [n.value for n in ast.walk(ast.parse(text)) if isinstance(n, ast.Constant) and isinstance(n.value, str)]
    if CONFIG_PATH in text or any(CONFIG_PATH in s for s in strings):
        found.add(CONFIG_PATH)
    where = str(path.relative_to(root))
    return {(where, what) for what in found}


def test_no_default_port_or_settings_path_outside_defaults_py():
    modules = sorted(p for p in PACKAGE.rglob("*.py") if p != SOURCE)
    assert len(modules) > 100  # the whole package, not an empty glob
    found = set().union(*(repeated_facts(p) for p in modules))
    assert found == KNOWN, ("write these as gptoss_spark/base/defaults.py's constants: "
                            f"{sorted(found - KNOWN)}; fixed, drop from KNOWN: {sorted(KNOWN - found)}")


def test_the_scan_sees_a_port_and_a_split_path(tmp_path):
    # The scan itself can fail: a port in a comment, a path split over two literals.
    mod = tmp_path / "m.py"
    mod.write_text('# talks to %d\nHELP = ("x " "%s" "%s")\nOK = 81000 + 18100\n'
                   % (defaults.ADMIN_PORT, CONFIG_PATH[:5], CONFIG_PATH[5:]))
    assert repeated_facts(mod, tmp_path) == {("m.py", str(defaults.ADMIN_PORT)), ("m.py", CONFIG_PATH)}


def test_pydantic_defaults_are_defaults_py():
    s = Settings()
    assert (s.engine.host, s.engine.port) == (defaults.LOOPBACK, defaults.ENGINE_PORT)
    assert (s.admin.host, s.admin.port) == (defaults.LOOPBACK, defaults.ADMIN_PORT)
    assert local_url(s.engine.host, s.engine.port) == defaults.ENGINE_URL
    assert admin_url(s) == defaults.ADMIN_URL


def test_the_shipped_settings_file_shows_the_same_defaults():
    shipped = REPO / "etc" / "gptoss-spark.toml"
    data = tomllib.loads(shipped.read_text())
    assert data["engine"]["host"] == data["admin"]["host"] == defaults.LOOPBACK
    assert (data["engine"]["port"], data["admin"]["port"]) == (defaults.ENGINE_PORT, defaults.ADMIN_PORT)
    assert f"Installed to {CONFIG_PATH} once" in shipped.read_text()  # where its header says it goes


def _parse(*argv: str):
    return cli.build_parser().parse_args(list(argv))


@pytest.mark.parametrize("argv", [["bench"], ["loadtest"], ["bench", "arena"]])
def test_bench_commands_default_to_the_default_settings_addresses(argv):
    args = _parse(*argv)
    s = Settings()
    assert args.url == local_url(s.engine.host, s.engine.port)
    assert args.admin_url == admin_url(s)


def test_without_a_settings_file_the_admin_cli_uses_the_defaults(tmp_path):
    assert admin_url(load_settings(tmp_path / "absent.toml", must_exist=False)) == defaults.ADMIN_URL


@pytest.mark.parametrize("argv", [["status"], ["profile"], ["bench", "ab", "a", "b"]])
def test_the_admin_cli_and_bench_ab_ask_the_admin_port_of_the_settings(tmp_path, capsys, argv):
    # A port bound but not listening: nothing answers there, and nothing else can take it meanwhile.
    with socket.socket() as held:
        held.bind((defaults.LOOPBACK, 0))
        port = held.getsockname()[1]
        cfg = tmp_path / "gs.toml"
        cfg.write_text(f"[admin]\nport = {port}\n")
        rc = cli.main([*argv, "--config", str(cfg)])
    assert rc == 69
    assert f"the service is not answering at http://{defaults.LOOPBACK}:{port};" in capsys.readouterr().err


def test_installer_prints_the_default_urls_without_a_config(tmp_path):
    urls = placement.endpoints(Layout(root=tmp_path))
    assert urls["engine"] == defaults.ENGINE_URL + "/v1" and urls["admin"] == defaults.ADMIN_URL + "/admin"
    assert Layout(root=tmp_path).config_file == tmp_path / CONFIG_PATH.lstrip("/")


def _config_helps(parser) -> dict[str, str]:
    helps = {}
    for action in parser._actions:
        if "--config" in action.option_strings:
            helps[parser.prog] = action.help or ""
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                helps.update(_config_helps(sub))
    return helps


def test_every_config_option_names_the_default_path():
    helps = _config_helps(cli.build_parser())
    assert len(helps) >= 10, helps  # serve, check, status, profile, restart, bench ab/arena, flashinfer x3, ...
    missing = {prog: h for prog, h in helps.items() if CONFIG_PATH not in h}
    assert not missing
