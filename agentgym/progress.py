"""Progress bars that stay readable in a log file.

On a terminal ``progress_bar`` is tqdm's live bar. Written to a file or a pipe (``agentgym train
... > train.log 2>&1``, a job scheduler's log) a live bar becomes one line per update joined by
carriage returns; there it prints a whole line instead each time another ``every_percent`` of
the work is done, and at the end::

    held-out RL T=0:  25% 50/200 ep [elapsed 00:12, ETA 00:36, 4.1 ep/s]
    train:  50% 30/60 step [elapsed 03:02, ETA 03:02, 6.1s/step] reward=0.41, success=0.38

Every part may import this module (it imports nothing of agentgym).
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Iterable, Iterator
from typing import IO, Any

EVERY_PERCENT = 5.0
UNKNOWN_TOTAL_EVERY_S = 30.0  # no total: a line at most this often


def is_terminal(file: IO[str] | None) -> bool:
    try:
        return bool(file is not None and file.isatty())
    except (AttributeError, ValueError):  # no isatty, or a closed file
        return False


def progress_bar(
    iterable: Iterable[Any] | None = None,
    *,
    total: float | None = None,
    desc: str = "",
    unit: str = "it",
    initial: int = 0,
    file: IO[str] | None = None,
    disable: bool = False,
    every_percent: float = EVERY_PERCENT,
    **tqdm_kwargs: Any,
) -> Any:
    """tqdm's bar on a terminal, else a ``LogProgress`` (a line every ``every_percent``). Both have
    ``update``, ``set_postfix``, ``set_postfix_str``, ``close``, iteration and ``with``."""
    file = file if file is not None else sys.stderr
    if disable or is_terminal(file):
        from tqdm.auto import tqdm

        return tqdm(
            iterable, total=total, desc=desc, unit=unit, initial=initial, file=file, disable=disable, **tqdm_kwargs
        )
    return LogProgress(
        iterable, total=total, desc=desc, unit=unit, initial=initial, file=file, every_percent=every_percent
    )


def format_seconds(seconds: float) -> str:
    """``75`` -> ``01:15``, ``3725`` -> ``1:02:05``."""
    seconds = int(max(seconds, 0))
    minutes, secs = divmod(seconds, 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours:d}:{minutes:02d}:{secs:02d}" if hours else f"{minutes:02d}:{secs:02d}"


class LogProgress:
    """A progress report for logs: one line per ``every_percent`` of ``total`` (and the last one),
    with the elapsed time, the ETA and the rate; without a total, one line per 30 s."""

    def __init__(
        self,
        iterable: Iterable[Any] | None = None,
        *,
        total: float | None = None,
        desc: str = "",
        unit: str = "it",
        initial: int = 0,
        file: IO[str] | None = None,
        every_percent: float = EVERY_PERCENT,
    ) -> None:
        if total is None and iterable is not None and hasattr(iterable, "__len__"):
            total = len(iterable)  # type: ignore[arg-type]
        self.iterable = iterable
        self.total = total
        self.desc = desc
        self.unit = unit
        self.n = initial
        self.initial = initial
        self.file = file if file is not None else sys.stderr
        self.every = max(float(every_percent), 0.1)
        self.postfix = ""
        self.started = time.monotonic()
        self.last_line_at = self.started
        self.printed_n: float | None = None
        self.next_percent = self._next_after(self.percent())
        self.closed = False

    def percent(self) -> float | None:
        return 100.0 * self.n / self.total if self.total else None

    def _next_after(self, percent: float | None) -> float:
        if percent is None:
            return math.inf
        return (math.floor(percent / self.every + 1e-9) + 1) * self.every

    def update(self, n: float = 1) -> None:
        self.n += n
        percent = self.percent()
        now = time.monotonic()
        if percent is not None:
            if percent + 1e-9 >= self.next_percent or (self.total is not None and self.n >= self.total):
                self.next_percent = self._next_after(percent)
                self._print()
        elif now - self.last_line_at >= UNKNOWN_TOTAL_EVERY_S:
            self._print()

    def set_postfix(self, ordered_dict: dict[str, Any] | None = None, refresh: bool = True, **kwargs: Any) -> None:
        items = {**(ordered_dict or {}), **kwargs}
        self.postfix = ", ".join(f"{k}={v}" for k, v in items.items())

    def set_postfix_str(self, s: str = "", refresh: bool = True) -> None:
        self.postfix = str(s)

    def line(self) -> str:
        elapsed = time.monotonic() - self.started
        done = self.n - self.initial
        rate = done / elapsed if elapsed > 0 else 0.0
        if rate >= 1 or rate == 0:
            speed = f"{rate:.3g} {self.unit}/s" if rate < 1000 else f"{rate:.0f} {self.unit}/s"
        else:
            speed = f"{1 / rate:.3g}s/{self.unit}"
        count = f"{self.n:g}/{self.total:g}" if self.total else f"{self.n:g}"
        head = f"{self.desc}: " if self.desc else ""
        percent = self.percent()
        if percent is not None:
            head += f"{percent:3.0f}% "
        times = f"elapsed {format_seconds(elapsed)}"
        if self.total and rate > 0:
            times += f", ETA {format_seconds(max(self.total - self.n, 0) / rate)}"
        tail = f" {self.postfix}" if self.postfix else ""
        return f"{head}{count} {self.unit} [{times}, {speed}]{tail}"

    def _print(self) -> None:
        self.last_line_at = time.monotonic()
        self.printed_n = self.n
        try:
            self.file.write(self.line() + "\n")
            self.file.flush()
        except (ValueError, OSError):  # the log was closed under us: progress is not worth a crash
            pass

    def close(self) -> None:
        """The last line, unless it was just printed (an interrupted run shows where it stopped)."""
        if self.closed:
            return
        self.closed = True
        if self.printed_n != self.n and self.n != self.initial:
            self._print()

    def __iter__(self) -> Iterator[Any]:
        if self.iterable is None:
            raise TypeError("LogProgress was made without an iterable")
        try:
            for item in self.iterable:
                yield item
                self.update(1)
        finally:
            self.close()

    def __enter__(self) -> LogProgress:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
