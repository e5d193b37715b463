"""The on-disk cache around FlashInfer's CuTe-DSL quantizer builders, without a GPU.

The builders, the DSL's export and its loader are replaced by small fakes with the same contract
(FlashInfer: `builder(*args) -> (compiled, int)`; DSL: `compiled.export_to_c(path, function_name=)`
writes an object file, `load_module(path)` returns an object whose attribute of that name is the
function). The real compile, export and load run on the device: tests/gpu/test_cute_dsl_cache_gpu.py.
"""

from __future__ import annotations

import logging
import subprocess
import sys
import textwrap
from pathlib import Path

from gptoss_spark.engine_hooks import cute_dsl_cache as c

REPO = Path(__file__).resolve().parents[2]
IDENTITY = {"flashinfer": "0.7.0.post1", "cutlass_dsl": "4.8.0", "torch_cuda": "13.0", "capability": "12.1"}


class Compiled:
    def __init__(self, tag: str):
        self.tag = tag

    def export_to_c(self, path: str, function_name: str) -> None:
        Path(path).write_text(f"{function_name}:{self.tag}")


class Loaded:
    def __init__(self, path: str):
        name, tag = Path(path).read_text().split(":")
        setattr(self, name, f"loaded:{tag}")


def builder(calls: list):
    def build(*args):
        calls.append(args)
        return Compiled(repr(args)), 128
    return build


def make(tmp_path, calls, identity=IDENTITY, name="_get_compiled_kernel_mxfp8_swizzled"):
    return c.persistent(name, builder(calls), tmp_path, identity=lambda: dict(identity), load=Loaded)


def test_first_call_compiles_and_stores_later_processes_load(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger=c.log.name)
    calls: list = []
    fn, extra = make(tmp_path, calls)(True, 2880, True, True, 0)
    assert isinstance(fn, Compiled) and extra == 128 and len(calls) == 1
    assert len(list(tmp_path.glob("*.o"))) == 1 and len(list(tmp_path.glob("*.json"))) == 1
    assert not list(tmp_path.glob(".*"))  # no temporary left behind
    assert "gptoss-spark cute-dsl compiled:" in caplog.text
    # A new engine process: a fresh wrapper over the same directory loads, compiles nothing.
    later: list = []
    fn2, extra2 = make(tmp_path, later)(True, 2880, True, True, 0)
    assert later == [] and fn2 == "loaded:(True, 2880, True, True, 0)" and extra2 == 128
    assert "gptoss-spark cute-dsl cache hit:" in caplog.text


def test_other_arguments_or_binary_identity_compile_again(tmp_path):
    calls: list = []
    make(tmp_path, calls)(True, 2880, True, True, 0)
    make(tmp_path, calls)(False, 2880, True, True, 0)  # another dtype
    make(tmp_path, calls, identity={**IDENTITY, "flashinfer": "0.7.2"})(True, 2880, True, True, 0)
    make(tmp_path, calls, identity={**IDENTITY, "capability": "9.0"})(True, 2880, True, True, 0)
    assert len(calls) == 4 and len(list(tmp_path.glob("*.o"))) == 4


def test_a_corrupt_entry_is_compiled_again_not_fatal(tmp_path, caplog):
    calls: list = []
    make(tmp_path, calls)(True, 2880, True, True, 0)
    obj = next(tmp_path.glob("*.o"))
    obj.write_text("garbage without a separator")
    fn, _ = make(tmp_path, calls)(True, 2880, True, True, 0)
    assert isinstance(fn, Compiled) and len(calls) == 2
    assert "unusable" in caplog.text
    # ... and stored again, whole: the next process loads it.
    later: list = []
    assert make(tmp_path, later)(True, 2880, True, True, 0)[0].startswith("loaded:") and later == []


def test_an_unwritable_cache_still_serves(tmp_path, caplog):
    blocked = tmp_path / "file"
    blocked.write_text("")
    calls: list = []
    fn, extra = make(blocked / "sub", calls)(True, 2880, True, True, 0)
    assert isinstance(fn, Compiled) and extra == 128
    assert "not stored" in caplog.text


def test_off_unless_the_service_names_a_directory():
    assert c.install({}) is False
    assert c.install({c.ENV_VAR: "  "}) is False


def test_import_hook_patches_the_module_when_it_is_first_imported(tmp_path):
    # A stand-in package at FlashInfer's module path, in a child interpreter (sys.modules stays clean).
    pkg = tmp_path / "site" / "flashinfer" / "quantization" / "kernels"
    pkg.mkdir(parents=True)
    for d in (pkg, pkg.parent, pkg.parent.parent):
        (d / "__init__.py").write_text("")
    (pkg / "mxfp8_quantize.py").write_text(textwrap.dedent("""
        import functools
        @functools.cache
        def _get_compiled_kernel_mxfp8_linear(*a):
            return object(), 1
        def _get_compiled_kernel_mxfp8_swizzled(*a):
            return object(), 2
        def quantize():
            return _get_compiled_kernel_mxfp8_swizzled(True)  # looked up as a module global, as FlashInfer does
    """))
    script = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(tmp_path / 'site')!r})
        from gptoss_spark.engine_hooks import cute_dsl_cache as c
        assert c.install({{c.ENV_VAR: {str(tmp_path / 'cache')!r}}})
        assert c.MODULE not in sys.modules
        import flashinfer.quantization.kernels.mxfp8_quantize as m
        print(all(getattr(getattr(m, n), "_gptoss_spark_cached", False) for n in c.BUILDERS))
        print(not any(isinstance(f, c._PatchAfterImport) for f in sys.meta_path))
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=REPO, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["True", "True"]
