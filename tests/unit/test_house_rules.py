"""House rules read from the source with `ast`: no module imports another module's private (`_name`)
names, JSON files are read through base.fsutil.read_json, and commands follow the one CLI
convention (docs/DESIGN.md).

A private name is its module's own business: a second module that imports one ties itself to a
detail its owner may change without looking. Whatever two modules share gets a public name that
says what it is (or moves where it belongs). One JSON reader (base/fsutil.py) reads as UTF-8
whatever the locale says and documents what it raises, so each caller's handling is the same.
Each checker is shown to catch a synthetic case, so an empty answer means something.
"""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

from tests.unit.test_layers import PACKAGE, REPO, _tree, graph, module_name, top_package

# Modules whose `json.loads(X.read_text())` stays, and why.
JSON_READ_EXCEPTIONS: dict[str, str] = {
    "gptoss_spark.base.fsutil": "read_json itself",
}


def _target(node: ast.ImportFrom, name: str, path: Path) -> str:
    """The absolute module an ImportFrom names (relative imports resolved)."""
    if not node.level:
        return node.module or ""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    parts = package.split(".")
    base = parts[: len(parts) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def private_imports(root: Path) -> list[str]:
    """`module -> other:_name` for each private name a module of ours imports from another."""
    bad = []
    for path in sorted(root.rglob("*.py")):
        name = module_name(path, root)
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.ImportFrom):
                continue
            target = _target(node, name, path)
            if target.split(".")[0] != root.name or target == name:
                continue
            bad += [f"{name} -> {target}:{a.name}" for a in node.names
                    if a.name.startswith("_") and not a.name.startswith("__")]
    return bad


def _is_read_text(node: ast.AST) -> bool:
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and node.func.attr == "read_text")


def json_read_text_sites(root: Path) -> list[str]:
    """`module:line` for each `json.loads(<anything>.read_text(...))`."""
    bad = []
    for path in sorted(root.rglob("*.py")):
        name = module_name(path, root)
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr == "loads" and isinstance(node.func.value, ast.Name)
                    and node.func.value.id == "json" and node.args and _is_read_text(node.args[0])):
                bad.append(f"{name}:{node.lineno}")
    return bad


def test_no_module_imports_a_private_name_of_another():
    assert private_imports(PACKAGE) == []


def test_json_files_are_read_through_read_json():
    sites = json_read_text_sites(PACKAGE)
    assert [s for s in sites if s.partition(":")[0] not in JSON_READ_EXCEPTIONS] == []


def test_the_checkers_see_a_private_import_and_a_json_read_text(tmp_path):
    root = _tree(tmp_path, {
        "__init__.py": "",
        "install/__init__.py": "",
        "install/venvs.py": "def _config_args():\n    pass\n",
        "install/validate.py": "from .venvs import _config_args\n",                    # the reach
        "install/own.py": "from .own import _mine\nfrom .venvs import __all__\n",      # allowed
        "model_cli.py": "def f():\n    from gptoss_spark.models.pull import _gb\n",  # absolute, lazy
        "warmup.py": "import json\ndef f(p):\n    return json.loads(p.read_text(encoding='utf-8'))\n",
        "fine.py": "import json\ndef f(raw):\n    return json.loads(raw)\n",
    })
    assert private_imports(root) == ["gptoss_spark.install.validate -> gptoss_spark.install.venvs:_config_args",
                                     "gptoss_spark.model_cli -> gptoss_spark.models.pull:_gb"]
    assert json_read_text_sites(root) == ["gptoss_spark.warmup:3"]


# ---------------------------------------------------------------- one CLI convention

def vllm_plugin_modules() -> set[str]:
    """The modules vLLM calls `register()` in (pyproject's vllm.general_plugins): a plugin's entry,
    not a command's."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    return {v.partition(":")[0] for v in project["entry-points"]["vllm.general_plugins"].values()}


def register_definers(root: Path) -> set[str]:
    """Modules with a top-level `def register(`."""
    return {module_name(p, root) for p in sorted(root.rglob("*.py"))
            if any(isinstance(n, ast.FunctionDef) and n.name == "register"
                   for n in ast.parse(p.read_text(), str(p)).body)}


def misplaced_registers(root: Path, command_modules: set[str], plugins: set[str]) -> list[str]:
    """Modules that add commands (define register) but are neither a package's cli.py nor a top-level
    command module that cli.py lists."""
    return sorted(m for m in register_definers(root) - command_modules - plugins
                  if not (m.endswith(".cli") and m.count(".") == 2))


def cross_package_cli_imports(g: dict[str, set[str]]) -> list[str]:
    """`module -> other package's cli`, and any import of gptoss_spark.cli, the parser; only the
    parser itself imports every package's cli."""
    return sorted(f"{m} -> {t}" for m, ts in g.items() if m != "gptoss_spark.cli" for t in ts
                  if (t.endswith(".cli") and t.count(".") == 2 and top_package(t) != top_package(m))
                  or t == "gptoss_spark.cli")


def test_commands_are_registered_only_by_cli_modules_and_the_listed_top_commands():
    from gptoss_spark import cli
    listed = {m.__name__ for m in cli.COMMAND_MODULES}
    assert len(listed) >= 10 and "gptoss_spark.install.cli" in listed
    assert misplaced_registers(PACKAGE, listed, vllm_plugin_modules()) == []
    # every listed module does define register (it is called for each)
    assert listed <= register_definers(PACKAGE)


def test_no_package_imports_another_packages_cli():
    assert cross_package_cli_imports(graph(PACKAGE)) == []


def test_the_cli_checkers_see_a_stray_register_and_a_cross_cli_import(tmp_path):
    root = _tree(tmp_path, {
        "__init__.py": "",
        "cli.py": "from .install import cli\nfrom . import doctor\n",
        "doctor.py": "def register(sub):\n    pass\n",
        "install/__init__.py": "",
        "install/cli.py": "def register(sub):\n    pass\n",
        "install/patching.py": "def register(sub):\n    pass\n",                     # a command outside cli.py
        "bench/__init__.py": "",
        "bench/cli.py": "def register(sub):\n    pass\n",
        "bench/ab.py": "def f():\n    from ..install.cli import register\n",        # another package's cli
        "bench/run.py": "from . import cli\n",                                         # its own: allowed
        "kernels/__init__.py": "",
        "kernels/plugin.py": "def register():\n    pass\n",                         # a vLLM plugin entry
        "draft/__init__.py": "",
        "draft/shrink.py": "from .. import cli\n",                                    # the top's parser
    })
    assert misplaced_registers(root, {"gptoss_spark.doctor"}, {"gptoss_spark.kernels.plugin"}) == [
        "gptoss_spark.install.patching"]
    assert cross_package_cli_imports(graph(root)) == ["gptoss_spark.bench.ab -> gptoss_spark.install.cli",
                                                      "gptoss_spark.draft.shrink -> gptoss_spark.cli"]
