"""Why the engine ended, in one line a person can act on.

The engine's last output is mostly noise at a crash: uvicorn logs every
request, and the supervisor's own /health and /metrics probes are requests,
so a kill -9 used to read "exited with code -9: ... "GET /metrics HTTP/1.1"
200 OK". Here access-log lines are dropped, error lines are preferred, and a
death by signal is named as one.

A failed vLLM start ends in the API server's wrapper, `RuntimeError: Engine core
initialization failed. See root cause above. Failed core proc(s): {}`: the cause is the
EngineCore process's exception, logged earlier. root_cause() finds it, and the reason
shows it first, the wrapper after it.
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

# A traceback's last line, `ValueError: ...`, after vLLM's process prefix `(EngineCore pid=N) ` and
# log header `ERROR 12-07 10:00:00 [core.py:1510] ` (logger.exception repeats the header on every line).
_PREFIX = re.compile(r"^(\([^)]*\)\s+)?((ERROR|CRITICAL)\s+\d\d-\d\d\s+[\d:.]+\s+\[[^\]]*\]\s?)?")
_EXCEPTION = re.compile(r"^(?:[A-Za-z_][\w.]*\.)?[A-Za-z_]\w*(Error|Exception|Exit): \S")
# pydantic names the class on one line and what is wrong on the next, indented.
_VALUE_ERROR = re.compile(r"^\s+Value error, \S")
# Lines that only point elsewhere: vLLM's API server saying "the cause is above", and the errors an
# engine client raises once its engine is gone. Never the root cause.
_WRAPPER = re.compile(r"See root cause above|Failed core proc|EngineDeadError|EngineCore encountered an issue")

# What vLLM's wrapper lists after this varies between two starts that failed alike.
_FAILED_PROCS = re.compile(r"(Failed core proc\(s\):)[^|]*")

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


def exception_line(line: str) -> str | None:
    """The exception a traceback ended in (`ValueError: ...`, pydantic's `  Value error, ...`) without
    vLLM's process prefix and log header; None for any other line."""
    bare = _PREFIX.sub("", line, count=1)
    if _EXCEPTION.match(bare):
        return bare.strip()
    if _VALUE_ERROR.match(bare):
        return bare.strip()
    return None


def root_cause(lines: Iterable[str]) -> str | None:
    """The last exception in the output that is not a wrapper pointing at another one (the API
    server's "See root cause above"), cut to LINE_LIMIT; None if the output names none."""
    causes = [e for e in map(exception_line, lines) if e and not _WRAPPER.search(e)]
    if not causes:
        return None
    cause = causes[-1]
    return cause if len(cause) <= LINE_LIMIT else cause[:LINE_LIMIT - 3] + "..."


def failure_signature(reason: str) -> str:
    """A failure's text with its numbers blanked (pids, timestamps, ports) and the list of failed
    processes in vLLM's wrapper left out (`{}` one time, `{'EngineCore': 1}` the next): two engine
    exits with the same signature failed the same way, and a third attempt would too."""
    return re.sub(r"\d+", "#", _FAILED_PROCS.sub(r"\1", reason))


def describe_exit(returncode: int, output: Iterable[str] = (), when: str = "",
                  exceptions: Iterable[str] = ()) -> str:
    """`engine killed by SIGKILL (signal 9)...` or `engine exited with code 1`, then `when`
    (e.g. " while loading"), then the root cause if the output names one (the wrapper after it),
    else the telling lines of its output. exceptions: exception lines seen earlier than the output
    kept (an engine's tail can be all API-server traceback)."""
    output = list(output)
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
    wrappers = [e for e in map(exception_line, output) if e and _WRAPPER.search(e)]
    # Earlier exceptions only when the output ends in a wrapper that points back at them: else an
    # exception vLLM logged hours ago for one bad request would pass for the cause of a later kill.
    cause = root_cause([*exceptions, *output] if wrappers else output)
    if cause is not None:
        shown = [cause, *wrappers[-1:]]
    return f"{what}: {' | '.join(shown)}" if shown else what
