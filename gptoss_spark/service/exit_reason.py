"""Why the engine ended, in one line a person can act on.

The engine's last output is mostly noise at a crash: uvicorn logs every
request, and the supervisor's own /health and /metrics probes are requests,
so a kill -9 used to read "exited with code -9: ... "GET /metrics HTTP/1.1"
200 OK". Here access-log lines are dropped, error lines are preferred, and a
death by signal is named as one.
"""

from __future__ import annotations

import re
import signal
from typing import Iterable

# uvicorn's access log: `127.0.0.1:40000 - "GET /metrics HTTP/1.1" 200 OK`.
_ACCESS_LOG = re.compile(r'"[A-Z]+ \S* HTTP/[0-9.]+" \d{3}\b')
# Lines worth showing first: a logged error (vLLM's `ERROR 12-01 10:00:00 [...]`,
# uvicorn's `ERROR:`), argparse's `prog: error: ...`, a traceback's first and last lines
# (vLLM prefixes its processes' lines with `(EngineCore pid=N) `).
# Not a bare ERROR: vLLM's usage text lists `{CRITICAL,ERROR,WARNING,...}`.
# pydantic's ValidationError (vLLM's config classes) names the class on one line and says what is
# wrong on the next, indented: `  Value error, User-specified max_model_len (...) is greater ...`.
_ERRORISH = re.compile(r"\b(ERROR|CRITICAL)(:|\s+\d\d-\d\d\s)|: error: |Traceback \(most recent call last\)"
                       r"|^(\([^)]*\)\s*)?[\w.]+(Error|Exception)(:|$)|^\s+Value error, ")

# A SIGKILL nobody here sent is most often the kernel's OOM killer.
_KILL_HINT = "; if nothing here sent it, check `journalctl -k` for the kernel's OOM killer"

# SIGSYS is what the unit's syscall filter does to a process that makes a call
# it blocks (systemd's default action): name the drop-in and the way out.
SYSCALL_FILTER_DROPIN = "/etc/systemd/system/gptoss-spark.service.d/20-syscall-filter.conf"
SYSCALL_FILTER_OFF = (f"sudo ln -sf /dev/null {SYSCALL_FILTER_DROPIN} && sudo systemctl daemon-reload "
                      "&& sudo systemctl restart gptoss-spark")
_SYS_HINT = (f"; a system call blocked by the unit's SystemCallFilter ({SYSCALL_FILTER_DROPIN}); "
             "`journalctl -k | grep type=1326` names it (syscall=N); turn the filter off: " + SYSCALL_FILTER_OFF)


# One shown line at most this long: a reason is read in `systemctl status` and a webhook.
LINE_LIMIT = 200


def telling_lines(lines: Iterable[str], n: int = 3, errors_only: bool = False) -> list[str]:
    """The last n lines that say something: error lines if there are any, else (unless errors_only)
    the last lines that are not access-log entries. Each cut to LINE_LIMIT characters."""
    useful = [ln for ln in lines if ln.strip() and not _ACCESS_LOG.search(ln)]
    errors = [ln for ln in useful if _ERRORISH.search(ln)]
    shown = (errors or ([] if errors_only else useful))[-n:]
    return [ln if len(ln) <= LINE_LIMIT else ln[:LINE_LIMIT - 3] + "..." for ln in shown]


def failure_signature(reason: str) -> str:
    """A failure's text with its numbers blanked (pids, timestamps, ports): two engine exits with the
    same signature failed the same way, and a third attempt would too."""
    return re.sub(r"\d+", "#", reason)


def describe_exit(returncode: int, output: Iterable[str] = (), when: str = "") -> str:
    """`engine killed by SIGKILL (signal 9)...` or `engine exited with code 1`, then `when`
    (e.g. " while loading"), then the telling lines of its output."""
    if returncode < 0:
        num = -returncode
        try:
            name = signal.Signals(num).name
        except ValueError:
            name = f"signal {num}"
        what = f"engine killed by {name} (signal {num}){when}" + {signal.SIGKILL: _KILL_HINT, signal.SIGSYS: _SYS_HINT}.get(num, "")
    else:
        what = f"engine exited with code {returncode}{when}"
    # A signal comes from outside: what the engine logged last (start-up, throughput) does not
    # explain it, only an error it logged on the way might.
    shown = telling_lines(output, errors_only=returncode < 0)
    return f"{what}: {' | '.join(shown)}" if shown else what
