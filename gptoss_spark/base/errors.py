"""Errors a user can cause. Each renders as one line: what is wrong and how to fix it."""

from __future__ import annotations

import os
import sys
from typing import Any, Callable

from .exit_codes import EXIT_BROKEN_PIPE, EXIT_INTERRUPTED, EXIT_REQUIREMENT, EXIT_USAGE


class UserError(Exception):
    """A problem the user can fix; the CLI prints str(err) and exits non-zero, no traceback."""

    exit_code = EXIT_USAGE


class ConfigError(UserError):
    """Bad settings or profile file. The message names the file, the key and the fix."""

    def __init__(self, file: object, key: str | None, problem: str, fix: str):
        self.file = str(file)
        self.key = key
        self.problem = problem
        self.fix = fix
        where = f"{self.file}: {key}" if key else self.file
        super().__init__(f"{where}: {problem}; {fix}")


class RequirementError(UserError):
    """A profile's declared requirement is not met on this host (e.g. the Eagle3 head is missing)."""

    exit_code = EXIT_REQUIREMENT


def run_command(func: Callable[[Any], int | None], args: Any, prog: str) -> int:
    """Run a parsed command: its exit code; a UserError as one line on stderr (`PROG: error: ...`)
    and its own code, never a traceback; Ctrl-C as 130; a reader that went away (`| head`) as 141,
    silently, as `cat` would. Every entry point runs commands through it."""
    try:
        code = int(func(args) or 0)
        sys.stdout.flush()  # here, where a closed pipe is still caught, not at the interpreter's exit
        return code
    except UserError as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        _quiet_stdout()
        return EXIT_BROKEN_PIPE


def _quiet_stdout() -> None:
    """Point stdout at /dev/null: the interpreter flushes it once more at exit, and that flush into
    the closed pipe would print its own BrokenPipeError (the Python docs' recipe, signal.rst)."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):
        pass  # stdout is no file descriptor (a test's capture): nothing will flush into the pipe
    finally:
        os.close(devnull)
