"""The packages of gptoss_spark stand in floors; each imports only its own and the floors below.

Read from the source with `ast` (nothing is imported), including imports inside functions: a
lazy import is still a dependency, and hiding one in a function is how a cycle slips in. Only
an `if __name__ == "__main__":` block may reach anywhere: it runs when the module is the
program, the top of the house by definition. docs/DESIGN.md draws the same floors.
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "gptoss_spark"

# Lowest first. A package may import from its own floor's package only if it is itself, and
# from any floor below. `gptoss_spark` (the root __init__: the version) is below everything.
FLOORS: list[set[str]] = [
    {"base"},                     # stdlib only, nothing of ours
    {"mxfp4", "engine_hooks", "models"},  # the MXFP4 format (torch); start-up hooks inside vLLM's processes;
                                          # the checkpoints (catalog, pull, manifest)
    {"service"},                  # the supervisor and what it is made of
    {"admin", "install"},         # the admin API and its client; the installer
    {"kernels"},
    {"flashinfer_jit", "kernel_tools"},  # ahead-of-time builds: FlashInfer's modules; our kernels' build
                                          # and benchmark
    {"bench"},
    {"draft"},
    {"warmup"},                   # start each profile's engine once (runs the service's engine)
    {"commands", "admin_cli", "doctor", "gpuclock", "model_cli"},  # commands of the top: serve, check, status, doctor, model
    {"cli"},                      # the parser, which lists every package's commands
]


def floor_of(package: str) -> int:
    for i, names in enumerate(FLOORS):
        if package in names:
            return i
    raise AssertionError(f"gptoss_spark.{package} is on no floor: add it to FLOORS and docs/DESIGN.md")


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_main_guard(node: ast.AST) -> bool:
    return (isinstance(node, ast.If) and isinstance(node.test, ast.Compare)
            and isinstance(node.test.left, ast.Name) and node.test.left.id == "__name__")


def imports_of(path: Path, root: Path, modules: set[str]) -> set[str]:
    """Our modules that `path` imports (`from X import sub` names X.sub when that is a module)."""
    name = module_name(path, root)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()

    def visit(node: ast.AST) -> None:
        if _is_main_guard(node):
            return
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.split(".")[0] == root.name)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] == root.name:
                for a in node.names:
                    sub = f"{target}.{a.name}"
                    out.add(sub if sub in modules else target)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_text(), str(path)))
    out.discard(name)
    return out


def graph(root: Path) -> dict[str, set[str]]:
    files = sorted(root.rglob("*.py"))
    modules = {module_name(p, root) for p in files}
    return {module_name(p, root): imports_of(p, root, modules) for p in files}


def top_package(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def upward_imports(g: dict[str, set[str]]) -> list[str]:
    bad = []
    for mod, targets in g.items():
        src = top_package(mod)
        if not src:
            bad += [f"{mod} -> {t}" for t in targets]  # the root __init__ imports nothing of ours
            continue
        for t in targets:
            dst = top_package(t)
            if not dst or dst == src:
                continue
            if floor_of(dst) >= floor_of(src):
                bad.append(f"{mod} -> {t}")
    return sorted(bad)


def cycles(g: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def strong(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in g.get(v, ()):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(g):
        if v not in index:
            strong(v)
    return found


def test_every_package_is_on_a_floor():
    packages = {top_package(m) for m in graph(PACKAGE)} - {""}
    assert len(packages) >= 10, packages  # the real tree, not an empty glob
    for p in packages:
        floor_of(p)


def test_no_package_imports_a_floor_above_its_own():
    assert upward_imports(graph(PACKAGE)) == []


def test_no_import_cycle_between_our_modules():
    assert cycles(graph(PACKAGE)) == []


def test_the_floor_imports_nothing_of_ours_but_itself():
    g = graph(PACKAGE)
    floor = {m: ts for m, ts in g.items() if top_package(m) == "base"}
    assert len(floor) >= 6, floor
    assert {t for ts in floor.values() for t in ts if top_package(t) != "base"} == set()


# What the kernels' Triton modules (kernels/device/) may import of the package above them: the weight
# layout they read and whether the interpreter runs them. The face above (ops, moe, the plugin)
# composes them, never the other way round.
DEVICE_MAY_IMPORT = {"gptoss_spark.kernels.mxfp4_layout", "gptoss_spark.kernels.runtime"}


def test_the_kernels_device_modules_import_only_each_other_the_layout_and_the_runtime():
    g = graph(PACKAGE)
    device = {m: ts for m, ts in g.items() if m.startswith("gptoss_spark.kernels.device")}
    assert len(device) >= 10, device
    assert {t for ts in device.values() for t in ts
            if not t.startswith("gptoss_spark.kernels.device") and t not in DEVICE_MAY_IMPORT} == set()


def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    root = tmp_path / "gptoss_spark"
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return root


def test_the_checks_see_a_lazy_upward_import_and_a_lazy_cycle(tmp_path):
    root = _tree(tmp_path, {
        "__init__.py": "",
        "base/__init__.py": "",
        "base/net.py": "def f():\n    from ..service.config import X\n",        # upward, in a function
        "service/__init__.py": "",
        "service/config.py": "from . import access\nX = 1\n",
        "service/access.py": "def g():\n    from .config import X\n",            # the cycle, lazily
        "service/run.py": 'if __name__ == "__main__":\n    from ..cli import main\n',  # allowed
        "cli.py": "from .service import run\n",
    })
    g = graph(root)
    assert upward_imports(g) == ["gptoss_spark.base.net -> gptoss_spark.service.config"]
    assert cycles(g) == [["gptoss_spark.service.access", "gptoss_spark.service.config"]]
