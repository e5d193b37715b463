"""One preflight check's outcome, and a list of them with the exit code the first failure decides."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Check:
    name: str
    ok: bool
    message: str
    exit_code: int = 0
    warning: bool = False


@dataclass
class PreflightResult:
    checks: list[Check] = field(default_factory=list)

    def add(self, name: str, ok: bool, message: str, exit_code: int = 0, warning: bool = False) -> None:
        self.checks.append(Check(name, ok, message, exit_code, warning))

    @property
    def exit_code(self) -> int:
        for c in self.checks:
            if not c.ok:
                return c.exit_code
        return 0

    def render(self) -> str:
        lines = []
        for c in self.checks:
            tag = "ok  " if c.ok and not c.warning else ("warn" if c.ok else "FAIL")
            lines.append(f"  [{tag}] {c.name}: {c.message}")
        return "\n".join(lines)
