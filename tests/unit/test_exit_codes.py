"""One exit-code table: gptoss_spark/base/exit_codes.py. Everything that states a code agrees with it."""

from __future__ import annotations

import re
from pathlib import Path

from gptoss_spark.base import exit_codes
from gptoss_spark.admin.client import ApiError, ServiceDown, TokenUnreadable
from gptoss_spark.bench.target import ServerUnreachable
from gptoss_spark.base.errors import RequirementError, UserError
from gptoss_spark.install import patching
from gptoss_spark.kernel_tools.aot import ToolchainError

REPO = Path(__file__).resolve().parents[2]


def test_each_code_has_one_name():
    names = [k for k in vars(exit_codes) if k.startswith("EXIT_")]
    values = [getattr(exit_codes, k) for k in names]
    assert len(values) == len(set(values)), "two names share a code"
    assert len(exit_codes.table()) == len(names)


def test_docs_table_is_the_code_table():
    rows = re.findall(r"^\| (\d+) \| `(EXIT_[A-Z_]+)` \| (.+) \|$", (REPO / "docs" / "EXIT_CODES.md").read_text(), re.M)
    assert {int(code): name for code, name, _ in rows} == exit_codes.table()
    assert all(meaning.strip() for _, _, meaning in rows)


def test_install_sh_literal_codes_are_in_the_table():
    text = (REPO / "install.sh").read_text()
    literal = {int(n) for n in re.findall(r"\b(?:die|exit) (\d+)\b", text)}
    assert literal and literal <= set(exit_codes.table()), literal - set(exit_codes.table())


def test_unit_does_not_restart_on_serve_codes_a_retry_cannot_fix():
    unit = (REPO / "systemd" / "gptoss-spark.service").read_text()
    listed = {int(n) for n in re.search(r"^RestartPreventExitStatus=(.*)$", unit, re.M).group(1).split()}
    assert listed == {exit_codes.EXIT_USAGE, exit_codes.EXIT_REQUIREMENT, exit_codes.EXIT_GAVE_UP}


def test_error_classes_take_their_codes_from_the_table():
    table = exit_codes.table()
    classes = [UserError, RequirementError, ApiError, ServiceDown, TokenUnreadable, ServerUnreachable, ToolchainError,
               patching.PatchInputError, patching.VersionMismatchError, patching.DriftError, patching.PatchSetError,
               patching.ApplyFailedError, patching.NotPatchedError, patching.TamperedError]
    assert all(c.exit_code in table for c in classes)
    # the service not answering is one code, whether the admin API or the engine's endpoint is down
    assert ServiceDown.exit_code == ServerUnreachable.exit_code == exit_codes.EXIT_UNAVAILABLE
    # gptoss-spark patches' codes do not collide with install.sh's 10-31 (install.sh maps them to EXIT_PATCHES)
    patch_codes = {c.exit_code for c in classes if c.__module__ == patching.__name__}
    assert len(patch_codes) == 7 and all(40 <= c < 50 for c in patch_codes)


def test_install_sh_interrupted_exits_128_plus_the_signal_and_the_table_names_each():
    """install.sh's trap exits $((128 + $(kill -l SIG))) (not a literal the test above sees): each
    signal it traps has its code in the table, so EXIT_CODES.md documents it."""
    import signal
    text = (REPO / "install.sh").read_text()
    assert "exit $((128 + $(kill -l \"$1\")))" in text
    trapped = re.findall(r"trap 'interrupted (\w+)' \1", text)
    assert sorted(trapped) == ["HUP", "INT", "TERM"], trapped
    table = exit_codes.table()
    assert {128 + getattr(signal, f"SIG{s}") for s in trapped} <= set(table)
    assert (table[129], table[130], table[143]) == ("EXIT_HANGUP", "EXIT_INTERRUPTED", "EXIT_TERMINATED")
