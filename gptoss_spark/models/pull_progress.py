"""Progress within one file of a pull: huggingface_hub's own bars on a terminal, else a line at a bounded rate.

huggingface_hub 2.4.0 draws its per-file bars with tqdm and `disable=None` (utils/tqdm.py,
_create_progress_bar), and tqdm then draws nothing when stderr is not a terminal: under the
installer (its output goes through `tee` into the install log) or journald, a shard of the 120b
downloaded for minutes without a sign. hf_hub_download takes a `tqdm_class`; a class that is not
huggingface_hub's own is used as given (`cls(**kwargs)`), by http_get (update, used as a context
manager) and by xet_get's XetDownloadProgressReporter (update, total, set_postfix_str, close; one
bar, not two, when the class has update_transfer). ProgressLines is such a class: it writes
`file: 5.2 GB of 13.2 GB (39 %), 112.0 MB/s, ~71 s left` at most every LINE_INTERVAL_S seconds,
and a last line when the file is complete if it wrote any.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any, TextIO

# Seconds between two lines of one file: a heartbeat in a log, not a flood (a 65 GB pull at
# ~100 MB/s writes ~130 lines).
LINE_INTERVAL_S = 5.0


def _size(n: float) -> str:
    return f"{n / 1e9:.1f} GB" if n >= 1e8 else f"{n / 1e6:.1f} MB" if n >= 1e5 else f"{int(n)} B"


class ProgressLines:
    """tqdm's interface as huggingface_hub uses it, writing lines; see the module docstring.
    Subclassed per file by lines_for (huggingface_hub instantiates the class itself)."""

    name = ""
    out: Callable[[str], None] = print
    interval = LINE_INTERVAL_S
    clock: Callable[[], float] = time.monotonic

    def __init__(self, *args: Any, total: float | None = None, initial: float = 0, **_tqdm_options: Any):
        self.total = total
        self.n = initial
        self._t0 = self._last_t = type(self).clock()
        self._n0 = self._last_n = initial
        self._wrote = False
        self._closed = False

    def update(self, n: float | None = 1) -> None:
        self.n += n or 0
        now = type(self).clock()
        if now - self._last_t >= self.interval:
            self._line(now, (self.n - self._last_n) / max(now - self._last_t, 1e-9))

    def _line(self, now: float, rate: float) -> None:
        of = f" of {_size(self.total)} ({100 * self.n / self.total:.0f} %)" if self.total else ""
        left = (f", ~{(self.total - self.n) / rate:.0f} s left" if self.total and rate > 0 and self.n < self.total
                else "")
        type(self).out(f"  {self.name}: {_size(self.n)}{of}, {_size(rate)}/s{left}")
        self._last_t, self._last_n, self._wrote = now, self.n, True

    def close(self) -> None:
        if self._wrote and not self._closed:
            now = type(self).clock()
            self._line(now, (self.n - self._n0) / max(now - self._t0, 1e-9))  # the file's average rate
        self._closed = True

    def __enter__(self) -> ProgressLines:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # Bytes on the wire (xet): update() already counts what reached the disk, the figure shown.
    def update_transfer(self, n: float) -> None:
        pass

    def set_postfix_str(self, *args: Any, **kwargs: Any) -> None:
        pass

    def set_transfer_postfix_str(self, *args: Any, **kwargs: Any) -> None:
        pass

    def refresh(self, *args: Any, **kwargs: Any) -> None:
        pass


def lines_for(name: str, out: Callable[[str], None], interval: float = LINE_INTERVAL_S,
              clock: Callable[[], float] = time.monotonic) -> type[ProgressLines]:
    return type("ProgressLines", (ProgressLines,), {"name": name, "out": staticmethod(out), "interval": interval,
                                                    "clock": staticmethod(clock)})


def progress_for(stream: TextIO | None = None, out: Callable[[str], None] = print,
                 interval: float = LINE_INTERVAL_S) -> Callable[[str], type | None]:
    """The tqdm_class to fetch a file with: None (huggingface_hub's own bars) where they are drawn, a
    terminal; lines otherwise; none at all under HF_HUB_DISABLE_PROGRESS_BARS=1."""
    from huggingface_hub import constants

    stream = stream or sys.stderr
    if constants.HF_HUB_DISABLE_PROGRESS_BARS or stream.isatty():
        return lambda _name: None
    return lambda name: lines_for(name, lambda line: out(line), interval)
